package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/charmbracelet/x/term"

	"github.com/kerneldeck/kerneldeck/client"
	"github.com/kerneldeck/kerneldeck/config"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/repl"
)

const replIntro = `Usage: kerneldeck repl [flags]

A persistent Python REPL on one kernel, for pipes and minimal terminals: the
quickest way to a Python whose state lasts, on this machine or on a host
reached by SSH. Each complete block of input runs as one cell in the kernel of
(--owner, --task, --backend); variables, imports and definitions persist from
block to block. The kernel starts with the first block.

Input:
  >>>  prompts for a new block, ...  for a continuation line (prompts are
  shown only when stdin is a terminal; through a pipe only output is shown).
  A block ends at a blank line, or at once when it is complete: a simple
  statement runs when its line ends (x = 1, print(x)), unless brackets, a
  string or a trailing backslash are still open. A compound statement (a line
  ending in ':', a decorator, or a one-line if/for/while/with/try/def/class)
  ends at a blank line, or at a new statement that starts at column 0 after
  its body, so a script piped in runs as written.
  The value of a block's last expression is shown, as in Python.

Output:
  The cell's stdout goes to stdout and its stderr to stderr as it is printed
  (on hosts that stream it; otherwise when the cell ends), then its traceback
  and any note about the kernel (for example that it was reaped or died and
  the state of earlier blocks was lost) on stderr. A cell's result keeps at
  most 50,000 characters of each stream (more may have been shown while it
  ran); the full text is kept under the state dir and its path printed.

Keys (on a terminal; arrows, home/end, ctrl+a/e/k/u/w edit the line):
  up/down  earlier and later lines from the history (kept across sessions in
           <state dir>/repl_history, mode 0600); ctrl+r searches it
  ctrl+c   while a cell runs: interrupt it (KeyboardInterrupt in the cell; the
           kernel and its state stay). The third ctrl+c during one cell kills
           its kernel, losing its state; the next block starts a fresh one.
           At the prompt: discard the block being typed.
  ctrl+d   (end of input) run the block being typed, if any, then exit,
           killing the kernel unless --keep-kernels is given.

Exit status: 0; through a pipe, 1 when a block raised or timed out (the
later blocks still run; the last line on stderr says which block failed
first), as python3 exits 1 when a script raises. Blocks interrupted with
ctrl+c do not count.

`

const replEpilogue = `
The REPL's kernel has no host tools.

SIGTERM and SIGHUP (a closed terminal) end the session like the end of input,
without running the block being typed. A block that fails to reach its host
prints the error and the session goes on.

Exit status: 0 at the end of input or a signal, 1 when reading input, writing
output or shutting the kernel down fails, 2 for a bad command line or config
file.

Examples:
  kerneldeck repl
  kerneldeck repl --backend ssh://me@gpu-box --task train
  printf 'x = 41\nx + 1\n' | kerneldeck repl          # prints 42
`

// replCmd is `kerneldeck repl`: a persistent REPL on one kernel.
type replCmd struct {
	eng         engineFlags
	owner, task string
	noEditing   bool
	raw         bool
	connect     string
	connected   bool
	images      string
}

func (c *replCmd) flags() *flagSet {
	fs := newFlagSet("kerneldeck repl")
	fs.section("REPL flags:")
	fs.Func("owner", "the kernel's owner `O` (default $USER, else \"me\")", nonEmpty("owner", &c.owner))
	fs.Func("task", "the kernel's task `T` (default \"default\")", nonEmpty("task", &c.task))
	fs.Bool(&c.raw, "raw-output", "write what the kernel prints as it is, escape sequences included (default: on a "+
		"terminal, escape sequences are shown, not obeyed, and plain colours kept)")
	imagesFlag(fs, &c.images, "under their lines", ", and where it was saved")
	fs.Bool(&c.noEditing, "no-line-editing", "on a terminal, read plain lines: no arrow keys, no history (default: "+
		"line editing, with history in <state dir>/repl_history, 0600; ctrl+r searches it)")
	fs.Optional(&c.connect, "connect", "run the REPL's kernel on "+connectTarget+", not in an engine of its own; at the "+
		"end the kernel stays there (that engine reaps it once idle)")
	c.eng.register(fs)
	return fs
}

