// Package repl is a line-oriented persistent Python REPL on one engine
// kernel: every complete block of input runs as one cell in the kernel of
// (owner, task, backend), so state persists from block to block. It serves
// pipes and minimal terminals alike.
package repl

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/imagefile"
	"github.com/kerneldeck/kerneldeck/internal/termimage"
	"github.com/kerneldeck/kerneldeck/internal/termtext"
)

// Prompts, as in Python.
const (
	PromptNew  = ">>> "
	PromptMore = "... "
)

// killAfter is the number of ctrl+c during one cell after which its kernel
// is killed: the earlier ones each interrupt it.
const killAfter = 3

// interruptRetry is how often a ctrl+c that found no running cell yet (the
// kernel was still starting) is tried again.
const interruptRetry = 50 * time.Millisecond

// Options configure Run.
type Options struct {
	// Owner, Task and Backend pick the kernel. Task defaults to "default",
	// Owner (like the engine) to the task, Backend to the engine's first.
	Owner, Task, Backend string
	// Interrupts delivers ctrl+c: it interrupts the running cell, or at the
	// prompt discards the block being typed.
	Interrupts <-chan struct{}
	// Prompt prints the ">>> " and "... " prompts on out. Callers set it
	// when the input is a terminal (kerneldeck repl does), like Python.
	Prompt bool
	// CleanOut and CleanErr show escape sequences in what is written to out
	// and errOut instead of passing them to the terminal (plain colours are
	// kept). Callers set each when that output is a terminal.
	CleanOut, CleanErr bool
	// ImageDir, when set, is a private dir (made 0700 if missing) a cell's
	// images are saved to, each said with its path; else only their labels
	// are printed.
	ImageDir string
	// Images, kitty or sixel, draws each image under its line, at most
	// ImageWidth columns wide (80 when 0); out must be a terminal that
	// speaks it.
	Images     termimage.Mode
	ImageWidth int
	// Lines, when set, reads the input instead of in: a line editor on a
	// terminal, which shows the prompt itself. It is asked for one line at
	// a time, only when the REPL waits for one, so the terminal is back to
	// normal (ctrl+c interrupts) while a cell runs.
	Lines LineReader
}

// LineReader reads one line of input after showing prompt. It returns
// ErrLineInterrupted for ctrl+c, io.EOF at the end of input. A "line"
// with newlines is a paste of several lines, run as one block.
type LineReader interface {
	ReadLine(prompt string) (string, error)
}

// Completing is a LineReader that completes (tab): Run gives it the
// kernel's completion of a line at a cursor (in characters), which answers
// where the matches start in the line, and the matches.
type Completing interface {
	SetCompletion(func(line []rune, pos int) (start int, matches []string))
}

// completeWait bounds a tab's completion: a prompt must not hang on it.
const completeWait = 3 * time.Second

// ErrLineInterrupted is a LineReader's answer to ctrl+c at the prompt: the
// block being typed is dropped.
var ErrLineInterrupted = errors.New("interrupted")

// Run reads blocks from in and runs each in the kernel until in ends, then
// returns nil; the caller closes the engine (which kills the kernel unless
// it keeps kernels). Cell output goes to out (stdout) and errOut (stderr,
// tracebacks, notes). It returns early with an error when ctx ends, when out
// or errOut cannot be written, or when in fails.
//
// A goroutine reads in; it ends when in reaches its end or fails, which may
// be after Run returns if Run returns early.
func Run(ctx context.Context, eng Engine, in io.Reader, out, errOut io.Writer, opts Options) error {
	opts.Task = cmp.Or(opts.Task, "default")
	opts.Owner = cmp.Or(opts.Owner, opts.Task)
	if bs := eng.Backends(); opts.Backend == "" && len(bs) > 0 {
		opts.Backend = bs[0]
	}
	if !slices.Contains(eng.Backends(), opts.Backend) {
		return fmt.Errorf("repl: unknown backend %q; the engine has %s", opts.Backend, strings.Join(eng.Backends(), ", "))
	}
	// One lock for both: they are often the same terminal, and the streamer
	// writes while the session may report an interrupt.
	var mu sync.Mutex
	r := &session{eng: eng, opts: opts, out: &stickyWriter{mu: &mu, w: out, clean: opts.CleanOut},
		errOut: &stickyWriter{mu: &mu, w: errOut, clean: opts.CleanErr}}
	if opts.Lines != nil {
		if c, ok := opts.Lines.(Completing); ok {
			c.SetCompletion(func(line []rune, pos int) (int, []string) { return r.complete(ctx, line, pos) })
		}
		return r.loopEditor(ctx)
	}
	lines, stop := readLines(in)
	defer stop()
	r.lines = lines
	return r.loop(ctx, lines)
}

