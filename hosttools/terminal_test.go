package hosttools

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func terminalValue(t *testing.T, res Result) TerminalResult {
	t.Helper()
	v, ok := res.Value.(TerminalResult)
	if !ok {
		t.Fatalf("terminal value = %#v, want a TerminalResult", res.Value)
	}
	return v
}

func TestTerminalExitCodes(t *testing.T) {
	w := newTestWorkspace(t)
	if err := os.Mkdir(filepath.Join(w.Root(), "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	r := newBuiltins(t, &Builtins{Workspace: w})
	tests := []struct {
		name   string
		args   map[string]any
		code   int
		output string
	}{
		{"success", map[string]any{"command": "echo hi"}, 0, "hi\n"},
		{"exit code", map[string]any{"command": "echo out; exit 3"}, 3, "out\n"},
		{"stderr interleaved", map[string]any{"command": "echo one; echo two >&2; echo three"}, 0, "one\ntwo\nthree\n"},
		{"killed by a signal", map[string]any{"command": "kill -9 $$"}, 137, ""},
		{"runs in the workspace", map[string]any{"command": "pwd"}, 0, w.Root() + "\n"},
		{"cwd inside", map[string]any{"command": "pwd", "cwd": "sub"}, 0, w.Root() + "/sub\n"},
		{"stdin is empty", map[string]any{"command": "cat; echo done"}, 0, "done\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := dispatch(t, r, "terminal", tc.args)
			if err != nil {
				t.Fatal(err)
			}
			v := terminalValue(t, res)
			if v.ExitCode != tc.code || v.Output != tc.output || v.TimedOut {
				t.Errorf("terminal %v = %+v, want exit %d output %q", tc.args, v, tc.code, tc.output)
			}
		})
	}
}

func TestTerminalArgErrors(t *testing.T) {
	w := newTestWorkspace(t)
	writeFile(t, filepath.Join(w.Root(), "file"), "")
	r := newBuiltins(t, &Builtins{Workspace: w})
	for _, args := range []map[string]any{
		{"command": "  "},
		{"command": "true", "timeout": 0},
		{"command": "true", "timeout": -1},
		{"command": "true", "timeout": 601},
	} {
		if _, err := dispatch(t, r, "terminal", args); !errors.Is(err, ErrInvalidArgs) {
			t.Errorf("terminal %v: err = %v, want ErrInvalidArgs", args, err)
		}
	}
	_, err := dispatch(t, r, "terminal", map[string]any{"command": "true", "timeout": 601})
	mustContain(t, "error", err.Error(), "at most 600")
	if _, err := dispatch(t, r, "terminal", map[string]any{"command": "true", "cwd": "file"}); err == nil {
		t.Error("a file was accepted as cwd")
	}
}

// gone reports whether pid no longer runs. A zombie counts as gone: after
// the kill it is only waiting for its new parent to reap it.
func gone(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] == "Z"
}

// waitGone polls (bounded) until pid is gone; SIGKILL is asynchronous.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if gone(pid) {
			return
		}
	}
	syscall.Kill(pid, syscall.SIGKILL)
	t.Errorf("process %d survived the call", pid)
}