func replMode() mode {
	return newMode("repl", "a persistent Python REPL on one kernel, for pipes and terminals", replIntro, replEpilogue, func() command { return &replCmd{} })
}

// parse parses the REPL's flags and the engine flags (one --backend at most).
func (c *replCmd) parse(args []string, std stdio, help func(io.Writer)) (r *modeRun, code int, ok bool) {
	r, code, ok = startMode("kerneldeck repl", c.flags(), &c.eng, args, std, help)
	if !ok {
		return nil, code, false
	}
	if len(c.eng.backends) > 1 {
		return nil, r.usage(fmt.Errorf("--backend is given %d times; the REPL runs one kernel on one backend, so give it once", len(c.eng.backends))), false
	}
	var err error
	if c.connected, err = r.connects("connect", "owner", "task", "raw-output", "backend", "no-line-editing", "images"); err != nil {
		return nil, r.usage(err), false
	}
	c.owner = cmp.Or(c.owner, defaultOwner())
	c.task = cmp.Or(c.task, "default")
	return r, exitOK, true
}

// defaultOwner is the login name, as in the dashboard.
func defaultOwner() string {
	if u := strings.TrimSpace(os.Getenv("USER")); u != "" {
		return u
	}
	return "me"
}

// lineEditor is the REPL's line editor when stdin is a terminal (nil
// otherwise, or with --no-line-editing), and what closes it.
func (c *replCmd) lineEditor(interactive bool, stateDir string, std stdio) (repl.LineReader, func()) {
	f, ok := std.in.(*os.File)
	if !interactive || !ok || c.noEditing {
		return nil, func() {}
	}
	e, err := newLineEditor(stateDir, f, std.out, std.err)
	if err != nil {
		fmt.Fprintf(std.err, "kerneldeck repl: %v; reading lines without editing\n", err)
		return nil, func() {}
	}
	return e, e.Close
}

// stdinIsTerminal decides whether prompts are shown, like Python.
func stdinIsTerminal(stdin io.Reader) bool {
	f, ok := stdin.(*os.File)
	return ok && term.IsTerminal(f.Fd())
}

// isTerminal reports whether w is a terminal, where escape sequences act.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(f.Fd())
}

func (c *replCmd) run(args []string, std stdio, help func(io.Writer)) int {
	r, code, ok := c.parse(args, std, help)
	if !ok {
		return code
	}
	if c.connected {
		return c.runConnected(std)
	}
	eng, code, ok := r.ownEngine(context.Background())
	if !ok {
		return code
	}
	s := eng.settings
	uri := s.backendURIs[0]

	// ctrl+c goes to the REPL, never to the default handler: it interrupts
	// a cell or clears the block being typed.
	interrupts, stopInterrupts := interruptsFromSignals()
	// A broken output pipe fails a write instead of killing us before the
	// kernel is killed; SIGTERM and a closed terminal end the session.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGHUP)

	interactive := stdinIsTerminal(std.in)
	keep := c.eng.keep
	if interactive {
		atExit := "exits and kills the kernel"
		if keep {
			atExit = "exits and leaves the kernel running"
		}
		fmt.Fprintf(std.err, "kerneldeck repl: Python on %s as owner %s, task %s; the kernel starts with the first block.\nctrl+c interrupts a running block, ctrl+d %s.\n",
			uri, c.owner, c.task, atExit)
	}
	lines, closeLines := c.lineEditor(interactive, s.stateDir, std)
	defer closeLines()
	images, width := replImages(c.images, std.out)
	runErr := repl.Run(ctx, eng.Engine, std.in, std.out, std.err, repl.Options{
		Owner: c.owner, Task: c.task, Backend: uri, Interrupts: interrupts, Prompt: interactive, Lines: lines,
		ImageDir: imageDirIn(s.stateDir), Images: images, ImageWidth: width,
		CleanOut: !c.raw && isTerminal(std.out), CleanErr: !c.raw && isTerminal(std.err),
	})
	signaled := ctx.Err() != nil
	stop()
	stopInterrupts()

	var kept []engine.KernelInfo
	if keep {
		kept = eng.Kernels()
	}
	had := len(eng.Kernels()) > 0
	_, closeErr := eng.close()
	for _, k := range kept {
		r.say("kernel %s (pid %d) keeps running on %s in %s; it exits after %v idle",
			k.ID, k.PID, k.Backend, k.Dir, s.cfg.IdleExit)
	}
	if interactive && !keep && had && !signaled && closeErr == nil {
		// Leaving a terminal session says what became of its state.
		r.say("the kernel was killed, and its state with it (--keep-kernels keeps it)")
	}
	return r.finish(signaled, runErr, closeErr, "", "the kernel was killed", "shut down the kernel")
}

