package engine_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// dockerEnv opens docker://name[?user=U].
func dockerEnv(t *testing.T, name, user string) *backends.Docker {
	return dockertest.Env(t, name, user, "")
}

// dockerEnvOwnTemp is dockerEnv with a temp dir of the test's own in the
// container (the suites plant files under it).
func dockerEnvOwnTemp(t *testing.T, name, user string) *backends.Docker {
	t.Helper()
	first := dockerEnv(t, name, user)
	res, err := first.Execute(context.Background(), "mktemp -d /tmp/kdtest.XXXXXX", backends.ExecOptions{})
	if err != nil || res.ReturnCode != 0 {
		t.Fatalf("mktemp in the container: %q %v", res.Output, err)
	}
	return dockertest.Env(t, name, user, strings.TrimSpace(res.Output))
}

// The whole lifecycle suite in a real container, for root and a plain
// user, over the stream relay and over plain Execute.
func TestDockerLifecycle(t *testing.T) {
	name := dockertest.Container(t, dockertest.ContainerOptions{})
	for _, user := range []string{"", "alice"} {
		t.Run("user="+user+"/stream", func(t *testing.T) {
			enginetest.Lifecycle(t, func(t *testing.T) backends.Env { return dockerEnvOwnTemp(t, name, user) })
		})
		t.Run("user="+user+"/execute", func(t *testing.T) {
			enginetest.Lifecycle(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(dockerEnvOwnTemp(t, name, user)) })
		})
	}
}

// The tool-call suite with kernels in a container and tools on this side.
func TestDockerToolCalls(t *testing.T) {
	name := dockertest.Container(t, dockertest.ContainerOptions{})
	t.Run("stream", func(t *testing.T) {
		enginetest.ToolCalls(t, func(t *testing.T) backends.Env { return dockerEnvOwnTemp(t, name, "alice") })
	})
	t.Run("execute", func(t *testing.T) {
		enginetest.ToolCalls(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(dockerEnvOwnTemp(t, name, "alice")) })
	})
}

// input() in a kernel in a container asks the caller here, through the relay.
func TestDockerInput(t *testing.T) {
	name := dockertest.Container(t, dockertest.ContainerOptions{})
	enginetest.Input(t, dockerEnvOwnTemp(t, name, "alice"))
}

// One owner's kernel attacks another's of the same user in a container.
func TestDockerIsolation(t *testing.T) {
	name := dockertest.Container(t, dockertest.ContainerOptions{})
	enginetest.Isolation(t, func(t *testing.T) backends.Env { return dockerEnvOwnTemp(t, name, "alice") })
}

// TestDockerRoundTrips: in a container, spawn + first cell = 1 Execute
// (one exec) + 1 frame, with one relay exec opened for the kernel; a warm
// cell = no exec, one frame.
func TestDockerRoundTrips(t *testing.T) {
	env := dockerEnv(t, dockertest.Container(t, dockertest.ContainerOptions{}), "alice")
	c := backendtest.NewCounting(env)
	eng, err := engine.New(engine.Config{Backends: []backends.Env{c}, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rtClose(t, eng) })
	first := rtExec(t, eng, engine.Request{Owner: "rt", Backend: env.URI(), Code: "x = 41\nprint(x + 1)"})
	if first.Stdout != "42\n" {
		t.Fatalf("first cell: %q", first.Stdout)
	}
	if got := rtSnapshot(c); got.Executes != 1 || got.Spawns != 1 || got.Frames != 1 || c.Dials() != 1 {
		t.Fatalf("spawn + first cell cost %+v and %d dials, want 1 Execute (the spawn), 1 frame, 1 relay", got, c.Dials())
	}
	for i := range 10 {
		before := rtSnapshot(c)
		rtExec(t, eng, engine.Request{Owner: "rt", Backend: env.URI(), Code: "x += 1"})
		if after := rtSnapshot(c); after.Executes != before.Executes || after.Frames-before.Frames != 1 {
			t.Fatalf("warm cell %d cost %d execs and %d frames, want 0 and 1", i, after.Executes-before.Executes, after.Frames-before.Frames)
		}
	}
	if c.Dials() != 1 {
		t.Errorf("%d relays for one kernel, want 1", c.Dials())
	}
	rtRequireCompiledSpawn(t, eng, c, env.URI())
}

