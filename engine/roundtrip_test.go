package engine_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/proctest"
)

// The headline figures, as exact counts over a real local backend
// with real python3 runners:
//
//	plain Execute: spawn + first cell = 2 Execute calls, warm cell = 1.
//	fast path:     spawn + first cell = 1 Execute + 1 frame, warm cell = 0 + 1.
const rtWarmCells = 20

// rtCountingEngine starts an engine over a Counting local backend; with
// executeOnly the local fast path is hidden, so every step is a plain Execute.
func rtCountingEngine(t testing.TB, executeOnly bool) (*engine.Engine, backendtest.Counting) {
	t.Helper()
	var env backends.Env = backends.NewLocal(enginetest.ShortTempDir(t))
	if executeOnly {
		env = backends.ExecuteOnly(env)
	}
	counting := backendtest.NewCounting(env)
	eng, err := engine.New(engine.Config{Backends: []backends.Env{counting}, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rtClose(t, eng) })
	return eng, counting
}

// rtClose kills every kernel; Close is idempotent, so tests may also call
// it early to check what it leaves behind.
func rtClose(t testing.TB, eng *engine.Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := eng.Close(ctx, false); err != nil {
		t.Errorf("engine close: %v", err)
	}
}

func rtExec(t testing.TB, eng *engine.Engine, req engine.Request) *engine.Result {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = 60 * time.Second
	}
	res, err := eng.Execute(context.Background(), req)
	if err != nil {
		t.Fatalf("Execute(%q): %v", req.Code, err)
	}
	if res.Status != "success" || res.Fallback != "" || res.Kernel == nil {
		t.Fatalf("Execute(%q): status %q fallback %q stderr %q traceback %q kernel %+v",
			req.Code, res.Status, res.Fallback, res.Stderr, res.Traceback, res.Kernel)
	}
	return res
}

// rtCounts is what one step cost in backend round trips. Executes leaves
// out the one compile of the runner per host, which runs beside the first
// spawn's kernel, not on any cell's path (Compiles counts it).
type rtCounts struct {
	Executes, Compiles, Spawns, Cells, Frames, CellFrames int
	Markers                                               map[string]int
}

func rtSnapshot(c backendtest.Counting) rtCounts {
	return rtCounts{Executes: rtExecutes(c), Compiles: c.ByMarker("compile"), Spawns: c.ByMarker("spawn"), Cells: c.ByMarker("cell"),
		Frames: c.Frames(), CellFrames: c.FramesByOp("cell"), Markers: c.Markers()}
}

// waitCompiles waits until n compiles of the runner have returned (the
// first spawn on a host sets one off in the background).
func waitCompiles(t testing.TB, c backendtest.Counting, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); c.Returned("compile") < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d compiles of the runner returned within 20 s, want %d", c.Returned("compile"), n)
		}
	}
}

// rtRequireCompiledSpawn checks that, once the runner's compile returned,
// a new kernel on the backend runs from the compiled runner: its runner.py
// is the loader (which runs nothing but code on its stdin), its cells run,
// and the code never became a file.
func rtRequireCompiledSpawn(t *testing.T, eng *engine.Engine, c backendtest.Counting, backend string) {
	t.Helper()
	waitCompiles(t, c, 1)
	res := rtExec(t, eng, engine.Request{Owner: "compiled", Backend: backend, Code: "print(6 * 7)"})
	if res.Stdout != "42\n" || res.Kernel.Reused {
		t.Fatalf("a kernel from the compiled runner: stdout %q kernel %+v", res.Stdout, res.Kernel)
	}
	dir := backends.ShellQuote(res.Kernel.Dir)
	out, err := c.Execute(context.Background(), "grep -q '^# kerneldeck runner loader' "+dir+"/runner.py && ! test -e "+dir+"/runner.code && echo COMPILED",
		backends.ExecOptions{Timeout: 20 * time.Second})
	if err != nil || !strings.Contains(out.Output, "COMPILED") {
		t.Fatalf("the spawn after the compile did not ship the loader alone: %q %v", out.Output, err)
	}
}

