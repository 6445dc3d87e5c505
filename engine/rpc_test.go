package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
)

func TestParseRPCRequest(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    rpcRequest
		wantErr string
	}{
		{in: `{"seq":7,"tool":"read_file","args":{"path":"x"},"token":"t","cell":"c1"}`,
			want: rpcRequest{Seq: 7, Tool: "read_file", Args: json.RawMessage(`{"path":"x"}`), Token: "t", Cell: "c1"}},
		{in: `{"seq":1,"token":null}`, want: rpcRequest{Seq: 1}},
		// Keys match exactly: encoding/json's struct decoder would read
		// "TOKEN" as "token" (the fuzzer found this one).
		{in: `{"seq":1,"TOKEN":"0"}`, wantErr: `unknown field "TOKEN"`},
		{in: `{"seq":1,"Seq":2}`, wantErr: `unknown field "Seq"`},
		// A key twice: one reader would take the first, another the last.
		{in: `{"seq":1,"token":"a","token":"b"}`, wantErr: `key "token" appears twice`},
		{in: `{"seq":1,"seq":2}`, wantErr: `key "seq" appears twice`},
		{in: `{"seq":1,"token":5}`, wantErr: "token must be a string"},
		{in: `{"seq":1,"cell":["c1"]}`, wantErr: "cell must be a string"},
		{in: `{"seq":1}}`, wantErr: "unparseable request"},
		{in: `[]`, wantErr: "not a JSON object"},
		{in: `{"seq":1.0}`, wantErr: "not a positive integer"},
		{in: `{"tool":"x"}`, wantErr: "seq is missing"},
	} {
		got, err := parseRPCRequest([]byte(tc.in))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseRPCRequest(%s) = %+v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got.Seq != tc.want.Seq || got.Tool != tc.want.Tool || got.Token != tc.want.Token ||
			got.Cell != tc.want.Cell || string(got.Args) != string(tc.want.Args) {
			t.Errorf("parseRPCRequest(%s) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// A parameter given twice in args is refused before the approval prompt or
// the tool sees it; the prompt shows exactly the arguments the tool gets.
func TestRPCArgsShownAreTheArgsRun(t *testing.T) {
	got := make(chan hosttools.Args, 4)
	r := newRPCRig(t, hosttools.Tool{Name: "echo", Description: "Record its args.",
		Params: hosttools.Schema{{Name: "a", Type: hosttools.TypeString}, {Name: "b", Type: hosttools.TypeArray}, {Name: "command", Type: hosttools.TypeString}},
		Handler: func(_ context.Context, c hosttools.Call) (hosttools.Result, error) {
			got <- c.Args
			return hosttools.Result{Text: "ok"}, nil
		}}, PolicyAsk)
	e := r.e
	sub := e.Subscribe(64)
	defer sub.Close()
	s := r.session(time.Minute)
	defer s.close()
	request := func(seq int, args string) []byte { return rpcRequestFor(seq, "echo", args) }

	// The first "command" would fill the prompt; the second would run.
	padded := `{"command":"echo hi` + strings.Repeat(" ", 5000) + `","command":"rm -rf ~"}`
	ans, answered := s.serve(rpcItem{name: "1.req", data: request(1, padded)})
	if !answered || ans.resp.OK || !strings.Contains(ans.resp.Error, `"command" appears twice`) {
		t.Fatalf("repeated arg: answer %+v (answered %v), want a refusal naming the repeated key", ans, answered)
	}
	if len(got) != 0 || len(e.PendingApprovals()) != 0 {
		t.Fatal("a request with a repeated arg reached the tool or the approval prompt")
	}

	done := make(chan rpcAnswer, 1)
	go func() {
		a, _ := s.serve(rpcItem{name: "2.req", data: request(2, `{ "b" : [1, 2], "a":"x" }`)})
		done <- a
	}()
	var shown string
	for shown == "" {
		select {
		case ev := <-sub.C:
			if ev.Type == EventApprovalRequest {
				shown = string(ev.Args)
				if err := e.Approve(ev.Request, ApproveOnce); err != nil {
					t.Fatal(err)
				}
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no approval request")
		}
	}
	if a := <-done; !a.resp.OK {
		t.Fatalf("approved call failed: %+v", a.resp)
	}
	ran, _ := json.Marshal(<-got)
	if shown != `{"a":"x","b":[1,2]}` || shown != string(ran) {
		t.Fatalf("the prompt showed %s, the tool got %s; want both {\"a\":\"x\",\"b\":[1,2]}", shown, ran)
	}
}

// Arguments too long for the prompt keep their head and their tail, so a
// harmless start padded out cannot hide what the end of a command does.
func TestClipArgsKeepsHeadAndTail(t *testing.T) {
	short := []byte(`{"command":"ls"}`)
	if got := clipArgs(short); string(got) != string(short) {
		t.Fatalf("short args changed: %s", got)
	}
	long, _ := json.Marshal(map[string]string{"command": "echo hi" + strings.Repeat(" ", 10_000) + "; rm -rf ~"})
	got := clipArgs(long)
	var text string
	if err := json.Unmarshal(got, &text); err != nil {
		t.Fatalf("clipped args are not a JSON string: %s", got)
	}
	if len(got) > maxEventArgs+200 || !strings.HasPrefix(text, `{"command":"echo hi`) || !strings.HasSuffix(text, `; rm -rf ~"}`) ||
		!strings.Contains(text, fmt.Sprintf("of %d bytes not shown", len(long))) {
		t.Fatalf("clipped to %d bytes: %.200q ... %.200q", len(got), text, text[max(0, len(text)-200):])
	}
}

// A call still waiting (here on the operator) when its cell passes the
// timeout gets no answer: the engine interrupts the cell, and an answer
// racing that interrupt could end the cell as a plain error, not a timeout.
func TestRPCCallPastTheCellDeadlineIsNotAnswered(t *testing.T) {
	r := newRPCRig(t, hosttools.Tool{Name: "noop", Description: "Do nothing.", Handler: func(context.Context, hosttools.Call) (hosttools.Result, error) {
		return hosttools.Result{Text: "ok"}, nil
	}}, PolicyAsk)
	e := r.e

	s := r.session(100 * time.Millisecond)
	ans, answered := s.serve(rpcItem{name: "1.req", data: rpcRequestFor(1, "noop", "{}")})
	s.close()
	if answered {
		t.Fatalf("a call whose cell passed its deadline was answered: %+v", ans)
	}

	// Ended by the operator before the deadline, it is answered.
	s = r.session(time.Minute)
	defer s.close()
	go func() {
		for len(e.PendingApprovals()) == 0 {
			time.Sleep(time.Millisecond)
		}
		e.Approve(e.PendingApprovals()[0].ID, ApproveDeny)
	}()
	ans, answered = s.serve(rpcItem{name: "2.req", data: rpcRequestFor(2, "noop", "{}")})
	if !answered || ans.resp.OK || !strings.Contains(ans.resp.Error, "denied") {
		t.Fatalf("a denied call: answer %+v (answered %v), want a denial", ans, answered)
	}
}

// rpcToken is the token of the kernels an rpcRig serves.
const rpcToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// rpcRig is an engine with one host tool, serving the tool calls of kernel
// records (no runner) through rpcSession directly.
type rpcRig struct {
	e   *Engine
	key Key
}

func newRPCRig(tb testing.TB, tool hosttools.Tool, policy Policy) *rpcRig {
	tb.Helper()
	reg := hosttools.NewRegistry()
	if err := reg.Register(tool); err != nil {
		tb.Fatal(err)
	}
	e, err := New(Config{Backends: []backends.Env{backends.NewLocal(tb.TempDir())}, Tools: reg,
		Approvals: Approvals{Default: policy}, ApprovalTimeout: time.Minute, MaxToolCalls: 1 << 30})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close(context.Background(), true) })
	key, _ := NewKey("o", e.DefaultBackend(), "t", "", []string{tool.Name})
	return &rpcRig{e: e, key: key}
}

// session starts serving cell c1 of a fresh kernel (no seq seen yet) until
// the deadline; the caller closes it.
func (r *rpcRig) session(deadline time.Duration) *rpcSession {
	k := &Kernel{key: r.key, id: "k1", token: rpcToken}
	return r.e.newRPCSession(context.Background(), k, &cellRun{id: "c1", deadline: time.Now().Add(deadline)})
}

// request is a well-formed request of cell c1 signed with the kernel's secret.
func rpcRequestFor(seq int, tool, args string) []byte {
	mac := kernelauth.MAC(rpcToken, kernelauth.RPC, fmt.Sprint(seq), "c1", tool, args)
	return []byte(fmt.Sprintf(`{"seq":%d,"tool":%q,"token":%q,"cell":"c1","args":%s}`, seq, tool, mac, args))
}