// loopEditor is loop over a line editor: one line asked for at a time.
func (r *session) loopEditor(ctx context.Context) error {
	r.next = PromptNew
	for {
		if err := r.writeErr(); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("repl: %w", ctx.Err())
		}
		line, err := r.opts.Lines.ReadLine(r.next)
		switch {
		case errors.Is(err, ErrLineInterrupted):
			r.block = block{}
			io.WriteString(r.errOut, "KeyboardInterrupt\n")
			r.next = PromptNew
			continue
		case err != nil:
			return r.finish(ctx, err)
		}
		if strings.Contains(line, "\n") {
			err = r.takePaste(ctx, line)
		} else {
			r.lineNo++
			err = r.take(ctx, line)
		}
		if errors.Is(err, errExitAsked) {
			return r.finish(ctx, io.EOF)
		} else if err != nil {
			return err
		}
	}
}

// takePaste runs a paste of several lines (a line editor's bracketed
// paste) as one cell, after the block open before it: its blank lines do
// not end it, as they would end a block typed line by line.
func (r *session) takePaste(ctx context.Context, paste string) error {
	if r.block.empty() {
		r.blockStart = r.lineNo + 1
	}
	code := paste + "\n"
	if !r.block.empty() {
		code = r.block.code() + code
	}
	r.lineNo += strings.Count(paste, "\n") + 1
	r.block = block{}
	if isExit(code) {
		return errExitAsked
	}
	if err := r.runCell(ctx, code); err != nil {
		return err
	}
	r.prompt(PromptNew)
	return nil
}

// Engine is what the REPL needs of an engine: the embedded one, or one it
// reaches over a socket (client.Client).
type Engine interface {
	Backends() []string
	Kernels() []engine.KernelInfo
	Execute(ctx context.Context, req engine.Request) (*engine.Result, error)
	Interrupt(ctx context.Context, id string) error
	Kill(ctx context.Context, id string) error
	Complete(ctx context.Context, id, code string, cursor int) (engine.Completion, error)
}

type session struct {
	eng    Engine
	opts   Options
	out    *stickyWriter
	errOut *stickyWriter
	block  block
	// Cells run, and those that did not succeed: a script's failure is
	// its exit status.
	cells, failed int
	first         *CellsFailedError
	// lineNo is the input line being taken; blockStart the line the open
	// block began on, cellLine that of the cell running.
	lineNo, blockStart, cellLine int
	next                         string // the prompt of the next line
	// lines is the input without a line editor; a cell's input() takes
	// its next line, as python3 reading a script from a pipe does, and
	// ended is its end when input() met it.
	lines <-chan input
	ended *input
}

// CellsFailedError ends a script (input that is not a terminal) in which
// some cells did not succeed, as python3 exits non-zero when a script raises.
type CellsFailedError struct {
	Failed, Cells int
	// First is the number of the first failed cell (from 1), its status
	// and the line of input its code started on.
	First  int
	Status string
	Line   int
}

func (e *CellsFailedError) Error() string {
	return fmt.Sprintf("%d of %d cells failed; the first was cell %d (from input line %d): %s", e.Failed, e.Cells, e.First, e.Line, e.Status)
}

// input is one line read, or the error that ended the input.
type input struct {
	line string
	err  error
}

// readLines reads in line by line on its own goroutine, one line ahead at
// most. stop lets a blocked send give up once the caller has returned.
func readLines(in io.Reader) (<-chan input, func()) {
	ch := make(chan input)
	done := make(chan struct{})
	go func() {
		br := bufio.NewReaderSize(in, 64<<10)
		for {
			line, err := br.ReadString('\n')
			if line != "" {
				select {
				case ch <- input{line: line}:
				case <-done:
					return
				}
			}
			if err != nil {
				select {
				case ch <- input{err: err}:
				case <-done:
				}
				return
			}
		}
	}()
	return ch, sync.OnceFunc(func() { close(done) })
}

