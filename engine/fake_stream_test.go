package engine_test

// The stream door at the protocol level: runners that answer on their
// sockets (fakeenv.StreamEnv), their faults, and the exactly-once rule
// when a stream ends under a cell.

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
)

// A warm kernel's cells go over its one stream: no cell command, one dial,
// each cell published once, in order, with its output.
func TestStreamDoorRunsCellsWithoutCommands(t *testing.T) {
	r := newStreamRig(t)
	r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome { return fakeenv.Outcome{Stdout: req.Code + "\n"} }
	first := r.exec(engine.Request{Code: "x = 1"})
	cellsBefore := r.env.Count("cell")
	for i, code := range []string{"a", "b", "c"} {
		res := r.exec(engine.Request{Code: code})
		if res.Status != "success" || res.Stdout != code+"\n" || res.Kernel.ID != first.Kernel.ID || res.Kernel.ExecutionCount != i+2 {
			t.Fatalf("cell %q: %+v %+v", code, res, *res.Kernel)
		}
	}
	if n := r.env.Count("cell") - cellsBefore; n != 0 {
		t.Fatalf("warm cells took %d cell commands, want 0: they go over the stream", n)
	}
	if n := r.streams.Dials(); n != 1 {
		t.Fatalf("%d streams opened for one kernel, want 1", n)
	}
	var codes []string
	for _, c := range r.host.Cells() {
		codes = append(codes, c.Code)
	}
	if !slices.Equal(codes, []string{"x = 1", "a", "b", "c"}) {
		t.Fatalf("the runner ran %q", codes)
	}
}

// Output streams when the request asks for it, before the result.
func TestStreamDoorStreamsOutput(t *testing.T) {
	r := newStreamRig(t)
	r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome { return fakeenv.Outcome{Stdout: "hello\n"} }
	r.exec(engine.Request{Code: "warm = 1"})
	var got []string
	res, err := r.eng.Execute(t.Context(), engine.Request{Code: "print('hello')", OnOutput: func(stream, text string) {
		got = append(got, stream+":"+text)
	}})
	if err != nil || res.Status != "success" {
		t.Fatalf("%+v %v", res, err)
	}
	if !slices.Equal(got, []string{"stdout:hello\n"}) {
		t.Fatalf("streamed %q, want the cell's stdout", got)
	}
}

// Tool calls of a cell on the stream are forwarded and answered on it.
func TestStreamDoorAnswersToolCallsOnTheStream(t *testing.T) {
	reg, ran := fakeEchoTools(t)
	r := newStreamRig(t, fakeToolsAllowed(reg))
	r.host.OnCell = twoEchoCalls
	tools := []string{"echo"}
	r.exec(engine.Request{Code: "warm = 1", Tools: tools})
	before := r.env.Count("cell")
	res := r.exec(engine.Request{Code: "two_calls()", Tools: tools})
	if res.Status != "success" || res.Stdout != "done\n" || res.ToolCallsMade != 2 {
		t.Fatalf("want success after two tool calls: %+v", res)
	}
	if got := ran(); !slices.Equal(got, []string{"1", "2"}) {
		t.Fatalf("the tool ran for x = %v, want [1 2]", got)
	}
	if n := r.env.Count("cell") - before; n != 0 {
		t.Fatalf("%d cell commands: tool calls on a stream are answered on it", n)
	}
	recs := r.host.Cells()
	if last := recs[len(recs)-1]; last.Requests != 2 || len(last.Answers) != 2 || last.Answers[0].Seq != 1 || last.Answers[1].Seq != 2 {
		t.Fatalf("the host saw %+v, want two requests, each answered once", last)
	}
}

// A cell past its timeout is interrupted over the stream and keeps its kernel.
func TestStreamDoorTimeoutInterrupts(t *testing.T) {
	r := newStreamRig(t)
	r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
		return fakeenv.Outcome{Hang: req.Code == "while True: pass"}
	}
	first := r.exec(engine.Request{Code: "x = 1"})
	res := r.exec(engine.Request{Code: "while True: pass", Timeout: 100 * time.Millisecond})
	if res.Status != "timeout" || res.Kernel.StateLost || !strings.Contains(res.Traceback, "KeyboardInterrupt") {
		t.Fatalf("want an interrupted timeout with state kept: %+v %+v", res, *res.Kernel)
	}
	if n := r.env.Count("kill") + r.env.Count("ring"); n != 0 {
		t.Fatalf("%d kill or ring commands: the interrupt goes on the stream", n)
	}
	cells := r.host.Cells()
	if last := cells[len(cells)-1]; last.Interrupts == 0 || last.Status != "interrupted" {
		t.Fatalf("the runner never got the interrupt: %+v", last)
	}
	if next := r.exec(engine.Request{Code: "x"}); next.Kernel.ID != first.Kernel.ID || !next.Kernel.Reused {
		t.Fatalf("the kernel was not kept: %+v", *next.Kernel)
	}
}

// A stream that fails under a cell hands the cell to the Execute door under
// the same id; the runner's records decide, and code that may have run is
// never run again, here or in a new kernel.
func TestStreamDoorExactlyOnce(t *testing.T) {
	const code = "charge_card()"
	cases := []struct {
		name  string
		fault func(r *rig)
		want  onceWant
	}{
		{"the socket refuses: the Execute door publishes", func(r *rig) { r.streams.Refuse(true) },
			onceWant{"success", false, 1, 1}},
		{"the stream drops after the runner took the cell: its result is found", func(r *rig) { r.streams.CutAfterCell(true) },
			onceWant{"success", false, 1, 1}},
		{"the runner dies running the cell", func(r *rig) {
			r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome { return fakeenv.Outcome{Crash: req.Code == code} }
		}, onceWant{"error", true, 1, 1}},
		{"the runner dies as the cell reaches its socket, before it took it: it runs once in a new kernel", func(r *rig) { r.streams.DieOnCell(true) },
			onceWant{"success", true, 2, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newStreamRig(t)
			r.exec(engine.Request{Code: "warm = 1"})
			r.exec(engine.Request{Code: "warm = 2"}) // the stream is open
			tc.fault(r)
			r.checkOnce(code, r.exec(engine.Request{Code: code}), tc.want)
			// Every command that carried the cell used the stream's id.
			ids := map[string]bool{}
			for _, c := range r.env.CallsOf("cell") {
				if len(c.Stdin) > 0 && requestCode(t, c.Stdin) == code {
					a, _ := fakeenv.ParseCell(c.Command)
					ids[a.ID] = true
				}
			}
			for _, c := range r.host.Cells() {
				if c.Code == code {
					ids[c.ID] = true
				}
			}
			if len(ids) > 1 {
				t.Fatalf("the cell went under %d ids: %v", len(ids), ids)
			}
		})
	}
}
