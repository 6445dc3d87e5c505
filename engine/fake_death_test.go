package engine_test

// Dead runners, lost transports and kills that cannot reach their host.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
)

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

// Once a cell's request may have reached the host, its code never runs a
// second time: a retry after a transport error reuses the same cell id (the
// runner dedups it) and never respawns; a kernel found gone or dead after a
// possibly published cell is state lost, not a re-run.
func TestExactlyOnceAfterTransportErrors(t *testing.T) {
	const code = "charge_card()"
	cases := []struct {
		name  string
		fault func(r *rig) fakeenv.HandlerFunc
		want  onceWant
	}{
		{"answer lost after publish, retry finds the result", func(r *rig) fakeenv.HandlerFunc {
			return fakeenv.AnswerLost(r.host.Cell)
		}, onceWant{"success", false, 1, 1}},
		{"request never reached the host, retry publishes", func(r *rig) fakeenv.HandlerFunc {
			return fakeenv.TransportError("broken pipe")
		}, onceWant{"success", false, 1, 1}},
		{"answer lost, then the kernel dir is gone (KD:GONE)", func(r *rig) fakeenv.HandlerFunc {
			return func(ctx context.Context, c fakeenv.Call) (backends.Result, error) {
				a, _ := fakeenv.ParseCell(c.Command)
				fakeenv.AnswerLost(r.host.Cell)(ctx, c)
				r.host.RemoveDir(a.PID)
				return backends.Result{}, fakeenv.ErrTransport
			}
		}, onceWant{"error", true, 1, 1}},
		{"answer lost, then the runner dies (KD:LOST)", func(r *rig) fakeenv.HandlerFunc {
			return func(ctx context.Context, c fakeenv.Call) (backends.Result, error) {
				a, _ := fakeenv.ParseCell(c.Command)
				r.host.OnCell = func(fakeenv.CellRequest) fakeenv.Outcome { return fakeenv.Outcome{Hang: true} }
				r.host.Cell(ctx, c)
				r.host.Crash(a.PID)
				return backends.Result{}, fakeenv.ErrTransport
			}
		}, onceWant{"error", true, 1, 1}},
		{"request never arrived and the runner is dead (KD:DEAD): respawn is safe", func(r *rig) fakeenv.HandlerFunc {
			return func(ctx context.Context, c fakeenv.Call) (backends.Result, error) {
				a, _ := fakeenv.ParseCell(c.Command)
				r.host.Crash(a.PID)
				return backends.Result{}, fakeenv.ErrTransport
			}
		}, onceWant{"success", true, 2, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.exec(engine.Request{Code: "warm = 1"})
			r.env.Prepend(fakeenv.On("cell", tc.fault(r)).If(fakeenv.StdinContains(code)).Once())
			r.checkOnce(code, r.exec(engine.Request{Code: code}), tc.want)
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

// onceWant is what a cell hit by a fault comes to: its status, whether its
// kernel's state was lost, and the spawns and runs of it the host saw.
type onceWant struct {
	status    string
	stateLost bool
	spawns    int
	runs      int
}

// checkOnce checks the result of code, and the host, against w.
func (r *rig) checkOnce(code string, res *engine.Result, w onceWant) {
	t := r.t
	t.Helper()
	if res.Kernel == nil {
		t.Fatalf("no kernel in the result: %+v", res)
	}
	if string(res.Status) != w.status || res.Kernel.StateLost != w.stateLost {
		t.Fatalf("got status %s state_lost %v (%+v), want %s %v", res.Status, res.Kernel.StateLost, *res.Kernel, w.status, w.stateLost)
	}
	if w.stateLost && !strings.Contains(res.Kernel.Note, phrase) {
		t.Fatalf("note %q lacks %q", res.Kernel.Note, phrase)
	}
	if n := r.host.Runs(code); n != w.runs {
		t.Fatalf("the cell ran %d times on the host, want %d", n, w.runs)
	}
	if n := r.env.Count("spawn"); n != w.spawns {
		t.Fatalf("%d spawns, want %d", n, w.spawns)
	}
}

// ---- tool calls over plain Execute -----------------------------------------

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
	// A failure is reported when its retry is scheduled: waiting for the
	// report keeps the clock from moving under a failure not yet recorded.
	failed := func() int {
		n := 0
		for _, ev := range r.ev.of(engine.EventTransportError) {
			if strings.HasPrefix(ev.Detail, "kill: ") {
				n++
			}
		}
		return n
	}
	if tries() != 1 {
		t.Fatalf("%d kill commands after Kill, want 1", tries())
	}
	eventually(t, "the first failure", func() bool { return failed() == 1 })
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
			eventually(t, fmt.Sprintf("retry %d", try+1), func() bool { return tries() == try+2 && failed() == try+2 })
		}
		waited += wait
	}
	// 91 s so far; the horizon is at 155 s. A try just before it (due since
	// 121 s) fails and waits 30 s more; the one after it gives up.
	r.clock.Advance(154*time.Second - waited)
	eventually(t, "try 9", func() bool { return tries() == 9 && failed() == 9 })
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
