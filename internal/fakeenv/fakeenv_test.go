package fakeenv_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
)

func run(t *testing.T, env backends.Env, cmd string, stdin string) (backends.Result, error) {
	t.Helper()
	return env.Execute(context.Background(), cmd, backends.ExecOptions{Stdin: []byte(stdin)})
}

func TestHandlersAnswerInOrderWithLimits(t *testing.T) {
	env := fakeenv.New()
	env.Use(fakeenv.On("cell", fakeenv.Reply("healthy")))
	env.Prepend(fakeenv.On("cell", fakeenv.Reply("fault")).Once().Named("fault"))
	env.Prepend(fakeenv.OnContains("special", fakeenv.ReplyRC("special", 7)))

	cases := []struct {
		cmd, out string
		rc       int
	}{
		{"# kerneldeck:cell\necho", "fault", 0},   // the one-shot fault first
		{"# kerneldeck:cell\necho", "healthy", 0}, // then the healthy handler again
		{"# kerneldeck:cell\nspecial", "special", 7},
		{"# kerneldeck:kill\n", "fakeenv: no handler for this command\n", 127},
	}
	for i, c := range cases {
		res, err := run(t, env, c.cmd, "in"+string(rune('0'+i)))
		if err != nil || res.Output != c.out || res.ReturnCode != c.rc {
			t.Fatalf("call %d: got %+v, %v; want %q rc %d", i, res, err, c.out, c.rc)
		}
	}
	calls := env.Calls()
	if len(calls) != 4 || calls[0].Handler != "fault" || string(calls[2].Stdin) != "in2" || calls[3].Marker != "kill" {
		t.Fatalf("recorded calls wrong: %+v", calls)
	}
	if got := env.Count("cell"); got != 3 {
		t.Fatalf("Count(cell) = %d, want 3", got)
	}
	if u := env.Unhandled(); len(u) != 1 || u[0].Seq != 3 {
		t.Fatalf("Unhandled = %+v", u)
	}
}

func TestTransportFaults(t *testing.T) {
	env := fakeenv.New()
	ran := 0
	env.Use(fakeenv.On("cell", fakeenv.AnswerLost(func(context.Context, fakeenv.Call) (backends.Result, error) {
		ran++
		return backends.Result{Output: "KD:RESULT {}"}, nil
	})).Once())
	env.Use(fakeenv.OnAny(fakeenv.TransportError("reset by peer")))
	if _, err := run(t, env, "# kerneldeck:cell\n", ""); !errors.Is(err, fakeenv.ErrTransport) || ran != 1 {
		t.Fatalf("AnswerLost: err %v, ran %d", err, ran)
	}
	if _, err := run(t, env, "# kerneldeck:spawn\n", ""); !errors.Is(err, fakeenv.ErrTransport) {
		t.Fatalf("TransportError: err %v", err)
	}
}

// The recorder is safe for concurrent use and its logical clock tells which
// calls overlapped.
func TestConcurrentCallsAreRecordedWithOverlap(t *testing.T) {
	env := fakeenv.New()
	gate := fakeenv.NewGate()
	env.Use(fakeenv.On("cell", gate.Wrap(fakeenv.Reply("ok"))))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { run(t, env, "# kerneldeck:cell\n", "x") })
	}
	for range 8 {
		<-gate.Entered()
	}
	if n := len(env.Calls()); n != 8 {
		t.Fatalf("recorded %d calls while blocked, want 8", n)
	}
	gate.Open()
	wg.Wait()
	calls := env.Calls()
	for _, c := range calls {
		if c.Running() || !calls[0].Overlaps(c) {
			t.Fatalf("call %d: running=%v overlaps first=%v", c.Seq, c.Running(), calls[0].Overlaps(c))
		}
	}
	// Sequential calls do not overlap.
	run(t, env, "# kerneldeck:cell\n", "")
	run(t, env, "# kerneldeck:cell\n", "")
	calls = env.Calls()
	if calls[8].Overlaps(calls[9]) {
		t.Fatal("sequential calls reported as overlapping")
	}
}

func TestGateHonoursContext(t *testing.T) {
	env := fakeenv.New()
	gate := fakeenv.NewGate()
	env.Use(fakeenv.OnAny(gate.Wrap(fakeenv.Reply("never"))))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := env.Execute(ctx, "x", backends.ExecOptions{}); !errors.Is(err, fakeenv.ErrTransport) {
		t.Fatalf("a canceled call must fail as a transport error, got %v", err)
	}
	if _, err := env.Execute(context.Background(), "x", backends.ExecOptions{Timeout: time.Millisecond}); !errors.Is(err, backends.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a timed-out call must fail with a timeout, got %v", err)
	}
}