// rtExecutes is the Execute calls so far but the runner's compile.
func rtExecutes(c backendtest.Counting) int { return c.Executes() - c.ByMarker("compile") }

// rtRequireOnly fails unless the Execute calls so far carry only the given
// markers (so a probe, cleanup or fetch command cannot hide in a total),
// and at most one compile of the runner.
func rtRequireOnly(t *testing.T, c backendtest.Counting, allowed ...string) {
	t.Helper()
	if n := c.ByMarker("compile"); n > 1 {
		t.Errorf("the runner was compiled %d times on one host, want at most once", n)
	}
	for m, n := range c.Markers() {
		ok := m == "compile"
		for _, a := range allowed {
			ok = ok || m == a
		}
		if !ok {
			t.Errorf("%d unexpected Execute call(s) with marker %q; commands:\n%s", n, m, strings.Join(c.Commands(), "\n---\n"))
		}
	}
}

func TestRoundTripExecuteOnly(t *testing.T) {
	eng, c := rtCountingEngine(t, true)

	// Spawn + first cell: exactly 1 spawn and 1 cell command.
	first := rtExec(t, eng, engine.Request{Owner: "rt", Code: "x = 41\nprint(x + 1)"})
	if first.Stdout != "42\n" || first.Kernel.Reused || first.Kernel.ExecutionCount != 1 {
		t.Fatalf("first cell: stdout %q kernel %+v", first.Stdout, first.Kernel)
	}
	if got := rtSnapshot(c); got.Executes != 2 || got.Spawns != 1 || got.Cells != 1 {
		t.Fatalf("spawn + first cell over plain Execute cost %d Execute calls (%v), want exactly 2 (1 spawn + 1 cell)", got.Executes, got.Markers)
	}
	rtRequireOnly(t, c, "spawn", "cell")

	// Each warm cell: exactly one cell command, no probe, no cleanup.
	for i := range rtWarmCells {
		before := rtExecutes(c)
		res := rtExec(t, eng, engine.Request{Owner: "rt", Code: "x += 1\nx"})
		if !res.Kernel.Reused || res.Kernel.ID != first.Kernel.ID || res.Kernel.ExecutionCount != i+2 || res.Stdout != strconv.Itoa(42+i)+"\n" {
			t.Fatalf("warm cell %d: stdout %q kernel %+v", i, res.Stdout, res.Kernel)
		}
		if d := rtExecutes(c) - before; d != 1 {
			t.Fatalf("warm cell %d cost %d Execute calls, want exactly 1; markers so far %v", i, d, c.Markers())
		}
	}
	if got := rtSnapshot(c); got.Executes != 2+rtWarmCells || got.Spawns != 1 || got.Cells != 1+rtWarmCells || got.Frames != 0 {
		t.Fatalf("after spawn + %d cells: %+v, want %d Execute calls (1 spawn + %d cells) and no frames",
			1+rtWarmCells, got, 2+rtWarmCells, 1+rtWarmCells)
	}
	rtRequireOnly(t, c, "spawn", "cell")

	// A cell that runs longer than the host-side poll tick (1 s) still costs
	// one command: the wait happens on the host, not in client-side polling.
	before := rtExecutes(c)
	rtExec(t, eng, engine.Request{Owner: "rt", Code: "import time\ntime.sleep(1.3)"})
	if d := rtExecutes(c) - before; d != 1 {
		t.Fatalf("a 1.3 s cell cost %d Execute calls, want 1 (one wait window is %v)", d, engine.DefaultWaitWindow)
	}
	rtRequireOnly(t, c, "spawn", "cell")
	pid := first.Kernel.PID

	rtClose(t, eng)
	rtRequireGone(t, pid)
}

