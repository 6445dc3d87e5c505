package client_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/client"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
	"github.com/kerneldeck/kerneldeck/server"
	"github.com/kerneldeck/kerneldeck/wire"
)

// served is an engine on a socket, as kerneldeck serve runs it; mutate,
// when given, changes its config first.
func served(t *testing.T, mutate ...func(*engine.Config)) (*engine.Engine, *server.Server) {
	t.Helper()
	cfg := engine.Config{Backends: []backends.Env{backends.NewLocal(t.TempDir())}, StateDir: t.TempDir()}
	for _, m := range mutate {
		m(&cfg)
	}
	eng, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.Listen(eng, server.Options{Path: filepath.Join(t.TempDir(), "run", wire.SocketName), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Shutdown(ctx, "test over")
		eng.Close(ctx, false)
	})
	return eng, s
}

func attach(t *testing.T, target string, o client.DialOptions, co client.Options) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, target, o)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(ctx, conn, conn.Where, co)
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// The client has the embedded engine's methods, over the socket: cells
// with their output, the snapshot, limits, cells of others, events.
func TestClientOverTheSocket(t *testing.T) {
	eng, s := served(t)
	pre, err := eng.Execute(context.Background(), engine.Request{Owner: "agent", Code: "print('before')"})
	if err != nil {
		t.Fatal(err)
	}
	c := attach(t, s.Path(), client.DialOptions{}, client.Options{Since: time.Hour, Output: true, RefreshEvery: 100 * time.Millisecond})
	if h := c.Hello(); h.Protocol != 2 || h.Version != "test" || len(h.Backends) != 1 {
		t.Fatalf("hello %+v", h)
	}
	// History first, marked.
	ev := <-c.Events()
	if !ev.History {
		t.Fatalf("first event %+v is not history", ev)
	}
	if ks := c.Kernels(); len(ks) != 1 || ks[0].ID != pre.Kernel.ID || ks[0].Owner != "agent" || ks[0].State != engine.StateIdle {
		t.Fatalf("snapshot %+v", ks)
	}
	var mu sync.Mutex
	var started, out string
	res, err := c.Execute(context.Background(), engine.Request{Owner: "me", Code: "print('a'); print('b')",
		OnStart:  func(cell string) { mu.Lock(); started = cell; mu.Unlock() },
		OnOutput: func(_, text string) { mu.Lock(); out += text; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if res.Stdout != "a\nb\n" || out != res.Stdout || started == "" || res.Cell != started || res.Kernel == nil || res.Kernel.Reused {
		t.Fatalf("result %+v, streamed %q, started %q", res, out, started)
	}
	mu.Unlock()
	waitFor(t, "the new kernel in the snapshot", func() bool { return len(c.Kernels()) == 2 })
	// An agent's cell elsewhere streams to this client's events.
	go eng.Execute(context.Background(), engine.Request{Owner: "agent", Code: "print('from the agent')"})
	for ev := range c.Events() {
		if ev.Type == engine.EventCellOutput && ev.Owner == "agent" && ev.Text == "from the agent\n" {
			break
		}
	}
	recs, err := c.Cells(context.Background(), pre.Kernel.ID)
	if err != nil || len(recs) < 1 || recs[0].Code != "print('before')" || recs[0].Status != engine.StatusSuccess || recs[0].Duration <= 0 {
		t.Fatalf("cells of the agent's kernel: %+v %v", recs, err)
	}
	n := 2
	idle := 5 * time.Minute
	if err := c.SetLimits(&n, &idle); err != nil {
		t.Fatal(err)
	}
	if got, d := c.Limits(); got != 2 || d != idle {
		t.Fatalf("client limits right after SetLimits: %d %v", got, d)
	}
	waitFor(t, "the engine's limits", func() bool { got, d := eng.Limits(); return got == 2 && d == idle })
	// A refusal comes back as an event, and the snapshot shows the truth.
	huge := 1 << 40
	if err := c.SetLimits(&huge, nil); err != nil {
		t.Fatal(err)
	}
	for ev := range c.Events() {
		if ev.Type == engine.EventNotice && strings.Contains(ev.Detail, "limits not changed") {
			break
		}
	}
	waitFor(t, "the snapshot's cap back at 2", func() bool { got, _ := c.Limits(); return got == 2 })
	if err := c.Kill(context.Background(), res.Kernel.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(context.Background(), "knope"); err == nil || !strings.Contains(err.Error(), "knope") {
		t.Fatalf("kill of an unknown kernel: %v", err)
	}
	if n := c.ShutdownOwner(context.Background(), "agent"); n != 1 {
		t.Fatalf("ShutdownOwner = %d", n)
	}
	waitFor(t, "an empty snapshot", func() bool { return len(c.Kernels()) == 0 })
}

// An engine that stops says goodbye; the client ends with the reason, and
// the kernels are the engine's business.
func TestClientTold(t *testing.T) {
	_, s := served(t)
	c := attach(t, s.Path(), client.DialOptions{}, client.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go s.Shutdown(ctx, "SIGTERM")
	select {
	case <-c.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the client was not told")
	}
	if err := c.Err(); err == nil || !strings.Contains(err.Error(), "goodbye: SIGTERM") {
		t.Fatalf("client error %v", err)
	}
	if _, err := c.Execute(context.Background(), engine.Request{Code: "1"}); err == nil {
		t.Fatal("Execute after goodbye succeeded")
	}
}

func TestDialExplains(t *testing.T) {
	_, err := client.Dial(context.Background(), filepath.Join(t.TempDir(), "none.sock"), client.DialOptions{})
	if err == nil || !strings.Contains(err.Error(), "no engine is serving") || !strings.Contains(err.Error(), "kerneldeck serve") {
		t.Fatalf("dial to nothing: %v", err)
	}
}

// Over the real sshd, through an ssh config alias: the remote socket is
// dialled on the shared connection.
func TestClientOverSSH(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	eng, s := served(t)
	eng.Execute(context.Background(), engine.Request{Owner: "agent", Code: "x = 1"})
	cfg := srv.WriteSSHConfig(t, "gateway", u)
	c := attach(t, "ssh://gateway"+s.Path(), client.DialOptions{SSH: backends.Options{SSHConfig: cfg}}, client.Options{})
	if ks := c.Kernels(); len(ks) != 1 || ks[0].Owner != "agent" {
		t.Fatalf("kernels over ssh: %+v", ks)
	}
	res, err := c.Execute(context.Background(), engine.Request{Owner: "agent", Code: "print(x + 1)"})
	if err != nil || res.Stdout != "2\n" || !res.Kernel.Reused {
		t.Fatalf("a cell over ssh: %+v %v", res, err)
	}
	if !strings.HasPrefix(c.Where(), "ssh://gateway/") {
		t.Fatalf("where %q", c.Where())
	}
}

// The remote default path follows the engine's own rule: the runtime dir's
// socket when there is one, else the state dir's.
func TestRemotePathScript(t *testing.T) {
	home := t.TempDir()
	run := func(env ...string) string {
		cmd := exec.Command("bash", "-c", client.RemotePathScript)
		cmd.Env = append([]string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}, env...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	if got := run(); got != "KD:SOCK "+home+"/.local/state/kerneldeck/engine.sock" {
		t.Fatalf("no XDG vars: %q", got)
	}
	if got := run("XDG_STATE_HOME=/srv/state"); got != "KD:SOCK /srv/state/kerneldeck/engine.sock" {
		t.Fatalf("XDG_STATE_HOME: %q", got)
	}
	rt := t.TempDir()
	os.Mkdir(filepath.Join(rt, "kerneldeck"), 0o700)
	if got := run("XDG_RUNTIME_DIR=" + rt); got != "KD:SOCK "+home+"/.local/state/kerneldeck/engine.sock" {
		t.Fatalf("a runtime dir without a socket: %q", got)
	}
	eng, err := engine.New(engine.Config{Backends: []backends.Env{backends.NewLocal(t.TempDir())}, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(context.Background(), false)
	s, err := server.Listen(eng, server.Options{Path: filepath.Join(rt, "kerneldeck", wire.SocketName)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background(), "")
	if got := run("XDG_RUNTIME_DIR=" + rt); got != "KD:SOCK "+rt+"/kerneldeck/engine.sock" {
		t.Fatalf("a runtime dir with a socket: %q", got)
	}
}

// KernelsSince gives the listing only when it changed: refreshes of an
// engine where nothing happens leave the generation as it was (the engine
// answered "unchanged"), and a cell, which moves last_used, is a new one.
func TestKernelsSince(t *testing.T) {
	eng, s := served(t)
	if _, err := eng.Execute(context.Background(), engine.Request{Owner: "agent", Code: "1"}); err != nil {
		t.Fatal(err)
	}
	c := attach(t, s.Path(), client.DialOptions{}, client.Options{RefreshEvery: 20 * time.Millisecond})
	ks, gen, changed := c.KernelsSince(0)
	if !changed || gen == 0 || len(ks) != 1 || ks[0].Owner != "agent" {
		t.Fatalf("first KernelsSince(0) = %d kernels, gen %d, changed %v", len(ks), gen, changed)
	}
	for range 10 {
		if err := c.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if again, g, changed := c.KernelsSince(gen); changed || again != nil || g != gen {
		t.Fatalf("after refreshes with nothing changed: %d kernels, gen %d (was %d), changed %v", len(again), g, gen, changed)
	}
	if _, err := eng.Execute(context.Background(), engine.Request{Owner: "agent", Code: "2"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	now, g, changed := c.KernelsSince(gen)
	if !changed || g == gen || len(now) != 1 || now[0].ExecutionCount != ks[0].ExecutionCount+1 {
		t.Fatalf("after a cell: %+v, gen %d (was %d), changed %v", now, g, gen, changed)
	}
}

// The listing carries the engine's spare runners, which count toward the
// cap: an attached dashboard's header says "spares N" as an embedded
// one's does.
func TestClientSpares(t *testing.T) {
	eng, s := served(t, func(c *engine.Config) { c.SpareKernels = map[string]int{"local": 1} })
	waitFor(t, "the engine's spare", func() bool { return eng.Spares() == 1 })
	c := attach(t, s.Path(), client.DialOptions{}, client.Options{RefreshEvery: 20 * time.Millisecond})
	waitFor(t, "the spare in the listing", func() bool { return c.Spares() == 1 })
	if ks := c.Kernels(); len(ks) != 0 {
		t.Fatalf("a spare is listed as a kernel: %+v", ks)
	}
	// A kernel takes the spare; the engine starts another.
	if _, err := eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "one kernel and a spare again", func() bool { return len(c.Kernels()) == 1 && c.Spares() == eng.Spares() })
}

// A cell's input() over the socket reaches the client's OnInput, and its
// answer (or an end of input) comes back to the cell.
func TestClientAnswersInput(t *testing.T) {
	_, s := served(t)
	c := attach(t, s.Path(), client.DialOptions{}, client.Options{})
	var mu sync.Mutex
	var asked []engine.InputRequest
	res, err := c.Execute(context.Background(), engine.Request{Owner: "me",
		Code: "a = input('first? ')\ntry:\n    input('second? ')\nexcept EOFError:\n    print(a, 'then eof')",
		OnInput: func(_ context.Context, ask engine.InputRequest) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, ask)
			if len(asked) == 2 {
				return "", engine.ErrInputEOF
			}
			return "yes", nil
		}})
	if err != nil || res.Stdout != "yes then eof\n" {
		t.Fatalf("a cell asking twice: %v %+v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 || asked[0].Prompt != "first? " || asked[1].Prompt != "second? " || asked[0].Cell != res.Cell {
		t.Errorf("asked %+v, want first? then second? of cell %s", asked, res.Cell)
	}
}
