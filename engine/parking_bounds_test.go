package engine_test

import (
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
	h.WaitFor("alice's state dropped for bob's", time.Minute, func() bool {
		return strings.Join(parkedOwners(h.Eng), ",") == "bob"
	})
	drops := h.EventsOf(engine.EventParkDropped)
	if len(drops) != 1 || drops[0].Owner != "alice" || !strings.Contains(drops[0].Detail, "over the total cap") {
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
