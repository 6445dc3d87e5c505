package engine_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/k8stest"
)

// Kernels in a running pod of a real cluster (k8s://NAMESPACE/POD): the
// lifecycle suite over the relay exec and over plain Execute, the tool-call
// and input() suites, and the round trips a cell costs. One cluster for
// all: starting one takes some seconds.
func TestK8sPodKernels(t *testing.T) {
	image := dockertest.Image(t)
	c := k8stest.ForTest(t, image)
	ctx := context.Background()
	if err := c.Namespace(ctx, "kd"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunPod(ctx, "kd", "box", image); err != nil {
		t.Fatal(err)
	}
	// A temp dir of each test's own in the pod (the suites plant files).
	podEnv := func(t *testing.T) *backends.K8s {
		t.Helper()
		first, err := backends.NewK8s("k8s://kd/box", backends.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer first.Close()
		res, err := first.Execute(ctx, "mktemp -d /tmp/kdtest.XXXXXX", backends.ExecOptions{})
		if err != nil || res.ReturnCode != 0 {
			t.Fatalf("mktemp in the pod: %q %v", res.Output, err)
		}
		env, err := backends.NewK8s("k8s://kd/box", backends.Options{DockerTempDir: strings.TrimSpace(res.Output)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { env.Close() })
		return env
	}
	t.Run("lifecycle/stream", func(t *testing.T) {
		enginetest.Lifecycle(t, func(t *testing.T) backends.Env { return podEnv(t) })
	})
	t.Run("lifecycle/execute", func(t *testing.T) {
		enginetest.Lifecycle(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(podEnv(t)) })
	})
	t.Run("tools/stream", func(t *testing.T) {
		enginetest.ToolCalls(t, func(t *testing.T) backends.Env { return podEnv(t) })
	})
	t.Run("tools/execute", func(t *testing.T) {
		enginetest.ToolCalls(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(podEnv(t)) })
	})
	t.Run("input", func(t *testing.T) { enginetest.Input(t, podEnv(t)) })
	t.Run("parking", func(t *testing.T) { enginetest.Parking(t, podEnv(t), enginetest.ParkingOptions{}) })

	// Spawn + first cell = 1 exec + 1 frame, with one relay exec opened
	// for the kernel; a warm cell = no exec, one frame.
	t.Run("round trips", func(t *testing.T) {
		env := podEnv(t)
		cnt := backendtest.NewCounting(env)
		eng, err := engine.New(engine.Config{Backends: []backends.Env{cnt}, StateDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rtClose(t, eng) })
		if first := rtExec(t, eng, engine.Request{Owner: "rt", Code: "x = 41\nprint(x + 1)"}); first.Stdout != "42\n" {
			t.Fatalf("first cell: %q", first.Stdout)
		}
		if got := rtSnapshot(cnt); got.Executes != 1 || got.Spawns != 1 || got.Frames != 1 || cnt.Dials() != 1 {
			t.Fatalf("spawn + first cell cost %+v and %d dials, want 1 Execute (the spawn), 1 frame, 1 relay", got, cnt.Dials())
		}
		for i := range 10 {
			before := rtSnapshot(cnt)
			rtExec(t, eng, engine.Request{Owner: "rt", Code: "x += 1"})
			if after := rtSnapshot(cnt); after.Executes != before.Executes || after.Frames-before.Frames != 1 {
				t.Fatalf("warm cell %d cost %d execs and %d frames, want 0 and 1", i, after.Executes-before.Executes, after.Frames-before.Frames)
			}
		}
		if cnt.Dials() != 1 {
			t.Errorf("%d relays for one kernel, want 1", cnt.Dials())
		}
	})

	// Two users' containers in one pod share its processes and its /tmp:
	// bob cannot list, read, write, signal, read the environ of or connect
	// to alice's kernel; her kernel's secret is in no exec's arguments and
	// no event.
	t.Run("lockdown in a shared pod", func(t *testing.T) {
		yes := true
		ctr := func(name string, id int64) corev1.Container {
			return corev1.Container{Name: name, Image: image, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "infinity"},
				SecurityContext: &corev1.SecurityContext{RunAsUser: &id, RunAsGroup: &id},
				VolumeMounts:    []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}}}
		}
		no := false
		if _, err := c.StartPod(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: "kd"},
			Spec: corev1.PodSpec{AutomountServiceAccountToken: &no, ShareProcessNamespace: &yes, TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{ctr("alice", int64(dockertest.Users["alice"])), ctr("bob", int64(dockertest.Users["bob"]))},
				Volumes:    []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
		}); err != nil {
			t.Fatal(err)
		}
		open := func(container string) *backends.K8s {
			env, err := backends.NewK8s("k8s://kd/shared?container="+container, backends.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { env.Close() })
			return env
		}
		cnt := backendtest.NewCounting(open("alice"))
		h := enginetest.New(t, cnt, nil)
		res := h.Run("a", "print('hi')", 0)
		token := ""
		for _, k := range h.Eng.Kept() {
			token = k.Token
		}
		requireLockedOut(t, open("bob"), "bob", res.Kernel.Dir, res.Kernel.PID)
		requireSecretHidden(t, cnt, h, token)
	})
}