// The healthy host understands every script the engine sends today: a whole
// lifecycle (tool calls, a reset, a per-call fallback in a transient kernel)
// produces no unhandled command and no parse error.
func TestHealthyHostSpeaksTheEngineProtocol(t *testing.T) {
	env, host := fakeenv.Healthy()
	env.SetTempDir("/srv/tmp")
	if _, ok := any(env).(backends.StreamDialer); ok {
		t.Fatal("the fake must not offer the stream fast path")
	}
	reg := hosttools.NewRegistry()
	err := reg.Register(hosttools.Tool{Name: "read_file", Description: "Read a file.",
		Params: hosttools.Schema{{Name: "path", Type: hosttools.TypeString, Required: true}},
		Handler: func(_ context.Context, call hosttools.Call) (hosttools.Result, error) {
			return hosttools.Result{Text: "contents of " + string(call.Args["path"])}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
		if req.Code == "a += 1" {
			return fakeenv.Outcome{Calls: []fakeenv.ToolCall{{Tool: "read_file", Args: map[string]string{"path": "x"}}}}
		}
		return fakeenv.Outcome{}
	}
	// The first two spawns work; the third, owner "fallback"'s, fails, so its
	// cell runs once in a transient kernel.
	env.Prepend(fakeenv.On("spawn", host.Spawn).Times(2).Named("first spawns"),
		fakeenv.On("spawn", fakeenv.SpawnFailed("no")).If(fakeenv.Not(fakeenv.Transient)).Once().Named("failed spawn"))
	eng, err := engine.New(engine.Config{Backends: []backends.Env{env}, InterruptGrace: 200 * time.Millisecond, SweepEvery: time.Hour,
		Tools: reg, Approvals: engine.Approvals{Default: engine.PolicyAllow}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, req := range []engine.Request{
		{Code: "a = 1", Tools: []string{"read_file"}},
		{Code: "a += 1", Tools: []string{"read_file"}},
		{Code: "a", Tools: []string{"read_file"}, Reset: true},
		{Owner: "fallback", Code: "b = 1"},
	} {
		res, err := eng.Execute(ctx, req)
		if err != nil || res.Status != "success" {
			t.Fatalf("call %d: %+v %v", i, res, err)
		}
		if i == 1 && res.ToolCallsMade != 1 {
			t.Fatalf("call 1 made %d tool calls, want 1", res.ToolCallsMade)
		}
		if i == 3 && (res.Fallback != "per_call" || res.Kernel != nil) {
			t.Fatalf("call 3 must fall back to a per-call run: %+v", res)
		}
	}
	if err := eng.Close(ctx, false); err != nil {
		t.Fatal(err)
	}
	for _, c := range env.Calls() {
		if c.Handler == "" || c.Result.ReturnCode == 99 {
			t.Errorf("call %d (%s) not understood: %q", c.Seq, c.Marker, c.Result.Output)
		}
	}
	if n := env.Count("cell"); n != 5 {
		t.Errorf("%d cell commands, want 5 (one per cell, one more for the tool call)", n)
	}
	ks := host.Kernels()
	if len(ks) != 3 || !ks[0].Killed || !ks[1].Killed || !ks[2].Killed {
		t.Fatalf("want three kernels (reset, per-call), all killed by the end: %+v", ks)
	}
	if !strings.HasPrefix(ks[0].Dir, "/srv/tmp/kerneldeck-tester/k") || len(ks[0].Token) != 64 || !strings.Contains(ks[0].Tools, "def read_file(") {
		t.Fatalf("spawn not parsed: %+v", ks[0])
	}
	if ks[0].ExecCount != 2 || ks[1].ExecCount != 1 || ks[2].ExecCount != 1 {
		t.Fatalf("execution counts %d, %d, %d; want 2, 1, 1", ks[0].ExecCount, ks[1].ExecCount, ks[2].ExecCount)
	}
	if ks[2].Dir != "/srv/tmp/kerneldeck-once-"+ks[2].ID || !ks[2].Transient || ks[0].Transient {
		t.Fatalf("transient spawn not parsed: %+v", ks[2])
	}
	if len(ks[0].Forwarded) != 1 || len(ks[0].Answers) != 1 || !strings.Contains(ks[0].Answers[0].JSON, `"text":"contents of \"x\""`) {
		t.Fatalf("tool call not served: forwarded %v, answers %+v", ks[0].Forwarded, ks[0].Answers)
	}
	for _, c := range host.Cells() {
		if c.Timeout <= 0 {
			t.Errorf("cell %s: request without a timeout", c.ID)
		}
	}
}

func TestParseAnswers(t *testing.T) {
	got, err := fakeenv.ParseAnswers([]byte("1 m1 {\"ok\":true}\n12 m2 {\"error\":\"no\"}\n"))
	if err != nil || len(got) != 2 || got[0] != (fakeenv.Answer{Seq: 1, JSON: `{"ok":true}`, MAC: "m1"}) || got[1].Seq != 12 {
		t.Fatalf("ParseAnswers: %+v %v", got, err)
	}
	for _, bad := range []string{
		"",                  // ans=1 with nothing to write
		"1 m {\"ok\":true}", // the host's read loop drops a last line without its newline
		"x m {}\n",          // the host skips a line without a numeric seq
		"-1 m {}\n",
		"1 m [1]\n", // the runner delivers objects only
		"1 m {\n",
		"1 {}\n", // no MAC
	} {
		if _, err := fakeenv.ParseAnswers([]byte(bad)); err == nil {
			t.Errorf("ParseAnswers(%q) accepted", bad)
		}
	}
}

func TestSpawnArgsDir(t *testing.T) {
	a := fakeenv.SpawnArgs{TempDir: "/t", ID: "k1"}
	if got := a.Dir("me"); got != "/t/kerneldeck-me/k1" {
		t.Errorf("registry dir %s", got)
	}
	a.Transient = true
	if got := a.Dir("me"); got != "/t/kerneldeck-once-k1" {
		t.Errorf("transient dir %s", got)
	}
}

// The host's tool-call simulation, driven by hand-written scripts: a cell's
// request is forwarded once, an interrupt ends a cell waiting for its answer,
// and a late answer reaches the rpc dir but no call.
func TestHostToolCallWaitsAndInterrupts(t *testing.T) {
	env, host := fakeenv.Healthy()
	host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
		return fakeenv.Outcome{Calls: []fakeenv.ToolCall{{Tool: "t", Args: map[string]int{"n": 1}}}}
	}
	spawn := "# kerneldeck:spawn\npy=''\nt='/tmp'\n" + `kd="$t/kerneldeck-once-"'k1'` + "\n" +
		`KERNELDECK_STDIN='1 0 1' "$py" -c 'import os;b=b"";exec("while len(b)<2:...")' "$kd/runner.py"` + "\n"
	tok := kernelauth.NewSecret()
	res, err := run(t, env, spawn, `bbrt{"secret":"`+tok+`"}`+"\n")
	if err != nil || res.Output != "KD:SPAWNED 4242 /tmp/kerneldeck-once-k1 /usr/bin/python3 landlock:6+userns\n" {
		t.Fatalf("transient spawn: %q %v", res.Output, err)
	}
	cell := func(pub, intr, ans int) string {
		return fmt.Sprintf("# kerneldeck:cell\nkd='/tmp/kerneldeck-once-k1'; id='c1'; pid=4242; w=1; pub=%d; intr=%d; ans=%d; imac='%s'\n",
			pub, intr, ans, kernelauth.MAC(tok, kernelauth.Interrupt, "c1"))
	}
	req := `{"id":"c1","code":"x","timeout":3}`
	if res, _ = run(t, env, cell(1, 0, 0), req); res.Output == "" || strings.Contains(res.Output, "KD:RPC") {
		t.Fatalf("an unsigned request was taken: %q", res.Output)
	}
	res, _ = run(t, env, cell(1, 0, 0), kernelauth.MAC(tok, kernelauth.Request, req)+" "+req)
	mac := kernelauth.MAC(tok, kernelauth.RPC, "1", "c1", "t", `{"n":1}`)
	want := `KD:RPC 1.req {"tool":"t","args":{"n":1},"token":"` + mac + `","cell":"c1","seq":1}` + "\nKD:RPCWAIT\n"
	if res.Output != want {
		t.Fatalf("publish answered %q, want %q", res.Output, want)
	}
	if res, _ = run(t, env, cell(0, 0, 0), ""); res.Output != "KD:PENDING\n" {
		t.Fatalf("the request must be forwarded once; then %q", res.Output)
	}
	if res, _ = run(t, env, cell(0, 1, 0), ""); !strings.Contains(res.Output, `"status":"interrupted"`) {
		t.Fatalf("an interrupt must end a cell waiting for an answer: %q", res.Output)
	}
	answer := "1 " + kernelauth.MAC(tok, kernelauth.Answer, "1", `{"ok":true}`) + " {\"ok\":true}\n"
	if res, _ = run(t, env, cell(0, 0, 1), answer); !strings.HasPrefix(res.Output, "KD:RESULT ") {
		t.Fatalf("a late answer: %q", res.Output)
	}
	k, _ := host.Kernel("k1", 0)
	c := host.Cells()[0]
	if !k.Transient || len(k.Answers) != 1 || c.Requests != 1 || len(c.Answers) != 0 || c.Timeout != 3 || !c.Transient {
		t.Fatalf("kernel %+v, cell %+v", k, c)
	}
	// pub=1 with ans=1 would lose the answers to the publish's read.
	if res, _ = run(t, env, cell(1, 0, 1), "1 {}\n"); res.ReturnCode != 99 {
		t.Fatalf("pub=1 ans=1 accepted: %q", res.Output)
	}
}
