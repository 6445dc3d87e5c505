package engine

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine/runner"
)

// compiledRunnerEngine is an engine on a local backend that keeps spares
// spare runners, and that backend.
func compiledRunnerEngine(t *testing.T, spares int) (*Engine, backends.Env) {
	t.Helper()
	tmp, err := os.MkdirTemp("", "kd") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	env := backends.NewLocal(tmp)
	// The spares wait for the test's first spawn to begin: past 250 ms (a
	// loaded machine) they would start first, with the python3 on PATH.
	// The sweep runs often, as under load a first spawn outlasts its
	// second: it must not start them before that spawn either.
	eng, err := New(Config{Backends: []backends.Env{env}, StateDir: t.TempDir(), SpareKernels: map[string]int{env.URI(): spares},
		firstSpawnWait: time.Minute, SweepEvery: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		eng.Close(ctx, false)
	})
	return eng, env
}

func codeRun(t *testing.T, eng *Engine, owner, code string) *Result {
	t.Helper()
	res, err := eng.Execute(context.Background(), Request{Owner: owner, Code: code})
	if err != nil || res.Kernel == nil {
		t.Fatalf("Execute(%q) for %s: %v", code, owner, err)
	}
	return res
}

// waitRunnerCode waits for the engine to hold env's compiled runner and
// returns it.
func waitRunnerCode(t *testing.T, eng *Engine, env backends.Env) []byte {
	t.Helper()
	python := eng.python(env)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var code []byte
		if c := eng.codes.get(codeKey(env, python)); c != nil {
			code, _ = eng.codes.result(c)
		}
		if code != nil {
			return code
		}
		if time.Now().After(deadline) {
			t.Fatalf("no compiled runner for %s within 20 s", python)
		}
	}
}

// shipped returns dir's runner.py and whether it is the loader, which runs
// only code it read on stdin: the code never is a file in the dir.
func shipped(t *testing.T, dir string) (script []byte, hasCode bool) {
	t.Helper()
	script, err := os.ReadFile(filepath.Join(dir, "runner.py"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "runner.code")); err == nil {
		t.Fatalf("%s holds a runner.code: the compiled runner went to a file", dir)
	}
	return script, bytes.Equal(script, runner.Loader)
}

// The first spawn on a host ships runner.py; its interpreter then compiles
// the runner once, and the spawns after it run that code through the
// loader: the same kernel, the runner's frames still out of tracebacks. The
// second spawn comes at once: it waits for the compile under way.
func TestSpawnShipsTheCompiledRunner(t *testing.T) {
	eng, env := compiledRunnerEngine(t, 0)
	first := codeRun(t, eng, "first", "x = 1")
	if script, hasCode := shipped(t, first.Kernel.Dir); !bytes.Equal(script, runner.Source) || hasCode {
		t.Fatalf("the first spawn shipped %d bytes of runner.py (code too: %v), want the source", len(script), hasCode)
	}
	for _, owner := range []string{"second", "third"} {
		res := codeRun(t, eng, owner, "x = 20\nprint(x * 2)\n__name__")
		if res.Status != StatusSuccess || res.Stdout != "40\n'__main__'\n" || res.Kernel.Reused {
			t.Fatalf("a kernel from the compiled runner: %+v", res)
		}
		script, hasCode := shipped(t, res.Kernel.Dir)
		if !bytes.Equal(script, runner.Loader) || !hasCode {
			t.Fatalf("spawn after the compile shipped %d bytes of runner.py (code: %v), want the loader and the code", len(script), hasCode)
		}
		failed := codeRun(t, eng, owner, "def f():\n    return 1/0\nf()")
		if failed.Status != StatusError || !strings.Contains(failed.Traceback, "return 1/0") || strings.Contains(failed.Traceback, "runner.py") {
			t.Fatalf("traceback from the compiled runner should show the cell's frames only: %q", failed.Traceback)
		}
	}
	code := waitRunnerCode(t, eng, env)
	python := eng.python(env)
	magic, err := exec.Command(python, "-c", "import sys, importlib.util; sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER)").Output()
	if err != nil || len(magic) != 4 || !bytes.HasPrefix(code, magic) {
		t.Fatalf("compiled runner starts %x, want %s's magic number %x (%v)", code[:min(8, len(code))], python, magic, err)
	}
	n := eng.codes.len()
	if n != 1 {
		t.Fatalf("%d compiled runners for one backend and interpreter, want 1", n)
	}
}

// The first kernel never waits for a compile: it ships the source; the
// spare, started once that spawn is done, and every kernel after it run the
// runner its interpreter compiled.
func TestFirstSparesShipTheCompiledRunner(t *testing.T) {
	eng, _ := compiledRunnerEngine(t, 1)
	for i, owner := range []string{"at-once", "next", "after"} {
		res := codeRun(t, eng, owner, "print(6 * 7)")
		if res.Status != StatusSuccess || res.Stdout != "42\n" {
			t.Fatalf("%s: %+v", owner, res)
		}
		script, hasCode := shipped(t, res.Kernel.Dir)
		if i == 0 && (!bytes.Equal(script, runner.Source) || hasCode) {
			t.Errorf("%s: the first kernel was shipped %d bytes of runner.py (code: %v), want the source: it waits for no compile", owner, len(script), hasCode)
		}
		if i > 0 && (!bytes.Equal(script, runner.Loader) || !hasCode) {
			t.Errorf("%s: the kernel was shipped %d bytes of runner.py (code: %v), want the loader and the code", owner, len(script), hasCode)
		}
	}
}

