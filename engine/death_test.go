package engine_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/cgrouptest"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// TestCauseOfDeath: a kernel that exits by itself, crashes, or is killed
// from outside says which, with its exit status or signal, on the local
// backend and over sshd.
func TestCauseOfDeath(t *testing.T) {
	check := func(t *testing.T, newEnv func(t *testing.T) backends.Env) {
		for _, tc := range []struct {
			name, code, want string
		}{
			{"exit", "import os\nos._exit(3)", "it exited by itself with status 3"},
			// 75 is also the status of a bootstrap that found its dir
			// already there (NODIR); a cell's own 75 is an exit like any.
			{"exit-75", "import os\nos._exit(75)", "it exited by itself with status 75"},
			{"segfault", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "it crashed: SIGSEGV"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				h := enginetest.New(t, newEnv(t), nil)
				h.Run("d", "x = 1", 0)
				res := h.Run("d", tc.code, 0)
				if res.Kernel == nil || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, tc.want) {
					t.Fatalf("status %s kernel %+v; want state lost and %q", res.Status, res.Kernel, tc.want)
				}
				lost := h.EventsOf(engine.EventStateLost)
				if len(lost) != 1 || !strings.Contains(lost[0].Detail, tc.want) {
					t.Errorf("state_lost events %+v, want one saying %q", lost, tc.want)
				}
				noDeadKernelLeft(t, h, res.Kernel.Dir)
			})
		}
		t.Run("killed-from-outside", func(t *testing.T) {
			h := enginetest.New(t, newEnv(t), nil)
			first := h.Run("d", "x = 1", 0)
			h.Host(fmt.Sprintf("kill -KILL %d", first.Kernel.PID))
			h.WaitFor("the runner dead", 10e9, func() bool { return !h.Alive(first.Kernel.PID) })
			res := h.Run("d", "print(1)", 0)
			if !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "killed by SIGKILL") || !strings.Contains(res.Kernel.Note, "possibly out of memory") {
				t.Fatalf("after kill -9: kernel %+v", res.Kernel)
			}
			noDeadKernelLeft(t, h, first.Kernel.Dir)
		})
		// Closed with the kernel dead while idle and never asked again, or
		// alive: the engine's own kill finds the dir gone, or waits for the
		// watcher to keep the status, and removes it either way, even when
		// the watcher was slow (a slow dmesg, on the local backend, where
		// the test sets PATH). It looks once the watcher is gone, so a
		// status written late is seen. A watcher killed first leaves the
		// dir and its mark to the engine's kill.
		for _, tc := range []struct {
			name                      string
			deadBefore, watcherKilled bool
		}{{"dead-then-closed", true, false}, {"closed-alive", false, false}, {"watcher-killed-then-closed", false, true}} {
			t.Run(tc.name, func(t *testing.T) {
				h := enginetest.New(t, newEnv(t), nil)
				first := h.Run("d", "x = 1", 0)
				watcher, _ := strconv.Atoi(strings.TrimSpace(h.Host(fmt.Sprintf("ps -o ppid= -p %d", first.Kernel.PID))))
				if tc.watcherKilled {
					h.Host(fmt.Sprintf("kill -KILL %d", watcher))
				}
				if tc.deadBefore {
					h.Host(fmt.Sprintf("kill -KILL %d", first.Kernel.PID))
					h.WaitFor("the runner's dir gone", 10e9, func() bool {
						return strings.TrimSpace(h.Host("ls -d "+first.Kernel.Dir+" 2>/dev/null; true")) == ""
					})
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if err := h.Eng.Close(ctx, false); err != nil {
					t.Fatal(err)
				}
				h.WaitFor("the runner's watcher gone", 10e9, func() bool { return !h.Alive(watcher) })
				noDeadKernelLeft(t, h, first.Kernel.Dir)
			})
		}
	}
	t.Run("local", func(t *testing.T) {
		slowDmesg(t)
		check(t, func(t *testing.T) backends.Env { return backends.NewLocal(enginetest.ShortTempDir(t)) })
	})
	t.Run("ssh", func(t *testing.T) {
		srv := sshdtest.Start(t, sshdtest.Options{})
		u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
		check(t, func(t *testing.T) backends.Env { return sshEnv(t, srv, u, nil) })
	})
}

// slowDmesg puts first on PATH a dmesg that takes half a second before
// printing the real one's output, as on a loaded host: a runner's watcher
// then keeps its exit status well after the runner is gone.
func slowDmesg(t *testing.T) {
	real, err := exec.LookPath("dmesg")
	if err != nil {
		t.Skipf("no dmesg: %v", err)
	}
	dir := t.TempDir()
	script := "#!/bin/sh\nsleep 0.5\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "dmesg"), []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// noDeadKernelLeft fails the test when a dead kernel's exit status is still
// kept beside the kernel dirs (once told, it goes), or when its dir and
// the mark that its spawn made it (<root>/.made-<id>) do not go soon.
func noDeadKernelLeft(t *testing.T, h *enginetest.Harness, kernelDir string) {
	t.Helper()
	root := path.Dir(kernelDir)
	if left := h.Host("cd " + root + " && ls -a | grep '^\\.exit-'; true"); strings.TrimSpace(left) != "" {
		t.Errorf("exit status files left in %s: %s", root, left)
	}
	h.WaitFor("the dead kernel's dir and its mark gone", 10e9, func() bool {
		return strings.TrimSpace(h.Host("ls -d "+kernelDir+" "+root+"/.made-"+path.Base(kernelDir)+" 2>/dev/null; true")) == ""
	})
}

// TestCauseOfDeathOOM: a kernel that the kernel's OOM killer ends at its
// memory cgroup's limit is reported as out of memory, not as a plain
// SIGKILL: locally the engine (root) reads it in the kernel log; over sshd
// the user cannot (dmesg_restrict), and the runner's cgroup counter says so.
func TestCauseOfDeathOOM(t *testing.T) {
	const limit = 256 << 20
	grow := "x = 1\nb = b'x' * (768 << 20)"
	check := func(t *testing.T, h *enginetest.Harness, memcg *cgrouptest.Memory) {
		res := h.Run("d", grow, 0)
		if res.Kernel == nil || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "out of memory: ") || !strings.Contains(res.Kernel.Note, "OOM killer") {
			t.Fatalf("status %s kernel %+v; want state lost, out of memory by the OOM killer", res.Status, res.Kernel)
		}
		t.Logf("note: %s", res.Kernel.Note)
		if n := memcg.OOMKills(t); n < 1 {
			t.Errorf("the cgroup's OOM killer killed %d processes; the test did not do what it meant", n)
		}
		lost := h.EventsOf(engine.EventStateLost)
		if len(lost) != 1 || !strings.Contains(lost[0].Detail, "out of memory") {
			t.Errorf("state_lost events %+v, want one saying out of memory", lost)
		}
	}
	t.Run("local", func(t *testing.T) {
		memcg := cgrouptest.NewMemory(t, limit)
		h := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), nil)
		first := h.Run("d", "y = 1", 0)
		memcg.Add(t, first.Kernel.PID)
		check(t, h, memcg)
	})
	t.Run("ssh", func(t *testing.T) {
		memcg := cgrouptest.NewMemory(t, limit)
		srv := sshdtest.Start(t, sshdtest.Options{})
		memcg.Add(t, srv.PID()) // every session, and so every runner, starts in it
		u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
		check(t, enginetest.New(t, sshEnv(t, srv, u, nil), nil), memcg)
	})
}
