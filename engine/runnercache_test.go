package engine_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// cacheEngine is an engine on the local backend with state dir state and a
// trace of its backend calls, closed when the test ends.
func cacheEngine(t *testing.T, state string, noConfine bool) (*engine.Engine, *eventWatch, string) {
	t.Helper()
	trace := filepath.Join(t.TempDir(), "trace.jsonl")
	tracer, err := backends.OpenTracer(trace)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Backends: []backends.Env{backends.Traced(backends.NewLocal(enginetest.ShortTempDir(t)), tracer)},
		StateDir: state, NoConfine: noConfine, SpareKernels: map[string]int{"local": 1}})
	if err != nil {
		t.Fatal(err)
	}
	log := &eventWatch{sub: eng.SubscribeWith(engine.SubscribeOptions{Buffer: 1 << 12, Since: time.Now().Add(-time.Hour)})}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		eng.Close(ctx, false)
		tracer.Close()
	})
	return eng, log, trace
}

// eventWatch sees an engine's events from its start (New's included).
type eventWatch struct{ sub *engine.Subscription }

func (w *eventWatch) WaitFor(t *testing.T, what string, within time.Duration, match func(engine.Event) bool) {
	t.Helper()
	for _, ev := range w.sub.History {
		if match(ev) {
			return
		}
	}
	deadline := time.After(within)
	for {
		select {
		case ev := <-w.sub.C:
			if match(ev) {
				return
			}
		case <-deadline:
			t.Fatalf("no event for %s within %v", what, within)
		}
	}
}

func waitUntil(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(within); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
	}
}

func pythonOf(t *testing.T, eng *engine.Engine, owner string) string {
	t.Helper()
	res, err := eng.Execute(context.Background(), engine.Request{Owner: owner, Code: "import sys; print(sys.executable)"})
	if err != nil || res.Status != engine.StatusSuccess {
		t.Fatalf("%s: %v %+v", owner, err, res)
	}
	return strings.TrimSpace(res.Stdout)
}

// The interpreter a spawn found and the runner it compiled are kept in the
// state dir (0600 in 0700): the next engine spawns with them and compiles
// nothing; it finds meanwhile that the host's interpreter changed, says
// so, and its next kernels run the new one. A kept file that is not
// private is not used.
func TestAFreshEngineSpawnsWithTheKeptRunner(t *testing.T) {
	state := t.TempDir()
	first, _, _ := cacheEngine(t, state, false)
	exe := pythonOf(t, first, "a")
	if first.Kernels()[0].Confinement == "" || !strings.HasPrefix(first.Kernels()[0].Confinement, "landlock:") {
		t.Skipf("runners here are not confined (%q): the local backend keeps no runner on disk", first.Kernels()[0].Confinement)
	}
	dir := filepath.Join(state, "runners")
	var files []string
	waitUntil(t, "the runner kept", 20*time.Second, func() bool {
		files, _ = filepath.Glob(filepath.Join(dir, "runner-*.json"))
		return len(files) == 1
	})
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("runners dir: %v %v, want 0700", st, err)
	}
	if st, err := os.Stat(files[0]); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("kept runner: %v %v, want 0600", st, err)
	}

	// The host's python3 "moves": the kept interpreter is a link to the
	// real one, which the next engine's first kernel runs as kept; the
	// check finds the real one and the next kernels run it.
	link := filepath.Join(t.TempDir(), "python-kept")
	if err := os.Symlink(exe, link); err != nil {
		t.Fatal(err)
	}
	var kept map[string]any
	data, _ := os.ReadFile(files[0])
	json.Unmarshal(data, &kept)
	kept["exe"] = link
	data, _ = json.Marshal(kept)
	if err := engine.WritePrivateFile(files[0], data); err != nil {
		t.Fatal(err)
	}
	second, log, trace := cacheEngine(t, state, false)
	if got := pythonOf(t, second, "b"); got != link {
		t.Fatalf("the next engine's first kernel ran %s, want the kept %s", got, link)
	}
	if tr, _ := os.ReadFile(trace); strings.Contains(string(tr), "kerneldeck:compile") {
		t.Errorf("the next engine compiled the runner though it was kept:\n%.400s", tr)
	}
	log.WaitFor(t, "the check that the interpreter moved", 30*time.Second, func(ev engine.Event) bool {
		return ev.Type == engine.EventNotice && strings.Contains(ev.Detail, "python3 now runs "+exe)
	})
	if got := pythonOf(t, second, "c"); got != exe {
		t.Errorf("after the check a new kernel ran %s, want %s", got, exe)
	}

	// A kept file others may read is not used, and says why.
	waitUntil(t, "the runner kept again", 20*time.Second, func() bool {
		files, _ = filepath.Glob(filepath.Join(dir, "runner-*.json"))
		return len(files) == 1
	})
	os.Chmod(files[0], 0o644)
	_, log, _ = cacheEngine(t, state, false)
	log.WaitFor(t, "the refusal", 10*time.Second, func(ev engine.Event) bool {
		return ev.Type == engine.EventNotice && strings.Contains(ev.Detail, "the kept runner is not used") && strings.Contains(ev.Detail, "0600")
	})
}

// Without confinement a local kernel could write the state dir: nothing is
// kept there.
func TestNoRunnerKeptForUnconfinedLocalKernels(t *testing.T) {
	state := t.TempDir()
	eng, _, _ := cacheEngine(t, state, true)
	pythonOf(t, eng, "a")
	time.Sleep(500 * time.Millisecond) // a compile's save would be done by now
	if files, _ := filepath.Glob(filepath.Join(state, "runners", "*")); len(files) != 0 {
		t.Fatalf("kept for unconfined kernels: %v", files)
	}
}
