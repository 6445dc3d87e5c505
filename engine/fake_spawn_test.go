package engine_test

// Spawn, reuse, reset, fail-open and what makes a kernel its own.

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
)

// The first call spawns, the second reuses (one spawn command in total,
// execution_count 2). The reference pins that a transport drop during
// best-effort cleanup after the cell ran does not fail the cell; here cleanup
// rides on the next publish, so the post-cell step that can still drop is the
// spill fetch: its failure must leave the finished result intact.
func TestFirstCallSpawnsSecondReuses(t *testing.T) {
	r := newRig(t)
	r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
		switch req.Code {
		case "print('one')":
			return fakeenv.Outcome{Stdout: "one\n"}
		case "print('x' * 10**6)":
			return fakeenv.Outcome{Stdout: "xxxx", SpillStdout: "full text"}
		}
		return fakeenv.Outcome{}
	}

	first := r.exec(engine.Request{Code: "print('one')"})
	if first.Status != "success" || first.Stdout != "one\n" || first.Fallback != "" || first.Kernel == nil {
		t.Fatalf("first call: %+v", first)
	}
	if first.Kernel.Reused || first.Kernel.ExecutionCount != 1 {
		t.Fatalf("first call must spawn: %+v", *first.Kernel)
	}

	// The spill fetch after the second cell drops: the cell already ran.
	r.env.Prepend(fakeenv.On("fetch", fakeenv.TransportError("ssh dropped after the cell ran")))
	second := r.exec(engine.Request{Code: "print('x' * 10**6)"})
	if second.Status != "success" || second.Stdout != "xxxx" || !second.StdoutClipped || second.SpillPath != "" {
		t.Fatalf("second call must succeed with the clipped output and no spill copy: %+v", second)
	}
	if !second.Kernel.Reused || second.Kernel.ExecutionCount != 2 || second.Kernel.ID != first.Kernel.ID {
		t.Fatalf("second call must reuse kernel %s: %+v", first.Kernel.ID, *second.Kernel)
	}
	if n := r.env.Count("spawn"); n != 1 {
		t.Fatalf("%d spawn commands, want exactly 1", n)
	}
	if n := r.env.Count("fetch"); n != 1 {
		t.Fatalf("the failing fetch was never tried (%d fetches); the test proves nothing", n)
	}
	if n := r.host.Runs("print('x' * 10**6)"); n != 1 {
		t.Fatalf("the cell ran %d times on the host, want 1 (no per-call re-run)", n)
	}
	if got := types(r.ev.of(engine.EventSpawned)); len(got) != 1 {
		t.Fatalf("spawned events: %v", got)
	}
	if got := r.ev.of(engine.EventReused); len(got) != 1 || got[0].Kernel != first.Kernel.ID {
		t.Fatalf("reused events: %+v", got)
	}

	// When the fetch works, the full text lands in a private file here.
	r.env.Prepend(fakeenv.On("fetch", r.host.Fetch).Once())
	third := r.exec(engine.Request{Code: "print('x' * 10**6)"})
	data, err := os.ReadFile(third.SpillPath)
	if err != nil || string(data) != "full text" || third.Kernel.ExecutionCount != 3 {
		t.Fatalf("spill copy: path %q, %q, %v, count %d", third.SpillPath, data, err, third.Kernel.ExecutionCount)
	}
	if st, _ := os.Stat(third.SpillPath); st.Mode().Perm() != 0o600 {
		t.Fatalf("spill file mode %v, want 0600", st.Mode().Perm())
	}
}

// ---- spawn failure fails open ---------------------------------------------