func TestRoundTripStream(t *testing.T) {
	eng, c := rtCountingEngine(t, false)
	if backends.StreamsOf(c) == nil {
		t.Fatal("the counting local backend must offer streams")
	}

	// Spawn + first cell: 1 Execute (the spawn) + 1 frame (the cell).
	first := rtExec(t, eng, engine.Request{Owner: "rt", Code: "x = 41\nprint(x + 1)"})
	if first.Stdout != "42\n" || first.Kernel.Reused || first.Kernel.ExecutionCount != 1 {
		t.Fatalf("first cell: stdout %q kernel %+v", first.Stdout, first.Kernel)
	}
	if got := rtSnapshot(c); got.Executes != 1 || got.Spawns != 1 || got.Frames != 1 || got.CellFrames != 1 {
		t.Fatalf("spawn + first cell on the fast path cost %+v, want exactly 1 Execute (spawn) + 1 cell frame", got)
	}

	// Each warm cell: no Execute, one frame.
	for i := range rtWarmCells {
		before := rtSnapshot(c)
		res := rtExec(t, eng, engine.Request{Owner: "rt", Code: "x += 1\nx"})
		if !res.Kernel.Reused || res.Kernel.ID != first.Kernel.ID || res.Kernel.ExecutionCount != i+2 || res.Stdout != strconv.Itoa(42+i)+"\n" {
			t.Fatalf("warm cell %d: stdout %q kernel %+v", i, res.Stdout, res.Kernel)
		}
		after := rtSnapshot(c)
		if after.Executes != before.Executes || after.Frames-before.Frames != 1 {
			t.Fatalf("warm cell %d cost %d Execute calls and %d frames, want 0 and 1",
				i, after.Executes-before.Executes, after.Frames-before.Frames)
		}
	}
	if got := rtSnapshot(c); got.Executes != 1 || got.Spawns != 1 || got.Frames != 1+rtWarmCells || got.CellFrames != 1+rtWarmCells {
		t.Fatalf("after spawn + %d cells: %+v, want 1 Execute and %d cell frames", 1+rtWarmCells, got, 1+rtWarmCells)
	}
	if c.Dials() != 1 {
		t.Errorf("%d dials for one kernel, want 1 (the stream is kept)", c.Dials())
	}
	rtRequireOnly(t, c, "spawn")
	// Nor any file of a cell: a cell over the socket has no request record,
	// and its result is filed only when a door needs it.
	ents, err := os.ReadDir(first.Kernel.Dir + "/cells")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if n := e.Name(); n != "_stdout" && n != "_stderr" {
			t.Errorf("cells dir after %d warm cells over the socket holds %s, want only the output files", rtWarmCells, n)
		}
	}

	before := rtSnapshot(c)
	rtExec(t, eng, engine.Request{Owner: "rt", Code: "import time\ntime.sleep(1.3)"})
	if after := rtSnapshot(c); after.Executes != before.Executes || after.Frames-before.Frames != 1 {
		t.Fatalf("a 1.3 s cell cost %d Execute calls and %d frames, want 0 and 1",
			after.Executes-before.Executes, after.Frames-before.Frames)
	}
	rtRequireCompiledSpawn(t, eng, c, "")
	pid := first.Kernel.PID

	rtClose(t, eng)
	rtRequireGone(t, pid)
}

// A reset is a kill plus a spawn; the first cell after it runs in the same
// round trips as any first cell.
func TestRoundTripReset(t *testing.T) {
	for _, mode := range []struct {
		name                string
		executeOnly         bool
		wantExec, wantFrame int
	}{{"execute", true, 3, 0}, {"stream", false, 2, 1}} {
		t.Run(mode.name, func(t *testing.T) {
			eng, c := rtCountingEngine(t, mode.executeOnly)
			first := rtExec(t, eng, engine.Request{Owner: "rt", Code: "x = 1"})
			c.Reset()
			res := rtExec(t, eng, engine.Request{Owner: "rt", Code: "'x' in dir()", Reset: true})
			if !res.Kernel.StateReset || res.Kernel.ID == first.Kernel.ID || res.Stdout != "False\n" {
				t.Fatalf("reset: stdout %q kernel %+v", res.Stdout, res.Kernel)
			}
			got := rtSnapshot(c)
			if got.Executes != mode.wantExec || got.Frames != mode.wantFrame || c.ByMarker("kill") != 1 || got.Spawns != 1 {
				t.Fatalf("reset + cell cost %+v, want %d Execute calls (1 kill + 1 spawn + cells) and %d frames", got, mode.wantExec, mode.wantFrame)
			}
			rtClose(t, eng)
			rtRequireGone(t, first.Kernel.PID)
			rtRequireGone(t, res.Kernel.PID)
		})
	}
}

