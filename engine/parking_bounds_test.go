package engine_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// parkedOwners lists the owners of the engine's parked states, oldest first.
func parkedOwners(eng *engine.Engine) []string {
	var out []string
	for _, p := range eng.Parked() {
		out = append(out, p.Owner)
	}
	return out
}

// Parked states stay within park_total_mb (the oldest dropped first) and
// park_retention, each drop an event; a park that takes longer than its
// time limit leaves the kernel evicted as before, and says so.
func TestParkingBounds(t *testing.T) {
	clock := &fakeClock{now: time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)}
	h := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), func(c *engine.Config) {
		c.MaxKernels, c.Python, c.Now = 1, richPython, clock.Now
		c.ParkDir = filepath.Join(c.StateDir, "parked")
		c.ParkTotalBytes, c.ParkRetention, c.ParkTimeout = 3<<20, time.Hour, 2*time.Second
	})
	h.Run("alice", "a = bytes(2 << 20)", 0)
	h.Run("bob", "b = bytes(2 << 20)", 0)
	h.WaitFor("alice parked", time.Minute, func() bool { return len(h.Eng.Parked()) == 1 })
	clock.Advance(time.Second) // bob's park is the newer one
	h.Run("carol", "c = 1", 0)
	// The listing changes a moment before the event is published.
	h.WaitFor("alice's state dropped for bob's", time.Minute, func() bool {
		return strings.Join(parkedOwners(h.Eng), ",") == "bob" && len(h.EventsOf(engine.EventParkDropped)) > 0
	})
	drops := h.EventsOf(engine.EventParkDropped)
	if len(drops) != 1 || drops[0].Owner != "alice" || !strings.Contains(drops[0].Detail, "over park_total_mb (3.0 MB)") {
		t.Fatalf("park_dropped for the total: %v", drops)
	}

	// Past park_retention, the sweep drops it.
	clock.Advance(2 * time.Hour)
	h.WaitFor("bob's state dropped for its age", time.Minute, func() bool { return len(h.EventsOf(engine.EventParkDropped)) == 2 })
	if ev := h.EventsOf(engine.EventParkDropped)[1]; ev.Owner != "bob" || !strings.Contains(ev.Detail, "park_retention 1h") {
		t.Fatalf("park_dropped for the age: %+v", ev)
	}
	res := h.Run("bob", `print("b" in globals())`, 0)
	if res.Stdout != "False\n" || res.Kernel.StateRestored {
		t.Fatalf("bob after the drop: %q %+v", res.Stdout, res.Kernel)
	}

	// A namespace that takes longer to pickle than the park may.
	h.Run("dave", "class Slow:\n    def __reduce__(self):\n        import time; time.sleep(60)\ns = Slow()", 0)
	h.Run("erin", "1", 0)
	h.WaitFor("dave's park to fail", time.Minute, func() bool {
		for _, ev := range h.EventsOf(engine.EventParkFailed) {
			if ev.Owner == "dave" {
				return true
			}
		}
		return false
	})
	for _, ev := range h.EventsOf(engine.EventParkFailed) {
		if ev.Owner == "dave" && !strings.Contains(ev.Detail, "longer than the park timeout of 2.00s") {
			t.Fatalf("park_failed: %+v", ev)
		}
	}
	if res := h.Run("dave", `print("s" in globals())`, 0); !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "could not be parked") {
		t.Fatalf("dave after the failed park: %+v", res.Kernel)
	}
}