// checkPerCallCommands checks the commands of a per-call fallback after the
// registry kernel's failed spawn (the first command): a transient spawn in
// <TempDir>/kerneldeck-once-<new id>, its cell commands and its kill, in
// that order and nothing else, none naming the failed kernel. It returns the
// transient kernel as the host saw it (killed by then).
func checkPerCallCommands(t *testing.T, r *rig) fakeenv.Kernel {
	t.Helper()
	// The compile of the runner the host's first answer set off is nobody's
	// cell command.
	calls := slices.DeleteFunc(r.env.Calls(), func(c fakeenv.Call) bool { return c.Marker == "compile" })
	if len(calls) < 4 {
		t.Fatalf("want spawn, transient spawn, cell, kill; got %d commands", len(calls))
	}
	failed, err := fakeenv.ParseSpawn(calls[0].Command, calls[0].Stdin)
	if err != nil || failed.Transient {
		t.Fatalf("the first command must be the registry kernel's spawn: id %s transient %v, %v", failed.ID, failed.Transient, err)
	}
	once, err := fakeenv.ParseSpawn(calls[1].Command, calls[1].Stdin)
	if err != nil || !once.Transient || once.ID == failed.ID {
		t.Fatalf("the second command must spawn a transient kernel under a new id: id %s (failed %s) transient %v, %v", once.ID, failed.ID, once.Transient, err)
	}
	tk := hostKernel(t, r.host, once.ID)
	if want := filepath.Join(r.env.TempDir(), "kerneldeck-once-"+once.ID); tk.Dir != want || !tk.Transient {
		t.Fatalf("transient kernel in %s (transient %v), want %s", tk.Dir, tk.Transient, want)
	}
	var markers []string
	for _, c := range calls[1:] {
		markers = append(markers, c.Marker)
		if strings.Contains(c.Command, failed.ID) {
			t.Fatalf("a %s command names the kernel whose spawn failed: %q", c.Marker, c.Command)
		}
		var dir string
		var pid int
		switch c.Marker {
		case "cell":
			a, err := fakeenv.ParseCell(c.Command)
			if err != nil {
				t.Fatal(err)
			}
			dir, pid = a.Dir, a.PID
		case "kill":
			targets, err := fakeenv.ParseKill(c.Command)
			if err != nil {
				t.Fatal(err)
			}
			if len(targets) != 1 {
				t.Fatalf("a kill command names %d runners, want the transient kernel alone: %+v", len(targets), targets)
			}
			dir, pid = targets[0].Dir, targets[0].PID
		default:
			continue
		}
		if dir != tk.Dir || pid != tk.PID {
			t.Fatalf("a %s command for %s pid %d, want the transient kernel %s pid %d", c.Marker, dir, pid, tk.Dir, tk.PID)
		}
	}
	middle := markers[1 : len(markers)-1]
	if markers[0] != "spawn" || markers[len(markers)-1] != "kill" || len(middle) == 0 || slices.ContainsFunc(middle, func(m string) bool { return m != "cell" }) {
		t.Fatalf("per-call commands %v, want spawn, cell..., kill", markers)
	}
	if !tk.Killed {
		t.Fatalf("the transient kernel was not killed after its cell: %+v", tk)
	}
	return tk
}

