package engine_test

// Protocol-level tests of the engine against the scripted fake Env
// (internal/fakeenv): the behaviours of the reference implementation's test
// suite, ported, plus the places where DESIGN.md improves on it (interrupt
// before kill, exactly-once cells, FIFO serialization).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
)

const phrase = "state from earlier calls was lost"

// ---- harness ---------------------------------------------------------------

type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	reads int
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	return c.now
}

// settle waits until the engine has read the clock n more times: with
// nothing else going on, that is its background sweep seeing the time.
func (c *fakeClock) settle(t *testing.T, n int) {
	t.Helper()
	c.mu.Lock()
	from := c.reads
	c.mu.Unlock()
	eventually(t, "the sweep to read the clock", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.reads >= from+n
	})
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// recorder keeps every event of one subscription. Events an Execute
// published are in the subscription's buffer when it returns, so reading
// whatever is buffered at each query sees them without a reader goroutine.
type recorder struct {
	mu     sync.Mutex
	sub    *engine.Subscription
	events []engine.Event
	closed bool
}

func record(sub *engine.Subscription) *recorder { return &recorder{sub: sub} }

func (r *recorder) all() []engine.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	for !r.closed {
		select {
		case ev, ok := <-r.sub.C:
			if !ok {
				r.closed = true
				break
			}
			r.events = append(r.events, ev)
			continue
		default:
		}
		break
	}
	return slices.Clone(r.events)
}

func (r *recorder) of(tp engine.EventType) []engine.Event {
	var out []engine.Event
	for _, ev := range r.all() {
		if ev.Type == tp {
			out = append(out, ev)
		}
	}
	return out
}

type rig struct {
	t     *testing.T
	env   *fakeenv.Env
	host  *fakeenv.Host
	eng   *engine.Engine
	clock *fakeClock
	ev    *recorder
	cfg   engine.Config
}

// newRig starts an engine on a healthy fake host with small timeouts, a
// fake clock and no background sweep (SweepEvery one hour) unless mod
// changes them. Cleanup closes the engine and checks that no goroutine
// outlives Close.
func newRig(t *testing.T, mod ...func(*engine.Config)) *rig {
	t.Helper()
	env, host := fakeenv.Healthy()
	clock := &fakeClock{now: time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)}
	cfg := engine.Config{
		Backends:       []backends.Env{env},
		MaxKernels:     4,
		IdleExit:       30 * time.Minute,
		CellTimeout:    5 * time.Second,
		InterruptGrace: 200 * time.Millisecond,
		WaitWindow:     time.Second,
		SweepEvery:     time.Hour,
		StateDir:       t.TempDir(),
		Now:            clock.Now,
	}
	for _, m := range mod {
		m(&cfg)
	}
	eng, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, env: env, host: host, eng: eng, clock: clock, ev: record(eng.Subscribe(1 << 16)), cfg: cfg}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := eng.Close(ctx, false); err != nil {
			t.Errorf("engine close: %v", err)
		}
		for _, ev := range r.ev.all() {
			if ev.Type == engine.EventMissed {
				t.Errorf("the test's subscription missed %d events", ev.Missed)
			}
		}
		goleak.VerifyNone(t)
	})
	return r
}

func (r *rig) exec(req engine.Request) *engine.Result {
	r.t.Helper()
	res, err := r.eng.Execute(context.Background(), req)
	if err != nil {
		r.t.Fatalf("Execute(%q): %v", req.Code, err)
	}
	return res
}

// owners returns the owners in the registry, sorted.
func (r *rig) owners() []string {
	var out []string
	for _, k := range r.eng.Kernels() {
		out = append(out, k.Owner)
	}
	slices.Sort(out)
	return out
}

// killedPIDs lists the pids of every kill command sent so far.
func (r *rig) killedPIDs() []int {
	r.t.Helper()
	var out []int
	for _, c := range r.env.CallsOf("kill") {
		a, err := fakeenv.ParseKill(c.Command)
		if err != nil {
			r.t.Fatal(err)
		}
		out = append(out, a.PID)
	}
	return out
}

// publishedCodes lists the code of every cell command that carried a request.
func (r *rig) publishedCodes() []string {
	var out []string
	for _, c := range r.env.CallsOf("cell") {
		if len(c.Stdin) > 0 {
			out = append(out, requestCode(r.t, c.Stdin))
		}
	}
	return out
}

func requestCode(t *testing.T, stdin []byte) string {
	t.Helper()
	var req struct{ Code string }
	if err := json.Unmarshal(stdin, &req); err != nil {
		t.Fatalf("cell request on stdin is not JSON: %v", err)
	}
	return req.Code
}

func hostKernel(t *testing.T, h *fakeenv.Host, id string) fakeenv.Kernel {
	t.Helper()
	k, ok := h.Kernel(id, 0)
	if !ok {
		t.Fatalf("the host never spawned kernel %s", id)
	}
	return k
}

// eventually waits (bounded, not timed) for cond; background kills run
// asynchronously.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func types(evs []engine.Event) []engine.EventType {
	out := make([]engine.EventType, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

// ---- spawn and reuse -------------------------------------------------------

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
	calls := r.env.Calls()
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
			a, err := fakeenv.ParseKill(c.Command)
			if err != nil {
				t.Fatal(err)
			}
			dir, pid = a.Dir, a.PID
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

// A kernel found dead before the next cell is reported and respawned, and the
// cell runs once in the new kernel.
func TestDeadKernelReportedAndRespawned(t *testing.T) {
	cases := []struct {
		name string
		kill func(h *fakeenv.Host, pid int)
	}{
		{"runner killed (KD:DEAD)", (*fakeenv.Host).Crash},
		{"runner exited and removed its dir (KD:GONE)", (*fakeenv.Host).RemoveDir},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			first := r.exec(engine.Request{Code: "x = 1"})
			tc.kill(r.host, first.Kernel.PID)

			res := r.exec(engine.Request{Code: "print('after')"})
			if res.Status != "success" || !res.Kernel.StateLost || res.Kernel.Reused {
				t.Fatalf("want success with state_lost: %+v %+v", res, *res.Kernel)
			}
			if !strings.Contains(res.Kernel.Note, phrase) {
				t.Fatalf("note %q lacks %q", res.Kernel.Note, phrase)
			}
			if res.Kernel.ID == first.Kernel.ID || res.Kernel.ExecutionCount != 1 {
				t.Fatalf("want a fresh kernel: %+v", *res.Kernel)
			}
			if n := r.env.Count("spawn"); n != 2 {
				t.Fatalf("%d spawns, want 2", n)
			}
			if n := r.host.Runs("print('after')"); n != 1 {
				t.Fatalf("the cell ran %d times, want 1", n)
			}
			if ks := r.eng.Kernels(); len(ks) != 1 || ks[0].ID != res.Kernel.ID {
				t.Fatalf("registry: %+v", ks)
			}
			if got := r.ev.of(engine.EventStateLost); len(got) != 1 {
				t.Fatalf("state_lost events: %+v", got)
			}
		})
	}
}

// A runner that dies during a cell: the cell may have been published, so it
// is never re-run; the caller hears state_lost and the kernel leaves the
// registry.
func TestDeathDuringCellIsNotRerun(t *testing.T) {
	const code = "os.kill(os.getpid(), 9)"
	cases := []struct {
		name  string
		setup func(r *rig)
		runs  int // publications the host saw
	}{
		{"runner crashes running the cell", func(r *rig) {
			r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome { return fakeenv.Outcome{Crash: req.Code == code} }
		}, 1},
		{"host answers KD:LOST", func(r *rig) {
			r.env.Prepend(fakeenv.On("cell", fakeenv.Lost()).If(fakeenv.StdinContains(code)).Once())
		}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			tc.setup(r)
			first := r.exec(engine.Request{Code: "x = 1"})
			res := r.exec(engine.Request{Code: code})
			if res.Status != "error" || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, phrase) {
				t.Fatalf("want error with state_lost: %+v %+v", res, *res.Kernel)
			}
			if n := r.host.Runs(code); n != tc.runs {
				t.Fatalf("the cell was published %d times, want %d", n, tc.runs)
			}
			if n := r.env.Count("spawn"); n != 1 {
				t.Fatalf("%d spawns: a lost cell must not be replayed in a new kernel", n)
			}
			if ks := r.eng.Kernels(); len(ks) != 0 {
				t.Fatalf("registry must be empty: %+v", ks)
			}
			if got := r.killedPIDs(); !slices.Equal(got, []int{first.Kernel.PID}) {
				t.Fatalf("kill commands %v, want [%d]: a lost kernel is cleaned up on its host", got, first.Kernel.PID)
			}
			if got := r.ev.of(engine.EventStateLost); len(got) != 1 || got[0].Kernel != first.Kernel.ID {
				t.Fatalf("state_lost events: %+v", got)
			}
		})
	}
}

