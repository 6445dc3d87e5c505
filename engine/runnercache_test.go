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

// cacheEngine is the enginetest harness on the local backend (kernels
// under tmp), with state dir state and a spare kept, and a watch of its
// events from its start.
func cacheEngine(t *testing.T, tmp, state string, noConfine bool) (*enginetest.Harness, *eventWatch) {
	t.Helper()
	h := enginetest.New(t, backends.NewLocal(tmp), func(c *engine.Config) {
		c.StateDir, c.NoConfine, c.SpareKernels = state, noConfine, map[string]int{"local": 1}
	})
	return h, &eventWatch{sub: h.Eng.SubscribeWith(engine.SubscribeOptions{Buffer: 1 << 12, Since: time.Now().Add(-time.Hour)})}
}

// eventWatch sees an engine's events from its start: New's are history by
// the time a harness's log subscribes.
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

// compiled says whether the harness's backend has run a compile of the
// runner to its end.
func compiled(h *enginetest.Harness) bool {
	tr, _ := os.ReadFile(h.Trace)
	return strings.Contains(string(tr), "kerneldeck:compile")
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
// nothing, unless python3 resolves to another interpreter now. A kept file
// that is not private is not used.
func TestAFreshEngineSpawnsWithTheKeptRunner(t *testing.T) {
	state := t.TempDir()
	tmp := enginetest.ShortTempDir(t)
	first, _ := cacheEngine(t, tmp, state, false)
	exe := pythonOf(t, first.Eng, "a")
	if c := first.Eng.Kernels()[0].Confinement; !strings.HasPrefix(c, "landlock:") {
		t.Skipf("runners here are not confined (%q): the local backend keeps no runner on disk", c)
	}
	dir := filepath.Join(state, "runners")
	var files []string
	first.WaitFor("the runner kept", 20*time.Second, func() bool {
		files, _ = filepath.Glob(filepath.Join(dir, "runner-*.json"))
		return len(files) == 1
	})
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("runners dir: %v %v, want 0700", st, err)
	}
	if st, err := os.Stat(files[0]); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("kept runner: %v %v, want 0600", st, err)
	}

	// The next engine spawns with the kept runner: no compile, and no id(1)
	// for the login, as it has the root.
	var kept map[string]any
	data, _ := os.ReadFile(files[0])
	body, err := engine.UnsealKeptRunner(state, data)
	if err != nil {
		t.Fatalf("the kept runner is not sealed: %v", err)
	}
	json.Unmarshal(body, &kept)
	root, _ := kept["root"].(string)
	if !strings.Contains(root, "/kerneldeck-") {
		t.Fatalf("the kept runner holds kernel root %q, want the host's", root)
	}
	second, _ := cacheEngine(t, tmp, state, false)
	if got := pythonOf(t, second.Eng, "b"); got != exe {
		t.Fatalf("the next engine's first kernel ran %s, want %s", got, exe)
	}
	if compiled(second) {
		t.Error("the next engine compiled the runner though it was kept")
	}
	if tr, _ := os.ReadFile(second.Trace); !strings.Contains(string(tr), "root='"+root+"'") {
		t.Errorf("the next engine's first spawn did not start from the kept root %s", root)
	}

	// A kept interpreter python3 no longer resolves to here (a venv since
	// deactivated, another pyenv version: here a link to the real one) is
	// not what the next engine's first kernel runs: it runs the
	// interpreter of this moment.
	link := filepath.Join(t.TempDir(), "python-kept")
	if err := os.Symlink(exe, link); err != nil {
		t.Fatal(err)
	}
	kept["exe"] = link
	body, _ = json.Marshal(kept)
	if data, err = engine.SealKeptRunner(state, body); err != nil {
		t.Fatal(err)
	}
	if err := engine.WritePrivateFile(files[0], data); err != nil {
		t.Fatal(err)
	}
	second, _ = cacheEngine(t, tmp, state, false)
	if got := pythonOf(t, second.Eng, "c"); got != exe {
		t.Errorf("with a kept runner of another interpreter the first kernel ran %s, want %s", got, exe)
	}

	// A kept file others may read is not used, and says why.
	second.WaitFor("the runner kept again", 20*time.Second, func() bool {
		files, _ = filepath.Glob(filepath.Join(dir, "runner-*.json"))
		return len(files) == 1
	})
	os.Chmod(files[0], 0o644)
	_, log := cacheEngine(t, tmp, state, false)
	log.WaitFor(t, "the refusal", 10*time.Second, func(ev engine.Event) bool {
		return ev.Type == engine.EventNotice && strings.Contains(ev.Detail, "the kept runner is not used") && strings.Contains(ev.Detail, "0600")
	})

	// A kept runner anyone else of the login wrote (a kernel, once, when
	// the state dir was open to it) names a planted interpreter: it is not
	// sealed, so it is not used, and the planted program never runs.
	marker := filepath.Join(t.TempDir(), "planted-ran")
	planted := filepath.Join(t.TempDir(), "python3")
	if err := os.WriteFile(planted, []byte("#!/bin/sh\ntouch "+marker+"\nexec "+exe+" \"$@\"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	kept["exe"] = planted
	body, _ = json.Marshal(kept)
	if err := engine.WritePrivateFile(files[0], body); err != nil {
		t.Fatal(err)
	}
	third, log := cacheEngine(t, tmp, state, false)
	log.WaitFor(t, "the planted runner's refusal", 10*time.Second, func(ev engine.Event) bool {
		return ev.Type == engine.EventNotice && strings.Contains(ev.Detail, "the kept runner") && strings.Contains(ev.Detail, "not sealed")
	})
	if got := pythonOf(t, third.Eng, "d"); got != exe {
		t.Errorf("after a planted runner file a kernel ran %s, want %s", got, exe)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the planted interpreter ran")
	}
}

// Without confinement a local kernel could write the state dir: nothing is
// kept there.
func TestNoRunnerKeptForUnconfinedLocalKernels(t *testing.T) {
	state := t.TempDir()
	h, _ := cacheEngine(t, enginetest.ShortTempDir(t), state, true)
	pythonOf(t, h.Eng, "a")
	h.WaitFor("the runner compiled", 20*time.Second, func() bool { return compiled(h) })
	h.Eng.Close(context.Background(), false) // waits for a save the compile would make
	if files, _ := filepath.Glob(filepath.Join(state, "runners", "*")); len(files) != 0 {
		t.Fatalf("kept for unconfined kernels: %v", files)
	}
}