// A spawn that fails with an answer from the host falls back to a per-call
// run: a transient kernel in a private dir runs the cell once and is killed
// (spawn(fails) -> spawn(transient) -> cell -> kill; before the transient
// kernel this was one "once" command and no cell command).
func TestSpawnFailureFailsOpen(t *testing.T) {
	cases := []struct {
		name  string
		spawn fakeenv.HandlerFunc
	}{
		{"host reports KD:ERR", fakeenv.SpawnFailed("python3 was not found on PATH on this host")},
		{"shell error without a KD line", fakeenv.ReplyRC("sh: cannot fork\n", 1)},
		{"pid not a number", fakeenv.Reply("KD:SPAWNED x /tmp/kerneldeck-tester/k000000000000\n")},
		// The dir goes into rm -rf later: one outside <TempDir>/kerneldeck-*/<id> is refused.
		{"dir outside the kernel root", fakeenv.Reply("KD:SPAWNED 77 /etc\n")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.env.Prepend(fakeenv.On("spawn", tc.spawn).If(fakeenv.Not(fakeenv.Transient)))
			r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
				if req.Transient {
					return fakeenv.Outcome{Stdout: "per-call ran\n"}
				}
				return fakeenv.Outcome{Stdout: "persistent kernel ran\n"}
			}
			res := r.exec(engine.Request{Owner: "o", Code: "print(2)"})
			if res.Fallback != "per_call" || res.Status != "success" || res.Stdout != "per-call ran\n" || res.Kernel != nil {
				t.Fatalf("want the per-call result: %+v", res)
			}
			if !strings.Contains(res.Stderr, "no persistent kernel") {
				t.Fatalf("the result must say it ran once: stderr %q", res.Stderr)
			}
			if ks := r.eng.Kernels(); len(ks) != 0 {
				t.Fatalf("registry must be empty: %+v", ks)
			}
			if runs := r.host.PerCallCells(); len(runs) != 1 || runs[0].Code != "print(2)" || len(r.host.Cells()) != 1 {
				t.Fatalf("per-call runs %+v, all cells %+v; want print(2) once, in a transient kernel", runs, r.host.Cells())
			}
			// Every cell command went to the transient kernel, which was killed.
			checkPerCallCommands(t, r)
			failed, fell := r.ev.of(engine.EventSpawnFailed), r.ev.of(engine.EventFallbackPerCall)
			if len(failed) != 1 || len(fell) != 1 || failed[0].Owner != "o" {
				t.Fatalf("events: spawn_failed %+v, fallback_per_call %+v", failed, fell)
			}
		})
	}

	// A host that cannot be reached at all gets no per-call attempt: it
	// would need the same transport. The error says so once.
	t.Run("unreachable host", func(t *testing.T) {
		r := newRig(t)
		r.env.Prepend(fakeenv.On("spawn", fakeenv.TransportError("connection refused")))
		res, err := r.eng.Execute(context.Background(), engine.Request{Owner: "o", Code: "1"})
		if err == nil || !strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "per-call") {
			t.Fatalf("want one transport error, got %+v, %v", res, err)
		}
		if n := r.env.Count("spawn"); n != 1 || len(r.env.Calls()) != 1 || len(r.host.PerCallCells()) != 0 {
			t.Fatalf("%d spawns, %d commands, per-call runs %+v against an unreachable host; want the one failed spawn only",
				n, len(r.env.Calls()), r.host.PerCallCells())
		}
		if ks := r.eng.Kernels(); len(ks) != 0 {
			t.Fatalf("registry must be empty: %+v", ks)
		}
		if failed := r.ev.of(engine.EventSpawnFailed); len(failed) != 1 {
			t.Fatalf("spawn_failed events: %+v", failed)
		}
	})

	// The per-call run starts with the transient kernel's spawn: when that
	// fails too, the error names both failures.
	t.Run("per-call run fails too", func(t *testing.T) {
		r := newRig(t)
		r.env.Prepend(fakeenv.On("spawn", fakeenv.SpawnFailed("no fifo support")).If(fakeenv.Not(fakeenv.Transient)),
			fakeenv.On("spawn", fakeenv.TransportError("host down")).If(fakeenv.Transient))
		res, err := r.eng.Execute(context.Background(), engine.Request{Code: "1"})
		if err == nil || !strings.Contains(err.Error(), "per-call fallback failed too") ||
			!strings.Contains(err.Error(), "no fifo support") || !strings.Contains(err.Error(), "host down") {
			t.Fatalf("want an error naming both failures, got %+v, %v", res, err)
		}
		if ks := r.eng.Kernels(); len(ks) != 0 {
			t.Fatalf("registry must be empty: %+v", ks)
		}
		if n := r.env.Count("spawn"); n != 2 || len(r.env.Calls()) != 2 {
			t.Fatalf("%d spawns, %d commands; want the failed spawn and the failed transient spawn only", n, len(r.env.Calls()))
		}
	})

	// Failed the same way (no interpreter, say): the reason is said once.
	t.Run("per-call run fails the same way", func(t *testing.T) {
		r := newRig(t)
		r.env.Prepend(fakeenv.On("spawn", fakeenv.SpawnFailed("python3 was not found on this host")))
		_, err := r.eng.Execute(context.Background(), engine.Request{Code: "1"})
		if err == nil || strings.Count(err.Error(), "python3 was not found") != 1 || !strings.Contains(err.Error(), "failed the same way") {
			t.Fatalf("want the reason once and the fallback said to have failed the same way, got %v", err)
		}
	})
}