// ---- timeout: interrupt first, kill only if the cell ignores it ------------

func TestCellTimeoutInterruptKeepsKernel(t *testing.T) {
	r := newRig(t)
	r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
		return fakeenv.Outcome{Hang: req.Code == "while True: pass"}
	}
	first := r.exec(engine.Request{Code: "x = 1"})
	res := r.exec(engine.Request{Code: "while True: pass", Timeout: 100 * time.Millisecond})
	if res.Status != "timeout" || res.Kernel.StateLost {
		t.Fatalf("want timeout with state kept: %+v %+v", res, *res.Kernel)
	}
	if !strings.Contains(res.Kernel.Note, "interrupted") || !strings.Contains(res.Traceback, "KeyboardInterrupt") {
		t.Fatalf("result must say the cell was interrupted: note %q traceback %q", res.Kernel.Note, res.Traceback)
	}
	if n := r.env.Count("kill"); n != 0 {
		t.Fatalf("%d kill commands: an interrupted cell keeps its kernel", n)
	}
	cells := r.host.Cells()
	if last := cells[len(cells)-1]; last.Code != "while True: pass" || last.Interrupts == 0 || last.Status != "interrupted" {
		t.Fatalf("the host never got the interrupt: %+v", last)
	}
	if ks := r.eng.Kernels(); len(ks) != 1 || ks[0].ID != first.Kernel.ID {
		t.Fatalf("registry: %+v", ks)
	}
	if got := r.ev.of(engine.EventCellTimeout); len(got) != 1 {
		t.Fatalf("cell_timeout events: %+v", got)
	}
	// The state survived: the next call reuses the kernel.
	next := r.exec(engine.Request{Code: "x"})
	if !next.Kernel.Reused || next.Kernel.ID != first.Kernel.ID || next.Kernel.ExecutionCount != 3 {
		t.Fatalf("next call must reuse the kernel: %+v", *next.Kernel)
	}
}

func TestCellTimeoutIgnoredInterruptKillsKernel(t *testing.T) {
	cases := []struct {
		name  string
		setup func(r *rig)
	}{
		{"runner ignores the interrupt", func(r *rig) {
			r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
				return fakeenv.Outcome{Hang: true, IgnoreInterrupt: true}
			}
		}},
		{"host answers KD:PENDING forever", func(r *rig) {
			r.env.Prepend(fakeenv.On("cell", fakeenv.Pending(2*time.Millisecond)))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			tc.setup(r)
			res := r.exec(engine.Request{Code: "while True: pass", Timeout: 100 * time.Millisecond})
			if res.Status != "timeout" || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, phrase) {
				t.Fatalf("want timeout with state_lost: %+v %+v", res, *res.Kernel)
			}
			if ks := r.eng.Kernels(); len(ks) != 0 {
				t.Fatalf("registry must be empty: %+v", ks)
			}
			if got := r.killedPIDs(); !slices.Equal(got, []int{res.Kernel.PID}) {
				t.Fatalf("kill commands for %v, want [%d]", got, res.Kernel.PID)
			}
			// The interrupt came first: a cell command rang it before the kill.
			interruptAt, killAt := -1, -1
			for _, c := range r.env.Calls() {
				if a, err := fakeenv.ParseCell(c.Command); err == nil && a.Interrupt && interruptAt < 0 {
					interruptAt = c.Seq
				}
				if c.Marker == "kill" {
					killAt = c.Seq
				}
			}
			if interruptAt < 0 || interruptAt > killAt {
				t.Fatalf("interrupt at command %d, kill at %d: the engine must interrupt before it kills", interruptAt, killAt)
			}
			if got := r.ev.of(engine.EventStateLost); len(got) != 1 {
				t.Fatalf("state_lost events: %+v", got)
			}
		})
	}
}

// The operator's interrupt reaches the running cell; the kernel stays.
func TestInterruptRunningCell(t *testing.T) {
	r := newRig(t)
	r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
		return fakeenv.Outcome{Hang: req.Code == "time.sleep(1e9)"}
	}
	first := r.exec(engine.Request{Code: "x = 1"})
	done := make(chan *engine.Result, 1)
	go func() {
		res, _ := r.eng.Execute(context.Background(), engine.Request{Code: "time.sleep(1e9)"})
		done <- res
	}()
	eventually(t, "the cell to run", func() bool { return r.host.Runs("time.sleep(1e9)") == 1 })
	if err := r.eng.Interrupt(context.Background(), first.Kernel.ID); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res == nil || res.Status != "interrupted" || res.Kernel.StateLost {
		t.Fatalf("want interrupted with state kept: %+v", res)
	}
	if k := hostKernel(t, r.host, first.Kernel.ID); !slices.Contains(k.Rings, "int "+k.Cells[1]) {
		t.Fatalf("no interrupt rung for the running cell: %+v", k.Rings)
	}
	if n := r.env.Count("kill"); n != 0 || len(r.ev.of(engine.EventInterrupted)) != 1 {
		t.Fatalf("kills %d, interrupted events %+v", n, r.ev.of(engine.EventInterrupted))
	}
}

// ---- keying ----------------------------------------------------------------

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

func TestOwnerShutdownKillsOnlyThatOwner(t *testing.T) {
	r := newRig(t)
	a1 := r.exec(engine.Request{Owner: "owner-a", Task: "t1", Code: "1"})
	a2 := r.exec(engine.Request{Owner: "owner-a", Task: "t2", Code: "1"})
	b := r.exec(engine.Request{Owner: "owner-b", Task: "t1", Code: "1"})
	if n := r.eng.ShutdownOwner(context.Background(), "owner-a"); n != 2 {
		t.Fatalf("ShutdownOwner = %d, want 2", n)
	}
	if got := r.owners(); !slices.Equal(got, []string{"owner-b"}) {
		t.Fatalf("owners left %v", got)
	}
	killed := r.killedPIDs()
	slices.Sort(killed)
	want := []int{a1.Kernel.PID, a2.Kernel.PID}
	slices.Sort(want)
	if !slices.Equal(killed, want) {
		t.Fatalf("killed %v, want %v", killed, want)
	}
	if hostKernel(t, r.host, b.Kernel.ID).Killed {
		t.Fatal("owner-b's kernel was killed")
	}
	if got := r.ev.of(engine.EventOwnerShutdown); len(got) != 1 || got[0].Owner != "owner-a" {
		t.Fatalf("owner_shutdown events: %+v", got)
	}
	if again := r.exec(engine.Request{Owner: "owner-b", Task: "t1", Code: "1"}); !again.Kernel.Reused {
		t.Fatalf("owner-b's kernel must still be reusable: %+v", *again.Kernel)
	}
}

func TestCloseKillsEveryKernelUnlessKept(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			r := newRig(t)
			r.exec(engine.Request{Owner: "a", Code: "1"})
			r.exec(engine.Request{Owner: "b", Code: "1"})
			if err := r.eng.Close(context.Background(), keep); err != nil {
				t.Fatal(err)
			}
			want := 2
			if keep {
				want = 0
			}
			if n := r.env.Count("kill"); n != want {
				t.Fatalf("%d kill commands after Close(keep=%v), want %d", n, keep, want)
			}
			if _, err := r.eng.Execute(context.Background(), engine.Request{Code: "1"}); err == nil {
				t.Fatal("Execute after Close must fail")
			}
		})
	}
}

// ---- idle reap and cap -----------------------------------------------------

