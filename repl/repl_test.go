package repl

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"image"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/imagetest"
	"github.com/kerneldeck/kerneldeck/internal/syncbuf"
	"github.com/kerneldeck/kerneldeck/internal/termimage"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newEngine starts a real engine on the local backend, closed (every runner
// killed) when the test ends. With stream set, kernels live under a short
// path so the engine reaches them over their Unix socket and output streams
// while cells run; otherwise the path is too long for a socket and every
// cell goes over plain commands, with output only in the result.
func newEngine(t *testing.T, stream bool) *engine.Engine {
	t.Helper()
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if stream {
		dir = enginetest.ShortTempDir(t)
	}
	eng, err := engine.New(engine.Config{
		Backends: []backends.Env{backends.NewLocal(dir)},
		StateDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := eng.Close(ctx, false); err != nil {
			t.Errorf("engine close: %v", err)
		}
	})
	return eng
}

// syncBuffer is a buffer Run writes while the test reads it.
type syncBuffer struct{ syncbuf.Buffer }

func (s *syncBuffer) waitFor(t *testing.T, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !strings.Contains(s.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q within %v; got:\n%s", want, within, s.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// forBothPaths runs f on the streaming fast path and on plain commands.
func forBothPaths(t *testing.T, f func(t *testing.T, eng *engine.Engine)) {
	for _, stream := range []bool{true, false} {
		name := "plain"
		if stream {
			name = "stream"
		}
		t.Run(name, func(t *testing.T) { f(t, newEngine(t, stream)) })
	}
}

const pipeSession = `x = 41
x + 1
def double(v):
    return v * 2

double(x)
for i in range(3):
    print(i)

import sys; print("to stderr", file=sys.stderr)
1/0
print("after", x)
`

func TestPipeSession(t *testing.T) {
	forBothPaths(t, func(t *testing.T, eng *engine.Engine) {
		var out, errOut bytes.Buffer
		err := Run(context.Background(), eng, strings.NewReader(pipeSession), &out, &errOut, Options{Owner: "me"})
		// A script whose cell raised fails, naming the cell, as python3
		// exits 1; the cells after it still ran.
		var failed *CellsFailedError
		if !errors.As(err, &failed) || failed.Failed != 1 || failed.Cells != 8 || failed.First != 7 || failed.Line != 11 || failed.Status != "error" {
			t.Fatalf("Run: %v, want 1 of 8 cells failed, the first cell 7 on line 11", err)
		}
		if got, want := out.String(), "42\n82\n0\n1\n2\nafter 41\n"; got != want {
			t.Errorf("stdout %q, want %q", got, want)
		}
		e := errOut.String()
		if !strings.HasPrefix(e, "to stderr\nTraceback (most recent call last):\n") || !strings.HasSuffix(e, "ZeroDivisionError: division by zero\n") {
			t.Errorf("stderr:\n%s", e)
		}
		if strings.Count(e, "to stderr") != 1 || strings.Count(e, "ZeroDivisionError") != 1 {
			t.Errorf("stderr repeats itself:\n%s", e)
		}
		// Every block ran as one cell in one kernel.
		ks := eng.Kernels()
		if len(ks) != 1 || ks[0].Owner != "me" || ks[0].Task != "default" || ks[0].ExecutionCount != 8 {
			t.Errorf("kernels %+v, want one of owner me, task default with 8 cells", ks)
		}
	})
}

// TestImageLabels: an image a cell displays is named by a line, as the
// dashboard's output pane does without inline images.
func TestImageLabels(t *testing.T) {
	forBothPaths(t, func(t *testing.T, eng *engine.Engine) {
		var out, errOut bytes.Buffer
		in := "import base64\nclass P:\n    def _repr_png_(self):\n        return base64.b64decode('" + onePixelPNG + "')\n\ndisplay(P())\nprint('after')\n"
		if err := Run(context.Background(), eng, strings.NewReader(in), &out, &errOut, Options{}); err != nil {
			t.Fatalf("Run: %v\n%s", err, errOut.String())
		}
		if got, want := out.String(), "[image/png 1×1, 70 B]\nafter\n"; got != want {
			t.Errorf("stdout %q, want %q", got, want)
		}
		// With an image dir, each image is saved there (0600, in a 0700
		// dir made for it) and the line says where.
		dir := filepath.Join(t.TempDir(), "images")
		out.Reset()
		if err := Run(context.Background(), eng, strings.NewReader(in), &out, &errOut, Options{Task: "saved", ImageDir: dir}); err != nil {
			t.Fatalf("Run: %v\n%s", err, errOut.String())
		}
		path := filepath.Join(dir, "kerneldeck-repl-cell3-1.png")
		if got, want := out.String(), "[image/png 1×1, 70 B] saved to "+path+"\nafter\n"; got != want {
			t.Errorf("stdout %q, want %q", got, want)
		}
		data, _ := os.ReadFile(path)
		want, _ := base64.StdEncoding.DecodeString(onePixelPNG)
		fi, err := os.Stat(path)
		di, derr := os.Stat(dir)
		if !bytes.Equal(data, want) || err != nil || fi.Mode().Perm() != 0o600 || derr != nil || di.Mode().Perm() != 0o700 {
			t.Errorf("saved image %s: %d bytes, %v %v; dir %v %v; want the PNG, 0600 in 0700", path, len(data), fi, err, di, derr)
		}
	})
}

const onePixelPNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="

// TestOutputOrder writes stdout and stderr into one buffer, as a terminal
// shows them: each block's output, then its traceback, before the next block.
func TestOutputOrder(t *testing.T) {
	forBothPaths(t, func(t *testing.T, eng *engine.Engine) {
		var both syncBuffer
		in := "print('one')\nraise ValueError('two')\nprint('three')\nimport sys; sys.stderr.write('four\\n')\nprint('five')\n"
		var failed *CellsFailedError
		if err := Run(context.Background(), eng, strings.NewReader(in), &both, &both, Options{}); !errors.As(err, &failed) || failed.First != 2 {
			t.Fatalf("Run: %v, want cell 2 failed", err)
		}
		got := both.String()
		last := -1
		for _, w := range []string{"one\n", "Traceback", "ValueError: two\n", "three\n", "four\n", "five\n"} {
			i := strings.Index(got, w)
			if i <= last || strings.Count(got, w) != 1 {
				t.Fatalf("%q out of order or repeated in:\n%s", w, got)
			}
			last = i
		}
	})
}

// TestStreamedOutputOnce checks that output printed early (streamed) and
// late (left for the result) each appear exactly once, and that clipped
// output says where its full text is.
func TestStreamedOutputOnce(t *testing.T) {
	forBothPaths(t, func(t *testing.T, eng *engine.Engine) {
		var out, errOut syncBuffer
		in := "import sys, time\n" +
			"print('early', flush=True); print('e-early', file=sys.stderr, flush=True); time.sleep(0.6); print('late'); print('e-late', file=sys.stderr)\n" +
			"print('x' * 60000)\n"
		if err := Run(context.Background(), eng, strings.NewReader(in), &out, &errOut, Options{}); err != nil {
			t.Fatal(err)
		}
		o, e := out.String(), errOut.String()
		if !strings.HasPrefix(o, "early\nlate\n") {
			t.Errorf("stdout starts %.40q", o)
		}
		if !strings.HasPrefix(e, "e-early\ne-late\n") {
			t.Errorf("stderr starts %.40q", e)
		}
		// The result keeps about 50,000 characters, its head and its tail;
		// streaming may have shown all.
		if n := strings.Count(o, "x"); n < 49000 || n > 60000 {
			t.Errorf("%d x's printed, want 49000..60000", n)
		}
		if !strings.Contains(e, "kerneldeck: stdout was clipped; the full text is in ") {
			t.Errorf("no clip note in stderr:\n%.500s", e)
		}
	})
}

func TestPrompts(t *testing.T) {
	eng := newEngine(t, true)
	var out, errOut bytes.Buffer
	in := "x = 1\n\n# a comment\nif x:\n    print('y')\n\n(x +\n 1)\n"
	if err := Run(context.Background(), eng, strings.NewReader(in), &out, &errOut, Options{Prompt: true}); err != nil {
		t.Fatal(err)
	}
	want := ">>> " + // first
		">>> " + // x = 1
		">>> " + // blank
		">>> " + // comment
		"... " + // if x:
		"... " + // print
		"y\n>>> " + // blank: runs
		"... " + // (x +
		"2\n>>> " + // 1): runs
		"\n" // EOF
	if got := out.String(); got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if errOut.Len() != 0 {
		t.Errorf("stderr %q", errOut.String())
	}
}

// TestScriptRunsAsWritten: a piped script needs no blank line after a
// body, and a block still open at the end of input runs.
func TestScriptRunsAsWritten(t *testing.T) {
	eng := newEngine(t, true)
	var out, errOut bytes.Buffer
	in := "def f(v):\n    return v + 1\nprint(f(1))\nfor i in range(2):\n    print(i)"
	if err := Run(context.Background(), eng, strings.NewReader(in), &out, &errOut, Options{}); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "2\n0\n1\n"; got != want || errOut.Len() != 0 {
		t.Errorf("stdout %q (want %q), stderr %q", got, want, errOut.String())
	}
}

// pipeREPL runs Run on a pipe; the test writes lines as a user types them.
type pipeREPL struct {
	t           *testing.T
	in          *io.PipeWriter
	out, errOut syncBuffer
	intr        chan struct{}
	done        chan error
}

func startREPL(t *testing.T, eng *engine.Engine, prompt bool) *pipeREPL {
	pr, pw := io.Pipe()
	p := &pipeREPL{t: t, in: pw, intr: make(chan struct{}, 1), done: make(chan error, 1)}
	go func() {
		p.done <- Run(context.Background(), eng, pr, &p.out, &p.errOut, Options{Owner: "me", Interrupts: p.intr, Prompt: prompt})
	}()
	t.Cleanup(func() {
		pw.Close()
		<-p.done
	})
	return p
}

func (p *pipeREPL) type_(s string) {
	p.t.Helper()
	if _, err := io.WriteString(p.in, s); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pipeREPL) end() error {
	p.in.Close()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(30 * time.Second):
		p.t.Fatal("Run did not return after the end of input")
		return nil
	}
}

func waitRunning(t *testing.T, eng *engine.Engine) engine.KernelInfo {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, k := range eng.Kernels() {
			if k.State == "running" {
				return k
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no cell started running: %+v", eng.Kernels())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestInterruptRunningCell(t *testing.T) {
	forBothPaths(t, func(t *testing.T, eng *engine.Engine) {
		// The cell marks when its code runs, so the interrupt lands in the
		// sleep rather than before the code starts. The dir exists before the
		// kernel does: a confined kernel reaches only what it saw at start.
		mark := filepath.Join(t.TempDir(), "sleeping")
		p := startREPL(t, eng, false)
		p.type_("x = 7; print('set')\n")
		p.out.waitFor(t, "set\n", 20*time.Second)
		p.type_(fmt.Sprintf("import time; open(%q, 'w').close(); time.sleep(30); print('slept')\n", mark))
		waitFile(t, mark)
		start := time.Now()
		p.intr <- struct{}{}
		p.errOut.waitFor(t, "KeyboardInterrupt", 10*time.Second)
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("interrupt took %v", d)
		}
		p.type_("print(x * 6)\n")
		if err := p.end(); err != nil {
			t.Fatal(err)
		}
		if got := p.out.String(); got != "set\n42\n" {
			t.Errorf("stdout %q, want the state kept (set, 42) and no 'slept'", got)
		}
		if e := p.errOut.String(); !strings.Contains(e, "time.sleep(30)") || strings.Count(e, "KeyboardInterrupt") != 1 {
			t.Errorf("stderr:\n%s", e)
		}
	})
}

// TestInterruptWhileStarting: a ctrl+c that comes while the kernel is still
// being spawned reaches the cell as soon as it runs.
func TestInterruptWhileStarting(t *testing.T) {
	eng := newEngine(t, true)
	p := startREPL(t, eng, false)
	p.type_("import time; time.sleep(30)\n")
	deadline := time.Now().Add(20 * time.Second)
	for len(eng.Kernels()) == 0 { // the block was taken: its kernel exists
		if time.Now().After(deadline) {
			t.Fatal("no kernel appeared")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	p.intr <- struct{}{}
	p.errOut.waitFor(t, "KeyboardInterrupt", 10*time.Second)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("interrupt took %v", d)
	}
	if err := p.end(); err != nil {
		t.Fatal(err)
	}
}

func TestInterruptAtPromptDropsBlock(t *testing.T) {
	eng := newEngine(t, true)
	p := startREPL(t, eng, true)
	p.type_("if True:\n")
	p.out.waitFor(t, ">>> ... ", 10*time.Second)
	p.intr <- struct{}{}
	p.errOut.waitFor(t, "KeyboardInterrupt\n", 10*time.Second)
	// Were the if block still open, this line would join it and not run.
	p.type_("print('fresh')\n")
	p.out.waitFor(t, "fresh\n", 20*time.Second)
	if err := p.end(); err != nil {
		t.Fatal(err)
	}
	if got, want := p.out.String(), ">>> ... >>> fresh\n>>> \n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if got := p.errOut.String(); got != "\nKeyboardInterrupt\n" {
		t.Errorf("stderr %q", got)
	}
}

// TestInterruptIgnoredKillsKernel: a cell that swallows KeyboardInterrupt
// is killed at the third ctrl+c, and the next block runs in a fresh kernel.
func TestInterruptIgnoredKillsKernel(t *testing.T) {
	eng := newEngine(t, true)
	p := startREPL(t, eng, false)
	mark := filepath.Join(t.TempDir(), "looping")
	// The mark is made inside the try, so a ctrl+c after it lands in the
	// handler (made before the try, one could end the cell under load).
	p.type_(fmt.Sprintf(`x = 1
import time
def spin():
    while True:
        try:
            open(%q, 'w').close()
            time.sleep(0.05)
        except KeyboardInterrupt:
            print('ignored', flush=True)

spin()
`, mark))
	waitFile(t, mark)
	k := waitRunning(t, eng)
	for i := 1; i <= 2; i++ {
		p.intr <- struct{}{}
		p.out.waitFor(t, strings.Repeat("ignored\n", i), 30*time.Second)
	}
	p.intr <- struct{}{}
	p.errOut.waitFor(t, "killing kernel "+k.ID, 10*time.Second)
	p.errOut.waitFor(t, "state from earlier calls was lost", 20*time.Second)
	p.type_("print('fresh', 'x' in globals())\n")
	if err := p.end(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(p.out.String(), "fresh False\n") {
		t.Errorf("stdout %q", p.out.String())
	}
	if ks := eng.Kernels(); len(ks) != 1 || ks[0].ID == k.ID {
		t.Errorf("kernels %+v: want one new kernel", ks)
	}
}

func TestUnknownBackend(t *testing.T) {
	eng := newEngine(t, true)
	err := Run(context.Background(), eng, strings.NewReader("1\n"), io.Discard, io.Discard, Options{Backend: "ssh://nowhere"})
	if err == nil || !strings.Contains(err.Error(), `unknown backend "ssh://nowhere"`) {
		t.Fatalf("err %v", err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestOutputFailureStops(t *testing.T) {
	eng := newEngine(t, true)
	in := "print(1)\nprint(2)\n"
	err := Run(context.Background(), eng, strings.NewReader(in), failWriter{}, io.Discard, Options{})
	if err == nil || !strings.Contains(err.Error(), "write output: broken pipe") {
		t.Fatalf("err %v", err)
	}
	if ks := eng.Kernels(); len(ks) != 1 || ks[0].ExecutionCount != 1 {
		t.Errorf("kernels %+v: want the REPL stopped after the first cell", ks)
	}
}

func TestContextEndsRun(t *testing.T) {
	eng := newEngine(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	pr, pw := io.Pipe()
	defer pw.Close() // ends the reading goroutine
	done := make(chan error, 1)
	go func() { done <- Run(ctx, eng, pr, &out, &errOut, Options{}) }()
	io.WriteString(pw, "import time; time.sleep(30)\n")
	waitRunning(t, eng)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return when its context ended")
	}
}

// TestCleanOutput: with CleanOut/CleanErr (a terminal), what the kernel
// prints reaches the writers with its escape sequences shown, not obeyed;
// without them (a pipe), byte for byte.
func TestCleanOutput(t *testing.T) {
	eng := newEngine(t, true)
	code := `import sys; print("\x1b]52;c;eA==\x07\x1b[2J\x1b[31mred\x1b[0m"); _ = sys.stderr.write("\x1b]2;t\x07\n")` + "\n"
	for _, clean := range []bool{true, false} {
		var out, errOut bytes.Buffer
		err := Run(context.Background(), eng, strings.NewReader(code), &out, &errOut, Options{Owner: fmt.Sprint(clean), CleanOut: clean, CleanErr: clean})
		if err != nil {
			t.Fatal(err)
		}
		want, wantErr := "\x1b]52;c;eA==\x07\x1b[2J\x1b[31mred\x1b[0m\n", "\x1b]2;t\x07\n"
		if clean {
			want, wantErr = "␛]52;c;eA==␇␛[2J\x1b[31mred\x1b[0m\n", "␛]2;t␇\n"
		}
		if out.String() != want || errOut.String() != wantErr {
			t.Errorf("clean %v: stdout %q stderr %q, want %q and %q", clean, out.String(), errOut.String(), want, wantErr)
		}
	}
}

// scriptedLines is a LineReader that answers from a script and records the
// prompts it was shown.
type scriptedLines struct {
	answers []any // string or error
	prompts []string
}

func (s *scriptedLines) ReadLine(prompt string) (string, error) {
	s.prompts = append(s.prompts, prompt)
	if len(s.answers) == 0 {
		return "", io.EOF
	}
	a := s.answers[0]
	s.answers = s.answers[1:]
	if err, ok := a.(error); ok {
		return "", err
	}
	return a.(string), nil
}

// TestLineEditor: with a line editor the REPL asks for one line at a time,
// telling it the prompt; ctrl+c at the prompt drops the open block.
func TestLineEditor(t *testing.T) {
	eng := newEngine(t, true)
	lines := &scriptedLines{answers: []any{"def f():", "    return 1", ErrLineInterrupted, "x = 41", "print(x + 1)"}}
	var out, errOut bytes.Buffer
	if err := Run(context.Background(), eng, strings.NewReader("never read"), &out, &errOut, Options{Prompt: true, Lines: lines}); err != nil {
		t.Fatal(err)
	}
	if want := []string{PromptNew, PromptMore, PromptMore, PromptNew, PromptNew, PromptNew}; !slices.Equal(lines.prompts, want) {
		t.Errorf("prompts %q, want %q", lines.prompts, want)
	}
	if out.String() != "42\n\n" || !strings.Contains(errOut.String(), "KeyboardInterrupt") {
		t.Errorf("stdout %q stderr %q", out.String(), errOut.String())
	}
	if strings.Contains(out.String(), ">>>") {
		t.Error("the REPL wrote a prompt itself: the editor shows it")
	}
	// f was dropped with its block.
	lines = &scriptedLines{answers: []any{"f()"}}
	out.Reset()
	errOut.Reset()
	Run(context.Background(), eng, strings.NewReader(""), &out, &errOut, Options{Prompt: true, Lines: lines})
	if !strings.Contains(errOut.String(), "NameError") {
		t.Errorf("f() after ctrl+c: stderr %q, want NameError", errOut.String())
	}
}

// TestInspectHelpAndExit: obj? shows the signature and docstring, obj??
// the source, as ipython does; help() prints; exit() ends the REPL, and
// nothing after it runs.
func TestInspectHelpAndExit(t *testing.T) {
	eng := newEngine(t, true)
	var out, errOut bytes.Buffer
	in := "def f(x, y=1):\n    \"Add them.\"\n    return x + y\n\nf?\nf??\n?len\nnope?\nhelp(len)\nexit()\nprint('after exit')\n"
	if err := Run(context.Background(), eng, strings.NewReader(in), &out, &errOut, Options{}); err != nil {
		t.Fatalf("Run: %v\n%s", err, errOut.String())
	}
	o := out.String()
	for _, want := range []string{
		"Signature:   f(x, y=1)\nDocstring:   Add them.\n",
		"Source:\ndef f(x, y=1):\n    \"Add them.\"\n    return x + y\n",
		"Signature:   len(obj, /)",
		"Object 'nope' not found.",
		"Help on built-in function len",
	} {
		if !strings.Contains(o, want) {
			t.Errorf("output lacks %q:\n%s", want, o)
		}
	}
	if strings.Contains(o, "after exit") || errOut.Len() != 0 {
		t.Errorf("exit() did not end the REPL: stdout\n%s\nstderr %q", o, errOut.String())
	}
	for _, code := range []string{"exit", "quit()", "  quit  "} {
		if !isExit(code) {
			t.Errorf("%q does not exit", code)
		}
	}
	if _, ok := inspectCode("a ? b"); ok {
		t.Error(`"a ? b" taken as an inspection`)
	}
}

// scriptedInput is scriptedLines that also answers input(): answers in
// inputs, each prompt and whether it was a password kept.
type scriptedInput struct {
	scriptedLines
	inputs []any
	asked  []string
}

func (s *scriptedInput) ReadInput(prompt string, password bool) (string, error) {
	s.asked = append(s.asked, fmt.Sprintf("%s|%v", prompt, password))
	a := s.inputs[0]
	s.inputs = s.inputs[1:]
	if err, ok := a.(error); ok {
		return "", err
	}
	return a.(string), nil
}

// TestInput: without a line editor a cell's input() takes the next input
// line, after printing its prompt, as python3 -i reading a pipe does; the
// end of input ends it with EOFError and the REPL after the cell.
func TestInput(t *testing.T) {
	forBothPaths(t, func(t *testing.T, eng *engine.Engine) {
		var out, errOut bytes.Buffer
		script := "name = input('who? ')\nAda\nprint('hi', name)\nimport getpass\npin = getpass.getpass()\n1234\nprint(len(pin))\nlast = input('last? ')\n"
		err := Run(context.Background(), eng, strings.NewReader(script), &out, &errOut, Options{Owner: "me"})
		var failed *CellsFailedError
		if !errors.As(err, &failed) || failed.Cells != 6 || failed.First != 6 || failed.Line != 8 {
			t.Fatalf("Run: %v, want the last cell (line 8) failed at the end of input", err)
		}
		if got, want := out.String(), "who? hi Ada\nPassword: 4\nlast? "; got != want {
			t.Errorf("stdout %q, want %q", got, want)
		}
		if !strings.Contains(errOut.String(), "EOFError: EOF when reading a line") {
			t.Errorf("stderr %q, want the EOFError of the last input()", errOut.String())
		}
	})
}

// TestInputInLineEditor: with a line editor, input() and getpass() read
// through it (a password unseen), and ctrl+c there interrupts the cell.
func TestInputInLineEditor(t *testing.T) {
	eng := newEngine(t, true)
	lines := &scriptedInput{scriptedLines: scriptedLines{answers: []any{
		"print('before'); a = input('a? '); import getpass; b = getpass.getpass('b? ')", "print(a, len(b))", "input('c? ')", "print('alive')"}},
		inputs: []any{"yes", "secret", ErrLineInterrupted}}
	var out, errOut bytes.Buffer
	if err := Run(context.Background(), eng, strings.NewReader("never read"), &out, &errOut, Options{Prompt: true, Lines: lines}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a? |false", "b? |true", "c? |false"}; !slices.Equal(lines.asked, want) {
		t.Errorf("asked %q, want %q", lines.asked, want)
	}
	if out.String() != "before\nyes 6\nalive\n\n" || !strings.Contains(errOut.String(), "KeyboardInterrupt") {
		t.Errorf("stdout %q stderr %q; want the answers, then KeyboardInterrupt at c? and the kernel alive", out.String(), errOut.String())
	}
}

// TestPastedBlock: a line editor's paste of several lines runs as one
// cell, blank lines and all, after the block open before it.
func TestPastedBlock(t *testing.T) {
	eng := newEngine(t, true)
	lines := &scriptedLines{answers: []any{"if True:", "def f():\n    x = 20\n\n    return x + 1", "print(f() * 2)"}}
	var out, errOut bytes.Buffer
	// "if True:" then a def at the left margin is an IndentationError: the
	// paste joined the open block, as typed text would.
	Run(context.Background(), eng, strings.NewReader(""), &out, &errOut, Options{Prompt: true, Lines: lines})
	if !strings.Contains(errOut.String(), "IndentationError") {
		t.Errorf("the paste did not join the open block: stderr %q", errOut.String())
	}
	lines = &scriptedLines{answers: []any{"def f():\n    x = 20\n\n    return x + 1", "print(f() * 2)"}}
	out.Reset()
	errOut.Reset()
	if err := Run(context.Background(), eng, strings.NewReader(""), &out, &errOut, Options{Prompt: true, Lines: lines}); err != nil {
		t.Fatal(err)
	}
	if out.String() != "42\n\n" || errOut.String() != "" {
		t.Errorf("stdout %q stderr %q, want the pasted function's 42", out.String(), errOut.String())
	}
	if want := []string{PromptNew, PromptNew, PromptNew}; !slices.Equal(lines.prompts, want) {
		t.Errorf("prompts %q, want %q: a paste is a whole block", lines.prompts, want)
	}
}

// TestImagesDrawn: with Images, an image is drawn under its line, in the
// kitty protocol or sixel, while the kernel's own escape sequences are
// still shown, not sent (CleanOut).
func TestImagesDrawn(t *testing.T) {
	eng := newEngine(t, true)
	png := base64.StdEncoding.EncodeToString(imagetest.Halves(t, 64, 32))
	in := "import base64\nclass P:\n    def _repr_png_(self):\n        return base64.b64decode('" + png + "')\n\ndisplay(P()); print('\\x1b[2J')\n"
	for _, mode := range []termimage.Mode{termimage.Kitty, termimage.Sixel} {
		var out, errOut bytes.Buffer
		if err := Run(context.Background(), eng, strings.NewReader(in), &out, &errOut, Options{Task: string(mode), Images: mode, ImageWidth: 40, CleanOut: true}); err != nil {
			t.Fatalf("Run: %v\n%s", err, errOut.String())
		}
		var img image.Image
		var ok bool
		if mode == termimage.Kitty {
			_, img, ok = imagetest.Kitty(out.String())
		} else {
			img, ok = imagetest.Sixel(out.String())
		}
		if !ok || !imagetest.IsRed(img.At(1, 1)) || imagetest.IsRed(img.At(img.Bounds().Dx()-2, 1)) {
			t.Errorf("%s: no drawing of the red and blue image in %q", mode, out.String())
		}
		if !strings.Contains(out.String(), "[image/png 64×32") || strings.Contains(out.String(), "\x1b[2J") {
			t.Errorf("%s: stdout %q; want the label, and the kernel's escape shown, not sent", mode, out.String())
		}
	}
}