// Where spares are kept the runner is compiled once per engine: by the
// interpreter the first spawn reports, for the spares and the kernels
// after it; the python3 on PATH compiles nothing of its own.
func TestRunnerCompiledOnceWhereSparesAreKept(t *testing.T) {
	eng, env := compiledRunnerEngine(t, 1)
	sub := eng.Subscribe(1 << 10)
	defer sub.Close()
	first := codeRun(t, eng, "first", "1")
	if first.Fallback != "" || first.Kernel.Reused {
		t.Fatalf("the first call did not spawn a kernel: %+v %+v", first, first.Kernel)
	}
	told := eng.python(env)
	waitRunnerCode(t, eng, env)
	codeRun(t, eng, "second", "1")
	if onPath := eng.codes.get(codeKey(env, "")); onPath != nil {
		var said []string
		for len(sub.C) > 0 {
			ev := <-sub.C
			said = append(said, string(ev.Type)+": "+ev.Detail)
		}
		t.Errorf("the python3 on PATH compiled the runner too, though the first spawn had told the interpreter (%q); events: %q", told, said)
	}
	if n := eng.codes.len(); n != 1 {
		t.Errorf("%d compiled runners for one backend and interpreter, want 1", n)
	}
}

// Code the host's interpreter refuses (another Python version came to the
// same path) costs one spawn from source, not a failed kernel, and is
// compiled again.
func TestRefusedCompiledRunnerFallsBackToSource(t *testing.T) {
	eng, env := compiledRunnerEngine(t, 0)
	codeRun(t, eng, "first", "x = 1")
	good := waitRunnerCode(t, eng, env)
	bad := bytes.Clone(good)
	bad[0] ^= 0xff
	key := codeKey(env, eng.python(env))
	c := eng.codes.get(key)
	_, exe := eng.codes.result(c)
	eng.codes.set(c, bad, exe)
	res := codeRun(t, eng, "second", "print('from source')")
	if res.Status != StatusSuccess || res.Stdout != "from source\n" {
		t.Fatalf("spawn with refused code: %+v", res)
	}
	if script, hasCode := shipped(t, res.Kernel.Dir); !bytes.Equal(script, runner.Source) || hasCode {
		t.Fatalf("after the refusal the spawn shipped %d bytes of runner.py (code: %v), want the source", len(script), hasCode)
	}
	if again := waitRunnerCode(t, eng, env); !bytes.Equal(again, good) {
		t.Fatalf("the runner compiled again differs from the first compile (%d vs %d bytes)", len(again), len(good))
	}
}

// A runner, from source or compiled, imports none of the modules it does
// without (their weight is in every kernel: BENCHMARKS.md, idle RSS), and
// the cells' sources still reach linecache when a cell first imports it:
// inspect finds an earlier cell's function, tracebacks show its lines.
func TestRunnerLeanImportsKeepCellSources(t *testing.T) {
	eng, env := compiledRunnerEngine(t, 0)
	for i, owner := range []string{"from-source", "compiled"} {
		if i == 1 {
			waitRunnerCode(t, eng, env)
		}
		codeRun(t, eng, owner, "def f():\n    return 41\n")
		// Only what a bare start of the same interpreter does not import
		// already (a site or .pth file may import re or threading).
		lean := codeRun(t, eng, owner, `import sys
mine = [m for m in ("json", "re", "ctypes", "linecache", "tokenize", "threading", "signal", "enum", "types", "functools", "collections", "_queue") if m in sys.modules]
import subprocess
bare = subprocess.run([sys.executable, "-c", "import sys; print(' '.join(sys.modules))"], capture_output=True, text=True).stdout.split()
print(sorted(m for m in mine if m not in bare))`)
		if lean.Stdout != "[]\n" {
			t.Errorf("%s: the runner imported %s", owner, lean.Stdout)
		}
		src := codeRun(t, eng, owner, "import inspect\nprint(inspect.getsource(f), end='')")
		if src.Stdout != "def f():\n    return 41\n" {
			t.Errorf("%s: inspect.getsource of an earlier cell's function: %q %q", owner, src.Stdout, src.Stderr)
		}
		codeRun(t, eng, owner, "def h():\n    raise ValueError('boom' * f())\n")
		tb := codeRun(t, eng, owner, "h()")
		if tb.Status != StatusError || !strings.Contains(tb.Traceback, "raise ValueError('boom' * f())") {
			t.Errorf("%s: traceback through an earlier cell's function: %q", owner, tb.Traceback)
		}
		// Once linecache is in, the finder no longer sees every import.
		finders := codeRun(t, eng, owner, "import sys; print([type(f).__name__ for f in sys.meta_path if 'Linecache' in type(f).__name__])")
		if finders.Stdout != "[]\n" {
			t.Errorf("%s: after linecache's import sys.meta_path still holds %s", owner, finders.Stdout)
		}
		if _, loader := shipped(t, tb.Kernel.Dir); loader != (i == 1) {
			t.Errorf("%s: the kernel ran the loader: %v", owner, loader)
		}
	}
}