// ---- reset -----------------------------------------------------------------

func TestResetKillsAndRespawns(t *testing.T) {
	r := newRig(t)
	first := r.exec(engine.Request{Code: "a = 1"})
	second := r.exec(engine.Request{Code: "a", Reset: true})
	if second.Status != "success" || !second.Kernel.StateReset || second.Kernel.Reused || second.Kernel.StateLost {
		t.Fatalf("reset result: %+v", *second.Kernel)
	}
	if second.Kernel.ExecutionCount != 1 || second.Kernel.ID == first.Kernel.ID {
		t.Fatalf("reset must run in a fresh kernel: first %+v, second %+v", *first.Kernel, *second.Kernel)
	}
	if n := r.env.Count("spawn"); n != 2 {
		t.Fatalf("%d spawns, want 2", n)
	}
	if got := r.killedPIDs(); !slices.Equal(got, []int{first.Kernel.PID}) {
		t.Fatalf("kill commands for pids %v, want exactly the old kernel's %d", got, first.Kernel.PID)
	}
	if !hostKernel(t, r.host, first.Kernel.ID).Killed {
		t.Fatal("the old runner is still alive on the host")
	}
	if ks := r.eng.Kernels(); len(ks) != 1 || ks[0].ID != second.Kernel.ID {
		t.Fatalf("registry: %+v", ks)
	}
	if got := r.ev.of(engine.EventReset); len(got) != 1 {
		t.Fatalf("reset events: %+v", got)
	}
}

// ---- death -----------------------------------------------------------------

func TestChangedToolSetSpawnsItsOwnKernel(t *testing.T) {
	r := newRig(t)
	a := r.exec(engine.Request{Task: "t1", Code: "1", Tools: []string{"read_file"}})
	b := r.exec(engine.Request{Task: "t1", Code: "1", Tools: []string{"web_search"}})
	if a.Kernel.ID == b.Kernel.ID || b.Kernel.Reused {
		t.Fatalf("a different tool set must get a different kernel: %+v %+v", *a.Kernel, *b.Kernel)
	}
	if n := r.env.Count("spawn"); n != 2 {
		t.Fatalf("%d spawns, want 2", n)
	}
	var sets []string
	for _, k := range r.eng.Kernels() {
		sets = append(sets, strings.Join(k.Tools, ","))
	}
	slices.Sort(sets)
	if !slices.Equal(sets, []string{"read_file", "web_search"}) {
		t.Fatalf("keyed tool sets %v", sets)
	}
	// Each kernel got stubs for its own tools only, generated at spawn.
	ka, kb := hostKernel(t, r.host, a.Kernel.ID), hostKernel(t, r.host, b.Kernel.ID)
	if !strings.Contains(ka.Tools, "def read_file(") || strings.Contains(ka.Tools, "web_search") ||
		!strings.Contains(kb.Tools, "def web_search(") || strings.Contains(kb.Tools, "read_file") {
		t.Fatalf("tool stubs:\n%s\n---\n%s", ka.Tools, kb.Tools)
	}
	// The same set in another order, with a duplicate, is the same kernel.
	c := r.exec(engine.Request{Task: "t1", Code: "1", Tools: []string{"web_search", "web_search"}})
	if !c.Kernel.Reused || c.Kernel.ID != b.Kernel.ID || r.env.Count("spawn") != 2 {
		t.Fatalf("same tool set must reuse %s: %+v", b.Kernel.ID, *c.Kernel)
	}
}