// A call for a different key reaps kernels idle longer than idle_exit on
// entry, without touching or reviving them; kernels idle less stay.
func TestIdleKernelReapedOnNextCall(t *testing.T) {
	r := newRig(t) // no background sweep: only the call can reap
	stale := r.exec(engine.Request{Owner: "stale", Code: "1"})
	r.clock.Advance(20 * time.Minute)
	recent := r.exec(engine.Request{Owner: "recent", Code: "1"})
	r.clock.Advance(11 * time.Minute) // stale idle 31m > 30m; recent idle 11m
	r.exec(engine.Request{Owner: "fresh", Code: "1"})

	if got := r.owners(); !slices.Equal(got, []string{"fresh", "recent"}) {
		t.Fatalf("owners %v, want [fresh recent]", got)
	}
	eventually(t, "the stale kernel's kill", func() bool { return len(r.killedPIDs()) == 1 })
	if got := r.killedPIDs(); got[0] != stale.Kernel.PID {
		t.Fatalf("killed %v, want the stale kernel %d", got, stale.Kernel.PID)
	}
	if got := r.ev.of(engine.EventReapedIdle); len(got) != 1 || got[0].Owner != "stale" {
		t.Fatalf("reaped_idle events: %+v", got)
	}
	if k := hostKernel(t, r.host, stale.Kernel.ID); len(k.Cells) != 1 {
		t.Fatalf("the stale kernel was touched again: cells %v", k.Cells)
	}
	if hostKernel(t, r.host, recent.Kernel.ID).Killed {
		t.Fatal("a kernel idle less than idle_exit was killed")
	}
}

// The reap skips its scan while nothing can be idle long enough, and never
// misses a kernel because of it: each kernel goes exactly when it passes
// idle_exit, in turn, whatever the calls in between.
func TestIdleReapInTurnAcrossSkippedScans(t *testing.T) {
	r := newRig(t)
	r.exec(engine.Request{Owner: "first", Code: "1"})
	r.clock.Advance(10 * time.Minute)
	r.exec(engine.Request{Owner: "second", Code: "1"})
	for _, step := range []struct {
		advance time.Duration
		want    []string
	}{
		{15 * time.Minute, []string{"first", "probe", "second"}}, // first idle 25m
		{6 * time.Minute, []string{"probe", "second"}},           // first 31m: reaped
		{4 * time.Minute, []string{"probe", "second"}},           // second 25m
		{6 * time.Minute, []string{"probe"}},                     // second 31m: reaped
	} {
		r.clock.Advance(step.advance)
		r.exec(engine.Request{Owner: "probe", Code: "1"})
		if got := r.owners(); !slices.Equal(got, step.want) {
			t.Fatalf("owners %v, want %v", got, step.want)
		}
	}
	if got := r.ev.of(engine.EventReapedIdle); len(got) != 2 || got[0].Owner != "first" || got[1].Owner != "second" {
		t.Fatalf("reaped_idle events: %+v", got)
	}
}

// A call whose own kernel passed idle_exit gets a fresh kernel, and the
// result says the old state is gone instead of looking like a first call.
func TestOwnIdleKernelReapedSaysStateLost(t *testing.T) {
	r := newRig(t)
	old := r.exec(engine.Request{Owner: "me", Code: "x = 1"})
	r.clock.Advance(31 * time.Minute)
	res := r.exec(engine.Request{Owner: "me", Code: "x"})
	if res.Kernel.ID == old.Kernel.ID || res.Kernel.Reused || !res.Kernel.StateLost {
		t.Fatalf("a reaped kernel's successor: %+v", res.Kernel)
	}
	if !strings.Contains(res.Kernel.Note, old.Kernel.ID) || !strings.Contains(res.Kernel.Note, "idle") ||
		!strings.Contains(res.Kernel.Note, "state from earlier calls was lost") {
		t.Fatalf("note %q does not say the kernel was reaped after idle", res.Kernel.Note)
	}
}

// The background sweep reaps an idle kernel without any call.
func TestBackgroundSweepReapsIdleKernel(t *testing.T) {
	r := newRig(t, func(c *engine.Config) { c.SweepEvery = 5 * time.Millisecond })
	res := r.exec(engine.Request{Code: "1"})
	r.clock.Advance(31 * time.Minute)
	eventually(t, "the sweep to reap", func() bool { return len(r.eng.Kernels()) == 0 })
	eventually(t, "the kill", func() bool { return slices.Equal(r.killedPIDs(), []int{res.Kernel.PID}) })
	if got := r.ev.of(engine.EventReapedIdle); len(got) != 1 {
		t.Fatalf("reaped_idle events: %+v", got)
	}
}

// Over the cap, the least recently used kernel is evicted.
func TestCapEvictsLeastRecentlyUsed(t *testing.T) {
	cases := []struct {
		calls   []string
		evicted string
		left    []string
	}{
		{[]string{"owner-0", "owner-1", "owner-2"}, "owner-0", []string{"owner-1", "owner-2"}},
		{[]string{"owner-0", "owner-1", "owner-0", "owner-2"}, "owner-1", []string{"owner-0", "owner-2"}},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.calls, ","), func(t *testing.T) {
			r := newRig(t, func(c *engine.Config) { c.MaxKernels = 2 })
			pids := map[string]int{}
			for _, owner := range tc.calls {
				pids[owner] = r.exec(engine.Request{Owner: owner, Code: "1"}).Kernel.PID
				r.clock.Advance(time.Second)
			}
			if got := r.owners(); !slices.Equal(got, tc.left) {
				t.Fatalf("owners %v, want %v", got, tc.left)
			}
			got := r.ev.of(engine.EventEvictedCap)
			if len(got) != 1 || got[0].Owner != tc.evicted {
				t.Fatalf("evicted_cap events %+v, want one for %s", got, tc.evicted)
			}
			eventually(t, "the evicted kernel's kill", func() bool { return len(r.killedPIDs()) == 1 })
			if k := r.killedPIDs(); k[0] != pids[tc.evicted] {
				t.Fatalf("killed %v, want %s's pid %d", k, tc.evicted, pids[tc.evicted])
			}
		})
	}
}

// A kernel with a running cell is never evicted, even when it is the least
// recently used: while every kernel is attached the registry stays over the
// cap and says so; the first kernel to settle is the one evicted, never the
// busy one.
func TestBusyKernelNeverEvicted(t *testing.T) {
	r := newRig(t, func(c *engine.Config) { c.MaxKernels = 1 })
	busyGate, settledGate := fakeenv.NewGate(), fakeenv.NewGate()
	r.env.Prepend(
		fakeenv.On("cell", busyGate.Wrap(r.host.Cell)).If(fakeenv.StdinContains("busy()")).Once(),
		fakeenv.On("cell", settledGate.Wrap(r.host.Cell)).If(fakeenv.StdinContains("settle()")).Once(),
	)
	var wg sync.WaitGroup
	var busy, settled *engine.Result
	t.Cleanup(func() { busyGate.Open(); settledGate.Open(); wg.Wait() })

	wg.Go(func() { busy, _ = r.eng.Execute(context.Background(), engine.Request{Owner: "busy", Code: "busy()"}) })
	entered := <-busyGate.Entered()
	a, err := fakeenv.ParseCell(entered.Command)
	if err != nil {
		t.Fatal(err)
	}
	busyID, busyPID := filepath.Base(a.Dir), a.PID
	r.clock.Advance(time.Second)

	// A second kernel while the first is mid-cell: nothing can be evicted.
	wg.Go(func() {
		settled, _ = r.eng.Execute(context.Background(), engine.Request{Owner: "settled", Code: "settle()"})
	})
	<-settledGate.Entered()
	ks := r.eng.Kernels()
	if len(ks) != 2 || !ks[0].Attached || !ks[1].Attached {
		t.Fatalf("want both kernels attached, over the cap of 1: %+v", ks)
	}
	skipped := r.ev.of(engine.EventEvictSkippedBusy)
	if len(skipped) != 1 || !strings.Contains(skipped[0].Detail, busyID) {
		t.Fatalf("evict_skipped_busy events %+v, want one naming %s", skipped, busyID)
	}
	if got := r.ev.of(engine.EventEvictedCap); len(got) != 0 || r.env.Count("kill") != 0 {
		t.Fatalf("evicted while every kernel was busy: %+v, %d kills", got, r.env.Count("kill"))
	}

	// The second kernel settles first: it goes, the older busy one stays.
	r.clock.Advance(time.Second)
	settledGate.Open()
	eventually(t, "the settled call", func() bool {
		ev := r.ev.of(engine.EventEvictedCap)
		return len(ev) == 1
	})
	if got := r.ev.of(engine.EventEvictedCap); got[0].Owner != "settled" {
		t.Fatalf("evicted %+v, want the settled kernel", got)
	}
	if got := r.owners(); !slices.Equal(got, []string{"busy"}) {
		t.Fatalf("owners %v, want [busy]", got)
	}
	eventually(t, "the settled kernel's kill", func() bool { return len(r.killedPIDs()) == 1 })

	r.clock.Advance(time.Second)
	busyGate.Open()
	wg.Wait()
	if busy == nil || busy.Status != "success" || busy.Kernel.StateLost || settled == nil || settled.Status != "success" {
		t.Fatalf("busy call %+v, settled call %+v", busy, settled)
	}
	if got := r.killedPIDs(); got[0] != settled.Kernel.PID || slices.Contains(got, busyPID) {
		t.Fatalf("killed %v: want only the settled kernel %d, never the busy %d", got, settled.Kernel.PID, busyPID)
	}
	if got := r.owners(); !slices.Equal(got, []string{"busy"}) {
		t.Fatalf("owners %v, want [busy]", got)
	}
}

