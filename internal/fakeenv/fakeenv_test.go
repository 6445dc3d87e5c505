package fakeenv_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
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
// lifecycle produces no unhandled command and no parse error.
func TestHealthyHostSpeaksTheEngineProtocol(t *testing.T) {
	env, host := fakeenv.Healthy()
	env.SetTempDir("/srv/tmp")
	if _, ok := any(env).(backends.StreamDialer); ok {
		t.Fatal("the fake must not offer the stream fast path")
	}
	eng, err := engine.New(engine.Config{Backends: []backends.Env{env}, InterruptGrace: 200 * time.Millisecond, SweepEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, req := range []engine.Request{
		{Code: "a = 1", Tools: []string{"read_file"}},
		{Code: "a += 1", Tools: []string{"read_file"}},
		{Code: "a", Tools: []string{"read_file"}, Reset: true},
	} {
		res, err := eng.Execute(ctx, req)
		if err != nil || res.Status != "success" {
			t.Fatalf("call %d: %+v %v", i, res, err)
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
	ks := host.Kernels()
	if len(ks) != 2 || !ks[0].Killed || !ks[1].Killed {
		t.Fatalf("want two kernels (reset), both killed by the end: %+v", ks)
	}
	if !strings.HasPrefix(ks[0].Dir, "/srv/tmp/kerneldeck-tester/k") || len(ks[0].Token) != 64 || !strings.Contains(ks[0].Tools, "def read_file(") {
		t.Fatalf("spawn not parsed: %+v", ks[0])
	}
	if ks[0].ExecCount != 2 || ks[1].ExecCount != 1 {
		t.Fatalf("execution counts %d, %d; want 2, 1", ks[0].ExecCount, ks[1].ExecCount)
	}
}
