package k8stest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// ForTest starts a cluster with images loaded for t, points KUBECONFIG at
// its admin kubeconfig, and closes it when t ends. Where this machine
// cannot run one the test skips, or fails with KERNELDECK_REQUIRE_K8S=1.
func ForTest(t *testing.T, images ...string) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log bytes.Buffer
	c, err := Start(ctx, Options{Images: images, Log: &log})
	if errors.Is(err, ErrUnavailable) && os.Getenv(RequireEnv) != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("k8stest: Close: %v", err)
		}
	})
	t.Setenv("KUBECONFIG", c.Kubeconfig)
	return c
}