// ---- serialization and snapshots -------------------------------------------

// Concurrent calls for one key run one at a time, in arrival order.
func TestCellsOnOneKernelAreFIFO(t *testing.T) {
	r := newRig(t)
	r.exec(engine.Request{Code: "warm = 1"})
	gate := fakeenv.NewGate()
	r.env.Prepend(fakeenv.On("cell", gate.Wrap(r.host.Cell)).If(fakeenv.StdinContains("fifo-0")).Once())

	const n = 5
	results := make([]*engine.Result, n)
	var wg sync.WaitGroup
	t.Cleanup(func() { gate.Open(); wg.Wait() })
	for i := range n {
		wg.Go(func() {
			results[i], _ = r.eng.Execute(context.Background(), engine.Request{Code: fmt.Sprintf("fifo-%d", i)})
		})
		if i == 0 {
			<-gate.Entered()
			continue
		}
		// Call i arrives only after call i-1 is queued.
		eventually(t, fmt.Sprintf("call %d to queue", i), func() bool {
			ks := r.eng.Kernels()
			return len(ks) == 1 && ks[0].Queued == i
		})
	}
	gate.Open()
	wg.Wait()

	want := []string{"warm = 1"}
	for i := range n {
		want = append(want, fmt.Sprintf("fifo-%d", i))
		if results[i] == nil || results[i].Status != "success" || results[i].Kernel.ExecutionCount != i+2 {
			t.Fatalf("call %d: %+v", i, results[i])
		}
	}
	if got := r.publishedCodes(); !slices.Equal(got, want) {
		t.Fatalf("cells published in order %v, want %v", got, want)
	}
	cells := r.env.CallsOf("cell")
	for i, a := range cells {
		for _, b := range cells[i+1:] {
			if a.Overlaps(b) {
				t.Fatalf("cell commands %d and %d overlapped", a.Seq, b.Seq)
			}
		}
	}
}

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

// Once a cell's request may have reached the host, its code never runs a
// second time: a retry after a transport error reuses the same cell id (the
// runner dedups it) and never respawns; a kernel found gone or dead after a
// possibly published cell is state lost, not a re-run.
func TestExactlyOnceAfterTransportErrors(t *testing.T) {
	const code = "charge_card()"
	cases := []struct {
		name      string
		fault     func(r *rig) fakeenv.HandlerFunc
		status    string
		stateLost bool
		spawns    int
		runs      int
	}{
		{"answer lost after publish, retry finds the result", func(r *rig) fakeenv.HandlerFunc {
			return fakeenv.AnswerLost(r.host.Cell)
		}, "success", false, 1, 1},
		{"request never reached the host, retry publishes", func(r *rig) fakeenv.HandlerFunc {
			return fakeenv.TransportError("broken pipe")
		}, "success", false, 1, 1},
		{"answer lost, then the kernel dir is gone (KD:GONE)", func(r *rig) fakeenv.HandlerFunc {
			return func(ctx context.Context, c fakeenv.Call) (backends.Result, error) {
				a, _ := fakeenv.ParseCell(c.Command)
				fakeenv.AnswerLost(r.host.Cell)(ctx, c)
				r.host.RemoveDir(a.PID)
				return backends.Result{}, fakeenv.ErrTransport
			}
		}, "error", true, 1, 1},
		{"answer lost, then the runner dies (KD:LOST)", func(r *rig) fakeenv.HandlerFunc {
			return func(ctx context.Context, c fakeenv.Call) (backends.Result, error) {
				a, _ := fakeenv.ParseCell(c.Command)
				r.host.OnCell = func(fakeenv.CellRequest) fakeenv.Outcome { return fakeenv.Outcome{Hang: true} }
				r.host.Cell(ctx, c)
				r.host.Crash(a.PID)
				return backends.Result{}, fakeenv.ErrTransport
			}
		}, "error", true, 1, 1},
		{"request never arrived and the runner is dead (KD:DEAD): respawn is safe", func(r *rig) fakeenv.HandlerFunc {
			return func(ctx context.Context, c fakeenv.Call) (backends.Result, error) {
				a, _ := fakeenv.ParseCell(c.Command)
				r.host.Crash(a.PID)
				return backends.Result{}, fakeenv.ErrTransport
			}
		}, "success", true, 2, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.exec(engine.Request{Code: "warm = 1"})
			r.env.Prepend(fakeenv.On("cell", tc.fault(r)).If(fakeenv.StdinContains(code)).Once())
			res := r.exec(engine.Request{Code: code})
			if string(res.Status) != tc.status || res.Kernel.StateLost != tc.stateLost {
				t.Fatalf("got status %s state_lost %v (%+v), want %s %v", res.Status, res.Kernel.StateLost, *res.Kernel, tc.status, tc.stateLost)
			}
			if tc.stateLost && !strings.Contains(res.Kernel.Note, phrase) {
				t.Fatalf("note %q lacks %q", res.Kernel.Note, phrase)
			}
			if n := r.host.Runs(code); n != tc.runs {
				t.Fatalf("the cell ran %d times on the host, want %d", n, tc.runs)
			}
			if n := r.env.Count("spawn"); n != tc.spawns {
				t.Fatalf("%d spawns, want %d", n, tc.spawns)
			}
			// Every retry of the cell used the same cell id.
			ids := map[string]bool{}
			for _, c := range r.env.CallsOf("cell")[1:] {
				a, _ := fakeenv.ParseCell(c.Command)
				ids[a.ID] = true
			}
			if len(ids) != 1 {
				t.Fatalf("the cell was sent under %d ids: %v", len(ids), ids)
			}
			if len(r.ev.of(engine.EventTransportError)) == 0 {
				t.Fatal("no transport_error event")
			}
			// The host answered again after the error: the operator sees the recovery.
			if len(r.ev.of(engine.EventReconnected)) == 0 {
				t.Fatal("no reconnected event after the host answered again")
			}
		})
	}
}

// ---- tool calls over plain Execute -----------------------------------------

