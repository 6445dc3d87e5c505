package backends_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/k8stest"
)

// The backend contract in a running pod (k8s://NAMESPACE/POD), through the
// Kubernetes API's exec.
func TestK8sContract(t *testing.T) {
	image := dockertest.Image(t)
	c := k8stest.ForTest(t, image)
	ctx := context.Background()
	if err := c.Namespace(ctx, "kd"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunPod(ctx, "kd", "box", image); err != nil {
		t.Fatal(err)
	}
	env, err := backends.Open("k8s://kd/box", backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.(*backends.K8s).Close() })
	backendtest.Contract(t, func(t *testing.T) backends.Env { return env })
	if n := env.(*backends.K8s).Relays(); n != 0 {
		t.Errorf("%d relay execs left open", n)
	}
}

// A k8s:// URI that names no pod, or has options it does not take, is a
// clear error before anything is reached.
func TestK8sURIErrors(t *testing.T) {
	for _, tc := range []struct{ uri, want string }{
		{"k8s://box", "a namespace and a pod"},
		{"k8s://Bad_NS/box", `"Bad_NS" is not a namespace name`},
		{"k8s://ns/Box!", `"Box!" is not a pod name`},
		{"k8s://ns/box?container=A_B", "container must be one container name"},
		{"k8s://ns/box?user=root", `unknown option "user"`},
	} {
		if _, err := backends.Open(tc.uri, backends.Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q) = %v, want an error with %q", tc.uri, err, tc.want)
		}
	}
	// A context's name may hold slashes (an EKS ARN): the pod and the
	// namespace are the last two parts. No such context: a clear error.
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	_, err := backends.Open("k8s://arn:aws:eks:eu-west-1:1:cluster/prod/agents/box", backends.Options{})
	if err == nil || !strings.Contains(err.Error(), "arn:aws:eks:eu-west-1:1:cluster/prod") {
		t.Errorf("an unknown context: %v, want it named", err)
	}
}
