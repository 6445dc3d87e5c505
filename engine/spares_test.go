package engine_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
	"github.com/kerneldeck/kerneldeck/internal/proctest"
)

// spareEngine is an engine on a counted local backend that keeps n spare
// runners, and on the other backends given, which keep none.
func spareEngine(t *testing.T, n, maxKernels int, others ...backends.Env) (*engine.Engine, backendtest.Counting, *engine.Subscription) {
	t.Helper()
	env := backendtest.NewCounting(backends.NewLocal(enginetest.ShortTempDir(t)))
	eng, err := engine.New(engine.Config{Backends: append([]backends.Env{env}, others...), StateDir: t.TempDir(), MaxKernels: maxKernels,
		SpareKernels: map[string]int{env.URI(): n}})
	if err != nil {
		t.Fatal(err)
	}
	sub := eng.Subscribe(1 << 12)
	t.Cleanup(func() { rtClose(t, eng) })
	return eng, env, sub
}

func waitSpares(t *testing.T, eng *engine.Engine, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); eng.Spares() != n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("spares %d, want %d", eng.Spares(), n)
		}
	}
}

// A new kernel takes the ready spare (no spawn command on the cell's
// path), is nobody else's, and a replacement is started for the next one.
func TestSpareKernelIsTakenAndReplaced(t *testing.T) {
	eng, env, sub := spareEngine(t, 1, 8)
	waitSpares(t, eng, 1)
	if ks := eng.Kernels(); len(ks) != 0 {
		t.Fatalf("a spare is listed as a kernel: %+v", ks)
	}
	spares := proctest.Runners(env.TempDir())
	if len(spares) != 1 {
		t.Fatalf("runner processes of one spare: %v", spares)
	}
	env.Reset()
	a := rtExec(t, eng, engine.Request{Owner: "a", Code: "x = 1; print(x)"})
	if a.Kernel.PID != spares[0] || a.Kernel.Reused || a.Stdout != "1\n" {
		t.Fatalf("first cell: kernel %+v stdout %q; want it run by the spare, pid %d", a.Kernel, a.Stdout, spares[0])
	}
	// The one spawn is the replacement, in the background.
	if n := env.ByMarker("kerneldeck:spawn"); n > 1 {
		t.Fatalf("the first cell with a spare ready: %d spawn commands, want at most the replacement's", n)
	}
	waitSpares(t, eng, 1) // replaced in the background
	b := rtExec(t, eng, engine.Request{Owner: "b", Code: "print(globals().get('x', 'fresh'))"})
	if b.Stdout != "fresh\n" || b.Kernel.PID == a.Kernel.PID || b.Kernel.Dir == a.Kernel.Dir {
		t.Fatalf("a second owner's kernel: %+v %q; want its own runner", b.Kernel, b.Stdout)
	}
	spawned := 0
	for done := false; !done; {
		select {
		case ev := <-sub.C:
			if ev.Type == engine.EventSpawned {
				spawned++
				if !strings.Contains(ev.Detail, "a spare runner, ready for") || ev.Owner == "" {
					t.Errorf("spawned event %+v, want it to name the spare and its owner", ev)
				}
			}
			if ev.Type == engine.EventKilled {
				t.Errorf("a kill event for a spare or a kernel: %+v", ev)
			}
		default:
			done = true
		}
	}
	if spawned != 2 {
		t.Errorf("%d spawned events, want 2 (one per owner, none for the spares)", spawned)
	}
	// A kernel with tools takes the spare too, writing its stubs first: one
	// command, no spawn on its path.
	waitSpares(t, eng, 1) // b's replacement
	spares = proctest.Runners(env.TempDir())
	env.Reset()
	c := rtExec(t, eng, engine.Request{Owner: "c", Tools: []string{"read_file"}, Code: "import kerneldeck_tools as kt\nprint(kt.TOOLS, callable(kt.read_file))"})
	if c.Stdout != "('read_file',) True\n" || !slices.Contains(spares, c.Kernel.PID) {
		t.Fatalf("a kernel with tools: stdout %q, kernel %+v; want its stubs, in one of the spares %v", c.Stdout, c.Kernel, spares)
	}
	if n, s := env.ByMarker("kerneldeck:spawn"), env.ByMarker("kerneldeck:stubs"); n > 1 || s != 1 {
		t.Errorf("a kernel with tools taking a spare: %d spawn commands (want at most the replacement's), %d stubs commands (want 1)", n, s)
	}
}