// fakeEchoTools returns a registry with one tool, echo, which returns its
// argument x, and the x of every call it ran, in order.
func fakeEchoTools(t *testing.T) (*hosttools.Registry, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var ran []string
	reg := hosttools.NewRegistry()
	err := reg.Register(hosttools.Tool{Name: "echo", Description: "Return x.",
		Params: hosttools.Schema{{Name: "x", Type: hosttools.TypeInt, Required: true}},
		Handler: func(_ context.Context, call hosttools.Call) (hosttools.Result, error) {
			mu.Lock()
			ran = append(ran, string(call.Args["x"]))
			mu.Unlock()
			return hosttools.Result{Value: json.RawMessage(call.Args["x"])}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return reg, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(ran)
	}
}

func fakeToolsAllowed(reg *hosttools.Registry) func(*engine.Config) {
	return func(c *engine.Config) {
		c.Tools = reg
		c.Approvals = engine.Approvals{Default: engine.PolicyAllow}
	}
}

// answerLines returns the answer lines on a cell command's stdin by seq.
func answerLines(t *testing.T, c fakeenv.Call) map[int64]string {
	t.Helper()
	a, err := fakeenv.ParseCell(c.Command)
	if err != nil || !a.Answers || a.Publish {
		t.Fatalf("cell command %d is not an answering one (%+v, %v)", c.Seq, a, err)
	}
	lines, err := fakeenv.ParseAnswers(c.Stdin)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]string{}
	for _, l := range lines {
		out[l.Seq] = l.JSON
	}
	return out
}

// Without the stream fast path, a cell's tool calls ride on its cell
// commands: each forwards the pending requests (KD:RPC ... KD:RPCWAIT) and
// the next one carries their answers (ans=1) and goes on waiting. A cell
// that makes two calls, one after the other, costs exactly two cell
// commands more than one that makes none.
func TestToolCallsOverExecute(t *testing.T) {
	reg, ran := fakeEchoTools(t)
	r := newRig(t, fakeToolsAllowed(reg))
	r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
		if req.Code != "two_calls()" {
			return fakeenv.Outcome{}
		}
		return fakeenv.Outcome{Stdout: "done\n", Calls: []fakeenv.ToolCall{
			{Tool: "echo", Args: map[string]int{"x": 1}},
			{Tool: "echo", Args: map[string]int{"x": 2}},
		}}
	}
	tools := []string{"echo"}
	r.exec(engine.Request{Code: "warm = 1", Tools: tools})
	if n := r.env.Count("cell"); n != 1 {
		t.Fatalf("a cell without tool calls took %d cell commands, want 1", n)
	}
	res := r.exec(engine.Request{Code: "two_calls()", Tools: tools})
	if res.Status != "success" || res.Stdout != "done\n" || res.ToolCallsMade != 2 || !res.Kernel.Reused {
		t.Fatalf("want success after two tool calls: %+v %+v", res, res.Kernel)
	}
	if got := ran(); !slices.Equal(got, []string{"1", "2"}) {
		t.Fatalf("the tool ran for x = %v, want [1 2]", got)
	}
	cells := r.env.CallsOf("cell")[1:]
	if len(cells) != 3 {
		t.Fatalf("%d cell commands for a cell with 2 tool calls, want 3 (1 + one per call)", len(cells))
	}
	first, err := fakeenv.ParseCell(cells[0].Command)
	if err != nil || !first.Publish || first.Answers {
		t.Fatalf("the first cell command must publish: %+v %v", first, err)
	}
	var req struct{ Timeout float64 }
	if err := json.Unmarshal(cells[0].Stdin, &req); err != nil || req.Timeout <= 0 || req.Timeout > r.cfg.CellTimeout.Seconds() {
		t.Fatalf("the cell request must carry the cell's timeout: %q", cells[0].Stdin)
	}
	for i, want := range []string{`{"ok":true,"value":1}`, `{"ok":true,"value":2}`} {
		c := cells[i+1]
		a, _ := fakeenv.ParseCell(c.Command)
		if a.ID != first.ID {
			t.Fatalf("cell command %d for cell %s, want %s", c.Seq, a.ID, first.ID)
		}
		if got := answerLines(t, c); len(got) != 1 || got[int64(i+1)] != want {
			t.Fatalf("answers on cell command %d: %v, want seq %d = %s", c.Seq, got, i+1, want)
		}
		if !strings.Contains(cells[i].Result.Output, "KD:RPCWAIT") {
			t.Fatalf("cell command %d answered %q, want forwarded requests", cells[i].Seq, cells[i].Result.Output)
		}
	}
	recs := r.host.Cells()
	if last := recs[len(recs)-1]; last.Requests != 2 || len(last.Answers) != 2 || last.Answers[0].Seq != 1 || last.Answers[1].Seq != 2 {
		t.Fatalf("the host saw %+v, want two requests, each answered once", last)
	}
	if got := r.ev.of(engine.EventRPCCall); len(got) != 2 || len(r.ev.of(engine.EventRPCRejected)) != 0 {
		t.Fatalf("rpc_call events %+v, rpc_rejected %+v", got, r.ev.of(engine.EventRPCRejected))
	}
}

// A tool call runs at most once. When the reply to the cell command that
// carried its answer is lost (the host wrote the answer), the engine sends
// the answer again, which the runner drops; the tool does not run again.
// A replayed request file (a seq already handled) is refused and gets no
// answer, while the cell's other request in the same round trip is served.
func TestToolCallRunsAtMostOnce(t *testing.T) {
	t.Run("answer's reply lost", func(t *testing.T) {
		reg, ran := fakeEchoTools(t)
		r := newRig(t, fakeToolsAllowed(reg))
		r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
			return fakeenv.Outcome{Stdout: "done\n", Calls: []fakeenv.ToolCall{{Tool: "echo", Args: map[string]int{"x": 7}}}}
		}
		r.env.Prepend(fakeenv.On("cell", fakeenv.AnswerLost(r.host.Cell)).If(fakeenv.Answering).Once())
		res := r.exec(engine.Request{Code: "one_call()", Tools: []string{"echo"}})
		if res.Status != "success" || res.Stdout != "done\n" || res.ToolCallsMade != 1 {
			t.Fatalf("want success: %+v", res)
		}
		if got := ran(); !slices.Equal(got, []string{"7"}) {
			t.Fatalf("the tool ran for x = %v, want [7] once", got)
		}
		var answering []fakeenv.Call
		for _, c := range r.env.CallsOf("cell") {
			if fakeenv.Answering(c) {
				answering = append(answering, c)
			}
		}
		if len(answering) != 2 || answering[0].Err == nil || !bytes.Equal(answering[0].Stdin, answering[1].Stdin) {
			t.Fatalf("want the lost answer sent again, byte for byte: %+v", answering)
		}
		k := r.host.Kernels()[0]
		if len(k.Answers) != 2 || r.host.Cells()[0].Requests != 1 || len(r.host.Cells()[0].Answers) != 1 {
			t.Fatalf("host: answers written %+v, cell %+v", k.Answers, r.host.Cells()[0])
		}
		if len(r.ev.of(engine.EventTransportError)) != 1 {
			t.Fatal("the fault was never hit; the test proves nothing")
		}
	})

	t.Run("replayed request", func(t *testing.T) {
		reg, ran := fakeEchoTools(t)
		r := newRig(t, fakeToolsAllowed(reg))
		r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
			return fakeenv.Outcome{Stdout: "done\n", Calls: []fakeenv.ToolCall{
				{Tool: "echo", Args: map[string]int{"x": 1}},
				{Seq: 1, Tool: "echo", Args: map[string]int{"x": 1}, NoWait: true}, // the same request again
				{Tool: "echo", Args: map[string]int{"x": 2}},
			}}
		}
		res := r.exec(engine.Request{Code: "calls()", Tools: []string{"echo"}})
		if res.Status != "success" || res.ToolCallsMade != 2 {
			t.Fatalf("want success with 2 calls made: %+v", res)
		}
		if got := ran(); !slices.Equal(got, []string{"1", "2"}) {
			t.Fatalf("the tool ran for x = %v, want [1 2]", got)
		}
		k := r.host.Kernels()[0]
		if len(k.Forwarded) != 3 {
			t.Fatalf("forwarded %v, want 3 request files", k.Forwarded)
		}
		// The replay and the second call were forwarded together; the answers
		// that followed are for the second call only.
		cells := r.env.CallsOf("cell")
		if len(cells) != 3 || !strings.Contains(cells[1].Result.Output, "KD:RPC 1.req") || !strings.Contains(cells[1].Result.Output, "KD:RPC 2.req") {
			t.Fatalf("cell commands %d; second answered %q", len(cells), cells[1].Result.Output)
		}
		if got := answerLines(t, cells[2]); len(got) != 1 || got[2] != `{"ok":true,"value":2}` {
			t.Fatalf("answers %v, want only seq 2", got)
		}
		rej := r.ev.of(engine.EventRPCRejected)
		if len(rej) != 1 || !strings.Contains(rej[0].Detail, "duplicate seq 1") {
			t.Fatalf("rpc_rejected events %+v, want one for the duplicate seq", rej)
		}
	})
}