func TestDelegatedChildGetsItsOwnKernel(t *testing.T) {
	r := newRig(t)
	parent := r.exec(engine.Request{Task: "conv", Code: "1"})
	child := r.exec(engine.Request{Task: "conv", Child: "child-9", Code: "1"})
	if parent.Kernel.ID == child.Kernel.ID || child.Kernel.Reused {
		t.Fatalf("the child must get its own kernel: %+v %+v", *parent.Kernel, *child.Kernel)
	}
	if n := r.env.Count("spawn"); n != 2 || len(r.eng.Kernels()) != 2 {
		t.Fatalf("%d spawns, %d kernels; want 2 and 2", n, len(r.eng.Kernels()))
	}
	again := r.exec(engine.Request{Task: "conv", Child: "child-9", Code: "1"})
	if again.Kernel.ID != child.Kernel.ID || !again.Kernel.Reused {
		t.Fatalf("the child's next call must reuse its kernel: %+v", *again.Kernel)
	}
}

// ---- owner shutdown, close -------------------------------------------------

func TestKernelsSnapshot(t *testing.T) {
	r := newRig(t, func(c *engine.Config) { c.MaxKernels = 2 })
	a := r.exec(engine.Request{Owner: "a", Code: "1"})
	r.clock.Advance(time.Second)
	b := r.exec(engine.Request{Owner: "b", Code: "1"})
	r.clock.Advance(10 * time.Second)

	snap := func() map[string]engine.KernelInfo {
		out := map[string]engine.KernelInfo{}
		for _, k := range r.eng.Kernels() {
			out[k.Owner] = k
		}
		return out
	}
	s := snap()
	if s["a"].ID != a.Kernel.ID || s["a"].PID != a.Kernel.PID || s["a"].Dir != a.Kernel.Dir || s["a"].Backend != "fake" {
		t.Fatalf("snapshot of a: %+v vs %+v", s["a"], *a.Kernel)
	}
	if s["a"].Attached || s["a"].Queued != 0 || s["a"].State != "idle" || s["a"].Idle != 11*time.Second || s["b"].Idle != 10*time.Second {
		t.Fatalf("idle snapshot: %+v", s)
	}
	if !s["a"].NextEvict || s["b"].NextEvict {
		t.Fatalf("at the cap, the LRU kernel a must be next to evict: a %v b %v", s["a"].NextEvict, s["b"].NextEvict)
	}

	// a runs a cell and has one more queued: it is attached, so b is next.
	gate := fakeenv.NewGate()
	r.env.Prepend(fakeenv.On("cell", gate.Wrap(r.host.Cell)).If(fakeenv.StdinContains("hold()")).Once())
	var wg sync.WaitGroup
	t.Cleanup(func() { gate.Open(); wg.Wait() })
	wg.Go(func() { r.eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "hold()"}) })
	<-gate.Entered()
	wg.Go(func() { r.eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "2"}) })
	eventually(t, "the second call on a to queue", func() bool { return snap()["a"].Queued == 1 })
	s = snap()
	if !s["a"].Attached || s["a"].State != "running" || s["a"].RunningCell == "" || s["a"].Idle != 0 {
		t.Fatalf("busy snapshot of a: %+v", s["a"])
	}
	if s["a"].NextEvict || !s["b"].NextEvict || s["b"].Attached || s["b"].Queued != 0 {
		t.Fatalf("an attached kernel is never next to evict: a %+v b %+v", s["a"], s["b"])
	}

	r.clock.Advance(time.Second)
	gate.Open()
	wg.Wait()
	s = snap()
	if s["a"].Attached || s["a"].Queued != 0 || s["a"].ExecutionCount != 3 || s["b"].ExecutionCount != 1 {
		t.Fatalf("settled snapshot: %+v", s)
	}
	if !s["b"].NextEvict || s["a"].NextEvict {
		t.Fatalf("b is now least recently used: a %v b %v", s["a"].NextEvict, s["b"].NextEvict)
	}
	// Under the cap, nothing is marked.
	four := 4
	if err := r.eng.SetLimits(&four, nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range r.eng.Kernels() {
		if k.NextEvict {
			t.Fatalf("under the cap nothing is next to evict: %+v", k)
		}
	}
	if s["b"].ID != b.Kernel.ID {
		t.Fatalf("snapshot of b: %+v vs %+v", s["b"], *b.Kernel)
	}
}