// Spares count toward max_kernels and never push a kernel out: a kernel
// that does not take the spare (on another backend, which keeps none)
// makes the spare go.
func TestSparesYieldToTheCap(t *testing.T) {
	eng, _, sub := spareEngine(t, 1, 2, fakeenv.NewQuiet(fakeenv.NewHost(), "fake", "/nonexistent/kdtest-fake"))
	waitSpares(t, eng, 1)
	rtExec(t, eng, engine.Request{Owner: "a", Code: "1"})
	waitSpares(t, eng, 1) // a + the spare = the cap
	rtExec(t, eng, engine.Request{Owner: "b", Backend: "fake", Code: "1"})
	time.Sleep(300 * time.Millisecond) // no refill may come: two kernels fill the cap
	if n, ks := eng.Spares(), eng.Kernels(); n != 0 || len(ks) != 2 {
		t.Fatalf("at the cap: %d spares, kernels %+v; want 0 spares and both kernels", n, ks)
	}
	for done := false; !done; {
		select {
		case ev := <-sub.C:
			if ev.Type == engine.EventEvictedCap {
				t.Errorf("a kernel was evicted for a spare: %+v", ev)
			}
		default:
			done = true
		}
	}
}

// Closing the engine kills its spares, even when it keeps its kernels.
func TestSparesDieWithTheEngine(t *testing.T) {
	tmp := enginetest.ShortTempDir(t)
	env := backends.NewLocal(tmp)
	eng, err := engine.New(engine.Config{Backends: []backends.Env{env}, StateDir: t.TempDir(), SpareKernels: map[string]int{env.URI(): 2}})
	if err != nil {
		t.Fatal(err)
	}
	waitSpares(t, eng, 2)
	pids := proctest.Runners(tmp)
	if len(pids) == 0 {
		t.Fatal("no runner process of the spares found")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := eng.Close(ctx, true); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if proctest.Alive(pid) {
			t.Errorf("spare runner pid %d outlived the engine (closed keeping kernels)", pid)
		}
	}
}

// A subscriber that takes output and comes while a cell runs gets that
// cell's output from then on (the engine asks the runner to stream it).
func TestOutputSubscriberJoinsARunningCell(t *testing.T) {
	tmp := enginetest.ShortTempDir(t)
	eng, err := engine.New(engine.Config{Backends: []backends.Env{backends.NewLocal(tmp)}, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rtClose(t, eng) })
	first := rtExec(t, eng, engine.Request{Owner: "a", Code: "import os, time"})
	mark := first.Kernel.Dir + "/go"
	done := make(chan *engine.Result, 1)
	go func() {
		r, _ := eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "i = 0\nwhile not os.path.exists(" + strconv.Quote(mark) +
			"):\n    i += 1\n    print('tick', i, flush=True)\n    time.sleep(0.05)"})
		done <- r
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ks := eng.Kernels(); len(ks) == 1 && ks[0].State == engine.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cell did not start")
		}
	}
	sub := eng.SubscribeWith(engine.SubscribeOptions{Buffer: 1 << 10, Output: true})
	defer sub.Close()
	timeout := time.After(10 * time.Second)
	for got := false; !got; {
		select {
		case ev := <-sub.C:
			got = ev.Type == engine.EventCellOutput && strings.HasPrefix(ev.Text, "tick")
		case <-timeout:
			b, _ := os.ReadFile(first.Kernel.Dir + "/runner.log")
			t.Fatalf("no output of the running cell reached a subscriber that came while it ran\n%s", b)
		}
	}
	os.WriteFile(mark, nil, 0o600)
	if r := <-done; r == nil || r.Status != engine.StatusSuccess {
		t.Fatalf("the cell: %+v", r)
	}
}