// prompt shows p, or with a line editor leaves it for the next line read.
func (r *session) prompt(p string) {
	r.next = p
	if r.opts.Prompt && r.opts.Lines == nil {
		io.WriteString(r.out, p)
	}
}

func (r *session) loop(ctx context.Context, lines <-chan input) error {
	r.prompt(PromptNew)
	for {
		if err := r.writeErr(); err != nil {
			return err
		}
		if r.ended != nil {
			return r.finish(ctx, r.ended.err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("repl: %w", ctx.Err())
		case <-r.opts.Interrupts:
			// Like Python: the block being typed is dropped.
			r.block = block{}
			if r.opts.Prompt {
				io.WriteString(r.errOut, "\n")
			}
			io.WriteString(r.errOut, "KeyboardInterrupt\n")
			r.prompt(PromptNew)
		case in := <-lines:
			if in.err != nil {
				return r.finish(ctx, in.err)
			}
			line := strings.TrimSuffix(strings.TrimSuffix(in.line, "\n"), "\r")
			r.lineNo++
			if err := r.take(ctx, line); errors.Is(err, errExitAsked) {
				return r.finish(ctx, io.EOF)
			} else if err != nil {
				return err
			}
		}
	}
}

// finish handles the end of input: a block still open runs (as when a file
// is piped into python3), then Run returns.
func (r *session) finish(ctx context.Context, inErr error) error {
	if !r.block.empty() {
		code := r.block.code()
		r.block = block{}
		if err := r.runCell(ctx, code); err != nil {
			return err
		}
	}
	if r.opts.Prompt {
		io.WriteString(r.out, "\n") // the shell's prompt starts on its own line
	}
	if !errors.Is(inErr, io.EOF) {
		return errors.Join(fmt.Errorf("repl: read input: %w", inErr), r.writeErr())
	}
	if err := r.writeErr(); err != nil {
		return err
	}
	if r.first != nil && !r.opts.Prompt {
		r.first.Failed, r.first.Cells = r.failed, r.cells
		return r.first
	}
	return nil
}

// take feeds one input line to the block and runs the block when complete.
func (r *session) take(ctx context.Context, line string) error {
	if r.block.empty() {
		r.blockStart = r.lineNo
	}
	switch r.block.add(line) {
	case vSkip:
		r.prompt(PromptNew)
	case vMore:
		r.prompt(PromptMore)
	case vRun:
		code := r.block.code()
		r.block = block{}
		if isExit(code) {
			return errExitAsked
		}
		if inspect, ok := inspectCode(code); ok && !strings.Contains(strings.TrimSpace(code), "\n") {
			code = inspect
		}
		if err := r.runCell(ctx, code); err != nil {
			return err
		}
		r.prompt(PromptNew)
	case vRunBefore:
		code := r.block.code()
		r.block = block{}
		if err := r.runCell(ctx, code); err != nil {
			return err
		}
		return r.take(ctx, line) // a fresh block: it cannot split again
	}
	return nil
}

// errExitAsked ends the loop as the end of input does: exit() or quit()
// leaves the REPL, and the kernel goes (or stays) as at ctrl+d.
var errExitAsked = errors.New("exit asked")

// writeErr is the first error writing out or errOut, wrapped.
func (r *session) writeErr() error {
	if err := r.out.failed(); err != nil {
		return fmt.Errorf("repl: write output: %w", err)
	}
	if err := r.errOut.failed(); err != nil {
		return fmt.Errorf("repl: write error output: %w", err)
	}
	return nil
}

// runCell runs code as one cell, streaming its output, and answers ctrl+c by
// interrupting it. It returns an error only when the REPL must stop.
func (r *session) runCell(ctx context.Context, code string) error {
	r.cellLine = r.blockStart
	st := newStreamer(r.out, r.errOut)
	type outcome struct {
		res *engine.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := r.eng.Execute(ctx, engine.Request{
			Owner: r.opts.Owner, Task: r.opts.Task, Backend: r.opts.Backend,
			Code: code, OnOutput: st.add,
			OnInput: func(ctx context.Context, ask engine.InputRequest) (string, error) { return r.answer(ctx, st, ask) },
		})
		done <- outcome{res, err}
	}()
	presses := 0
	var retry <-chan time.Time
	var o outcome
wait:
	for {
		select {
		case o = <-done:
			break wait
		case <-r.opts.Interrupts:
			presses++
			if presses >= killAfter {
				retry = nil
				r.kill(ctx, presses)
				continue
			}
			if r.interrupt(ctx) {
				retry = nil
			} else {
				retry = time.After(interruptRetry)
			}
		case <-retry:
			// A ctrl+c came while the kernel was starting: deliver it as
			// soon as the cell runs.
			if r.interrupt(ctx) {
				retry = nil
			} else {
				retry = time.After(interruptRetry)
			}
		}
	}
	streamed := st.close()
	r.cells++
	if o.err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("repl: %w", ctx.Err())
		}
		// The error is printed once, here; the summary points at it.
		r.cellFailed("not run (its error is above)")
		fmt.Fprintf(r.errOut, "kerneldeck: %v\n", o.err)
		return r.writeErr()
	}
	// An interrupt (or the kill after ctrl+c presses) is the operator's
	// doing, not the script's failure.
	if presses == 0 && (o.res.Status == engine.StatusError || o.res.Status == engine.StatusTimeout) {
		r.cellFailed(string(o.res.Status))
	}
	r.report(o.res, streamed)
	return r.writeErr()
}

