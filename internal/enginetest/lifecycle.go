// Package enginetest is the engine lifecycle suite that runs against real
// backends (local now, ssh later): real runners, real files, real kills.
package enginetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// Harness is one engine on one real backend, closed at the end of the test.
type Harness struct {
	T        *testing.T
	Env      backends.Env
	Eng      *engine.Engine
	StateDir string
	Trace    string
	Log      *EventLog
}

// EventLog keeps every event of a subscription, for tests that check which
// events a scenario produced.
type EventLog struct {
	sub  *engine.Subscription
	mu   sync.Mutex
	seen []engine.Event
}

// NewEventLog subscribes to eng with room for many events.
func NewEventLog(eng *engine.Engine) *EventLog { return &EventLog{sub: eng.Subscribe(1 << 14)} }

// All drains the subscription and returns every event seen so far.
func (l *EventLog) All() []engine.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		select {
		case ev, ok := <-l.sub.C:
			if ok {
				l.seen = append(l.seen, ev)
				continue
			}
		default:
		}
		return slices.Clone(l.seen)
	}
}

// New starts an engine on env with small limits suited to tests; mutate cfg
// to change them.
func New(t *testing.T, env backends.Env, mutate func(*engine.Config)) *Harness {
	t.Helper()
	h := &Harness{T: t, Env: env, StateDir: filepath.Join(t.TempDir(), "state"),
		Trace: filepath.Join(t.TempDir(), "trace.jsonl")}
	tracer, err := backends.OpenTracer(h.Trace)
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.Config{
		Backends:       []backends.Env{backends.Traced(env, tracer)},
		StateDir:       h.StateDir,
		Tracer:         tracer,
		InterruptGrace: time.Second,
		CellTimeout:    60 * time.Second,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	h.Eng, err = engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.Log = NewEventLog(h.Eng)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.Eng.Close(ctx, false); err != nil {
			t.Errorf("close engine: %v", err)
		}
		tracer.Close()
	})
	return h
}

// Run executes code for owner and fails the test on an engine error.
func (h *Harness) Run(owner, code string, timeout time.Duration) *engine.Result {
	h.T.Helper()
	res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: owner, Code: code, Timeout: timeout})
	if err != nil {
		h.T.Fatalf("execute %q for %s: %v", code, owner, err)
	}
	if res.Kernel == nil {
		h.T.Fatalf("execute %q for %s ran without a kernel (fallback %q): %q", code, owner, res.Fallback, res.Stderr)
	}
	return res
}

// ShortTempDir is a private temp dir with a short path: t.TempDir() paths
// can be too long for a Unix socket, which would hide the fast path.
func ShortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Host runs a shell command on the backend's host and returns its output.
func (h *Harness) Host(command string) string {
	h.T.Helper()
	res, err := h.Env.Execute(context.Background(), command, backends.ExecOptions{Timeout: 20 * time.Second})
	if err != nil {
		h.T.Fatalf("host command %q: %v", command, err)
	}
	return res.Output
}

// Alive reports whether pid runs on the host.
func (h *Harness) Alive(pid int) bool {
	h.T.Helper()
	// A zombie waiting for its adopter to reap it is not alive.
	out := h.Host(fmt.Sprintf(`s=$(ps -o stat= -p %d 2>/dev/null); case "$s" in ""|Z*) ;; *) echo ALIVE;; esac`, pid))
	return strings.Contains(out, "ALIVE")
}