// rtRequireGone fails unless the runner process pid has exited (a zombie
// waiting for its reaper counts as gone).
func rtRequireGone(t *testing.T, pid int) {
	t.Helper()
	if pid <= 1 {
		t.Fatalf("bad runner pid %d", pid)
	}
	for range 100 {
		if !rtProcessAlive(pid) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	t.Fatalf("runner pid %d is still running after the engine closed", pid)
}

func rtProcessAlive(pid int) bool { return proctest.Alive(pid) }

// A tool call costs one extra round trip, never a polling cadence: over
// plain Execute a warm cell making N fast calls costs 1+N cell scripts (each
// returns the requests and the next one carries the answers while it waits
// on), and over the fast path no Execute at all, one rpc_result frame each.
func TestRoundTripsPerToolCall(t *testing.T) {
	const calls = 5
	for _, door := range rtDoors {
		t.Run(door.name, func(t *testing.T) {
			var env backends.Env = backends.NewLocal(enginetest.ShortTempDir(t))
			if door.executeOnly {
				env = backends.ExecuteOnly(env)
			}
			counting := backendtest.NewCounting(env)
			reg := hosttools.NewRegistry()
			if err := reg.Register(hosttools.Tool{Name: "noop", Description: "Answer at once.",
				Handler: func(context.Context, hosttools.Call) (hosttools.Result, error) {
					return hosttools.Result{Text: "ok"}, nil
				}}); err != nil {
				t.Fatal(err)
			}
			eng, err := engine.New(engine.Config{Backends: []backends.Env{counting}, StateDir: t.TempDir(),
				Tools: reg, Approvals: engine.Approvals{Default: engine.PolicyAllow}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rtClose(t, eng) })
			req := engine.Request{Owner: "a", Tools: []string{"noop"}, Code: "1"}
			rtExec(t, eng, req)
			counting.Reset()
			// The cell also counts the request files its calls write (the
			// runner's write_private): one each over plain Execute, none over
			// the runner's socket.
			req.Code = "import sys, kerneldeck_tools as kt\nM = sys.modules['__main__']\nfiles, orig = [], M.write_private\n" +
				"M.write_private = lambda p, d: (files.append(p), orig(p, d))[1]\n" +
				"try:\n    n = sum(kt.noop() == 'ok' for _ in range(" + strconv.Itoa(calls) + "))\nfinally:\n    M.write_private = orig\n" +
				"print(n, sum('/rpc/' in p for p in files))"
			res := rtExec(t, eng, req)
			wantFiles := 0
			if door.executeOnly {
				wantFiles = calls
			}
			if res.Stdout != fmt.Sprintf("%d %d\n", calls, wantFiles) || res.ToolCallsMade != calls {
				t.Fatalf("stdout %q (calls answered, request files written), tool_calls_made %d; want %d %d", res.Stdout, res.ToolCallsMade, calls, wantFiles)
			}
			got := rtSnapshot(counting)
			want := rtCounts{Executes: 1 + calls, Cells: 1 + calls}
			if !door.executeOnly {
				want = rtCounts{Executes: 0, Cells: 0}
				if f := counting.FramesByOp("rpc_result"); f != calls {
					t.Errorf("rpc_result frames %d, want %d", f, calls)
				}
			}
			if got.Executes != want.Executes || got.Cells != want.Cells || got.Spawns != 0 {
				t.Fatalf("a warm cell with %d tool calls cost %+v, want %d executes, %d cell scripts", calls, got, want.Executes, want.Cells)
			}
		})
	}
}
