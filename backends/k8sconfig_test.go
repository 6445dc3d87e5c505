package backends

import (
	"strings"
	"testing"
)

// With no kubeconfig anywhere, the k8s backends say where one goes, as
// kubectl's users know it (client-go's own words named KUBERNETES_MASTER).
func TestNoKubeconfigSaysWhereItGoes(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, uri := range []string{"k8s-image://python:3", "k8s://ns/pod"} {
		var err error
		if strings.HasPrefix(uri, "k8s-image") {
			_, err = NewPodSandbox(uri, Options{})
		} else {
			_, err = NewK8s(uri, Options{})
		}
		if err == nil || !strings.Contains(err.Error(), "set KUBECONFIG") || !strings.Contains(err.Error(), "~/.kube/config") ||
			strings.Contains(err.Error(), "KUBERNETES_MASTER") {
			t.Errorf("%s without a kubeconfig: %v", uri, err)
		}
	}
}
