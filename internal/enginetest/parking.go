package enginetest

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// ParkingOptions say what a backend's kernels can do for the parking suite.
type ParkingOptions struct {
	// Python is the interpreter kernels run with ("": the host's python3).
	// It must have cloudpickle.
	Python string
	// Rich: it also has numpy and pandas.
	Rich bool
}

// parkSetup is a namespace with what parks (a class a cell defined and its
// instances, a lambda, data, an in-memory file, modules) and what cannot
// (an open file, a thread).
const parkSetup = `import io, json as j, threading, tempfile
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)
    def norm(self):
        return (self.x ** 2 + self.y ** 2) ** 0.5
p1, p2 = Point(3, 4), Point(1, 2)
sq = lambda v: v * v
data = {"a": [1, 2, 3], "b": b"\x00\x01", "c": {1, 2}}
buf = io.BytesIO(b"in memory")
f = tempfile.TemporaryFile()
t = threading.Thread(target=len, args=("",))
t.start(); t.join()
`

const parkCheck = `print(p1 == Point(3, 4), isinstance(p2, Point), p1.norm(), sq(7), data == {"a": [1, 2, 3], "b": b"\x00\x01", "c": {1, 2}},
      j.dumps([1]), buf.getvalue().decode(), "f" in globals(), "t" in globals())`

const parkWant = "True True 5.0 49 True [1] in memory False False\n"

const richSetup = `import numpy as np, pandas as pd
arr = np.arange(1000.0).reshape(10, 100)
df = pd.DataFrame({"n": range(5), "s": list("abcde"), "x": [0.5, 1.5, 2.5, 3.5, 4.5]})`

const richCheck = `print(bool((arr == np.arange(1000.0).reshape(10, 100)).all()),
      df.equals(pd.DataFrame({"n": range(5), "s": list("abcde"), "x": [0.5, 1.5, 2.5, 3.5, 4.5]})), arr.dtype, df.shape)`

const richWant = "True True float64 (5, 3)\n"