// A parked state outlives its engine where the engine keeps its kernels
// (and after a crash): the next engine on the same state dir, adopting
// them, restores it. A reset drops it, and so does its owner's shutdown,
// and a clean stop that keeps nothing (the session is over: a later,
// unrelated one must not get its state); a park key anyone else could
// read makes the engine refuse to start.
func TestParkedStateOutlivesItsEngine(t *testing.T) {
	env := backends.NewLocal(enginetest.ShortTempDir(t))
	parkDir := filepath.Join(t.TempDir(), "parked")
	park := func(c *engine.Config) {
		c.MaxKernels, c.Python, c.ParkDir = 1, richPython, parkDir
	}
	first := enginetest.New(t, env, park)
	first.Run("alice", "x = 41", 0)
	first.Run("bob", "y = 1", 0)
	first.WaitFor("alice parked", time.Minute, func() bool { return len(first.Eng.Parked()) == 1 })
	kept := first.Eng.Kept()
	if err := first.Eng.Close(context.Background(), true); err != nil {
		t.Fatal(err)
	}

	second := enginetest.New(t, env, park)
	if n, skipped := second.Eng.Adopt(context.Background(), kept); n != 1 {
		t.Fatalf("adopted %d (%v), want bob's kernel", n, skipped)
	}
	if got := parkedOwners(second.Eng); len(got) != 1 || got[0] != "alice" {
		t.Fatalf("the next engine's parked states: %v", got)
	}
	if res := second.Run("alice", "print(x + 1)", 0); res.Stdout != "42\n" || !res.Kernel.StateRestored {
		t.Fatalf("alice on the next engine: %q %+v", res.Stdout, res.Kernel)
	}

	// Reset: the parked state is dropped, not restored.
	second.Run("bob", "y = 2", 0) // parks alice
	second.WaitFor("alice parked again", time.Minute, func() bool { return len(second.Eng.Parked()) == 1 })
	res, err := second.Eng.Execute(context.Background(), engine.Request{Owner: "alice", Code: `print("x" in globals())`, Reset: true})
	if err != nil || res.Stdout != "False\n" || res.Kernel.StateRestored {
		t.Fatalf("a reset of a parked key: %v %+v", err, res)
	}
	// Owner shutdown: bob's parked state goes with its kernels.
	second.WaitFor("bob parked", time.Minute, func() bool { return strings.Join(parkedOwners(second.Eng), ",") == "bob" })
	second.Eng.ShutdownOwner(context.Background(), "bob")
	if got := parkedOwners(second.Eng); len(got) != 0 {
		t.Fatalf("parked after bob's shutdown: %v", got)
	}
	drops := second.EventsOf(engine.EventParkDropped)
	if len(drops) != 2 || !strings.Contains(drops[0].Detail, "a reset was asked") || !strings.Contains(drops[1].Detail, "its owner shut down") {
		t.Fatalf("park_dropped: %v", drops)
	}

	// A clean stop that keeps nothing: its parked states go with it, the
	// one it parked and the one it got with the kernels it adopted.
	second.Run("alice", "w = 1", 0)
	second.Run("carol", "z = 3", 0) // parks alice
	second.WaitFor("alice parked for the last time", time.Minute, func() bool { return len(second.Eng.Parked()) == 1 })
	if err := second.Eng.Close(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	third := enginetest.New(t, env, park)
	if got := parkedOwners(third.Eng); len(got) != 0 {
		t.Fatalf("parked states after a clean stop: %v", got)
	}
	third.Eng.Close(context.Background(), false)

	// A park key others could read: refused, saying what to do.
	if err := os.Chmod(filepath.Join(parkDir, "park.key"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = engine.New(engine.Config{Backends: []backends.Env{env}, ParkDir: parkDir})
	if err == nil || !strings.Contains(err.Error(), "mode 0600") {
		t.Fatalf("an engine on a readable park key: %v", err)
	}
}

// While a kernel is being parked it is out of the registry but still in
// the journal, until it is killed: an engine that dies mid-park leaves it
// to the next engine, state and all.
func TestTheJournalKeepsAKernelBeingParked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "journal")
	h := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), func(c *engine.Config) {
		c.Python, c.JournalDir, c.ParkDir, c.ParkTimeout = richPython, dir, filepath.Join(c.StateDir, "parked"), 20*time.Second
	})
	res := h.Run("alice", "class Slow:\n    def __reduce__(self):\n        import time; time.sleep(2)\n        return (int, ())\ns = Slow()", 0)
	done := make(chan error, 1)
	go func() { _, err := h.Eng.Park(context.Background(), res.Kernel.ID); done <- err }()
	h.WaitFor("the park to begin", 10*time.Second, func() bool { return len(h.Eng.Kernels()) == 0 })
	waitJournal(t, dir, []string{res.Kernel.ID})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitJournal(t, dir, nil)
}

// A kernel whose namespace holds nothing is not parked when the cap
// evicts it: there is nothing to restore, nothing is listed, nothing is
// said to be lost. One that holds only what cannot be saved is not parked
// either, and its state is said to be lost.
func TestNothingToSaveIsNotParked(t *testing.T) {
	h := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), func(c *engine.Config) {
		c.MaxKernels, c.ParkDir = 1, filepath.Join(t.TempDir(), "parked")
	})
	h.Run("empty", "1 + 1", 30*time.Second)
	h.Run("file", "f = open('/dev/null')", 30*time.Second)
	h.Run("other", "x = 1", 30*time.Second)
	h.WaitFor("both evictions to settle", 20*time.Second, func() bool {
		return len(h.EventsOf(engine.EventParkFailed)) == 1
	})
	if p := h.Eng.Parked(); len(p) != 0 {
		t.Errorf("parked states %+v; want none", p)
	}
	if failed := h.EventsOf(engine.EventParkFailed); failed[0].Owner != "file" || !strings.Contains(failed[0].Detail, "f (open file)") {
		t.Errorf("park_failed %+v; want the file's, naming f", failed)
	}
	if again := h.Run("empty", "print(1)", 30*time.Second); again.Kernel.StateLost || again.Kernel.StateRestored {
		t.Errorf("the empty kernel's next call: %+v; want neither lost nor restored", again.Kernel)
	}
	if again := h.Run("file", "print(1)", 30*time.Second); !again.Kernel.StateLost {
		t.Errorf("the file's kernel's next call: %+v; want its state said lost", again.Kernel)
	}
}
