package engine_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
)

// imageSandbox opens docker-image://<the test image><query>.
func imageSandbox(t testing.TB, query string) *backends.ImageSandbox {
	t.Helper()
	b, err := backends.NewImageSandbox("docker-image://"+dockertest.Image(t)+query, backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// containerOf is the managed container of the kernel whose key starts with
// owner + "/", failing unless there is exactly one.
func containerOf(t *testing.T, owner string) container.Summary {
	t.Helper()
	var found []container.Summary
	for _, s := range dockertest.Managed(t) {
		if strings.HasPrefix(s.Labels[backends.LabelKey], owner+"/") {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d containers for %s, want 1: %+v", len(found), owner, found)
	}
	return found[0]
}

func inspect(t *testing.T, id string) (container.InspectResponse, bool) {
	t.Helper()
	res, err := dockertest.Client(t).ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
	if err != nil {
		if strings.Contains(strings.ToLower(err.Error()), "no such container") {
			return container.InspectResponse{}, false
		}
		t.Fatal(err)
	}
	return res.Container, true
}

// TestDockerImageContainerPerKernel: each kernel key gets a container of its
// own with the limits asked for and the safe defaults; spawn + first cell
// is one container, one exec and one frame, a warm cell one frame; kill,
// reset and Close remove the containers.
func TestDockerImageContainerPerKernel(t *testing.T) {
	b := imageSandbox(t, "?memory=256m&pids=128&cpus=1")
	c := backendtest.NewCounting(b)
	eng, err := engine.New(engine.Config{Backends: []backends.Env{c}, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rtClose(t, eng) })
	run := func(owner, code string, reset bool) *engine.Result {
		t.Helper()
		return rtExec(t, eng, engine.Request{Owner: owner, Code: code, Reset: reset})
	}
	if first := run("alice", "x = 41\nprint(x + 1)", false); first.Stdout != "42\n" {
		t.Fatalf("alice's first cell: %q", first.Stdout)
	}
	if got := rtSnapshot(c); backendtest.Provisions(c) != 1 || got.Executes != 1 || got.Spawns != 1 || got.Frames != 1 || c.Dials() != 1 {
		t.Fatalf("spawn + first cell cost %d containers, %+v, %d relays; want 1 container, 1 exec (the spawn), 1 frame, 1 relay",
			backendtest.Provisions(c), got, c.Dials())
	}
	before := rtSnapshot(c)
	if warm := run("alice", "x += 1\nprint(x)", false); warm.Stdout != "42\n" || !warm.Kernel.Reused {
		t.Fatalf("warm cell: %q %+v", warm.Stdout, warm.Kernel)
	}
	if after := rtSnapshot(c); after.Executes != before.Executes || after.Frames-before.Frames != 1 || backendtest.Provisions(c) != 1 {
		t.Fatalf("a warm cell cost %d execs and %d frames, want 0 and 1", after.Executes-before.Executes, after.Frames-before.Frames)
	}
	run("bob", "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))", false)
	if got := run("bob", workProbe, false); got.Stdout != workProbeWant {
		t.Errorf("a newcomer's first steps in bob's container: %q %s, want %q", got.Stdout, got.Traceback, workProbeWant)
	}

	alice, bob := containerOf(t, "alice"), containerOf(t, "bob")
	if alice.ID == bob.ID {
		t.Fatal("alice and bob share a container")
	}
	info, _ := inspect(t, alice.ID)
	hc := info.HostConfig
	if hc.Memory != 256<<20 || hc.MemorySwap != 256<<20 || hc.PidsLimit == nil || *hc.PidsLimit != 128 || hc.NanoCPUs != 1e9 ||
		string(hc.NetworkMode) != "none" || !hc.ReadonlyRootfs || !slices.Equal(hc.CapDrop, []string{"ALL"}) ||
		!slices.Contains(hc.SecurityOpt, "no-new-privileges:true") || !strings.Contains(hc.Tmpfs["/tmp"], "size=256m") {
		t.Errorf("alice's container: memory %d swap %d pids %v cpus %d network %s ro %v capdrop %v secopt %v tmpfs %v",
			hc.Memory, hc.MemorySwap, hc.PidsLimit, hc.NanoCPUs, hc.NetworkMode, hc.ReadonlyRootfs, hc.CapDrop, hc.SecurityOpt, hc.Tmpfs)
	}
	if got := info.Config.Labels[backends.LabelKey]; !strings.HasPrefix(got, "alice/default@docker-image://") {
		t.Errorf("alice's container is labelled %q", got)
	}

	// A reset gives bob a new container; the old one is removed.
	if res := run("bob", "print(1)", true); !res.Kernel.StateReset {
		t.Fatalf("reset: %+v", res.Kernel)
	}
	if _, there := inspect(t, bob.ID); there {
		t.Error("bob's old container is still there after the reset")
	}
	if again := containerOf(t, "bob"); again.ID == bob.ID {
		t.Error("the reset kernel runs in the old container")
	}
	// A kill removes alice's container.
	k, _ := kernelOf(eng, "alice")
	if err := eng.Kill(context.Background(), k.ID); err != nil {
		t.Fatal(err)
	}
	if _, there := inspect(t, alice.ID); there {
		t.Error("alice's container is still there after the kill")
	}
	rtClose(t, eng)
	if left := dockertest.Managed(t); len(left) != 0 {
		t.Errorf("containers left after Close: %+v", left)
	}
	if left := b.Containers(); len(left) != 0 {
		t.Errorf("the backend still tracks %v", left)
	}
}

// workProbe is what a newcomer does first in a sandboxed kernel: list /tmp,
// write there, in ~ and in the cwd. A container's kernel once could not
// list /tmp (as root too), ran in / and had a read-only HOME.
const workProbe = `import os
r = []
for what, do in [("ls /tmp", lambda: os.listdir("/tmp")), ("/tmp", lambda: open("/tmp/x.csv", "w").write("1")),
                 ("~", lambda: open(os.path.expanduser("~/x.csv"), "w").write("1")), ("cwd", lambda: open("x.csv", "w").write("1"))]:
    try:
        do()
        r.append("ok")
    except OSError as e:
        r.append("%s: %s" % (what, e))
print(" ".join(r))`

const workProbeWant = "ok ok ok ok\n"

// sandboxEngine is an engine over b alone, closed when the test ends.
func sandboxEngine(t *testing.T, b backends.Env) *engine.Engine {
	t.Helper()
	eng, err := engine.New(engine.Config{Backends: []backends.Env{b}, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rtClose(t, eng) })
	return eng
}

func kernelOf(eng *engine.Engine, owner string) (engine.KernelInfo, bool) {
	for _, k := range eng.Kernels() {
		if k.Owner == owner {
			return k, true
		}
	}
	return engine.KernelInfo{}, false
}

// TestDockerImageOutOfMemory: a cell that allocates past the container's
// memory limit is reported as out of memory, not as a bare death.
func TestDockerImageOutOfMemory(t *testing.T) {
	b := imageSandbox(t, "?memory=64m")
	eng := sandboxEngine(t, b)
	rtExec(t, eng, engine.Request{Owner: "a", Code: "x = 1"})
	res, err := eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "b = bytearray(512 << 20)", Timeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the memory bomb: %s", res.Kernel.Note)
	if res.Kernel == nil || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "out of memory") {
		t.Fatalf("the memory bomb: status %s traceback %q kernel %+v; want state lost, out of memory", res.Status, res.Traceback, res.Kernel)
	}
}

// TestDockerImageContainerRemovedFromOutside: the kernel's container is
// removed behind the engine's back; the next cell finds the kernel dead and
// runs in a new container, saying the state was lost.
func TestDockerImageContainerRemovedFromOutside(t *testing.T) {
	b := imageSandbox(t, "")
	eng := sandboxEngine(t, b)
	rtExec(t, eng, engine.Request{Owner: "a", Code: "x = 1"})
	old := containerOf(t, "a")
	if _, err := dockertest.Client(t).ContainerRemove(context.Background(), old.ID, client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	res := rtExec(t, eng, engine.Request{Owner: "a", Code: "print(1)"})
	if !res.Kernel.StateLost || res.Stdout != "1\n" {
		t.Fatalf("after the container was removed: stdout %q kernel %+v", res.Stdout, res.Kernel)
	}
	if now := containerOf(t, "a"); now.ID == old.ID {
		t.Fatal("the kernel still names the removed container")
	}
}

// TestDockerImageOrphans: on open, containers left by an engine of this
// host that is gone are removed, and the engine says so; those of a live
// engine stay.
func TestDockerImageOrphans(t *testing.T) {
	c := dockertest.Client(t)
	host, _ := os.Hostname()
	mk := func(engineLabel string) string {
		t.Helper()
		res, err := c.ContainerCreate(context.Background(), client.ContainerCreateOptions{
			Config: &container.Config{Image: dockertest.Image(t), Labels: map[string]string{
				backends.LabelManaged: "1", backends.LabelKey: "ghost/default@docker-image://x", backends.LabelEngine: engineLabel}},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.ContainerRemove(context.Background(), res.ID, client.ContainerRemoveOptions{Force: true}) })
		return res.ID
	}
	gone := mk(host + "/999999999/12345")
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(stat)[strings.LastIndexByte(string(stat), ')')+1:])
	live := mk(host + "/" + strconv.Itoa(os.Getpid()) + "/" + fields[19]) // this process: alive
	b := imageSandbox(t, "")
	if _, there := inspect(t, gone); there {
		t.Error("the gone engine's container is still there")
	}
	if _, there := inspect(t, live); !there {
		t.Error("a container whose engine label names a live pid was removed")
	}
	eng := sandboxEngine(t, b)
	sub := eng.SubscribeWith(engine.SubscribeOptions{Buffer: 16, Since: time.Now().Add(-time.Hour)})
	defer sub.Close()
	found := false
	for _, ev := range sub.History {
		found = found || (ev.Type == engine.EventNotice && strings.Contains(ev.Detail, "removed 1 kernels' own hosts left by an engine that is gone: container ") &&
			strings.Contains(ev.Detail, "ghost/default"))
	}
	if !found {
		t.Errorf("no notice of the removed container in %+v", sub.History)
	}
}

// TestDockerImageErrors: a missing image and bad options are clear errors.
func TestDockerImageErrors(t *testing.T) {
	dockertest.Client(t)
	for _, tc := range []struct{ uri, want string }{
		{"docker-image://kerneldeck-no-such-image:1", `image "kerneldeck-no-such-image:1" is not on the Docker Engine`},
		{"docker-image://img?memory=lots", "memory must be a size"},
		{"docker-image://img?network=host", "not host"},
		{"docker-image://img?pids=2", "at least 16"},
		{"docker-image://img?cpus=-1", "cpus must be"},
		{"docker-image://img?swap=1g", `unknown option "swap"`},
		{"docker-image://Bad Image", "not an image reference"},
	} {
		if _, err := backends.Open(tc.uri, backends.Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q) = %v, want an error with %q", tc.uri, err, tc.want)
		}
	}
}

// TestDockerImageWarmPool: with spare_kernels on a docker-image backend,
// containers are made, started and hold a runner before anyone asks; a new
// owner's kernel is handed one (no container made, no spawn on its way)
// with its limits, its replacement comes in the background, the pool
// counts toward the cap, and Close removes every container.
func TestDockerImageWarmPool(t *testing.T) {
	b := imageSandbox(t, "?memory=256m")
	c := backendtest.NewCounting(b)
	eng, err := engine.New(engine.Config{Backends: []backends.Env{c}, StateDir: t.TempDir(), MaxKernels: 3,
		SpareKernels: map[string]int{b.URI(): 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rtClose(t, eng) })
	waitSpares := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); eng.Spares() != n; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d containers in the pool, want %d", eng.Spares(), n)
			}
		}
	}
	waitSpares(1)
	pool := dockertest.Managed(t)
	if len(pool) != 1 || !strings.HasPrefix(pool[0].Labels[backends.LabelKey], "spare-") {
		t.Fatalf("the pool's containers: %+v, want one labelled as a spare", pool)
	}
	provisions, spawns, dials := backendtest.Provisions(c), rtSnapshot(c).Spawns, c.Dials()
	// Docker names a container's host by its short id. The kernel's stream
	// runs over the relay the pool dialed ahead (the replacement, which
	// comes next, takes a container's start first).
	res := rtExec(t, eng, engine.Request{Owner: "alice", Code: "import socket\nprint(socket.gethostname())"})
	if got := c.Dials() - dials; got != 0 {
		t.Errorf("alice's first cell opened %d relays, want none: the pool's was dialed ahead", got)
	}
	if want := pool[0].ID[:12] + "\n"; res.Stdout != want {
		t.Fatalf("alice's cell ran on %q, want the pool's container %q", res.Stdout, want)
	}
	// The replacement may have started already: it is the only new one.
	if got := backendtest.Provisions(c) - provisions; got > 1 || rtSnapshot(c).Spawns-spawns > 1 {
		t.Errorf("alice's kernel made %d containers and %d spawns, want the pool's replacement at most", got, rtSnapshot(c).Spawns-spawns)
	}
	waitSpares(1) // the replacement
	if n := len(dockertest.Managed(t)); n != 2 {
		t.Errorf("%d containers, want alice's and the pool's", n)
	}
	// The pool counts toward the cap: two more owners fill it (the second
	// takes the pool's container, and no replacement fits).
	rtExec(t, eng, engine.Request{Owner: "bob", Code: "1"})
	rtExec(t, eng, engine.Request{Owner: "carol", Code: "1"})
	if n, sp := len(eng.Kernels()), eng.Spares(); n+sp > 3 {
		t.Errorf("%d kernels and %d in the pool, over the cap of 3", n, sp)
	}
	rtClose(t, eng)
	if left := dockertest.Managed(t); len(left) != 0 {
		t.Errorf("containers left after Close: %+v", left)
	}
}
