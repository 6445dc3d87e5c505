package engine_test

// Cells: timeouts, interrupts and their first-come-first-served order.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
)

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