// WaitFor polls cond until it holds or the deadline passes.
func (h *Harness) WaitFor(what string, within time.Duration, cond func() bool) {
	h.T.Helper()
	end := time.Now().Add(within)
	for !cond() {
		if time.Now().After(end) {
			h.T.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AllEvents drains the subscription and returns every event seen so far.
func (h *Harness) AllEvents() []engine.Event { return h.Log.All() }

// EventsOf returns every event of type t seen so far.
func (h *Harness) EventsOf(t engine.EventType) []engine.Event {
	var out []engine.Event
	for _, ev := range h.AllEvents() {
		if ev.Type == t {
			out = append(out, ev)
		}
	}
	return out
}

// Kernel returns the registry entry of owner, if any.
func (h *Harness) Kernel(owner string) (engine.KernelInfo, bool) {
	for _, k := range h.Eng.Kernels() {
		if k.Owner == owner {
			return k, true
		}
	}
	return engine.KernelInfo{}, false
}

func expectStatus(t *testing.T, res *engine.Result, want string) {
	t.Helper()
	if string(res.Status) != want {
		t.Fatalf("status %q, want %q; stdout %q stderr %q traceback %q kernel %+v",
			res.Status, want, res.Stdout, res.Stderr, res.Traceback, res.Kernel)
	}
}

// Lifecycle runs the lifecycle suite; newEnv returns a fresh backend for one
// subtest.
func Lifecycle(t *testing.T, newEnv func(t *testing.T) backends.Env) {
	// A runner nobody will reap is left first and looked at last, so that
	// its idle_exit passes while the other subtests run.
	forgotten := forgetARunner(t, newEnv(t))
	t.Run("StatePersistsAndCountGrows", func(t *testing.T) {
		h := New(t, newEnv(t), nil)
		first := h.Run("a", "x = 40", 0)
		expectStatus(t, first, "success")
		if first.Kernel.Reused {
			t.Fatal("first call reports a reused kernel")
		}
		second := h.Run("a", "x += 2\nprint(x)\n__name__", 0)
		expectStatus(t, second, "success")
		if second.Stdout != "42\n'__main__'\n" || !second.Kernel.Reused || second.Kernel.ExecutionCount != 2 {
			t.Fatalf("second cell: stdout %q reused %v count %d", second.Stdout, second.Kernel.Reused, second.Kernel.ExecutionCount)
		}
		if second.Kernel.PID != first.Kernel.PID {
			t.Fatalf("pid changed from %d to %d", first.Kernel.PID, second.Kernel.PID)
		}
		errRes := h.Run("a", "def f():\n    return 1/0\nf()", 0)
		expectStatus(t, errRes, "error")
		if !strings.Contains(errRes.Traceback, "ZeroDivisionError") || !strings.Contains(errRes.Traceback, "return 1/0") ||
			strings.Contains(errRes.Traceback, "runner.py") {
			t.Fatalf("traceback should show the cell's frames only: %q", errRes.Traceback)
		}
		sub := h.Run("a", "import subprocess\nsubprocess.run(['echo', 'from a child'])\nimport sys; print('err', file=sys.stderr)", 0)
		if sub.Stdout != "from a child\n" || sub.Stderr != "err\n" {
			t.Fatalf("subprocess output not captured: stdout %q stderr %q", sub.Stdout, sub.Stderr)
		}
	})

	t.Run("KilledWhileIdleIsReportedAndRespawned", func(t *testing.T) {
		h := New(t, newEnv(t), nil)
		first := h.Run("a", "x = 1", 0)
		h.Host(fmt.Sprintf("kill -9 %d", first.Kernel.PID))
		h.WaitFor("runner to die", 10*time.Second, func() bool { return !h.Alive(first.Kernel.PID) })
		res := h.Run("a", "print(globals().get('x', 'gone'))", 0)
		expectStatus(t, res, "success")
		if !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "state from earlier calls was lost") {
			t.Fatalf("state loss not reported: %+v", res.Kernel)
		}
		if res.Stdout != "gone\n" || res.Kernel.PID == first.Kernel.PID || res.Kernel.Reused {
			t.Fatalf("not a fresh kernel: stdout %q kernel %+v", res.Stdout, res.Kernel)
		}
		if len(h.EventsOf(engine.EventStateLost)) == 0 {
			t.Fatal("no state_lost event")
		}
	})

	t.Run("KilledMidCellIsNoticedBeforeTheTimeout", func(t *testing.T) {
		h := New(t, newEnv(t), nil)
		first := h.Run("a", "x = 1", 0)
		done := make(chan *engine.Result, 1)
		// The marker proves the cell runs in the runner, not just that the
		// engine is about to publish it (a kill before publishing respawns).
		marker := first.Kernel.Dir + "/started"
		go func() {
			res, _ := h.Eng.Execute(context.Background(), engine.Request{Owner: "a",
				Code: fmt.Sprintf("import time\nopen(%q, 'w').close()\ntime.sleep(60)", marker), Timeout: 120 * time.Second})
			done <- res
		}()
		h.WaitFor("cell to run", 10*time.Second, func() bool { return strings.Contains(h.Host("ls "+marker+" 2>/dev/null; true"), marker) })
		start := time.Now()
		h.Host(fmt.Sprintf("kill -9 %d", first.Kernel.PID))
		var res *engine.Result
		select {
		case res = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("a runner killed mid-cell was not noticed; the call waits for its 120s timeout")
		}
		t.Logf("death noticed after %v", time.Since(start))
		if res == nil {
			t.Fatal("execute returned an error instead of a result")
		}
		expectStatus(t, res, "error")
		if !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "state from earlier calls was lost") {
			t.Fatalf("state loss not reported: %+v", res.Kernel)
		}
		if _, ok := h.Kernel("a"); ok {
			t.Fatal("a dead kernel stays in the registry")
		}
		next := h.Run("a", "print(1)", 0)
		if next.Kernel.PID == first.Kernel.PID || next.Stdout != "1\n" {
			t.Fatalf("next call did not respawn: %+v", next.Kernel)
		}
	})

	t.Run("OwnerOnlyFilesAndNoTokenAnywhere", func(t *testing.T) {
		h := New(t, newEnv(t), nil)
		res := h.Run("a", "print('hi')", 0)
		dir := res.Kernel.Dir
		// The secret lives in the engine's and the runner's memory only: not
		// in the runner's environment, argv or any file of its dir.
		token := ""
		for _, k := range h.Eng.Kept() {
			token = k.Token
		}
		if len(token) < 32 {
			t.Fatalf("the engine lists no secret for the kernel")
		}
		if env := h.Host(fmt.Sprintf("cat /proc/%d/environ /proc/%d/cmdline 2>/dev/null; true", res.Kernel.PID, res.Kernel.PID)); strings.Contains(env, token) {
			t.Fatalf("the secret is in the runner's environment or argv")
		}
		if files := strings.TrimSpace(h.Host(fmt.Sprintf("grep -rl %s %s 2>/dev/null; true", token, dir))); files != "" {
			t.Fatalf("the secret is in files of the kernel dir: %s", files)
		}
		inCell := h.Run("a", "import os\nprint('\\n'.join(k + '=' + v for k, v in os.environ.items()))", 0)
		if inCell.Status != "success" || strings.Contains(inCell.Stdout, token) {
			t.Fatalf("cells see the secret in os.environ (status %s)", inCell.Status)
		}
		modes := h.Host(fmt.Sprintf("cd %s && stat -c '%%a %%n' .. . cells rpc runner.py kerneldeck_tools.py runner.log cells/* sock; ls -a", dir))
		for line := range strings.SplitSeq(strings.TrimSpace(modes), "\n") {
			mode, name, _ := strings.Cut(line, " ")
			switch {
			case name == "" || strings.HasPrefix(mode, "."):
			case name == ".." || name == "." || name == "cells" || name == "rpc":
				if mode != "700" {
					t.Errorf("dir %s has mode %s, want 700", name, mode)
				}
			case strings.Contains(mode, "/") || len(mode) != 3:
			default:
				if mode != "600" {
					t.Errorf("file %s has mode %s, want 600", name, mode)
				}
			}
			if strings.Contains(line, "kernel.env") {
				t.Errorf("kernel.env was not deleted after sourcing: %s", line)
			}
		}
		if strings.Contains(modes, "kernel.env") {
			t.Errorf("kernel.env left in the kernel dir: %s", modes)
		}
		trace, err := os.ReadFile(h.Trace)
		if err != nil {
			t.Fatal(err)
		}
		if len(trace) == 0 {
			t.Fatal("trace is empty")
		}
		if strings.Contains(string(trace), token) {
			t.Fatal("the RPC token appears in the trace of backend commands")
		}
		for _, ev := range h.AllEvents() {
			if strings.Contains(fmt.Sprint(ev), token) {
				t.Errorf("token in event %+v", ev)
			}
		}
		if st, err := os.Stat(h.Trace); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("trace file mode: %v %v", st.Mode(), err)
		}
	})

	t.Run("CloseLeavesNoRunner", func(t *testing.T) {
		env := newEnv(t)
		h := New(t, env, nil)
		var pids []int
		var dirs []string
		for _, owner := range []string{"a", "b", "c"} {
			res := h.Run(owner, "1", 0)
			pids = append(pids, res.Kernel.PID)
			dirs = append(dirs, res.Kernel.Dir)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.Eng.Close(ctx, false); err != nil {
			t.Fatal(err)
		}
		for i, pid := range pids {
			if h.Alive(pid) {
				t.Errorf("runner %d still alive after Close", pid)
			}
			if out := h.Host("ls -d " + dirs[i] + " 2>/dev/null; true"); strings.TrimSpace(out) != "" {
				t.Errorf("kernel dir %s left behind", dirs[i])
			}
		}
	})

	t.Run("IdleKernelIsReapedOnItsHost", func(t *testing.T) {
		h := New(t, newEnv(t), func(c *engine.Config) { c.SweepEvery = 100 * time.Millisecond })
		res := h.Run("a", "1", 0)
		idle := time.Second
		if err := h.Eng.SetLimits(nil, &idle); err != nil {
			t.Fatal(err)
		}
		h.WaitFor("idle reap", 15*time.Second, func() bool { _, ok := h.Kernel("a"); return !ok })
		h.WaitFor("runner killed on its host", 15*time.Second, func() bool { return !h.Alive(res.Kernel.PID) })
		if evs := h.EventsOf(engine.EventReapedIdle); len(evs) != 1 || !strings.Contains(evs[0].Detail, "idle_exit") {
			t.Fatalf("reaped_idle events: %+v", evs)
		}
	})

	t.Run("CapEvictsLeastRecentlyUsed", func(t *testing.T) {
		h := New(t, newEnv(t), func(c *engine.Config) { c.MaxKernels = 2 })
		r0 := h.Run("owner-0", "1", 0)
		h.Run("owner-1", "1", 0)
		h.Run("owner-0", "2", 0) // owner-1 is now the least recently used
		h.Run("owner-2", "1", 0)
		var owners []string
		for _, k := range h.Eng.Kernels() {
			owners = append(owners, k.Owner)
		}
		if strings.Join(owners, ",") != "owner-0,owner-2" {
			t.Fatalf("kernels after eviction: %v, want owner-0,owner-2", owners)
		}
		if !h.Alive(r0.Kernel.PID) {
			t.Fatal("the recently used kernel was killed")
		}
		evs := h.EventsOf(engine.EventEvictedCap)
		if len(evs) != 1 || evs[0].Owner != "owner-1" || !strings.Contains(evs[0].Detail, "least recently used") {
			t.Fatalf("evicted_cap events: %+v", evs)
		}
	})

	t.Run("BusyKernelIsNeverEvicted", func(t *testing.T) {
		h := New(t, newEnv(t), func(c *engine.Config) { c.MaxKernels = 1 })
		busy := h.Run("busy", "import time", 0)
		done := make(chan *engine.Result, 1)
		// Busy until the test interrupts it, not for a fixed time that a
		// loaded machine could outlast; the marker says the loop (and its
		// handler) is entered, so the interrupt cannot land before it.
		marker := busy.Kernel.Dir + "/busy"
		go func() {
			res, _ := h.Eng.Execute(context.Background(), engine.Request{Owner: "busy",
				Code: fmt.Sprintf("try:\n    open(%q, 'w').close()\n    while True: time.sleep(0.01)\nexcept KeyboardInterrupt:\n    print('survived')", marker)})
			done <- res
		}()
		h.WaitFor("busy cell to run", 30*time.Second, func() bool { return strings.Contains(h.Host("ls "+marker+" 2>/dev/null; true"), marker) })
		other := h.Run("other", "print('other')", 0)
		expectStatus(t, other, "success")
		// The newcomer settled first, so it is the one evicted; the busy one stays.
		if k, ok := h.Kernel("busy"); !ok || k.RunningCell == "" {
			t.Fatalf("the busy kernel was evicted mid-cell: %+v %v", k, ok)
		}
		if len(h.EventsOf(engine.EventEvictSkippedBusy)) == 0 {
			t.Fatal("no evict_skipped_busy event")
		}
		if err := h.Eng.Interrupt(context.Background(), busy.Kernel.ID); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res == nil || res.Stdout != "survived\n" || res.Kernel.PID != busy.Kernel.PID || res.Kernel.StateLost {
			t.Fatalf("busy kernel was disturbed: %+v", res)
		}
		// Once it settles, the registry comes back under the cap.
		h.WaitFor("cap enforced after the busy cell", 10*time.Second, func() bool { return len(h.Eng.Kernels()) == 1 })
	})

	t.Run("TimeoutInterruptsAndKeepsState", func(t *testing.T) {
		h := New(t, newEnv(t), nil)
		first := h.Run("a", "x = 5", 0)
		res := h.Run("a", "import time\ntime.sleep(30)", time.Second)
		expectStatus(t, res, "timeout")
		if res.Kernel.StateLost || res.Kernel.PID != first.Kernel.PID || !strings.Contains(res.Traceback, "KeyboardInterrupt") {
			t.Fatalf("an interruptible cell lost its kernel: %+v %q", res.Kernel, res.Traceback)
		}
		after := h.Run("a", "print(x)", 0)
		if after.Stdout != "5\n" || after.Kernel.StateLost {
			t.Fatalf("state not kept after an interrupted timeout: %q %+v", after.Stdout, after.Kernel)
		}
	})

	t.Run("TimeoutIgnoringInterruptKillsKernel", func(t *testing.T) {
		h := New(t, newEnv(t), func(c *engine.Config) { c.InterruptGrace = 500 * time.Millisecond })
		first := h.Run("a", "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)", 0)
		res := h.Run("a", "time.sleep(30)", time.Second)
		expectStatus(t, res, "timeout")
		if !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "state from earlier calls was lost") {
			t.Fatalf("kill after an ignored interrupt not reported: %+v", res.Kernel)
		}
		h.WaitFor("runner killed", 10*time.Second, func() bool { return !h.Alive(first.Kernel.PID) })
		if _, ok := h.Kernel("a"); ok {
			t.Fatal("killed kernel still registered")
		}
	})

	t.Run("InterruptStopsTheCellOnly", func(t *testing.T) {
		h := New(t, newEnv(t), nil)
		h.Run("a", "y = 'kept'", 0)
		done := make(chan *engine.Result, 1)
		go func() {
			res, _ := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "import time\nwhile True: time.sleep(0.01)"})
			done <- res
		}()
		var id string
		h.WaitFor("cell to run", 10*time.Second, func() bool { k, _ := h.Kernel("a"); id = k.ID; return k.RunningCell != "" })
		if err := h.Eng.Interrupt(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		res := <-done
		expectStatus(t, res, "interrupted")
		if after := h.Run("a", "print(y)", 0); after.Stdout != "kept\n" {
			t.Fatalf("state lost by an interrupt: %q", after.Stdout)
		}
	})

	t.Run("ResetGivesAFreshNamespace", func(t *testing.T) {
		h := New(t, newEnv(t), nil)
		first := h.Run("a", "x = 1", 0)
		res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "print('x' in globals())", Reset: true})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "False\n" || !res.Kernel.StateReset || res.Kernel.Reused || res.Kernel.ExecutionCount != 1 {
			t.Fatalf("reset: stdout %q kernel %+v", res.Stdout, res.Kernel)
		}
		h.WaitFor("old runner killed", 10*time.Second, func() bool { return !h.Alive(first.Kernel.PID) })
	})

	t.Run("ClippedOutputSpillsToStateDir", func(t *testing.T) {
		h := New(t, newEnv(t), func(c *engine.Config) { c.ClipChars = 1000 })
		res := h.Run("a", "print('x' * 5000)\nimport sys\n_ = sys.stderr.write('e' * 10)", 0)
		if !HeadAndTail(res.Stdout, 1000, "x\n") || !res.StdoutClipped || res.StderrClipped || res.Stderr != "eeeeeeeeee" {
			t.Fatalf("clip: stdout %q clipped %v/%v stderr %q", res.Stdout, res.StdoutClipped, res.StderrClipped, res.Stderr)
		}
		if res.SpillPath == "" || !strings.HasPrefix(res.SpillPath, h.StateDir) {
			t.Fatalf("spill path %q not under the state dir %s", res.SpillPath, h.StateDir)
		}
		data, err := os.ReadFile(res.SpillPath)
		if err != nil || string(data) != strings.Repeat("x", 5000)+"\n" {
			t.Fatalf("spill content: %d bytes, %v", len(data), err)
		}
		for p := res.SpillPath; strings.HasPrefix(p, h.StateDir) && p != h.StateDir; p = filepath.Dir(p) {
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			want := os.FileMode(0o700)
			if !st.IsDir() {
				want = 0o600
			}
			if st.Mode().Perm() != want {
				t.Errorf("%s has mode %v, want %v", p, st.Mode().Perm(), want)
			}
		}
	})

	t.Run("CellsOnOneKernelAreSerialized", func(t *testing.T) {
		h := New(t, newEnv(t), nil)
		h.Run("a", "order = []", 0)
		var wg sync.WaitGroup
		counts := make(chan int, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a",
					Code: fmt.Sprintf("import time\norder.append(%d)\ntime.sleep(0.02)\norder.append(%d)", i, i)})
				if err != nil || res.Status != "success" {
					t.Errorf("cell %d: %v %+v", i, err, res)
					return
				}
				counts <- res.Kernel.ExecutionCount
			}()
		}
		wg.Wait()
		close(counts)
		seen := map[int]bool{}
		for c := range counts {
			seen[c] = true
		}
		if len(seen) != 8 {
			t.Fatalf("execution counts not distinct: %v", seen)
		}
		res := h.Run("a", "print(all(order[i] == order[i+1] for i in range(0, len(order), 2)), len(order))", 0)
		if res.Stdout != "True 16\n" {
			t.Fatalf("cells overlapped: %q", res.Stdout)
		}
	})

	t.Run("PlantedRootFailsOpenToPerCall", func(t *testing.T) {
		env := newEnv(t)
		h := New(t, env, nil)
		login := strings.TrimSpace(h.Host("id -un"))
		root := env.TempDir() + "/kerneldeck-" + login
		target := env.TempDir() + "/elsewhere"
		h.Host(fmt.Sprintf("mkdir -p %s && ln -s %s %s", target, target, root))
		res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "print(6 * 7)"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Fallback != "per_call" || res.Kernel != nil || res.Stdout != "42\n" {
			t.Fatalf("fallback: %q kernel %+v stdout %q", res.Fallback, res.Kernel, res.Stdout)
		}
		if !strings.Contains(res.Stderr, root) || !strings.Contains(res.Stderr, "symbolic link") {
			t.Fatalf("the error does not name the planted path: %q", res.Stderr)
		}
		if out := strings.TrimSpace(h.Host("ls -A " + target)); out != "" {
			t.Fatalf("something was written through the planted symlink: %q", out)
		}
		if len(h.Eng.Kernels()) != 0 || len(h.EventsOf(engine.EventSpawnFailed)) != 1 || len(h.EventsOf(engine.EventFallbackPerCall)) != 1 {
			t.Fatalf("registry %d, events spawn_failed %d fallback %d", len(h.Eng.Kernels()),
				len(h.EventsOf(engine.EventSpawnFailed)), len(h.EventsOf(engine.EventFallbackPerCall)))
		}
	})

	t.Run("KeptKernelsAreAdoptedByTheNextEngine", func(t *testing.T) {
		env := newEnv(t)
		first := New(t, env, nil)
		a := first.Run("a", "x = 41", 0)
		b := first.Run("b", "y = 1", 0)
		kept := first.Eng.Kept()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := first.Eng.Close(ctx, true); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "kept.json")
		if err := engine.SaveKept(path, kept); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("kept file: %v %v", st, err)
		}
		loaded, err := engine.LoadKept(path)
		if err != nil || len(loaded) != 2 {
			t.Fatalf("LoadKept: %d kernels, %v", len(loaded), err)
		}
		if _, err := os.Stat(path); err == nil {
			t.Fatal("LoadKept left the file: a third engine would adopt the same kernels again")
		}
		// b's runner dies in the meantime: it is skipped, never respawned.
		first.Host(fmt.Sprintf("kill -9 %d", b.Kernel.PID))
		first.WaitFor("b's runner to die", 10*time.Second, func() bool { return !first.Alive(b.Kernel.PID) })

		second := New(t, env, nil)
		n, skipped := second.Eng.Adopt(context.Background(), loaded)
		if n != 1 || len(skipped) != 1 || !strings.Contains(skipped[0], b.Kernel.ID) || !strings.Contains(skipped[0], "exited") {
			t.Fatalf("adopted %d, skipped %q", n, skipped)
		}
		next := second.Run("a", "x + 1", 0)
		if next.Stdout != "42\n" || !next.Kernel.Reused || next.Kernel.PID != a.Kernel.PID || next.Kernel.ExecutionCount != 2 || next.Kernel.StateLost {
			t.Fatalf("the adopted kernel lost its state or was replaced: %q %+v", next.Stdout, next.Kernel)
		}
		if ev := second.EventsOf(engine.EventAdopted); len(ev) != 1 || ev[0].Kernel != a.Kernel.ID {
			t.Fatalf("adopted events: %+v", ev)
		}
		// It says how its runner is confined, as the first engine knew.
		for _, k := range second.Eng.Kernels() {
			for _, kk := range loaded {
				if k.ID == a.Kernel.ID && kk.ID == k.ID && (k.Confinement == "" || k.Confinement != kk.Confinement) {
					t.Fatalf("the adopted kernel's confinement %q, want %q, as its runner said", k.Confinement, kk.Confinement)
				}
			}
		}
		if len(second.EventsOf(engine.EventSpawned)) != 0 {
			t.Fatal("adopting spawned a kernel")
		}
		// Adopting the same records again is refused: no duplicates.
		if n, skipped := second.Eng.Adopt(context.Background(), loaded[:1]); n != 0 || len(skipped) != 1 {
			t.Fatalf("second adoption: %d, %q", n, skipped)
		}
	})

	t.Run("RunnerExitsByItselfWhenForgotten", func(t *testing.T) {
		// Left at the start, the runner has had its idle_exit while the
		// subtests above ran: its own reap is looked at now.
		h := forgotten.h
		h.T = t
		h.WaitFor("runner to exit by itself", 30*time.Second, func() bool { return !h.Alive(forgotten.pid) })
		// Its watcher removes the dir the moment the runner is gone.
		h.WaitFor("the runner's dir to go", 5*time.Second, func() bool {
			return strings.TrimSpace(h.Host("ls -d "+forgotten.dir+" 2>/dev/null; true")) == ""
		})
	})
}

