package engine_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/k8stest"
)

// podCluster is the cluster of the k8s-image tests, with a namespace.
type podCluster struct {
	*k8stest.Cluster
	image, ns string
}

// sandbox opens k8s-image://<the test image>?namespace=…&pull=Never<query>,
// closed when t ends.
func (c podCluster) sandbox(t *testing.T, query string) *backends.PodSandbox {
	t.Helper()
	b, err := backends.NewPodSandbox("k8s-image://"+c.image+"?namespace="+c.ns+"&pull=Never"+query, backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// pods are the kerneldeck pods in the namespace, as the API lists them
// (those being deleted too).
func (c podCluster) pods(t *testing.T) []corev1.Pod {
	t.Helper()
	list, err := c.Client.CoreV1().Pods(c.ns).List(context.Background(), metav1.ListOptions{LabelSelector: backends.LabelManaged + "=1"})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// podOf is the pod of the kernel whose key starts with owner + "/",
// failing unless there is exactly one.
func (c podCluster) podOf(t *testing.T, owner string) corev1.Pod {
	t.Helper()
	var found []corev1.Pod
	for _, p := range c.pods(t) {
		if strings.HasPrefix(p.Annotations[backends.LabelKey], owner+"/") && p.DeletionTimestamp == nil {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d pods for %s, want 1: %v", len(found), owner, podNames(found))
	}
	return found[0]
}

func podNames(pods []corev1.Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return names
}

func (c podCluster) gone(t *testing.T, name string) bool {
	t.Helper()
	_, err := c.Client.CoreV1().Pods(c.ns).Get(context.Background(), name, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

// sharedPod is a kernel's pod used as a shared host: the suites run many
// kernels in it, so the engine must not dispose of it with the first.
type sharedPod struct {
	backends.Env
	backends.StreamDialer
}

// Kernels in pods of their own (k8s-image://) on a real cluster: one
// cluster for all, as starting one takes some seconds.
func TestK8sImageKernels(t *testing.T) {
	image := dockertest.Image(t)
	c := podCluster{Cluster: k8stest.ForTest(t, image), image: image, ns: "kdi"}
	ctx := context.Background()
	if err := c.Namespace(ctx, c.ns); err != nil {
		t.Fatal(err)
	}

	// Each key gets a pod of its own with the limits asked for and the safe
	// defaults; spawn + first cell is one pod, one exec, one frame and one
	// relay, a warm cell one frame; reset, kill and Close delete the pods.
	t.Run("a pod per kernel", func(t *testing.T) {
		b := c.sandbox(t, "&memory=256Mi&cpu=1&user=1001")
		cnt := backendtest.NewCounting(b)
		eng := sandboxEngine(t, cnt)
		run := func(owner, code string, reset bool) *engine.Result {
			t.Helper()
			return rtExec(t, eng, engine.Request{Owner: owner, Code: code, Reset: reset})
		}
		if first := run("alice", "x = 41\nprint(x + 1)", false); first.Stdout != "42\n" {
			t.Fatalf("alice's first cell: %q", first.Stdout)
		}
		if got := rtSnapshot(cnt); backendtest.Provisions(cnt) != 1 || got.Executes != 1 || got.Spawns != 1 || got.Frames != 1 || cnt.Dials() != 1 {
			t.Fatalf("spawn + first cell cost %d pods, %+v, %d relays; want 1 pod, 1 exec (the spawn), 1 frame, 1 relay",
				backendtest.Provisions(cnt), got, cnt.Dials())
		}
		for i := range 5 {
			before := rtSnapshot(cnt)
			run("alice", "x += 1", false)
			if after := rtSnapshot(cnt); after.Executes != before.Executes || after.Frames-before.Frames != 1 || backendtest.Provisions(cnt) != 1 {
				t.Fatalf("warm cell %d cost %d execs and %d frames, want 0 and 1", i, after.Executes-before.Executes, after.Frames-before.Frames)
			}
		}
		// From inside: the uid asked for, a read-only root, no token.
		inside := run("bob", `import os, errno
try:
    open("/etc/pwned", "w")
    ro = "writable"
except OSError as e:
    ro = errno.errorcode[e.errno]
print(os.getuid(), ro, os.path.exists("/var/run/secrets/kubernetes.io"))`, false)
		if inside.Stdout != "1001 EROFS False\n" {
			t.Errorf("inside bob's pod: %q, want uid 1001, a read-only root and no service account token", inside.Stdout)
		}
		if got := run("bob", workProbe, false); got.Stdout != workProbeWant {
			t.Errorf("a newcomer's first steps in bob's pod: %q %s, want %q", got.Stdout, got.Traceback, workProbeWant)
		}
		alice, bob := c.podOf(t, "alice"), c.podOf(t, "bob")
		if alice.Name == bob.Name {
			t.Fatal("alice and bob share a pod")
		}
		spec, ctr := alice.Spec, alice.Spec.Containers[0]
		sc := ctr.SecurityContext
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken || spec.EnableServiceLinks == nil || *spec.EnableServiceLinks ||
			sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" ||
			spec.SecurityContext.RunAsNonRoot == nil || !*spec.SecurityContext.RunAsNonRoot || *spec.SecurityContext.RunAsUser != 1001 ||
			ctr.Resources.Limits.Memory().String() != "256Mi" || ctr.Resources.Limits.Cpu().String() != "1" || ctr.ImagePullPolicy != corev1.PullNever {
			t.Errorf("alice's pod: %+v\n%+v", spec, ctr)
		}
		if key := alice.Annotations[backends.LabelKey]; !strings.HasPrefix(key, "alice/default@k8s-image://") {
			t.Errorf("alice's pod carries the key %q", key)
		}
		// The listing says where the kernel is: its pod and node.
		k, _ := kernelOf(eng, "alice")
		if want := (backends.Place{Kind: "pod", Name: c.ns + "/" + alice.Name, Node: c.Node}); k.Host != want {
			t.Errorf("alice's kernel is listed at %+v, want %+v", k.Host, want)
		}
		// A reset gives bob a new pod; the old one is deleted.
		if res := run("bob", "print(1)", true); !res.Kernel.StateReset {
			t.Fatalf("reset: %+v", res.Kernel)
		}
		if !c.gone(t, bob.Name) {
			t.Error("bob's old pod is still there after the reset")
		}
		if again := c.podOf(t, "bob"); again.Name == bob.Name {
			t.Error("the reset kernel runs in the old pod")
		}
		// A kill deletes alice's pod, and the event says which.
		if err := eng.Kill(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
		if !c.gone(t, alice.Name) {
			t.Error("alice's pod is still there after the kill")
		}
		rtClose(t, eng)
		if left := c.pods(t); len(left) != 0 {
			t.Errorf("pods left after Close: %v", podNames(left))
		}
		if left := b.Pods(); len(left) != 0 {
			t.Errorf("the backend still tracks %v", left)
		}
	})

	// The suites, in a pod the backend made (its limits, its read-only
	// root, a user of the image's), over the relay exec and over Execute.
	podHost := func(streams bool) func(t *testing.T) backends.Env {
		return func(t *testing.T) backends.Env {
			t.Helper()
			b := c.sandbox(t, "&user=1001")
			host, err := b.Provision(ctx, "suite/default@k8s-image://x[]")
			if err != nil {
				t.Fatal(err)
			}
			if !streams {
				return backends.ExecuteOnly(sharedPod{Env: host})
			}
			return sharedPod{Env: host, StreamDialer: host.(backends.StreamDialer)}
		}
	}
	t.Run("lifecycle/stream", func(t *testing.T) { enginetest.Lifecycle(t, podHost(true)) })
	t.Run("lifecycle/execute", func(t *testing.T) { enginetest.Lifecycle(t, podHost(false)) })
	t.Run("tools/stream", func(t *testing.T) { enginetest.ToolCalls(t, podHost(true)) })
	t.Run("tools/execute", func(t *testing.T) { enginetest.ToolCalls(t, podHost(false)) })
	t.Run("input", func(t *testing.T) { enginetest.Input(t, podHost(true)(t)) })

	// The cap evicts the least recently used kernel and deletes its pod;
	// reaping deletes the rest.
	t.Run("cap and reaping", func(t *testing.T) {
		b := c.sandbox(t, "")
		eng, err := engine.New(engine.Config{Backends: []backends.Env{b}, StateDir: t.TempDir(), MaxKernels: 1, IdleExit: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rtClose(t, eng) })
		rtExec(t, eng, engine.Request{Owner: "alice", Code: "1"})
		alice := c.podOf(t, "alice")
		rtExec(t, eng, engine.Request{Owner: "bob", Code: "1"})
		bob := c.podOf(t, "bob")
		if !c.gone(t, alice.Name) {
			t.Error("the evicted kernel's pod is still there")
		}
		for deadline := time.Now().Add(30 * time.Second); !c.gone(t, bob.Name); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("bob's pod is still there 30 s after its idle exit of 2 s")
			}
		}
		if left := b.Pods(); len(left) != 0 {
			t.Errorf("the backend still tracks %v", left)
		}
	})

	// A cell that allocates past the pod's memory limit is reported as out
	// of memory, naming the limit.
	t.Run("out of memory", func(t *testing.T) {
		eng := sandboxEngine(t, c.sandbox(t, "&memory=64Mi"))
		rtExec(t, eng, engine.Request{Owner: "a", Code: "x = 1"})
		res, err := eng.Execute(ctx, engine.Request{Owner: "a", Code: "b = bytearray(512 << 20)", Timeout: 60 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if res.Kernel == nil || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "out of memory: killed for exceeding its pod's memory limit of 64Mi") {
			t.Fatalf("the memory bomb: status %s traceback %q kernel %+v; want state lost, out of memory", res.Status, res.Traceback, res.Kernel)
		}
	})

	// The pod is deleted under a running cell, with a grace period longer
	// than the cell's timeout: the pod's processes run on through it, so
	// only the watch can tell the kernel is lost, and it does.
	t.Run("pod deleted mid-cell", func(t *testing.T) {
		eng := sandboxEngine(t, c.sandbox(t, ""))
		rtExec(t, eng, engine.Request{Owner: "a", Code: "x = 1"})
		pod := c.podOf(t, "a")
		done := make(chan *engine.Result, 1)
		go func() {
			res, err := eng.Execute(ctx, engine.Request{Owner: "a", Code: "import time\ntime.sleep(40)", Timeout: 20 * time.Second})
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		waitRunning(t, eng, "a")
		grace := int64(60)
		if err := c.Client.CoreV1().Pods(c.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res == nil || res.Kernel == nil || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "is being deleted") {
			t.Fatalf("the cell in a pod being deleted: %+v", res)
		}
		next := rtExec(t, eng, engine.Request{Owner: "a", Code: "print(globals().get('x', 'gone'))"})
		if next.Stdout != "gone\n" || c.podOf(t, "a").Name == pod.Name {
			t.Fatalf("the next cell: %q in %s", next.Stdout, c.podOf(t, "a").Name)
		}
	})

	// The relay exec dies while a cell runs: the cell's result is collected
	// over Execute, once, and the kernel lives on.
	t.Run("stream cut mid-cell", func(t *testing.T) {
		b := c.sandbox(t, "")
		eng := sandboxEngine(t, b)
		rtExec(t, eng, engine.Request{Owner: "a", Code: "n = 1"})
		done := make(chan *engine.Result, 1)
		go func() {
			res, err := eng.Execute(ctx, engine.Request{Owner: "a", Code: "import time\ntime.sleep(2)\nn += 1\nprint('done', n)", Timeout: 30 * time.Second})
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		waitRunning(t, eng, "a")
		pod := c.podOf(t, "a").Name
		k8s, err := backends.NewK8s("k8s://"+c.ns+"/"+pod, backends.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer k8s.Close()
		out, err := k8s.Execute(ctx, `for p in /proc/[0-9]*; do tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q KDRELAY && kill -KILL "${p#/proc/}" && echo KILLED; done`, backends.ExecOptions{})
		if err != nil || !strings.Contains(out.Output, "KILLED") {
			t.Fatalf("killing the relay: %q %v", out.Output, err)
		}
		res := <-done
		if res == nil || res.Status != engine.StatusSuccess || res.Stdout != "done 2\n" {
			t.Fatalf("the cell in flight when its relay died: %+v", res)
		}
		if again := rtExec(t, eng, engine.Request{Owner: "a", Code: "n"}); again.Stdout != "2\n" || !again.Kernel.Reused {
			t.Fatalf("the next cell: %q %+v (the cell ran more than once, or the kernel was lost)", again.Stdout, again.Kernel)
		}
	})

	// An image that is not on the node fails the spawn at once, naming the
	// image and the reason, and leaves no pod.
	// Parking: the state goes out of the pod over the relay, the pod is
	// deleted, and the next call's new pod gets it back.
	t.Run("parking", func(t *testing.T) {
		enginetest.Parking(t, c.sandbox(t, ""), enginetest.ParkingOptions{})
	})

	t.Run("missing image", func(t *testing.T) {
		for _, pull := range []string{"Never", "IfNotPresent"} {
			b, err := backends.NewPodSandbox("k8s-image://kerneldeck-no-such-image:1?namespace="+c.ns+"&pull="+pull, backends.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			eng := sandboxEngine(t, b)
			_, err = eng.Execute(ctx, engine.Request{Owner: "a", Code: "1", Timeout: 60 * time.Second})
			if err == nil || !strings.Contains(err.Error(), "kerneldeck-no-such-image:1") || !strings.Contains(err.Error(), "cannot start") ||
				strings.Contains(err.Error(), "per-call") {
				t.Fatalf("pull=%s: %v, want an error naming the image and why it cannot start, and no per-call run in a second pod", pull, err)
			}
			t.Logf("pull=%s: %v", pull, err)
			if left := c.pods(t); len(left) != 0 {
				t.Errorf("pods left after a failed start: %v", podNames(left))
			}
		}
	})

	// A pod no node can take fails with the scheduler's words.
	t.Run("unschedulable", func(t *testing.T) {
		eng := sandboxEngine(t, c.sandbox(t, "&node_selector=kerneldeck.io/gpu=h100"))
		_, err := eng.Execute(ctx, engine.Request{Owner: "a", Code: "1", Timeout: 60 * time.Second})
		if err == nil || !strings.Contains(err.Error(), "cannot be scheduled") || !strings.Contains(err.Error(), "node affinity/selector") {
			t.Fatalf("%v, want the scheduler's words", err)
		}
		if left := c.pods(t); len(left) != 0 {
			t.Errorf("pods left: %v", podNames(left))
		}
	})

	// On open, pods left by an engine of this host that is gone are
	// deleted, and the engine says so; those of a live engine stay.
	t.Run("orphans", func(t *testing.T) {
		host, _ := os.Hostname()
		stat, err := os.ReadFile("/proc/self/stat")
		if err != nil {
			t.Fatal(err)
		}
		fields := strings.Fields(string(stat)[strings.LastIndexByte(string(stat), ')')+1:])
		mk := func(name, engineLabel string) {
			t.Helper()
			no := false
			_, err := c.Client.CoreV1().Pods(c.ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{backends.LabelManaged: "1"},
					Annotations: map[string]string{backends.LabelKey: "ghost/default@k8s-image://x[]", backends.LabelEngine: engineLabel}},
				Spec: corev1.PodSpec{AutomountServiceAccountToken: &no, TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{Name: "k", Image: image, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "infinity"}}}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				c.Client.CoreV1().Pods(c.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			})
		}
		mk("orphan", host+"/999999999/12345")
		mk("alive", host+"/"+strconv.Itoa(os.Getpid())+"/"+fields[19])
		b := c.sandbox(t, "")
		if !c.gone(t, "orphan") {
			t.Error("the gone engine's pod is still there")
		}
		if c.gone(t, "alive") {
			t.Error("a pod whose engine is alive was deleted")
		}
		eng := sandboxEngine(t, b)
		sub := eng.SubscribeWith(engine.SubscribeOptions{Buffer: 16, Since: time.Now().Add(-time.Hour)})
		defer sub.Close()
		found := false
		for _, ev := range sub.History {
			found = found || (ev.Type == engine.EventNotice && strings.Contains(ev.Detail, "removed 1 kernels' own hosts left by an engine that is gone: pod "+c.ns+"/orphan (kernel ghost/default"))
		}
		if !found {
			t.Errorf("no notice of the deleted pod in %+v", sub.History)
		}
	})

	// With spare_kernels, pods are made, started and hold a runner before
	// anyone asks; a new owner's kernel is handed one, with no pod made on
	// its way; Close deletes them all.
	t.Run("warm pool", func(t *testing.T) {
		b := c.sandbox(t, "")
		cnt := backendtest.NewCounting(b)
		eng, err := engine.New(engine.Config{Backends: []backends.Env{cnt}, StateDir: t.TempDir(), MaxKernels: 3,
			SpareKernels: map[string]int{b.URI(): 1}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rtClose(t, eng) })
		waitPool := func(n int) {
			t.Helper()
			for deadline := time.Now().Add(60 * time.Second); eng.Spares() != n; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d pods in the pool, want %d", eng.Spares(), n)
				}
			}
		}
		waitPool(1)
		pool := c.pods(t)
		if len(pool) != 1 || !strings.HasPrefix(pool[0].Annotations[backends.LabelKey], "spare-") {
			t.Fatalf("the pool's pods: %v, want one made for a spare", podNames(pool))
		}
		provisions, dials := backendtest.Provisions(cnt), cnt.Dials()
		res := rtExec(t, eng, engine.Request{Owner: "alice", Code: "import socket\nprint(socket.gethostname())"})
		if res.Stdout != pool[0].Name+"\n" {
			t.Fatalf("alice's cell ran on %q, want the pool's pod %s", res.Stdout, pool[0].Name)
		}
		if got := cnt.Dials() - dials; got != 0 {
			t.Errorf("alice's first cell opened %d relays, want none: the pool's was dialed ahead", got)
		}
		if got := backendtest.Provisions(cnt) - provisions; got > 1 {
			t.Errorf("alice's kernel made %d pods, want the pool's replacement at most", got)
		}
		waitPool(1)
		rtClose(t, eng)
		if left := c.pods(t); len(left) != 0 {
			t.Errorf("pods left after Close: %v", podNames(left))
		}
	})
}

// waitRunning waits until owner's kernel runs a cell.
func waitRunning(t *testing.T, eng *engine.Engine, owner string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if k, ok := kernelOf(eng, owner); ok && k.State == engine.StateRunning {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's cell is not running after 20 s", owner)
		}
	}
}