// ---- exactly once ----------------------------------------------------------

// A spawn given up on after it reached the host (its answer lost: the
// runner may be starting there) is cleaned up by one abandon command naming
// its kernel, which the host then no longer runs; a spawn that never
// reached the host costs no command more.
func TestGivenUpSpawnIsCleanedUp(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reached bool
	}{{"reached the host", true}, {"never reached the host", false}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			fail := fakeenv.TransportError("connection refused")
			if tc.reached {
				fail = fakeenv.AnswerLost(r.host.Spawn)
			}
			r.env.Prepend(fakeenv.On("spawn", fail).If(fakeenv.Not(fakeenv.Transient)).Once())
			if _, err := r.eng.Execute(context.Background(), engine.Request{Owner: "o", Code: "1"}); err == nil {
				t.Fatal("a spawn that failed on the transport gave no error")
			}
			// Close waits for the engine's background work, the cleanup too.
			if err := r.eng.Close(context.Background(), false); err != nil {
				t.Fatal(err)
			}
			want := map[bool]int{true: 1, false: 0}[tc.reached]
			if n := r.env.Count("abandon"); n != want {
				t.Fatalf("%d abandon commands, want %d; commands: %v", n, want, r.env.Calls())
			}
			for _, k := range r.host.Kernels() {
				if k.Alive || !k.DirGone {
					t.Fatalf("kernel %s of the given-up spawn still on the host: %+v", k.ID, k)
				}
			}
			if tc.reached && len(r.host.Kernels()) != 1 {
				t.Fatalf("host kernels %+v; want the one the lost spawn started", r.host.Kernels())
			}
		})
	}
}

// A host whose runners have no user namespace of their own is said once:
// what their kernels start could use an engine socket there as its user.
func TestNoUserNamespaceIsSaidOnce(t *testing.T) {
	r := newRig(t)
	r.host.Confinement = "landlock:6"
	r.exec(engine.Request{Owner: "a", Code: "1"})
	r.exec(engine.Request{Owner: "b", Code: "1"})
	var said []engine.Event
	for _, ev := range r.ev.of(engine.EventUnconfined) {
		if strings.Contains(ev.Detail, "no user namespace of their own") {
			said = append(said, ev)
		}
	}
	if len(said) != 1 {
		t.Fatalf("unconfined events about user namespaces: %+v, want one", said)
	}
	for _, k := range r.eng.Kernels() {
		if k.Confinement != "landlock:6" {
			t.Fatalf("kernel %s confinement %q, want the runner's word", k.ID, k.Confinement)
		}
	}
}

// Close does not wait for a spare that is still starting: the engine's own
// background work runs on a context Close cancels, and the spawn it gives
// up is cleaned up on its host.
func TestCloseCancelsASpareStillStarting(t *testing.T) {
	env, _ := fakeenv.Healthy()
	entered := make(chan struct{})
	env.Prepend(fakeenv.On("spawn", func(ctx context.Context, c fakeenv.Call) (backends.Result, error) {
		close(entered)
		<-ctx.Done() // a host that never answers
		return backends.Result{}, ctx.Err()
	}).Once())
	eng, err := engine.New(engine.Config{Backends: []backends.Env{env}, StateDir: t.TempDir(), SpareKernels: map[string]int{env.URI(): 1}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no spare started")
	}
	// Well under the spawn's own timeout (30 s): only a cancelled spawn
	// lets Close end in time.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Close(ctx, false); err != nil {
		t.Fatalf("Close waited for a spare's spawn: %v", err)
	}
}