// ---- lockdown --------------------------------------------------------------

var tokenLine = regexp.MustCompile(`(?m)^KERNELDECK_RPC_TOKEN=([0-9a-f]{64})$`)

// The RPC token reaches the host only in the env file on spawn's stdin: never
// in a command string, an event or a result. Tool calls bring it back from
// the host (in each request); it goes no further: not into the answers, a
// refusal, or the quote of a host answer the engine could not make sense of.
func TestLockdownTokenNeverInCommands(t *testing.T) {
	reg, _ := fakeEchoTools(t)
	r := newRig(t, fakeToolsAllowed(reg))
	r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
		out := fakeenv.Outcome{Hang: req.Code == "hang()", Stdout: "ok\n"}
		if req.Code == "3" {
			out.Calls = []fakeenv.ToolCall{
				// Authenticated (the kernel's own token) but refused: it names
				// another cell. Its token must not leak into the refusal.
				{Tool: "echo", Args: map[string]int{"x": 4}, Cell: "c-earlier", NoWait: true},
				{Tool: "echo", Args: map[string]int{"x": 3}},
			}
		}
		if req.Code == "5" {
			out.Calls = []fakeenv.ToolCall{{Tool: "echo", Args: map[string]int{"x": 5}}}
		}
		return out
	}
	var results []*engine.Result
	results = append(results, r.exec(engine.Request{Owner: "a", Code: "1", Tools: []string{"read_file"}}))
	results = append(results, r.exec(engine.Request{Owner: "a", Code: "hang()", Tools: []string{"read_file"}, Timeout: 50 * time.Millisecond}))
	results = append(results, r.exec(engine.Request{Owner: "a", Code: "2", Tools: []string{"read_file"}, Reset: true}))
	results = append(results, r.exec(engine.Request{Owner: "b", Code: "3", Tools: []string{"echo"}}))
	r.env.Prepend(fakeenv.On("spawn", fakeenv.SpawnFailed("cannot create kernel dir")).Once())
	results = append(results, r.exec(engine.Request{Owner: "c", Code: "4"}))
	// The answer to b's next cell command is cut off after a forwarded
	// request (no KD:RPCWAIT): the engine gives the kernel up and quotes
	// what the host said.
	r.env.Prepend(fakeenv.On("cell", func(ctx context.Context, c fakeenv.Call) (backends.Result, error) {
		res, err := r.host.Cell(ctx, c)
		res.Output = strings.Replace(res.Output, "KD:RPCWAIT\n", "", 1)
		return res, err
	}).If(fakeenv.StdinContains(`"code":"5"`)).Once())
	results = append(results, r.exec(engine.Request{Owner: "b", Code: "5", Tools: []string{"echo"}}))
	r.eng.ShutdownOwner(context.Background(), "a")

	var tokens []string
	for _, c := range r.env.CallsOf("spawn") {
		a, err := fakeenv.ParseSpawn(c.Command, c.Stdin)
		if err != nil {
			t.Fatal(err)
		}
		m := tokenLine.FindStringSubmatch(string(a.EnvFile))
		if m == nil {
			t.Fatalf("spawn stdin env file has no token: %q", a.EnvFile)
		}
		tokens = append(tokens, m[1])
		if strings.Contains(c.Command, "KERNELDECK_RPC_TOKEN") {
			t.Fatal("the spawn command names the token variable itself")
		}
	}
	// Five spawns: a, a after the reset, b, c's failed one, and the
	// transient kernel of c's per-call run (the per-call run used to be one
	// "once" command, without a spawn of its own).
	if len(tokens) != 5 || len(slices.Compact(slices.Sorted(slices.Values(tokens)))) != 5 {
		t.Fatalf("want 5 spawns with distinct tokens, got %v", tokens)
	}
	if len(r.env.CallsOf("kill")) == 0 || len(r.host.PerCallCells()) != 1 || !slices.ContainsFunc(r.env.CallsOf("spawn"), fakeenv.Transient) {
		t.Fatal("the scenario must cover kill and a per-call run in a transient kernel")
	}
	if results[3].ToolCallsMade != 1 || !slices.ContainsFunc(r.env.CallsOf("cell"), fakeenv.Answering) ||
		len(r.ev.of(engine.EventRPCCall)) != 1 || len(r.ev.of(engine.EventRPCRejected)) != 1 {
		t.Fatalf("the scenario must cover a served and a refused tool call: %+v, %d rpc_call, %d rpc_rejected",
			results[3], len(r.ev.of(engine.EventRPCCall)), len(r.ev.of(engine.EventRPCRejected)))
	}
	if bk := hostKernel(t, r.host, results[3].Kernel.ID); !slices.ContainsFunc(r.env.CallsOf("cell"), func(c fakeenv.Call) bool {
		return strings.Contains(c.Result.Output, bk.Token) && !strings.Contains(c.Result.Output, "KD:RPCWAIT")
	}) {
		t.Fatal("no cut-off answer brought the token back from the host; the test proves nothing about it")
	}
	if res := results[5]; res.Kernel == nil || !res.Kernel.StateLost || !strings.Contains(res.Traceback, "unexpected answer from the host") {
		t.Fatalf("the cut-off answer must lose the kernel with a quote of the host: %+v", res)
	}
	for _, tok := range tokens {
		for _, c := range r.env.Calls() {
			if strings.Contains(c.Command, tok) {
				t.Fatalf("token in the %s command line (seq %d)", c.Marker, c.Seq)
			}
			if c.Marker != "spawn" && bytes.Contains(c.Stdin, []byte(tok)) {
				t.Fatalf("token on the stdin of a %s command", c.Marker)
			}
		}
		for _, ev := range r.ev.all() {
			if strings.Contains(fmt.Sprintf("%+v", ev), tok) {
				t.Fatalf("token in event %+v", ev)
			}
		}
		for _, res := range results {
			if strings.Contains(fmt.Sprintf("%+v %+v", res, res.Kernel), tok) {
				t.Fatalf("token in a result: %+v", res)
			}
		}
	}
}

