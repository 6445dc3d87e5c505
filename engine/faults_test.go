package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/proctest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// Faults on real backends (issue 7, "Faults"): a full temp dir, huge or
// unreadable runner output (the suites in internal/enginetest/faults.go, run
// here on the local backend and over a real sshd), and the ssh connection
// cut during a spawn and during a tool call. A cut during a cell is covered
// by TestSSHDropMidCell and TestSSHDropMidCellRepeated; a runner killed
// mid-cell by the lifecycle suite; the host process killed by
// TestBinaryKilledLeavesNoKernelPastIdleExit in the root package.

// The disk-full suite on the local backend: a 256 KiB tmpfs is the
// backend's temp dir, over the socket fast path and over plain Execute.
func TestLocalFullTempDir(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		enginetest.FullTempDir(t, func(t *testing.T, dir string) backends.Env { return backends.NewLocal(dir) })
	})
	t.Run("execute", func(t *testing.T) {
		enginetest.FullTempDir(t, func(t *testing.T, dir string) backends.Env { return backends.ExecuteOnly(backends.NewLocal(dir)) })
	})
}

// Huge output, malformed result files and broken frames on the local backend.
func TestLocalRunnerOutputFaults(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		enginetest.RunnerOutputFaults(t, func(t *testing.T) backends.Env { return backends.NewLocal(enginetest.ShortTempDir(t)) })
	})
	t.Run("execute", func(t *testing.T) {
		enginetest.RunnerOutputFaults(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(backends.NewLocal(t.TempDir())) })
	})
}

// faultUser picks the ssh test user: kdtest1 when the tests may create
// users (root), else the current user.
func faultUser(t *testing.T, srv *sshdtest.Server) *sshdtest.User {
	t.Helper()
	if sshdtest.CanCreateUsers() {
		return srv.User(t, "kdtest1", sshdtest.UserOptions{})
	}
	return srv.User(t, "", sshdtest.UserOptions{})
}

// The disk-full suite over a real sshd: the tmpfs is the ssh backend's
// temp dir on the (loopback) host.
func TestSSHFullTempDir(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := faultUser(t, srv)
	t.Run("stream", func(t *testing.T) {
		enginetest.FullTempDir(t, func(t *testing.T, dir string) backends.Env {
			return sshEnv(t, srv, u, func(o *backends.Options) { o.SSHTempDir = dir })
		})
	})
	t.Run("execute", func(t *testing.T) {
		enginetest.FullTempDir(t, func(t *testing.T, dir string) backends.Env {
			return backends.ExecuteOnly(sshEnv(t, srv, u, func(o *backends.Options) { o.SSHTempDir = dir }))
		})
	})
}

// Huge output, malformed result files and broken frames over a real sshd.
func TestSSHRunnerOutputFaults(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := faultUser(t, srv)
	t.Run("stream", func(t *testing.T) {
		enginetest.RunnerOutputFaults(t, func(t *testing.T) backends.Env { return sshEnv(t, srv, u, nil) })
	})
	t.Run("execute", func(t *testing.T) {
		enginetest.RunnerOutputFaults(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(sshEnv(t, srv, u, nil)) })
	})
}

// fcGateUser is the user whose Python start-up the spawn-cut test can hold.
const fcGateUser = "kdfault"

// fcGate holds every Python that fcGateUser starts over ssh while the gate
// file exists: the user's own ~/.bashrc (which bash reads for every command
// sshd runs) puts a python3 first on PATH that, while the gate is there,
// writes its pid to the entered file and waits until the gate is removed,
// then execs the real one under its own name (so that the engine learns
// it as the interpreter, and every spawn goes through it). A runner starts
// isolated (-I -S), so no hook inside Python could hold it. Nothing else
// changes for the user.
type fcGate struct {
	dir, gate, entered string
}

func fcInstallGate(t *testing.T, u *sshdtest.User) *fcGate {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("the gate wraps /usr/bin/python3, which this host lacks")
	}
	dir, err := os.MkdirTemp("", "kdgate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	g := &fcGate{dir: dir, gate: filepath.Join(dir, "gate"), entered: filepath.Join(dir, "entered")}
	sh := fmt.Sprintf(`#!/bin/bash
if [ -e %[1]s ]; then
  echo $$ >>%[2]s
  while [ -e %[1]s ]; do sleep 0.02; done
fi
exec -a "$0" /usr/bin/python3 "$@"
`, g.gate, g.entered)
	if err := os.WriteFile(filepath.Join(dir, "python3"), []byte(sh), 0o755); err != nil {
		t.Fatal(err)
	}
	rc := filepath.Join(u.Home, ".bashrc")
	old, err := os.ReadFile(rc)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	const tag = "# kerneldeck faults_test gate\n"
	// A line left by a crashed run goes; ours goes at the very top (Debian's
	// .bashrc returns early for non-interactive shells).
	var kept []string
	for line := range strings.SplitSeq(string(old), "\n") {
		if !strings.HasSuffix(line, strings.TrimSpace(tag)) {
			kept = append(kept, line)
		}
	}
	rest := strings.Join(kept, "\n")
	mine := fmt.Sprintf("export PATH=%s:$PATH %s", dir, tag)
	if err := os.WriteFile(rc, []byte(mine+rest), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(rc, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if old == nil {
			os.Remove(rc)
		} else if err := os.WriteFile(rc, []byte(rest), 0o644); err != nil {
			t.Errorf("restore %s: %v", rc, err)
		}
	})
	return g
}