// dockerProcs lists the container's processes (pid and command line).
func dockerProcs(t *testing.T, h *enginetest.Harness) string {
	t.Helper()
	return h.Host(`for p in /proc/[0-9]*; do printf '%s %s\n' "${p#/proc/}" "$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)"; done`)
}

// TestDockerRelayKilledMidCell: the relay exec dies while a cell runs; the
// cell's result is collected over Execute, once, and the next cell opens a
// new relay.
func TestDockerRelayKilledMidCell(t *testing.T) {
	env := dockerEnv(t, dockertest.Container(t, dockertest.ContainerOptions{}), "alice")
	h := enginetest.New(t, env, nil)
	h.Run("a", "n = 1", 0)
	done := make(chan *engine.Result, 1)
	go func() {
		res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "import time\ntime.sleep(1.5)\nn += 1\nprint('done', n)", Timeout: 30 * time.Second})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	h.WaitFor("the cell running", 10*time.Second, func() bool { k, _ := h.Kernel("a"); return k.State == engine.StateRunning })
	var relay string
	for _, line := range strings.Split(dockerProcs(t, h), "\n") {
		if strings.Contains(line, "KDRELAY") {
			relay, _, _ = strings.Cut(line, " ")
		}
	}
	if relay == "" {
		t.Fatalf("no relay process in the container:\n%s", dockerProcs(t, h))
	}
	h.Host("kill -KILL " + relay)
	res := <-done
	if res == nil || res.Status != engine.StatusSuccess || res.Stdout != "done 2\n" {
		t.Fatalf("the cell in flight when its relay died: %+v", res)
	}
	if again := h.Run("a", "n", 0); again.Stdout != "2\n" || !again.Kernel.Reused {
		t.Fatalf("the next cell: %q %+v (the cell ran more than once, or the kernel was lost)", again.Stdout, again.Kernel)
	}
}

// TestDockerContainerStoppedMidCell: killing the container under a running
// cell ends it with the kernel's state reported lost, and the next call
// says the container is not running.
func TestDockerContainerStoppedMidCell(t *testing.T) {
	name := dockertest.Container(t, dockertest.ContainerOptions{})
	env := dockerEnv(t, name, "alice")
	h := enginetest.New(t, env, nil)
	h.Run("a", "x = 1", 0)
	done := make(chan *engine.Result, 1)
	errc := make(chan error, 1)
	go func() {
		res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "import time\ntime.sleep(60)", Timeout: 90 * time.Second})
		done <- res
		errc <- err
	}()
	h.WaitFor("the cell running", 10*time.Second, func() bool { k, _ := h.Kernel("a"); return k.State == engine.StateRunning })
	c := dockertest.Client(t)
	if _, err := c.ContainerKill(context.Background(), name, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	res, err := <-done, <-errc
	if err == nil && res.Status == engine.StatusSuccess {
		t.Fatalf("a cell in a killed container succeeded: %+v", res)
	}
	t.Logf("the cell: %+v, %v", res, err)
	if lost := h.EventsOf(engine.EventStateLost); len(lost) != 1 {
		t.Errorf("state_lost events: %v, want one for the kernel in the killed container", lost)
	}
	h.WaitFor("the kernel gone from the list", 10*time.Second, func() bool { _, ok := h.Kernel("a"); return !ok })
	next, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "x", Timeout: 20 * time.Second})
	msg := ""
	if err != nil {
		msg = err.Error()
	} else if next != nil {
		msg = next.Stderr + next.Traceback + next.Fallback
	}
	if !strings.Contains(msg, "not running") {
		t.Errorf("the next cell: %+v %v; want it to say the container is not running", next, err)
	}
}