// forgottenRunner is a kernel whose engine closed keeping it, so that
// nobody but the runner itself will reap it.
type forgottenRunner struct {
	h   *Harness
	pid int
	dir string
}

// forgetARunner starts a kernel on env with a short idle_exit and closes its
// engine keeping it.
func forgetARunner(t *testing.T, env backends.Env) forgottenRunner {
	t.Helper()
	// Long enough for Close and the look at the host after it to happen
	// before the runner's own reap, on a loaded host too (a second was
	// not, with the suites in parallel and ssh as root).
	h := New(t, env, func(c *engine.Config) { c.IdleExit = 6 * time.Second })
	res := h.Run("a", "1", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Eng.Close(ctx, true); err != nil {
		t.Fatal(err)
	}
	if !h.Alive(res.Kernel.PID) {
		t.Fatal("kept kernel was killed by Close(keep)")
	}
	return forgottenRunner{h: h, pid: res.Kernel.PID, dir: res.Kernel.Dir}
}

// StreamsOutput checks that output reaches OnOutput while the cell runs,
// and all of it before the result (fast path only).
func StreamsOutput(t *testing.T, env backends.Env) {
	h := New(t, env, nil)
	var mu sync.Mutex
	var got strings.Builder
	sawFirstEarly := make(chan struct{})
	var once sync.Once
	res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a",
		Code: "import time\nprint('first', flush=True)\ntime.sleep(1)\nprint('second')",
		OnOutput: func(stream, text string) {
			mu.Lock()
			defer mu.Unlock()
			got.WriteString(stream + ":" + text)
			if strings.Contains(got.String(), "first") {
				once.Do(func() { close(sawFirstEarly) })
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sawFirstEarly:
	default:
		t.Fatal("no output was streamed before the result")
	}
	if res.Stdout != "first\nsecond\n" {
		t.Fatalf("result stdout %q", res.Stdout)
	}
	mu.Lock()
	defer mu.Unlock()
	// All of it, the end too, before the result.
	if got.String() != "stdout:first\nstdout:second\n" {
		t.Fatalf("streamed %q, want both lines", got.String())
	}
}

// gapLine is the line a clipped stream's head and tail are joined by.
var gapLine = regexp.MustCompile(`\n\[\.\.\. [0-9,]+ bytes not shown; the whole output is in the spill file \.\.\.\]\n`)

// HeadAndTail reports whether a clipped stream is what the runner makes of
// one longer than clip characters: its head and its tail, made of body's
// characters, about clip in all, joined by the line saying how much is
// not shown.
func HeadAndTail(text string, clip int, body string) bool {
	loc := gapLine.FindStringIndex(text)
	if loc == nil {
		return false
	}
	rest := text[:loc[0]] + text[loc[1]:]
	n := utf8.RuneCountInString(rest)
	return strings.Trim(rest, body) == "" && n > clip*9/10 && n <= clip+1
}