func (g *fcGate) close(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(g.gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (g *fcGate) open(t *testing.T) {
	t.Helper()
	if err := os.Remove(g.gate); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

// waitEntered waits until a held Python reported its pid, or fails if call
// ended first.
func (g *fcGate) waitEntered(t *testing.T, call *stCall) int {
	t.Helper()
	end := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(g.entered); err == nil && strings.HasSuffix(string(b), "\n") {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("entered file %q", b)
			}
			return pid
		}
		select {
		case <-call.done:
			t.Fatalf("the call returned before the runner started: %v, %+v", call.err, call.res)
		default:
		}
		if time.Now().After(end) {
			t.Fatal("no runner reached the gate within 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The connection is cut while a spawn runs on the host: the engine's spawn
// command is waiting for the new runner's READY, and the runner is held in
// its Python start-up. The call fails at once with a transport error that
// says the spawn failed (no per-call fallback: it would need the same
// transport), nothing is registered and the cell's code never runs. What
// the cut spawn left running on the host (the held runner, the spawn
// script) is killed by the engine over a new connection, and its dir goes,
// while the runner is still held: nothing waits for its idle_exit. The next
// call spawns a fresh kernel and runs the code exactly once.
func TestSSHCutDuringSpawn(t *testing.T) {
	srv, u, g, r := fcGatedRig(t)
	marker := filepath.Join(enginetest.SharedDir(t), "ran")
	code := fmt.Sprintf("with open(%q, 'a') as f:\n    f.write('ran\\n')", marker)

	g.close(t)
	call := stGo(r.eng, engine.Request{Owner: "cut", Code: code, Timeout: 60 * time.Second})
	orphan := g.waitEntered(t, call)
	dir := fcRunnerDir(t, orphan)
	if n := srv.KillSessions(t, u.Name); n < 1 {
		t.Fatalf("KillSessions(%s) dropped %d connections, want at least 1", u.Name, n)
	}
	res, err := call.wait(t, stHang)
	t.Logf("spawn cut: answered after %v: %v", call.took, err)
	if err == nil {
		t.Fatalf("a spawn whose connection was cut reported %+v %+v; want an error\nevents:\n%s", res, res.Kernel, r.eventLog())
	}
	if !strings.Contains(err.Error(), "spawn kernel") || !strings.Contains(err.Error(), "connection lost") {
		t.Fatalf("the error must say the spawn failed because the connection was lost: %v", err)
	}
	if n := len(r.eng.Kernels()); n != 0 {
		t.Fatalf("%d kernels registered after a cut spawn", n)
	}
	if r.count(engine.EventSpawnFailed) != 1 || r.count(engine.EventFallbackPerCall) != 0 {
		t.Fatalf("want one spawn_failed and no per-call fallback\nevents:\n%s", r.eventLog())
	}
	fcWaitReclaimed(t, orphan, dir, r.eventLog)
	g.open(t)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the cell of the cut spawn ran")
	}
	next := rtExec(t, r.eng, engine.Request{Owner: "cut", Code: code})
	if next.Kernel.Reused || next.Kernel.PID == orphan {
		t.Fatalf("the call after the cut: %+v; want a fresh kernel", next.Kernel)
	}
	if got := stReadFile(t, marker); got != "ran\n" {
		t.Fatalf("marker %q, want the code to have run exactly once", got)
	}
}

// A call gives up on its spawn (its context ends) while the runner is held
// in its start-up: the timed-out command's process group is killed, but
// that leaves the kernel dir (its watcher, which removes it, is killed too),
// and a runner that already left the group (it setsid()s before READY)
// would live on. The engine kills what the spawn left, found by the
// kernel's id, and removes the dir. Stop 28's CI left spawns so in TestLoad.
func TestSSHSpawnGivenUpLeavesNothing(t *testing.T) {
	_, _, g, r := fcGatedRig(t)

	g.close(t)
	ctx, cancel := context.WithCancel(context.Background())
	call := &stCall{done: make(chan struct{}), start: time.Now()}
	go func() {
		defer close(call.done)
		call.res, call.err = r.eng.Execute(ctx, engine.Request{Owner: "given-up", Code: "1"})
		call.took = time.Since(call.start)
	}()
	orphan := g.waitEntered(t, call)
	dir := fcRunnerDir(t, orphan)
	cancel()
	if _, err := call.wait(t, stHang); err == nil || !strings.Contains(err.Error(), "spawn kernel") {
		t.Fatalf("a spawn given up on: %v; want its error", err)
	}
	fcWaitReclaimed(t, orphan, dir, r.eventLog)
	g.open(t)
	if res := rtExec(t, r.eng, engine.Request{Owner: "given-up", Code: "1"}); res.Kernel.PID == orphan {
		t.Fatalf("the call after: %+v; want a fresh kernel", res.Kernel)
	}
}

// fcGatedRig is an engine on an ssh host whose user's Python start-up a
// gate can hold (fcInstallGate).
func fcGatedRig(t *testing.T) (*sshdtest.Server, *sshdtest.User, *fcGate, *stRig) {
	t.Helper()
	if !sshdtest.CanCreateUsers() {
		t.Skip("the spawn is held in a test user's Python start-up through its ~/.bashrc; that needs a created user (run as root)")
	}
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, fcGateUser, sshdtest.UserOptions{})
	return srv, u, fcInstallGate(t, u), stNewRig(t, srv, u, false, nil)
}

// fcRunnerDir is the kernel dir of a runner held at the gate.
func fcRunnerDir(t *testing.T, pid int) string {
	t.Helper()
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	p, ok := proctest.RunnerPath(string(cmd))
	if err != nil || !ok {
		t.Fatalf("pid %d is not a held runner: %q, %v", pid, cmd, err)
	}
	return filepath.Dir(p)
}

// fcWaitReclaimed waits until the held runner pid, every process that
// mentions its kernel's id (the spawn script, the watcher) and its dir are
// gone; the gate is still closed, so the engine must have killed them.
func fcWaitReclaimed(t *testing.T, pid int, dir string, events func() string) {
	t.Helper()
	id := filepath.Base(dir)
	end := time.Now().Add(30 * time.Second)
	for {
		left := proctest.Mentioning(id)
		_, err := os.Stat(dir)
		if !proctest.Alive(pid) && len(left) == 0 && os.IsNotExist(err) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("30 s after the spawn was given up: runner %d alive %v, dir %s: %v, processes:\n  %s\nevents:\n%s",
				pid, proctest.Alive(pid), dir, err, strings.Join(left, "\n  "), events())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fcHoldTool registers "hold": each call appends a line to calls (on this
// machine: tools run where kerneldeck runs), reports that it started, and
// blocks until release is closed.
func fcHoldTool(t *testing.T, reg *hosttools.Registry, calls string) (started <-chan struct{}, release chan struct{}) {
	t.Helper()
	st := make(chan struct{}, 16)
	release = make(chan struct{})
	err := reg.Register(hosttools.Tool{Name: "hold", Description: "Blocks until the test releases it.",
		Handler: func(ctx context.Context, call hosttools.Call) (hosttools.Result, error) {
			f, err := os.OpenFile(calls, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err != nil {
				return hosttools.Result{}, err
			}
			fmt.Fprintln(f, "called")
			f.Close()
			st <- struct{}{}
			select {
			case <-release:
				return hosttools.Result{Text: "held"}, nil
			case <-ctx.Done():
				return hosttools.Result{}, ctx.Err()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	return st, release
}

// The connection is cut while a tool call runs on this machine: the kernel
// waits for the answer, the engine's channel to the runner (fast path) or
// its host-side wait (plain Execute) dies under it. The tool finishes after
// the cut; its answer still reaches the kernel over the re-dialed
// connection, so the cell succeeds in the same kernel with its state. The
// tool ran once, the cell's code ran once, and the call returns well within
// its timeout.
func TestSSHCutDuringToolCall(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := faultUser(t, srv)
	for _, mode := range []struct {
		name        string
		executeOnly bool
	}{{"stream", false}, {"execute", true}} {
		t.Run(mode.name, func(t *testing.T) {
			ssh := sshEnv(t, srv, u, nil)
			var env backends.Env = ssh
			if mode.executeOnly {
				env = backends.ExecuteOnly(ssh)
			}
			h := enginetest.NewTools(t, env, nil)
			calls := filepath.Join(t.TempDir(), "calls")
			started, release := fcHoldTool(t, h.Registry, calls)
			tools := []string{"hold"}
			first := h.Call("tool", tools, "x = 1")
			if first.Status != "success" || first.Kernel == nil {
				t.Fatalf("first call: %+v", first)
			}
			marker := filepath.Join(first.Kernel.Dir, "ran-tool.txt")
			code := fmt.Sprintf(`import kerneldeck_tools as kt
with open(%q, "a") as f:
    f.write("ran\n")
r = kt.hold()
x += 1
print(x, r)`, marker)
			const timeout = 90 * time.Second
			call := stGo(h.Eng, engine.Request{Owner: "tool", Tools: tools, Code: code, Timeout: timeout})
			select {
			case <-started:
			case <-call.done:
				t.Fatalf("the cell returned before its tool call started: %v %+v", call.err, call.res)
			case <-time.After(30 * time.Second):
				t.Fatal("the tool call did not start within 30 s")
			}
			if mode.executeOnly {
				// Cut while the engine's host-side wait for the cell is in
				// flight (the one after the wait that brought the request),
				// not in the gap between two waits.
				fcWaitNewCellScript(t, first.Kernel.Dir, fcCellScripts(first.Kernel.Dir), call)
			}
			before := len(srv.SessionPIDs(u.Name))
			if n := srv.KillSessions(t, u.Name); n < 1 {
				t.Fatalf("KillSessions(%s) dropped %d connections, want at least 1", u.Name, n)
			}
			// Release the tool once the engine is on a new connection: an
			// answer written into the dead connection before the client
			// noticed the cut would be lost (nothing acknowledges answers
			// on the stream), and the kernel's call would time out instead.
			end := time.Now().Add(30 * time.Second)
			for len(srv.SessionPIDs(u.Name)) == 0 && time.Now().Before(end) {
				time.Sleep(10 * time.Millisecond)
			}
			close(release)
			res, err := call.wait(t, stHang)
			t.Logf("%s: tool call cut (%d connection(s)): answered after %v", mode.name, before, call.took)
			if err != nil {
				t.Fatalf("a cell whose tool call was cut: %v\nevents:\n%s", err, h.EventText())
			}
			if res.Status != "success" || res.Stdout != "2 held\n" || res.Kernel == nil || res.Kernel.PID != first.Kernel.PID ||
				res.Kernel.StateLost || res.ToolCallsMade != 1 {
				t.Fatalf("after a cut during a tool call: status %q stdout %q traceback %q tool calls %d kernel %+v; want success from the same kernel",
					res.Status, res.Stdout, res.Traceback, res.ToolCallsMade, res.Kernel)
			}
			if got := stReadFile(t, calls); got != "called\n" {
				t.Fatalf("the tool ran %d times, want once", strings.Count(got, "called"))
			}
			if got := stReadFile(t, marker); got != "ran\n" {
				t.Fatalf("the cell's code ran %d times, want once", strings.Count(got, "ran"))
			}
			next := h.Call("tool", tools, "print(x)")
			if next.Stdout != "2\n" || next.Kernel.PID != first.Kernel.PID {
				t.Fatalf("the call after the cut: %q %+v", next.Stdout, next.Kernel)
			}
			if got := stReadFile(t, calls); got != "called\n" {
				t.Fatalf("the tool ran again later: %q", got)
			}
		})
	}
}

// fcCellScripts lists the pids of running cell scripts (the engine's
// host-side waits over plain Execute) for the kernel in dir.
func fcCellScripts(dir string) map[int]bool {
	out := map[int]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(cmd), "# kerneldeck:cell") && strings.Contains(string(cmd), dir) && rtProcessAlive(pid) {
			out[pid] = true
		}
	}
	return out
}

// fcWaitNewCellScript waits until a cell script for dir runs that is not
// one of old.
func fcWaitNewCellScript(t *testing.T, dir string, old map[int]bool, call *stCall) {
	t.Helper()
	end := time.Now().Add(30 * time.Second)
	for {
		for pid := range fcCellScripts(dir) {
			if !old[pid] {
				return
			}
		}
		select {
		case <-call.done:
			t.Fatalf("the call returned before the engine waited for its cell again: %v, %+v", call.err, call.res)
		default:
		}
		if time.Now().After(end) {
			t.Fatal("the engine did not wait for the cell on the host within 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Kernel code flooding the stream cannot make the engine hold gigabytes:
// one frame being read (8 MiB at most) and the budget of the running cell
// (16 MiB); the bound asserted leaves room for the race detector.
func TestLocalFloodIsBounded(t *testing.T) {
	enginetest.FloodBound(t, backends.NewLocal(enginetest.ShortTempDir(t)), 64<<20)
}

// The same flood over a real sshd: the engine holds no more than over a
// local socket (the channel's window is the ssh library's).
func TestSSHFloodIsBounded(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := faultUser(t, srv)
	enginetest.FloodBound(t, sshEnv(t, srv, u, nil), 64<<20)
}