// The recorded spawn command, replayed through a real bash with the recorded
// stdin under a private temp dir, refuses a symlinked kernel root (nothing
// written, named in the error), repairs a permissive one, and otherwise
// yields 0700 dirs and 0600 files, a runner that got the token from the
// sourced env file (then deleted) and never on its argv.
func TestLockdownSpawnReplayRealBash(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the replay checks /proc and GNU stat")
	}
	for _, tool := range []string{"bash", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not on PATH", tool)
		}
	}
	tmp := t.TempDir()
	r := newRig(t)
	r.env.SetTempDir(tmp)
	res := r.exec(engine.Request{Code: "1", Tools: []string{"read_file"}})
	spawns := r.env.CallsOf("spawn")
	if len(spawns) != 1 {
		t.Fatalf("%d spawns", len(spawns))
	}
	spawn := spawns[0]
	args, err := fakeenv.ParseSpawn(spawn.Command, spawn.Stdin)
	if err != nil {
		t.Fatal(err)
	}
	token := tokenLine.FindStringSubmatch(string(args.EnvFile))[1]
	if filepath.Base(res.Kernel.Dir) != args.ID {
		t.Fatalf("kernel dir %s does not end in the spawned id %s", res.Kernel.Dir, args.ID)
	}

	login, err := exec.Command("id", "-un").Output()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(tmp, "kerneldeck-"+strings.TrimSpace(string(login)))
	kd := filepath.Join(root, args.ID)

	replay := func() (string, int) {
		t.Helper()
		return replayBash(t, spawn)
	}

	// A symlinked kernel root fails closed: nothing is written or changed
	// through it.
	elsewhere := t.TempDir()
	if err := os.Chmod(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, root); err != nil {
		t.Fatal(err)
	}
	out, rc := replay()
	if rc == 0 || !strings.Contains(out, "KD:ERR") || !strings.Contains(out, root) || strings.Contains(out, "KD:SPAWNED") {
		t.Fatalf("symlinked root must fail closed naming %s: rc %d, %q", root, rc, out)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("files were written through the symlink: %v", entries)
	}
	if st, err := os.Stat(elsewhere); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("the symlink's target was changed through it: %v %v", st.Mode(), err)
	}

	// A world-writable existing root is locked down.
	os.Remove(root)
	if err := os.Mkdir(root, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(root, 0o777)

	out, rc = replay()
	m := regexp.MustCompile(`(?m)^KD:SPAWNED (\d+) (\S+)`).FindStringSubmatch(out)
	if rc != 0 || m == nil {
		t.Fatalf("replayed spawn failed: rc %d, %q", rc, out)
	}
	var pid int
	fmt.Sscan(m[1], &pid)
	t.Cleanup(func() { killRunner(t, pid) })
	if m[2] != kd {
		t.Fatalf("spawned in %s, want %s", m[2], kd)
	}

	for _, d := range []string{root, kd, kd + "/cells", kd + "/rpc"} {
		st, err := os.Lstat(d)
		if err != nil {
			t.Fatal(err)
		}
		if !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, want a 0700 directory", d, st.Mode())
		}
	}
	var files []string
	filepath.WalkDir(kd, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files = append(files, filepath.Base(p))
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, st.Mode().Perm())
		}
		return nil
	})
	for _, want := range []string{"runner.py", "kerneldeck_tools.py", "runner.log"} {
		if !slices.Contains(files, want) {
			t.Errorf("%s missing from %s (have %v)", want, kd, files)
		}
	}
	if slices.Contains(files, "kernel.env") {
		t.Error("kernel.env (with the token) was left on disk after sourcing")
	}
	tools, _ := os.ReadFile(kd + "/kerneldeck_tools.py")
	if !bytes.Equal(tools, args.Tools) || !bytes.Contains(tools, []byte("def read_file(")) {
		t.Error("kerneldeck_tools.py is not the shipped stub module")
	}

	// The sourced env reached the runner; its argv never held the token.
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(environ, []byte("KERNELDECK_RPC_TOKEN="+token)) {
		t.Error("the runner did not start with the token from the sourced env file")
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if bytes.Contains(cmdline, []byte(token)) || len(cmdline) == 0 {
		t.Errorf("runner argv %q", cmdline)
	}

	killRunner(t, pid)
}

// replayBash runs a recorded command through a real bash with its recorded
// stdin and returns its output and exit code; what it started is killed at
// cleanup.
func replayBash(t *testing.T, c fakeenv.Call) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", c.Command)
	cmd.Stdin = bytes.NewReader(c.Stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	err = cmd.Wait()
	rc := 0
	if err != nil {
		rc = cmd.ProcessState.ExitCode()
	}
	return out.String(), rc
}

// The transient (per-call) kernel's spawn, replayed through a real bash:
// its dir is <TempDir>/kerneldeck-once-<id>, outside any kernel root.
// Anything already at that path (here a planted symlink) fails it closed
// with nothing written through it; otherwise it yields 0700 dirs, 0600
// files and a runner with the token in its environment only.
func TestLockdownTransientSpawnReplayRealBash(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the replay checks /proc and GNU stat")
	}
	for _, tool := range []string{"bash", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not on PATH", tool)
		}
	}
	tmp := t.TempDir()
	r := newRig(t)
	r.env.SetTempDir(tmp)
	r.env.Prepend(fakeenv.On("spawn", fakeenv.SpawnFailed("kernel root unusable")).If(fakeenv.Not(fakeenv.Transient)))
	if res := r.exec(engine.Request{Code: "1", Tools: []string{"read_file"}}); res.Fallback != "per_call" {
		t.Fatalf("want the per-call fallback: %+v", res)
	}
	i := slices.IndexFunc(r.env.CallsOf("spawn"), fakeenv.Transient)
	if i < 0 {
		t.Fatal("no transient spawn recorded")
	}
	spawn := r.env.CallsOf("spawn")[i]
	args, err := fakeenv.ParseSpawn(spawn.Command, spawn.Stdin)
	if err != nil {
		t.Fatal(err)
	}
	token := tokenLine.FindStringSubmatch(string(args.EnvFile))[1]
	kd := args.Dir("")
	if kd != filepath.Join(tmp, "kerneldeck-once-"+args.ID) {
		t.Fatalf("transient dir %s", kd)
	}

	// Something planted at the path fails closed, naming it.
	elsewhere := t.TempDir()
	if err := os.Chmod(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, kd); err != nil {
		t.Fatal(err)
	}
	spawned := regexp.MustCompile(`(?m)^KD:SPAWNED (\d+) (\S+)`)
	out, rc := replayBash(t, spawn)
	if m := spawned.FindStringSubmatch(out); m != nil {
		var pid int
		fmt.Sscan(m[1], &pid)
		t.Cleanup(func() { killRunner(t, pid) }) // it runs in its own session
	}
	if rc == 0 || !strings.Contains(out, "KD:ERR") || !strings.Contains(out, kd) || strings.Contains(out, "KD:SPAWNED") {
		t.Fatalf("a planted symlink must fail closed naming %s: rc %d, %q", kd, rc, out)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("files were written through the symlink: %v", entries)
	}
	if st, err := os.Stat(elsewhere); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("the symlink's target was changed through it: %v %v", st.Mode(), err)
	}
	os.Remove(kd)

	out, rc = replayBash(t, spawn)
	m := spawned.FindStringSubmatch(out)
	if rc != 0 || m == nil {
		t.Fatalf("replayed spawn failed: rc %d, %q", rc, out)
	}
	var pid int
	fmt.Sscan(m[1], &pid)
	t.Cleanup(func() { killRunner(t, pid) })
	if m[2] != kd {
		t.Fatalf("spawned in %s, want %s", m[2], kd)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 1 {
		t.Fatalf("the temp dir holds %v, want only the transient dir (no kernel root)", entries)
	}
	for _, d := range []string{kd, kd + "/cells", kd + "/rpc"} {
		if st, err := os.Lstat(d); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want a 0700 directory", d, st.Mode(), err)
		}
	}
	filepath.WalkDir(kd, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if st, err := os.Lstat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, st.Mode().Perm())
		}
		if d.Name() == "kernel.env" {
			t.Error("kernel.env (with the token) was left on disk after sourcing")
		}
		return nil
	})
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(environ, []byte("KERNELDECK_RPC_TOKEN="+token)) {
		t.Error("the runner did not start with the token from the sourced env file")
	}
	if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); bytes.Contains(cmdline, []byte(token)) || len(cmdline) == 0 {
		t.Errorf("runner argv %q", cmdline)
	}
	killRunner(t, pid)
}

// killRunner kills the runner's process group (it runs in its own session)
// and waits until it is gone or a zombie.
func killRunner(t *testing.T, pid int) {
	t.Helper()
	syscall.Kill(-pid, syscall.SIGKILL)
	syscall.Kill(pid, syscall.SIGKILL)
	eventually(t, fmt.Sprintf("runner %d to die", pid), func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		// Fields after the ")" that ends the command name: state first.
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		return len(rest) > 1 && rest[1] == 'Z'
	})
}

