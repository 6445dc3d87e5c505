package engine_test

// Tool calls over plain Execute.

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
)

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
// twoEchoCalls: the cell two_calls() calls echo with x = 1, then 2, and
// prints "done"; other cells do nothing.
func twoEchoCalls(req fakeenv.CellRequest) fakeenv.Outcome {
	if req.Code != "two_calls()" {
		return fakeenv.Outcome{}
	}
	return fakeenv.Outcome{Stdout: "done\n", Calls: []fakeenv.ToolCall{
		{Tool: "echo", Args: map[string]int{"x": 1}},
		{Tool: "echo", Args: map[string]int{"x": 2}},
	}}
}

func TestToolCallsOverExecute(t *testing.T) {
	reg, ran := fakeEchoTools(t)
	r := newRig(t, fakeToolsAllowed(reg))
	r.host.OnCell = twoEchoCalls
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
	if err := json.Unmarshal(fakeenv.RequestBody(cells[0].Stdin), &req); err != nil || req.Timeout <= 0 || req.Timeout > r.cfg.CellTimeout.Seconds() {
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