// A cell that runs on a spare is filed under the spare's id, which is the
// kernel's: whoever lists the kernel's cells sees it while it runs.
func TestCellOnASpareIsTheKernels(t *testing.T) {
	eng, env, _ := spareEngine(t, 1, 8)
	waitSpares(t, eng, 1)
	mark := env.TempDir() + "/go"
	done := make(chan *engine.Result, 1)
	go func() {
		r, _ := eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "import os, time\nwhile not os.path.exists(" +
			strconv.Quote(mark) + "):\n    time.sleep(0.02)"})
		done <- r
	}()
	defer func() { os.WriteFile(mark, nil, 0o600); <-done }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ks := eng.Kernels(); len(ks) == 1 && ks[0].State == engine.StateRunning {
			cells := eng.Cells(ks[0].ID)
			if len(cells) == 1 && cells[0].Running && cells[0].Kernel == ks[0].ID {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("kernel %s runs a cell; its cells: %+v", ks[0].ID, cells)
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the cell did not start")
		}
	}
}

// A spare whose stubs cannot be written (its stubs file is now a link) is
// not used: it is killed, and the kernel with tools gets a runner of its
// own, with its stubs.
func TestSpareWithoutStubsIsNotUsed(t *testing.T) {
	eng, env, _ := spareEngine(t, 1, 8)
	waitSpares(t, eng, 1)
	spares := proctest.Runners(env.TempDir())
	dirs, _ := filepath.Glob(filepath.Join(env.TempDir(), "kerneldeck-*", "k*", "kerneldeck_tools.py"))
	if len(spares) != 1 || len(dirs) != 1 {
		t.Fatalf("one spare: runners %v, stubs files %v", spares, dirs)
	}
	if err := os.Remove(dirs[0]); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/null", dirs[0]); err != nil {
		t.Fatal(err)
	}
	c := rtExec(t, eng, engine.Request{Owner: "c", Tools: []string{"read_file"}, Code: "import kerneldeck_tools as kt\nprint(kt.TOOLS)"})
	if c.Stdout != "('read_file',)\n" || c.Kernel.PID == spares[0] {
		t.Fatalf("stdout %q, kernel %+v; want its stubs in a runner other than the spare %d", c.Stdout, c.Kernel, spares[0])
	}
	for deadline := time.Now().Add(10 * time.Second); proctest.Alive(spares[0]); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the spare %d whose stubs failed still runs", spares[0])
		}
	}
}

// gatedDialer is a local backend whose first stream to a runner waits at
// a gate: the test holds a cell between the engine's choice of whether to
// stream it and the cell reaching the runner.
type gatedDialer struct {
	*backends.Local
	dialing chan struct{} // closed when the first dial waits
	gate    chan struct{} // closed by the test to let it through
}

func (g *gatedDialer) DialUnix(ctx context.Context, path string) (net.Conn, error) {
	select {
	case <-g.dialing:
	default:
		close(g.dialing)
		<-g.gate
	}
	return g.Local.DialUnix(ctx, path)
}

// A subscriber that takes output and comes while the stream to a cell's
// runner is being opened, after the engine chose not to stream the cell,
// still gets the cell's output.
func TestOutputSubscriberJoinsACellOnItsWay(t *testing.T) {
	env := &gatedDialer{Local: backends.NewLocal(enginetest.ShortTempDir(t)), dialing: make(chan struct{}), gate: make(chan struct{})}
	eng, err := engine.New(engine.Config{Backends: []backends.Env{env}, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rtClose(t, eng) })
	mark := env.TempDir() + "/go"
	done := make(chan *engine.Result, 1)
	go func() {
		r, _ := eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "import os, time\ni = 0\nwhile not os.path.exists(" +
			strconv.Quote(mark) + "):\n    i += 1\n    print('tick', i, flush=True)\n    time.sleep(0.05)"})
		done <- r
	}()
	defer func() { os.WriteFile(mark, nil, 0o600); <-done }()
	select {
	case <-env.dialing:
	case <-time.After(30 * time.Second):
		t.Fatal("the engine never opened a stream to the runner")
	}
	if ks := eng.Kernels(); len(ks) != 1 || ks[0].State != engine.StateRunning {
		t.Fatalf("the stream is opened for a cell that does not run yet: %+v", ks)
	}
	sub := eng.SubscribeWith(engine.SubscribeOptions{Buffer: 1 << 10, Output: true})
	defer sub.Close()
	close(env.gate)
	timeout := time.After(10 * time.Second)
	for got := false; !got; {
		select {
		case ev := <-sub.C:
			got = ev.Type == engine.EventCellOutput && strings.HasPrefix(ev.Text, "tick")
		case <-timeout:
			t.Fatal("no output reached a subscriber that came while the cell's stream was being opened")
		}
	}
}