// Parking is the suite for parked state on env's kernels: what the cap
// evicts (and, with Rich, what idle_exit reaps) comes back on the owner's
// next call, what could not be saved is named, and a parked state that
// was changed, or is another key's, is refused.
func Parking(t *testing.T, env backends.Env, opts ParkingOptions) {
	park := func(mutate func(*engine.Config)) func(*engine.Config) {
		return func(c *engine.Config) {
			c.MaxKernels = 1
			c.ParkDir = filepath.Join(c.StateDir, "parked")
			c.Python = opts.Python
			if mutate != nil {
				mutate(c)
			}
		}
	}
	t.Run("evicted by the cap and restored", func(t *testing.T) {
		h := New(t, env, park(nil))
		setup := h.Run("alice", parkSetup, 0)
		if opts.Rich {
			setup = h.Run("alice", richSetup, 0)
		}
		if setup.Status != engine.StatusSuccess {
			t.Fatalf("the namespace's setup: %s %q", setup.Status, setup.Traceback)
		}
		h.Run("bob", "secret = 42", 0)
		h.waitParked("alice")
		if ev := h.EventsOf(engine.EventParked); !strings.Contains(ev[0].Detail, "not saved: f (open file), t (thread)") {
			t.Fatalf("parked event: %q", ev[0].Detail)
		}
		parked := h.Eng.Parked()
		if len(parked) != 1 || parked[0].Owner != "alice" || parked[0].Kernel != setup.Kernel.ID || parked[0].Bytes <= 0 ||
			parked[0].Reason != "evicted by the cap" || len(parked[0].NotSaved) != 2 {
			t.Fatalf("parked listing: %+v", parked)
		}
		res := h.Run("alice", parkCheck, 0)
		if res.Stdout != parkWant || res.Status != engine.StatusSuccess {
			t.Fatalf("after the restore: %q %q", res.Stdout, res.Traceback)
		}
		k := res.Kernel
		if !k.StateRestored || k.StateLost || !strings.Contains(k.Note, "not restored: f (open file), t (thread)") ||
			!strings.HasPrefix(k.Note, "restored ") {
			t.Fatalf("restored kernel: %+v", k)
		}
		if k.ExecutionCount != setup.Kernel.ExecutionCount+1 {
			t.Fatalf("execution count %d after %d parked: it must go on", k.ExecutionCount, setup.Kernel.ExecutionCount)
		}
		if opts.Rich {
			if r := h.Run("alice", richCheck, 0); r.Stdout != richWant {
				t.Fatalf("numpy and pandas after the restore: %q %q", r.Stdout, r.Traceback)
			}
		}
		if ev := h.EventsOf(engine.EventRestored); len(ev) != 1 {
			t.Fatalf("restored events: %v", ev)
		} else if d := ev[0].Detail; strings.Contains(d, "not restored") && !regexp.MustCompile(`^restored \d+ names? parked from kernel k[0-9a-f]+, [^;]*(bytes|B), in [^;]+; not restored: `).MatchString(d) {
			// The parked state's size comes before what did not come back,
			// so that it cannot read as the size of the last of them.
			t.Errorf("restored event %q", d)
		}
		// The restored state is used up: bob's kernel went for alice's and
		// is parked now, alice's is not.
		h.waitParked("bob")
		if p := h.Eng.Parked(); len(p) != 1 || p[0].Owner != "bob" {
			t.Fatalf("parked after the restore: %+v", p)
		}

		t.Run("a changed parked state is refused", func(t *testing.T) {
			path := h.parkFile("bob")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[0] ^= 0x40
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			// (b: a namespace with nothing in it would not be parked next.)
			res := h.Run("bob", "print(\"secret\" in globals())\nb = 1", 0)
			if res.Stdout != "False\n" || !res.Kernel.StateLost || res.Kernel.StateRestored || !strings.Contains(res.Kernel.Note, "refused") {
				t.Fatalf("a changed parked state: %q %+v", res.Stdout, res.Kernel)
			}
			if ev := h.EventsOf(engine.EventRestoreRefused); len(ev) != 1 || !strings.Contains(ev[0].Detail, "MAC does not match") {
				t.Fatalf("refusal events: %v", ev)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Fatalf("the refused state is still there: %v", err)
			}
		})
		t.Run("another key's parked state is refused", func(t *testing.T) {
			h.waitParked("alice") // went for bob's new kernel
			h.Run("carol", "1", 0)
			h.waitParked("bob")
			alice, err := os.ReadFile(h.parkFile("alice"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(h.parkFile("bob"), alice, 0o600); err != nil {
				t.Fatal(err)
			}
			res := h.Run("bob", `print("p1" in globals())`, 0)
			if res.Stdout != "False\n" || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "parked for another kernel") {
				t.Fatalf("another key's parked state: %q %+v", res.Stdout, res.Kernel)
			}
		})
	})
	t.Run("over park_max_mb", func(t *testing.T) {
		h := New(t, env, park(func(c *engine.Config) { c.ParkMaxBytes = 1 << 20 }))
		h.Run("alice", "big = bytes(3 << 20); small = 1", 0)
		h.Run("bob", "1", 0)
		h.WaitFor("alice's park to fail", 30*time.Second, func() bool { return len(h.EventsOf(engine.EventParkFailed)) > 0 })
		if ev := h.EventsOf(engine.EventParkFailed)[0]; ev.Owner != "alice" || !strings.Contains(ev.Detail, "over park_max_mb (1.0 MB)") {
			t.Fatalf("park_failed: %+v", ev)
		}
		res := h.Run("alice", `print("small" in globals())`, 0)
		if res.Stdout != "False\n" || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "could not be parked") {
			t.Fatalf("after a failed park: %q %+v", res.Stdout, res.Kernel)
		}
		for _, p := range h.Eng.Parked() {
			if p.Owner == "alice" {
				t.Fatalf("a failed park left %+v", p)
			}
		}
	})
	if opts.Rich {
		t.Run("reaped by idle_exit and restored", func(t *testing.T) {
			h := New(t, env, park(func(c *engine.Config) { c.MaxKernels = 4; c.IdleExit = time.Second }))
			for _, code := range []string{parkSetup, richSetup} {
				if res := h.Run("alice", code, 0); res.Status != engine.StatusSuccess {
					t.Fatalf("the namespace's setup: %s %q", res.Status, res.Traceback)
				}
			}
			h.waitParked("alice")
			if ev := h.EventsOf(engine.EventReapedIdle); len(ev) != 1 {
				t.Fatalf("reaped events: %v", ev)
			}
			res := h.Run("alice", parkCheck+"\n"+richCheck, 0)
			if res.Stdout != parkWant+richWant || !res.Kernel.StateRestored {
				t.Fatalf("after the reap: %q %q %+v", res.Stdout, res.Traceback, res.Kernel)
			}
		})
	}
}

// waitParked waits until owner's kernel is parked and the event said so
// (it comes a moment after the listing has it).
func (h *Harness) waitParked(owner string) {
	h.T.Helper()
	h.WaitFor(owner+"'s kernel to be parked", time.Minute, func() bool {
		said := slices.ContainsFunc(h.EventsOf(engine.EventParked), func(ev engine.Event) bool { return ev.Owner == owner })
		for _, p := range h.Eng.Parked() {
			if p.Owner == owner && said {
				return true
			}
		}
		for _, ev := range h.EventsOf(engine.EventParkFailed) {
			if ev.Owner == owner {
				h.T.Fatalf("park failed: %s", ev.Detail)
			}
		}
		return false
	})
}

// parkFile is the file owner's parked state rests in.
func (h *Harness) parkFile(owner string) string {
	h.T.Helper()
	dir := filepath.Join(h.StateDir, "parked")
	ents, err := os.ReadDir(dir)
	if err != nil {
		h.T.Fatal(err)
	}
	for _, d := range ents {
		if !strings.HasSuffix(d.Name(), ".park") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, d.Name()))
		if err == nil && bytes.Contains(b, []byte(`"Owner":"`+owner+`"`)) {
			return filepath.Join(dir, d.Name())
		}
	}
	h.T.Fatalf("no parked state of %s in %s", owner, dir)
	return ""
}
