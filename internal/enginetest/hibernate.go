package enginetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// Hibernation is the suite for hibernate_after on env's kernels: an idle
// kernel is parked and its runner ended, listed as hibernated, and its
// next call wakes it with its state; a busy kernel, or one with what would
// not survive, stays awake; idle_exit still ends the session.
func Hibernation(t *testing.T, env backends.Env, python string) {
	hibernating := func(idleExit time.Duration) func(*engine.Config) {
		return func(c *engine.Config) {
			c.ParkDir = filepath.Join(c.StateDir, "parked")
			c.Python = python
			c.HibernateAfter, c.IdleExit = time.Second, idleExit
			c.SweepEvery = 100 * time.Millisecond
		}
	}
	t.Run("an idle kernel hibernates and its next call wakes it", func(t *testing.T) {
		h := New(t, env, hibernating(time.Hour))
		first := h.Run("alice", "x = 41\ndef f(v):\n    return v + x", 0)
		h.WaitFor("alice's kernel to hibernate", 20*time.Second, func() bool {
			return len(h.EventsOf(engine.EventHibernated)) > 0 || strings.Contains(h.EventText(), "not hibernated")
		})
		if len(h.EventsOf(engine.EventHibernated)) == 0 {
			t.Fatalf("not hibernated:\n%s", h.EventText())
		}
		h.WaitFor("its runner to end", 20*time.Second, func() bool { return !h.Alive(first.Kernel.PID) })
		if _, ok := h.Kernel("alice"); ok {
			t.Fatalf("a hibernated kernel is still listed as a kernel: %+v", h.Eng.Kernels())
		}
		ev := h.EventsOf(engine.EventHibernated)[0]
		if ev.Kernel != first.Kernel.ID || !strings.Contains(ev.Detail, "> hibernate_after 1.00s") {
			t.Errorf("hibernated event: %+v", ev)
		}
		parked := h.Eng.Parked()
		if len(parked) != 1 || !parked[0].Hibernated || !strings.HasPrefix(parked[0].Reason, "hibernated after idle") ||
			parked[0].LastUsed.IsZero() || parked[0].Kernel != first.Kernel.ID {
			t.Fatalf("the listing of a hibernated kernel: %+v", parked)
		}
		res := h.Run("alice", "print(f(1))", 0)
		if res.Stdout != "42\n" || !res.Kernel.StateRestored || !strings.HasPrefix(res.Kernel.Note, "woke from hibernation: restored 2 names") {
			t.Fatalf("after waking: %q %q %+v", res.Stdout, res.Traceback, res.Kernel)
		}
		if res.Kernel.ExecutionCount != first.Kernel.ExecutionCount+1 {
			t.Errorf("execution count %d after %d: it must go on", res.Kernel.ExecutionCount, first.Kernel.ExecutionCount)
		}
		if p := h.Eng.Parked(); len(p) != 0 {
			t.Errorf("a woken kernel is still parked: %+v", p)
		}
	})

	t.Run("what would not survive keeps a kernel awake", func(t *testing.T) {
		h := New(t, env, hibernating(time.Hour))
		threaded := h.Run("alice", "import threading, time\nt = threading.Thread(target=time.sleep, args=(3600,), daemon=True, name='poller')\nt.start()\nx = 1", 0)
		filed := h.Run("bob", "f = open('/dev/null')\ny = 2", 0)
		h.WaitFor("both to be found unfit", 20*time.Second, func() bool {
			return strings.Count(h.EventText(), "not hibernated") >= 2
		})
		time.Sleep(500 * time.Millisecond) // five more sweeps: no second try while unused
		text := h.EventText()
		if strings.Count(text, "not hibernated") != 2 || !strings.Contains(text, "threads of its own run (poller)") ||
			!strings.Contains(text, "f (open file)") || len(h.EventsOf(engine.EventHibernated)) != 0 {
			t.Fatalf("events:\n%s", text)
		}
		if !h.Alive(threaded.Kernel.PID) || !h.Alive(filed.Kernel.PID) || len(h.Eng.Parked()) != 0 {
			t.Fatalf("a kernel that stays awake was ended or parked: %+v", h.Eng.Parked())
		}
		if res := h.Run("alice", "print(t.is_alive(), x)", 0); res.Stdout != "True 1\n" || res.Kernel.PID != threaded.Kernel.PID {
			t.Fatalf("alice's kernel after it stayed awake: %q %q", res.Stdout, res.Traceback)
		}
		// Once the thread is gone and the kernel idle again, it hibernates.
		h.Run("bob", "f.close()\ndel f", 0)
		h.WaitFor("bob's kernel to hibernate", 20*time.Second, func() bool { return len(h.EventsOf(engine.EventHibernated)) > 0 })
		if ev := h.EventsOf(engine.EventHibernated); ev[0].Owner != "bob" {
			t.Fatalf("hibernated: %+v", ev)
		}
	})

	t.Run("a call that comes while its kernel hibernates gets it as it was", func(t *testing.T) {
		h := New(t, env, hibernating(time.Hour))
		// Its park says when it starts (a file), then takes 2 s: the call
		// comes in the middle of it.
		marks := ShortTempDir(t)
		first := h.Run("alice", fmt.Sprintf(`import time
class Slow:
    def __reduce__(self):
        open(%q, "w").close()
        time.sleep(2)
        return (int, (7,))
slow = Slow()
x = 41`, filepath.Join(marks, "parking")), 0)
		h.WaitFor("the park to start", 20*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(marks, "parking"))
			return err == nil
		})
		if k, ok := h.Kernel("alice"); !ok || k.State != engine.StateHibernating || !k.Attached {
			t.Fatalf("a kernel being hibernated is listed as %+v", k)
		}
		res := h.Run("alice", "print(x + 1)", 0)
		if res.Stdout != "42\n" || res.Kernel.PID != first.Kernel.PID || res.Kernel.StateRestored || res.Kernel.StateLost {
			t.Fatalf("the call during the park: %q %q %+v", res.Stdout, res.Traceback, res.Kernel)
		}
		if _, listed := h.Kernel("alice"); !listed || !h.Alive(first.Kernel.PID) || len(h.EventsOf(engine.EventHibernated)) != 0 {
			t.Fatalf("the kernel a call overtook its hibernation with was ended or not listed:\n%s", h.EventText())
		}
		if p := h.Eng.Parked(); len(p) != 0 {
			t.Errorf("the park a call overtook is still listed: %+v", p)
		}
	})

	t.Run("a restore that does not get through in time fails its call and keeps the state", func(t *testing.T) {
		h := New(t, env, func(c *engine.Config) {
			hibernating(time.Hour)(c)
			c.ParkTimeout = time.Second
		})
		// Loading nap sleeps 3 s: longer than the park timeout.
		first := h.Run("alice", "import time\nclass Nap:\n    def __reduce__(self):\n        return (time.sleep, (3,))\nnap = Nap()\nx = 1", 0)
		if _, err := h.Eng.Park(context.Background(), first.Kernel.ID); err != nil {
			t.Fatal(err)
		}
		_, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "alice", Code: "print(x)"})
		if !errors.Is(err, engine.ErrRestoreLater) || !strings.Contains(err.Error(), "call again, or drop it") {
			t.Fatalf("a call whose restore timed out: %v", err)
		}
		if p := h.Eng.Parked(); len(p) != 1 || p[0].Owner != "alice" {
			t.Fatalf("the state a slow restore could not bring back was not kept: %+v", p)
		}
		if _, listed := h.Kernel("alice"); listed {
			t.Fatalf("the fresh kernel of a failed restore stands for the key: %+v", h.Eng.Kernels())
		}
		if ok, err := h.Eng.DropParked("alice", "", "", "", nil); !ok || err != nil {
			t.Fatalf("drop: %v %v", ok, err)
		}
		if res := h.Run("alice", "print('x' in globals())", 0); res.Stdout != "False\n" {
			t.Fatalf("after the drop: %q %+v", res.Stdout, res.Kernel)
		}
	})

	t.Run("a restore that fails for good says the state was lost and drops it", func(t *testing.T) {
		h := New(t, env, hibernating(time.Hour))
		// Loading boom raises SystemExit, which the runner's restore
		// answers as an error: no next call would load it either.
		first := h.Run("alice", "import sys\nclass Boom:\n    def __reduce__(self):\n        return (sys.exit, (3,))\nboom = Boom()\nx = 1", 0)
		if _, err := h.Eng.Park(context.Background(), first.Kernel.ID); err != nil {
			t.Fatal(err)
		}
		res := h.Run("alice", "print('x' in globals())", 0)
		if res.Stdout != "False\n" || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "could not be restored") {
			t.Fatalf("a call whose restore failed for good: %q %+v", res.Stdout, res.Kernel)
		}
		if p := h.Eng.Parked(); len(p) != 0 {
			t.Fatalf("a state that cannot be loaded is kept to fail again: %+v", p)
		}
	})

	t.Run("a kernel with nothing in its namespace just ends", func(t *testing.T) {
		h := New(t, env, hibernating(time.Hour))
		first := h.Run("alice", "print(1)", 0)
		h.WaitFor("its runner to end", 20*time.Second, func() bool { return !h.Alive(first.Kernel.PID) })
		if ev := h.EventsOf(engine.EventHibernated); len(ev) != 1 || !strings.Contains(ev[0].Detail, "nothing was parked") {
			t.Fatalf("hibernated events: %+v\n%s", ev, h.EventText())
		}
		if p := h.Eng.Parked(); len(p) != 0 {
			t.Fatalf("an empty namespace was parked: %+v", p)
		}
		if res := h.Run("alice", "print(2)", 0); res.Stdout != "2\n" || res.Kernel.StateLost {
			t.Fatalf("the next call after nothing was kept: %q %+v", res.Stdout, res.Kernel)
		}
	})

	t.Run("a running cell keeps its kernel awake", func(t *testing.T) {
		h := New(t, env, hibernating(time.Hour))
		res := h.Run("alice", "import time\ntime.sleep(2.5)\nz = 3", 0)
		if res.Status != engine.StatusSuccess || len(h.EventsOf(engine.EventHibernated)) != 0 {
			t.Fatalf("a kernel hibernated mid-cell: %s %+v", res.Status, h.EventsOf(engine.EventHibernated))
		}
	})

	t.Run("idle_exit ends a hibernated session and keeps its state", func(t *testing.T) {
		h := New(t, env, hibernating(3*time.Second))
		h.Run("alice", "w = 'kept'", 0)
		h.WaitFor("the hibernated session to end", 30*time.Second, func() bool {
			return strings.Contains(h.EventText(), "hibernated session ended")
		})
		reaped := h.EventsOf(engine.EventReapedIdle)
		if len(reaped) != 1 || reaped[0].Owner != "alice" || !strings.Contains(reaped[0].Detail, "> idle_exit 3.00s") {
			t.Fatalf("reaped events: %+v", reaped)
		}
		if p := h.Eng.Parked(); len(p) != 1 || p[0].Hibernated {
			t.Fatalf("after idle_exit the state is a reaped kernel's, not a hibernated one: %+v", p)
		}
		if res := h.Run("alice", "print(w)", 0); res.Stdout != "kept\n" || !res.Kernel.StateRestored {
			t.Fatalf("after the session ended: %q %+v", res.Stdout, res.Kernel)
		}
	})
}