// killOnCleanup kills the process whose pid a command wrote to path, so a
// failing test leaves no sleeper behind.
func killOnCleanup(t *testing.T, path string) {
	t.Cleanup(func() {
		if b, err := os.ReadFile(path); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestTerminalTimeoutKillsGroup(t *testing.T) {
	w := newTestWorkspace(t)
	r := newBuiltins(t, &Builtins{Workspace: w})
	killOnCleanup(t, filepath.Join(w.Root(), "child.pid"))
	res, err := dispatch(t, r, "terminal", map[string]any{
		"command": "sleep 300 & echo $! > child.pid; echo started; wait",
		// Long enough for bash to start on a loaded machine (at 0.5 s, CI
		// once timed it out before it ran a line).
		"timeout": 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	v := terminalValue(t, res)
	if !v.TimedOut || v.ExitCode != 137 || v.Output != "started\n" {
		t.Errorf("timed-out command = %+v, want timed_out, exit 137, its output so far", v)
	}
	mustContain(t, "note", res.Note, "timed out after 3s", "everything it started were killed")
	waitGone(t, readPid(t, filepath.Join(w.Root(), "child.pid")))
}

// A command that exits leaving a background job gets it killed, and the
// call does not wait for the job.
func TestTerminalKillsLeftoverJobs(t *testing.T) {
	w := newTestWorkspace(t)
	r := newBuiltins(t, &Builtins{Workspace: w})
	killOnCleanup(t, filepath.Join(w.Root(), "child.pid"))
	killOnCleanup(t, filepath.Join(w.Root(), "child2.pid"))
	res, err := dispatch(t, r, "terminal", map[string]any{"command": "nohup sleep 300 >/dev/null 2>&1 & echo $! > child.pid; sleep 300 & echo $! > child2.pid; echo bye"})
	if err != nil {
		t.Fatal(err)
	}
	if v := terminalValue(t, res); v.ExitCode != 0 || v.TimedOut || v.Output != "bye\n" {
		t.Errorf("result = %+v", v)
	}
	waitGone(t, readPid(t, filepath.Join(w.Root(), "child.pid")))
	waitGone(t, readPid(t, filepath.Join(w.Root(), "child2.pid")))
}

// A process that leaves the group (setsid) and keeps the output pipe open
// cannot hold the call: the output is cut after a short grace.
func TestTerminalEscapedProcessDoesNotHang(t *testing.T) {
	w := newTestWorkspace(t)
	r := newBuiltins(t, &Builtins{Workspace: w})
	killOnCleanup(t, filepath.Join(w.Root(), "escaped.pid")) // it escaped the group by design
	res, err := dispatch(t, r, "terminal", map[string]any{"command": "setsid sh -c 'echo $$ > escaped.pid; exec sleep 300' & sleep 0.2; echo done"})
	if err != nil {
		t.Fatal(err)
	}
	if v := terminalValue(t, res); v.Output != "done\n" || v.ExitCode != 0 {
		t.Errorf("result = %+v", v)
	}
}

func TestTerminalContextCancel(t *testing.T) {
	w := newTestWorkspace(t)
	r := newBuiltins(t, &Builtins{Workspace: w})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := r.Dispatch(ctx, Call{Tool: "terminal", Args: rawArgs(t, map[string]any{"command": "echo $$ > bash.pid; sleep 300"})})
		done <- err
	}()
	pidFile := filepath.Join(w.Root(), "bash.pid")
	killOnCleanup(t, pidFile)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(pidFile); strings.HasSuffix(string(b), "\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command never started")
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("terminal ignored the cancelled context (hang guard)")
	}
	waitGone(t, readPid(t, pidFile))
}

func TestTerminalEnvHasNoKerneldeckVars(t *testing.T) {
	t.Setenv("KERNELDECK_RPC_TOKEN", "tok-3f9a1c")
	t.Setenv("KERNELDECK_OTHER", "other-secret")
	t.Setenv("kerneldeck_lower", "lower-secret")
	t.Setenv("HOSTTOOLS_TEST_KEPT", "kept-value")
	r := newBuiltins(t, &Builtins{})
	res, err := dispatch(t, r, "terminal", map[string]any{"command": "env"})
	if err != nil {
		t.Fatal(err)
	}
	out := terminalValue(t, res).Output
	for _, leak := range []string{"tok-3f9a1c", "other-secret", "lower-secret", "KERNELDECK", "kerneldeck_"} {
		if strings.Contains(out, leak) {
			t.Errorf("the command's environment contains %q:\n%s", leak, out)
		}
	}
	mustContain(t, "env output", out, "HOSTTOOLS_TEST_KEPT=kept-value") // the rest of the environment does pass
}

func TestTerminalDropsBackgroundParams(t *testing.T) {
	r := newBuiltins(t, &Builtins{})
	res, err := dispatch(t, r, "terminal", map[string]any{
		"command": "echo foreground", "background": true, "notify_on_complete": true, "persist_on_release": true, "heartbeat": 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := terminalValue(t, res); v.Output != "foreground\n" {
		t.Errorf("output = %q", v.Output)
	}
	if want := []string{"background", "heartbeat", "notify_on_complete", "persist_on_release"}; !slices.Equal(res.Dropped, want) {
		t.Errorf("Dropped = %v, want %v", res.Dropped, want)
	}
	mustContain(t, "note", res.Note, "dropped parameters background, heartbeat")
}

func TestTerminalOutputCap(t *testing.T) {
	for _, tc := range []struct {
		limit int
		want  int
	}{{100, 100}, {0, DefaultOutputLimit}} {
		r := newBuiltins(t, &Builtins{OutputLimit: tc.limit})
		res, err := dispatch(t, r, "terminal", map[string]any{"command": "head -c 1200000 /dev/zero | tr '\\0' a; echo; exit 4"})
		if err != nil {
			t.Fatal(err)
		}
		v := terminalValue(t, res)
		if len(v.Output) != tc.want || !v.OutputClipped || v.ExitCode != 4 {
			t.Errorf("limit %d: output %d bytes, clipped %v, exit %d; want %d bytes, clipped, exit 4", tc.limit, len(v.Output), v.OutputClipped, v.ExitCode, tc.want)
		}
		mustContain(t, "note", res.Note, "output clipped to its first "+strconv.Itoa(tc.want)+" bytes")
	}
}

// TestTerminalKillsDaemons: processes that leave the command's group and
// session (setsid, nohup, a double fork) still end with the call.
func TestTerminalKillsDaemons(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the child subreaper is Linux's")
	}
	w := newTestWorkspace(t)
	r := newBuiltins(t, &Builtins{Workspace: w})
	for _, f := range []string{"setsid.pid", "nohup.pid", "double.pid"} {
		killOnCleanup(t, filepath.Join(w.Root(), f))
	}
	res, err := dispatch(t, r, "terminal", map[string]any{"command": `setsid sh -c 'echo $$ > setsid.pid; exec sleep 300' </dev/null >/dev/null 2>&1 &
nohup setsid sh -c 'echo $$ > nohup.pid; exec sleep 300' </dev/null >/dev/null 2>&1 &
( setsid sh -c '( echo $$ > double.pid; exec sleep 300 ) &' </dev/null >/dev/null 2>&1 & )
while [ ! -s setsid.pid ] || [ ! -s nohup.pid ] || [ ! -s double.pid ]; do sleep 0.01; done
echo daemonized`})
	if err != nil {
		t.Fatal(err)
	}
	if v := terminalValue(t, res); v.Output != "daemonized\n" || v.ExitCode != 0 {
		t.Fatalf("result = %+v", v)
	}
	for _, f := range []string{"setsid.pid", "nohup.pid", "double.pid"} {
		waitGone(t, readPid(t, filepath.Join(w.Root(), f)))
	}
}