// InputReader is a LineReader that also reads the answer to a cell's
// input(): a line the history does not keep or, for a password, one typed
// unseen.
type InputReader interface {
	ReadInput(prompt string, password bool) (string, error)
}

// answer reads the line a cell's input() waits on: from the line editor,
// or else the next input line, after the prompt, as python3 does when its
// stdin is not a terminal. ctrl+c interrupts the cell, as in Python.
func (r *session) answer(ctx context.Context, st *streamer, ask engine.InputRequest) (string, error) {
	st.flush() // what the cell printed before asking comes first
	if r.opts.Lines != nil {
		ir, ok := r.opts.Lines.(InputReader)
		if !ok {
			return "", engine.ErrNoInput
		}
		line, err := ir.ReadInput(ask.Prompt, ask.Password)
		if errors.Is(err, ErrLineInterrupted) {
			r.interrupt(ctx)
		}
		if err != nil {
			return "", engine.ErrInputEOF
		}
		return line, nil
	}
	io.WriteString(r.out, ask.Prompt)
	select {
	case in := <-r.lines:
		if in.err != nil {
			r.ended = &in
			return "", engine.ErrInputEOF
		}
		r.lineNo++
		return strings.TrimSuffix(strings.TrimSuffix(in.line, "\n"), "\r"), nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (r *session) cellFailed(status string) {
	r.failed++
	if r.first == nil {
		r.first = &CellsFailedError{First: r.cells, Status: status, Line: r.cellLine}
	}
}

// complete is the kernel's completion of line at pos, with the lines of
// the open block before it as context: where in line the matches start,
// and the matches. Nothing while the REPL has no kernel yet.
func (r *session) complete(ctx context.Context, line []rune, pos int) (int, []string) {
	k, ok := r.kernel(false)
	if !ok {
		return pos, nil
	}
	before := ""
	if !r.block.empty() {
		before = r.block.code()
	}
	offset := len([]rune(before))
	ctx, cancel := context.WithTimeout(ctx, completeWait)
	defer cancel()
	c, err := r.eng.Complete(ctx, k.ID, before+string(line), offset+pos)
	if err != nil || c.Start < offset {
		return pos, nil
	}
	return c.Start - offset, c.Matches
}

// kernel finds the REPL's kernel in the engine; running asks for one with a
// running cell (in this process only the REPL runs cells on it).
func (r *session) kernel(running bool) (engine.KernelInfo, bool) {
	for _, k := range r.eng.Kernels() {
		if k.Owner == r.opts.Owner && k.Task == r.opts.Task && k.Backend == r.opts.Backend &&
			k.Child == "" && len(k.Tools) == 0 && (!running || k.State == engine.StateRunning) {
			return k, true
		}
	}
	return engine.KernelInfo{}, false
}

// interrupt interrupts the running cell; false means there is none yet.
func (r *session) interrupt(ctx context.Context) bool {
	k, ok := r.kernel(true)
	if !ok {
		return false
	}
	if err := r.eng.Interrupt(ctx, k.ID); err != nil {
		// The cell may just have ended; if not, say why ctrl+c did nothing.
		if _, still := r.kernel(true); still {
			fmt.Fprintf(r.errOut, "kerneldeck: interrupt kernel %s: %v\n", k.ID, err)
		}
	}
	return true
}

// kill kills the kernel of a cell that went on despite presses ctrl+c.
func (r *session) kill(ctx context.Context, presses int) {
	k, ok := r.kernel(false)
	if !ok {
		return // already killed by an earlier press
	}
	fmt.Fprintf(r.errOut, "\nkerneldeck: the cell went on after ctrl+c %d times; killing kernel %s (pid %d), whose state is lost\n", presses, k.ID, k.PID)
	if err := r.eng.Kill(ctx, k.ID); err != nil {
		fmt.Fprintf(r.errOut, "kerneldeck: kill kernel %s: %v\n", k.ID, err)
	}
}

// report prints what of the result was not streamed, then the traceback and
// notes about the kernel.
func (r *session) report(res *engine.Result, streamed [2]streamed) {
	io.WriteString(r.out, unseen(res.Stdout, streamed[0]))
	io.WriteString(r.errOut, unseen(res.Stderr, streamed[1]))
	clipNote := func(name string, clipped bool, spill string) {
		switch {
		case !clipped:
		case spill != "":
			fmt.Fprintf(r.errOut, "kerneldeck: %s was clipped; the full text is in %s\n", name, spill)
		default:
			fmt.Fprintf(r.errOut, "kerneldeck: %s was clipped; the full text could not be copied to this machine\n", name)
		}
	}
	// An image cannot be shown in a line-oriented session: its label says
	// it is there, and where it was saved (text displays already printed
	// their text to stdout).
	for i, d := range res.Displays {
		label := d.Label()
		if !strings.HasPrefix(label, "[image/") {
			continue
		}
		if path, err := r.saveImage(d, i); err != nil {
			fmt.Fprintf(r.out, "%s (not saved: %v)\n", label, err)
		} else if path != "" {
			fmt.Fprintf(r.out, "%s saved to %s\n", label, path)
		} else {
			fmt.Fprintln(r.out, label)
		}
		r.draw(d, i)
	}
	clipNote("stdout", res.StdoutClipped, res.SpillPath)
	clipNote("stderr", res.StderrClipped, res.StderrSpillPath)
	if res.Traceback != "" {
		io.WriteString(r.errOut, res.Traceback)
		if !strings.HasSuffix(res.Traceback, "\n") {
			io.WriteString(r.errOut, "\n")
		}
	}
	if k := res.Kernel; k != nil {
		switch {
		case k.Note != "" && !strings.Contains(res.Traceback, k.Note):
			fmt.Fprintf(r.errOut, "kerneldeck: %s\n", k.Note)
		case k.Note == "" && k.StateLost:
			fmt.Fprintf(r.errOut, "kerneldeck: kernel %s lost the state of earlier cells\n", k.ID)
		case k.Note == "" && k.StateReset:
			fmt.Fprintf(r.errOut, "kerneldeck: kernel %s was reset; the state of earlier cells is gone\n", k.ID)
		}
	}
}

// draw draws display i of the cell just run under its line, with Images.
// What reaches the terminal is the image decoded and encoded again here,
// never bytes of the kernel's.
func (r *session) draw(d engine.Display, i int) {
	if r.opts.Images != termimage.Kitty && r.opts.Images != termimage.Sixel {
		return
	}
	_, raw := imagefile.Bytes(d)
	if raw == nil {
		return
	}
	lines, err := termimage.Lines(r.opts.Images, termimage.ID(r.cells, i), raw, cmp.Or(r.opts.ImageWidth, 80))
	if err != nil {
		fmt.Fprintf(r.out, "(not drawn: %v)\n", err)
		return
	}
	r.out.writeRaw(strings.Join(lines, "\n") + "\n")
}

// saveImage writes display i of the cell just run to ImageDir, and returns
// its path ("" without ImageDir).
func (r *session) saveImage(d engine.Display, i int) (string, error) {
	if r.opts.ImageDir == "" {
		return "", nil
	}
	if err := engine.EnsurePrivateDir(r.opts.ImageDir); err != nil {
		return "", err
	}
	return imagefile.SaveOne(r.opts.ImageDir, d, fmt.Sprintf("kerneldeck-repl-cell%d-%d", r.cells, i+1))
}

// unseen is the part of a result stream that streaming did not print: the
// streamed text is a prefix of the result's text (which may be clipped, and
// then shorter than what was streamed).
func unseen(text string, s streamed) string {
	switch {
	case s.n == 0:
		return text
	case s.n >= len(text):
		return ""
	case s.complete() && strings.HasPrefix(text, s.prefix.String()):
		return text[s.n:]
	case s.complete():
		// The stream and the result disagree: never print twice.
		return ""
	default:
		// Too much was streamed to keep it all; trust the prefix.
		return text[s.n:]
	}
}

// keepStreamed bounds the streamed text kept for comparison with the
// result, which is clipped far below it.
const keepStreamed = 1 << 20

// streamed is what OnOutput delivered for one stream.
type streamed struct {
	n      int             // bytes
	prefix strings.Builder // the first keepStreamed bytes
}

func (s *streamed) complete() bool { return s.n == s.prefix.Len() }

// streamer writes a cell's streamed output as it arrives, from its own
// goroutine, so OnOutput never blocks the engine on a slow terminal.
type streamer struct {
	out, errOut io.Writer

	mu     sync.Mutex
	queue  []chunk
	closed bool
	seen   [2]streamed // stdout, stderr

	wake chan struct{}
	done chan struct{}
}

type chunk struct {
	stderr bool
	text   string
	// flushed, when set, marks no text: it is closed once everything
	// queued before it is written.
	flushed chan struct{}
}

func newStreamer(out, errOut io.Writer) *streamer {
	s := &streamer{out: out, errOut: errOut, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go s.write()
	return s
}

// add is the OnOutput callback.
func (s *streamer) add(stream, text string) {
	stderr := stream == "stderr"
	s.mu.Lock()
	seen := &s.seen[0]
	if stderr {
		seen = &s.seen[1]
	}
	if room := keepStreamed - seen.prefix.Len(); room > 0 && seen.complete() {
		seen.prefix.WriteString(text[:min(room, len(text))])
	}
	seen.n += len(text)
	s.queue = append(s.queue, chunk{stderr: stderr, text: text})
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *streamer) write() {
	defer close(s.done)
	for range s.wake {
		s.mu.Lock()
		q, closed := s.queue, s.closed
		s.queue = nil
		s.mu.Unlock()
		for _, c := range q {
			if c.flushed != nil {
				close(c.flushed)
				continue
			}
			w := s.out
			if c.stderr {
				w = s.errOut
			}
			io.WriteString(w, c.text)
		}
		if closed {
			return
		}
	}
}

// flush returns once what was queued before it is written.
func (s *streamer) flush() {
	done := make(chan struct{})
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.queue = append(s.queue, chunk{flushed: done})
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	<-done
}

// close writes what is queued and returns what was streamed; add must not
// be called any more (Execute has returned).
func (s *streamer) close() [2]streamed {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	// wake has room or a pending wake-up; either way write sees closed.
	select {
	case s.wake <- struct{}{}:
	default:
	}
	<-s.done
	return s.seen
}

// stickyWriter remembers the first write error and drops later writes, so
// a broken output stops the REPL at its next step rather than mid-cell.
// With clean, escape sequences are shown rather than written.
type stickyWriter struct {
	mu    *sync.Mutex
	w     io.Writer
	err   error
	clean bool
}

func (w *stickyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	if w.clean {
		if _, err := io.WriteString(w.w, termtext.Clean(string(p), true)); err != nil {
			w.err = err
			return 0, err
		}
		return len(p), nil
	}
	n, err := w.w.Write(p)
	w.err = err
	return n, err
}

// writeRaw writes s as it is, escape sequences included: what the REPL
// itself draws.
func (w *stickyWriter) writeRaw(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		_, w.err = io.WriteString(w.w, s)
	}
}

func (w *stickyWriter) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}
