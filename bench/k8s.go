package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/k8stest"
)

// setupK8s adds the pod rows: a new owner's k8s-image:// kernel through
// one headless process, without a pool and with one, and the floor a pod
// costs before anything runs in it. The cluster is the tests' own
// single-node one (internal/k8stest), started for the bench alone.
func (e *setupEnv) setupK8s(ctx context.Context, t *tb, log io.Writer) error {
	image := dockertest.Image(t)
	fmt.Fprintf(log, "bench: starting a single-node Kubernetes cluster\n")
	c, err := k8stest.Start(ctx, k8stest.Options{Images: []string{image}, Log: log})
	if err != nil {
		return err
	}
	t.Cleanup(func() { c.Close() })
	const ns = "kdbench"
	if err := c.Namespace(ctx, ns); err != nil {
		return err
	}
	// The headless processes read the cluster's kubeconfig as kubectl would.
	os.Setenv("KUBECONFIG", c.Kubeconfig)
	uri := "k8s-image://" + image + "?namespace=" + ns + "&pull=Never"
	sandbox, err := backends.NewPodSandbox(uri, backends.Options{})
	if err != nil {
		return err
	}
	t.Cleanup(func() { sandbox.Close() })
	e.subjects = append(e.subjects, &hostFloor{name: "floor.k8s.pod", p: sandbox})
	for _, h := range []struct {
		name   string
		spares int
	}{{"headless.k8s-image", 0}, {"headless.k8s-image.pool", 1}} {
		s, err := newHeadless(ctx, t, h.name, e.bin, uri, h.spares)
		if err != nil {
			return err
		}
		e.subjects = append(e.subjects, s)
	}
	return nil
}