// TestDockerLockdown: a second user in the same container cannot list,
// read, write, connect to or signal the first user's kernel; its secret is
// in no command (each one an exec's arguments), event or container log.
func TestDockerLockdown(t *testing.T) {
	name := dockertest.Container(t, dockertest.ContainerOptions{})
	c := backendtest.NewCounting(dockerEnv(t, name, "alice"))
	h := enginetest.New(t, c, nil)
	res := h.Run("a", "print('hi')", 0)
	dir, pid := res.Kernel.Dir, res.Kernel.PID
	token := ""
	for _, k := range h.Eng.Kept() {
		token = k.Token
	}
	if len(token) < 32 {
		t.Fatal("the engine lists no secret for the kernel")
	}
	requireLockedOut(t, dockerEnv(t, name, "bob"), "bob", dir, pid)
	requireSecretHidden(t, c, h, token)
	logs, err := dockertest.Client(t).ContainerLogs(context.Background(), name, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	var all strings.Builder
	stdcopy.StdCopy(&all, &all, logs)
	if strings.Contains(all.String(), token) {
		t.Fatal("the secret is in the container's log")
	}
}

// runnerProc matches a runner's command line in a process listing:
// python3 -I -S -B -c <start program> <dir>/runner.py.
var runnerProc = regexp.MustCompile(`(?m)^\S*python3\S*( -[IESB]+)* -c .* \S+/runner\.py $`)

// TestDockerCloseLeavesNoExec: after the engine's Close, no exec it started
// in the container still runs (asked of the daemon), the relays included,
// and no relay process is left, even when the runners are kept (so the
// relays end because their stream closed, not because the runner died);
// without keeping, no runner is left either.
func TestDockerCloseLeavesNoExec(t *testing.T) {
	name := dockertest.Container(t, dockertest.ContainerOptions{})
	env := dockerEnv(t, name, "alice")
	tracePath := filepath.Join(t.TempDir(), "trace")
	tracer, err := backends.OpenTracer(tracePath)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Backends: []backends.Env{env}, StateDir: t.TempDir(), Tracer: tracer})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		// A failure before the Close below must not leave the engine's
		// goroutines to the leak checks of the tests after it.
		if !closed {
			rtClose(t, eng)
		}
	})
	for _, owner := range []string{"a", "b"} {
		rtExec(t, eng, engine.Request{Owner: owner, Code: "x = 1"})
	}
	relays := env.RelayExecs()
	if len(relays) != 2 {
		trace, _ := os.ReadFile(tracePath)
		t.Fatalf("%d relays open for two kernels, want 2; what the engine ran (its trace):\n%s", len(relays), trace)
	}
	c := dockertest.Client(t)
	ctx := context.Background()
	// running lists the execs the daemon says still run: those it lists on
	// the container, and the relays by id.
	running := func() []string {
		info, err := c.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, id := range append(info.Container.ExecIDs, relays...) {
			if ex, err := c.ExecInspect(ctx, id, client.ExecInspectOptions{}); err == nil && ex.Running && !slices.Contains(out, id[:12]) {
				out = append(out, id[:12])
			}
		}
		return out
	}
	if r := running(); len(r) != 2 {
		t.Fatalf("the daemon lists %v running before Close, want the 2 relays", r)
	}
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	closed = true
	if err := eng.Close(ctx2, true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r := running(); len(r) > 0; r = running() {
		if time.Now().After(deadline) {
			t.Fatalf("execs still running 10s after Close: %v", r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	probe := backends.Env(dockerEnv(t, name, ""))
	res, err := probe.Execute(ctx, `for p in /proc/[0-9]*; do tr '\0' ' ' <"$p/cmdline" 2>/dev/null; echo; done`, backends.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// (The runners' watchers show the spawn script, which names runner.py
	// too: count the python processes running one.)
	if strings.Contains(res.Output, "KDRELAY") || len(runnerProc.FindAllString(res.Output, -1)) != 2 {
		t.Errorf("after Close keeping the kernels, want their 2 runners and no relay in the container:\n%s", res.Output)
	}
}