// A failed publish (disk full) fails closed: Execute errors, the kernel is
// evicted and killed, and the cell never ran.
func TestLockdownFailedPublishFailsClosed(t *testing.T) {
	r := newRig(t)
	first := r.exec(engine.Request{Code: "x = 1"})
	r.env.Prepend(fakeenv.On("cell", fakeenv.PubFail("mv: No space left on device")).If(fakeenv.Publishing).Once())
	res, err := r.eng.Execute(context.Background(), engine.Request{Code: "x += 1", Timeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "evicted") || !strings.Contains(err.Error(), "No space left on device") {
		t.Fatalf("want an error that says the kernel was evicted and why, got %+v, %v", res, err)
	}
	if ks := r.eng.Kernels(); len(ks) != 0 {
		t.Fatalf("registry must be empty: %+v", ks)
	}
	if got := r.killedPIDs(); !slices.Equal(got, []int{first.Kernel.PID}) {
		t.Fatalf("kill commands %v, want [%d]", got, first.Kernel.PID)
	}
	if n := r.host.Runs("x += 1"); n != 0 {
		t.Fatalf("the unpublished cell ran %d times", n)
	}
	// The next call does not reuse the kernel that missed a cell.
	next := r.exec(engine.Request{Code: "x"})
	if next.Kernel.Reused || next.Kernel.ID == first.Kernel.ID || r.env.Count("spawn") != 2 {
		t.Fatalf("next call must get a fresh kernel: %+v", *next.Kernel)
	}
}

// A failed dir setup (the spawn script's owner-only check) ships nothing
// further and spawns nothing: no cell, no kill, no other command names the
// kernel; the caller gets the per-call fallback and the error names the path.
func TestLockdownFailedDirSetupSpawnsNothing(t *testing.T) {
	r := newRig(t)
	const reason = "not owner-only (want 700 0 directory): 775 0 directory:/tmp/kerneldeck-tester"
	r.env.Prepend(fakeenv.On("spawn", fakeenv.SpawnFailed(reason)).Once())
	res := r.exec(engine.Request{Code: "print(1)"})
	if res.Fallback != "per_call" || res.Kernel != nil {
		t.Fatalf("want the per-call fallback: %+v", res)
	}
	// After the failed spawn come only the transient kernel's commands, in
	// its own dir (spawn, cell, kill), none naming the failed kernel; before
	// the transient kernel, the only other command was one "once" script.
	tk := checkPerCallCommands(t, r)
	spawns := r.env.CallsOf("spawn")
	if hk := r.host.Kernels(); len(spawns) != 2 || len(hk) != 1 || hk[0].ID != tk.ID || len(r.eng.Kernels()) != 0 {
		t.Fatalf("spawns %d, host kernels %+v, registry %d; want 2, only the (killed) transient one, 0", len(spawns), hk, len(r.eng.Kernels()))
	}
	if got := r.ev.of(engine.EventSpawnFailed); len(got) != 1 || !strings.Contains(got[0].Detail, "/tmp/kerneldeck-tester") {
		t.Fatalf("spawn_failed must name the path: %+v", got)
	}
	// Nothing stale is left behind: the next call spawns normally.
	if next := r.exec(engine.Request{Code: "1"}); next.Fallback != "" || next.Kernel == nil || next.Kernel.Reused {
		t.Fatalf("next call: %+v", next)
	}
}

// ---- engine bugs found while porting ---------------------------------------
//
// These two tests fail against the engine as it is; the report that came
// with them names the lines and a fix.

// A kernel found dead is respawned; if the respawned runner is also found
// dead before the cell is published, nothing ran anywhere, and the caller
// must get an answer (here: state lost, or the per-call fallback), never a
// crash of the engine.
func TestRespawnedKernelAlsoDeadIsAnswered(t *testing.T) {
	r := newRig(t)
	r.exec(engine.Request{Code: "x = 1"})
	r.env.Prepend(fakeenv.On("cell", fakeenv.DeadRunner()).Times(2))
	var res *engine.Result
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("Execute panicked: %v", p)
			}
		}()
		res, err = r.eng.Execute(context.Background(), engine.Request{Code: "print(2)"})
	}()
	if err != nil {
		return // an error is an answer too
	}
	if res.Fallback == "" && (res.Kernel == nil || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, phrase)) {
		t.Fatalf("want state_lost or the per-call fallback: %+v", res)
	}
	// Runs counts publications in registry and transient (per-call) kernels.
	if n := r.host.Runs("print(2)"); n > 1 {
		t.Fatalf("the cell ran %d times", n)
	}
}

// The interrupt at a cell's timeout rides on a cell command. When that one
// command is lost to a transport error, the retry must still carry the
// interrupt; otherwise a cell that would have stopped is killed with its
// kernel and the caller loses state.
func TestTimeoutInterruptSurvivesTransportError(t *testing.T) {
	r := newRig(t)
	r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
		return fakeenv.Outcome{Hang: req.Code == "while True: pass"}
	}
	first := r.exec(engine.Request{Code: "x = 1"})
	interrupting := func(c fakeenv.Call) bool {
		a, err := fakeenv.ParseCell(c.Command)
		return err == nil && a.Interrupt
	}
	r.env.Prepend(fakeenv.On("cell", fakeenv.TransportError("connection reset")).If(interrupting).Once())
	res := r.exec(engine.Request{Code: "while True: pass", Timeout: 100 * time.Millisecond})
	if len(r.ev.of(engine.EventTransportError)) != 1 {
		t.Fatal("the fault was never hit; the test proves nothing")
	}
	if res.Status != "timeout" || res.Kernel.StateLost || r.env.Count("kill") != 0 {
		t.Fatalf("want the interrupt retried and the kernel kept: status %s, %+v, %d kills", res.Status, *res.Kernel, r.env.Count("kill"))
	}
	if ks := r.eng.Kernels(); len(ks) != 1 || ks[0].ID != first.Kernel.ID {
		t.Fatalf("registry: %+v", ks)
	}
}

// A kill that cannot reach its host is retried with a doubling wait (1 s,
// 2 s, 4 s, ... at most 30 s), and given up, with one event saying so, once
// the runner has exited by itself: the cell timeout plus idle_exit plus the
// runner's margin after the first failure. Close does not retry it then.
func TestFailedKillBacksOffAndGivesUp(t *testing.T) {
	r := newRig(t, func(c *engine.Config) {
		c.SweepEvery = 5 * time.Millisecond
		c.IdleExit = 2 * time.Minute // margin 30 s; with the 5 s cell timeout, give up at 2m35s
	})
	res := r.exec(engine.Request{Owner: "a", Code: "1"})
	r.env.Prepend(fakeenv.On("kill", fakeenv.TransportError("no free ssh session")))
	if err := r.eng.Kill(context.Background(), res.Kernel.ID); err != nil {
		t.Fatal(err)
	}
	tries := func() int { return r.env.Count("kill") }
	if tries() != 1 {
		t.Fatalf("%d kill commands after Kill, want 1", tries())
	}
	// Each step: advance the clock by 1 s at a time; the next try comes
	// exactly when its wait is over, never before.
	waited := time.Duration(0)
	for try, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second} {
		for step := time.Second; step <= wait; step += time.Second {
			if step < wait {
				r.clock.Advance(time.Second)
				// Several sweeps run at this time; none may retry yet.
				r.clock.settle(t, 10)
				if got := tries(); got != try+1 {
					t.Fatalf("%v after the failure: %d kill commands, want %d (the retry came early)", waited+step, got, try+1)
				}
				continue
			}
			r.clock.Advance(time.Second)
			eventually(t, fmt.Sprintf("retry %d", try+1), func() bool { return tries() == try+2 })
		}
		waited += wait
	}
	// 91 s so far; the horizon is at 155 s. A try just before it (due since
	// 121 s) fails and waits 30 s more; the one after it gives up.
	r.clock.Advance(154*time.Second - waited)
	eventually(t, "try 9", func() bool { return tries() == 9 })
	r.clock.settle(t, 10)
	if d := lastDetail(r.ev.of(engine.EventTransportError)); strings.Contains(d, "gave up") {
		t.Fatalf("gave up before the runner's own idle exit: %q", d)
	}
	r.clock.Advance(30 * time.Second)
	eventually(t, "the try that gives up", func() bool { return strings.Contains(lastDetail(r.ev.of(engine.EventTransportError)), "gave up") })
	n := tries()
	gaveUp := 0
	for _, ev := range r.ev.of(engine.EventTransportError) {
		if strings.Contains(ev.Detail, "gave up after") {
			gaveUp++
			if !strings.Contains(ev.Detail, fmt.Sprintf("after %d tries", n)) {
				t.Errorf("give-up event %q, want it to count %d tries", ev.Detail, n)
			}
		}
	}
	if gaveUp != 1 {
		t.Fatalf("%d give-up events, want 1", gaveUp)
	}
	r.clock.Advance(time.Hour)
	r.clock.settle(t, 10)
	if err := r.eng.Close(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if tries() != n {
		t.Fatalf("%d kill commands after giving up at %d", tries(), n)
	}
}

func lastDetail(evs []engine.Event) string {
	if len(evs) == 0 {
		return ""
	}
	return evs[len(evs)-1].Detail
}
