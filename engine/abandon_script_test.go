package engine

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/proctest"
)

// abandonScript, run by the real local backend, kills what a spawn left
// behind, found by the kernel's id alone: a runner that setsid()ed out of
// the spawn's process group, the spawn script and a forked copy of it (the
// runner's watcher). It removes the kernel dir and the exit status and the
// mark beside it, and leaves another kernel's processes and dir alone.
func TestAbandonScriptKillsASpawnByItsID(t *testing.T) {
	for _, transient := range []bool{false, true} {
		name := map[bool]string{false: "kernel", true: "per-call kernel"}[transient]
		t.Run(name, func(t *testing.T) {
			tmp := t.TempDir()
			root := filepath.Join(tmp, "kerneldeck-tester")
			if err := os.Mkdir(root, 0o700); err != nil {
				t.Fatal(err)
			}
			dirOf := func(id string) string {
				if transient {
					return filepath.Join(tmp, "kerneldeck-once-"+id)
				}
				return filepath.Join(root, id)
			}
			const gone, kept = "k0123456789ab", "kba9876543210"
			procs := map[string][]*exec.Cmd{}
			for _, id := range []string{gone, kept} {
				procs[id] = abStartSpawn(t, dirOf(id), id)
				for _, beside := range []string{".exit-" + id, ".made-" + id} {
					if err := os.WriteFile(filepath.Join(root, beside), []byte("0\n"), 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := backends.NewLocal(tmp).Execute(ctx, abandonScript(tmp, gone), backends.ExecOptions{Timeout: killTimeout})
			if err != nil || !hasLine(res.Output, "KD:KILLED") {
				t.Fatalf("abandon script: %v, %q", err, res.Output)
			}
			for _, c := range procs[gone] {
				proctest.WaitDead(t, c.Process.Pid, 5*time.Second)
			}
			if left := proctest.Mentioning(gone); len(left) > 0 {
				t.Fatalf("left after the abandon script:\n  %s", strings.Join(left, "\n  "))
			}
			if _, err := os.Stat(dirOf(gone)); !os.IsNotExist(err) {
				t.Fatalf("the abandoned kernel's dir %s: %v; want it gone", dirOf(gone), err)
			}
			for _, beside := range []string{".exit-" + gone, ".made-" + gone} {
				if _, err := os.Stat(filepath.Join(root, beside)); !transient && !os.IsNotExist(err) {
					t.Fatalf("the abandoned kernel's %s: %v; want it gone", beside, err)
				}
			}
			for _, c := range procs[kept] {
				if !proctest.Alive(c.Process.Pid) {
					t.Fatalf("process %d of the other kernel %s was killed", c.Process.Pid, kept)
				}
			}
			if _, err := os.Stat(filepath.Join(dirOf(kept), "runner.py")); err != nil {
				t.Fatalf("the other kernel's dir: %v", err)
			}
		})
	}
}

// abStartSpawn starts what a spawn of kernel id leaves running: a runner
// (python3 <dir>/runner.py, in a session of its own), one still in its
// interpreter's shim, and a shell whose argv holds a spawn script naming
// id, with a forked copy of itself. They are killed and reaped when the
// test ends.
func abStartSpawn(t *testing.T, dir, id string) []*exec.Cmd {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "runner.py")
	if err := os.WriteFile(script, []byte("import os, time\nos.setsid()\ntime.sleep(120)\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runner := exec.Command("python3", script)
	// An interpreter's shim (pyenv's is a bash script) holds the runner's
	// path later in its argv until it execs the interpreter.
	shim := exec.Command("bash", "--norc", "-c", "sleep 120; :", script)
	// The shell forks a copy of itself (a subshell keeps its argv) and
	// waits; neither ends on its own within the test.
	spawn := exec.Command("bash", "--norc", "-c", "# kerneldeck:spawn\nkd=\"$root/\"'"+id+"'\n( while :; do sleep 1; done ) & wait")
	// Each in a group of its own (the runner makes its own session), so
	// that the cleanup kills the shell's forked copy with it.
	shim.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	spawn.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var cmds []*exec.Cmd
	for _, c := range []*exec.Cmd{runner, shim, spawn} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
		t.Cleanup(func() {
			// The group outlives its leader, which the abandon script may
			// have killed: the leader's forked copy is still in it.
			if c.SysProcAttr != nil && c.SysProcAttr.Setpgid {
				syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			}
			c.Process.Kill()
			c.Wait()
		})
	}
	// The runner has left the group it was started in before the abandon
	// script looks, as a real one has before READY.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if pg, err := syscall.Getpgid(runner.Process.Pid); err == nil && pg == runner.Process.Pid {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the stand-in runner %d did not setsid within 10 s", runner.Process.Pid)
		}
	}
	return cmds
}