// imageDirIn is where the REPL saves a cell's images: <state dir>/images,
// or nowhere without a state dir.
func imageDirIn(stateDir string) string {
	if stateDir == "" {
		return ""
	}
	return filepath.Join(stateDir, "images")
}

// interruptsFromSignals forwards ctrl+c to the REPL; stop ends it.
func interruptsFromSignals() (interrupts chan struct{}, stop func()) {
	sigint := make(chan os.Signal, 1)
	signal.Notify(sigint, os.Interrupt)
	interrupts = make(chan struct{}, 1)
	forwarded := make(chan struct{})
	go func() {
		defer close(forwarded)
		for range sigint {
			select {
			case interrupts <- struct{}{}:
			default: // one pending ctrl+c is enough
			}
		}
	}()
	return interrupts, func() {
		signal.Stop(sigint)
		close(sigint)
		<-forwarded
	}
}

// runConnected is the REPL on an engine elsewhere: its kernel lives there.
func (c *replCmd) runConnected(std stdio) int {
	const prog = "kerneldeck repl"
	_, fail := reporters(std.err, prog)
	cl, err := redialEngine(context.Background(), &c.eng, c.connect, client.Options{}, func(s string) {
		fmt.Fprintf(std.err, "%s: %s\n", prog, s)
	})
	if err != nil {
		return fail(err)
	}
	defer cl.Close()
	backend := ""
	if len(c.eng.backends) == 1 {
		backend = c.eng.backends[0]
	}
	interrupts, stopInterrupts := interruptsFromSignals()
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGHUP)
	interactive := stdinIsTerminal(std.in)
	if interactive {
		where := "the engine is on another host: a kernel it makes works where its backend starts it"
		if p := clientPlace(c.connect, ""); !p.IsZero() {
			where = fmt.Sprintf("a kernel it makes for you works in %s, on %s", p.Dir, cmp.Or(p.Python, "python3"))
		}
		fmt.Fprintf(std.err, "kerneldeck repl: Python on the engine at %s as owner %s, task %s; %s.\nctrl+c interrupts a running block; ctrl+d exits and leaves the kernel there.\n",
			cl.Where(), c.owner, c.task, where)
	}
	stateDir := c.eng.stateDir
	if stateDir == "" {
		stateDir, _ = config.DefaultStateDir()
	}
	lines, closeLines := c.lineEditor(interactive, stateDir, std)
	defer closeLines()
	images, width := replImages(c.images, std.out)
	runErr := repl.Run(ctx, cl, std.in, std.out, std.err, repl.Options{
		Owner: c.owner, Task: c.task, Backend: backend, Interrupts: interrupts, Prompt: interactive, Lines: lines,
		ImageDir: imageDirIn(stateDir), Images: images, ImageWidth: width,
		CleanOut: !c.raw && isTerminal(std.out), CleanErr: !c.raw && isTerminal(std.err),
	})
	signaled := ctx.Err() != nil
	stop()
	stopInterrupts()
	for _, k := range cl.Kernels() {
		if k.Owner == c.owner && k.Task == c.task && (backend == "" || k.Backend == backend) && k.Child == "" && len(k.Tools) == 0 {
			fmt.Fprintf(std.err, "%s: kernel %s stays on the engine at %s; it is reaped there once idle\n", prog, k.ID, cl.Where())
		}
	}
	if runErr != nil && !signaled {
		return fail(runErr)
	}
	return exitOK
}
