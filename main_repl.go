package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/charmbracelet/x/term"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/repl"
)

const replHelp = `Usage: kerneldeck repl [flags]

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

Keys:
  ctrl+c   while a cell runs: interrupt it (KeyboardInterrupt in the cell; the
           kernel and its state stay). The third ctrl+c during one cell kills
           its kernel, losing its state; the next block starts a fresh one.
           At the prompt: discard the block being typed.
  ctrl+d   (end of input) run the block being typed, if any, then exit,
           killing the kernel unless --keep-kernels is given.

Flags (flags override the config file):
  --backend URI            where the kernel runs: local, ssh://[user@]host[:port]
                           (host may be a Host alias from ~/.ssh/config), or a
                           name from [backends] in the config file; give it
                           once (default: default_backend from the config,
                           else local)
  --owner O                the kernel's owner (default $USER, else "me")
  --task T                 the kernel's task (default "default")
  --keep-kernels           at exit, leave the kernel running on its host; it
                           exits by itself once idle for --idle-exit
  --idle-exit DURATION     kill the kernel after it has been idle this long,
                           as a Go duration such as 30m or 1h; at least 1s
                           (default 30m)
  --cell-timeout DURATION  a block running longer is interrupted (and its
                           kernel killed if it does not stop), such as 300s or
                           2h (default 5m)
  --config FILE            TOML config file (default
                           $XDG_CONFIG_HOME/kerneldeck/config.toml, or
                           ~/.config/kerneldeck/config.toml); it must exist
                           when given here
  --state-dir DIR          where the full text of clipped output is kept,
                           created 0700 (default $XDG_STATE_HOME/kerneldeck,
                           or ~/.local/state/kerneldeck)
  --trace FILE             append one JSON line per backend command to FILE

SSH backends:
  --ssh-config FILE        OpenSSH client config to read Host aliases from
                           (default ~/.ssh/config)
  --identity FILE          private key to use instead of IdentityFile; keys
                           in ssh-agent are offered too (an encrypted key must
                           be loaded with ssh-add)
  --known-hosts FILE       known_hosts file (default ~/.ssh/known_hosts). Host
                           keys are always checked: an unknown host is
                           refused, a changed key always
  --accept-new-host-key    record the key of a host seen for the first time

The other engine flags of 'kerneldeck help headless' (--max-kernels and the
host tool flags) are accepted too; the REPL's kernel has no host tools.

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

// replFlags are the REPL's own flags, beside the engine flags.
type replFlags struct {
	owner, task string
	keep        bool
}

// parseREPLFlags parses the engine flags every mode shares (one --backend
// at most) and the REPL's own.
func parseREPLFlags(args []string) (*headlessFlags, *replFlags, error) {
	r := &replFlags{}
	nonEmpty := func(name string, dst *string) func(string) error {
		return func(s string) error {
			if strings.TrimSpace(s) == "" {
				return fmt.Errorf("the %s must not be empty", name)
			}
			*dst = s
			return nil
		}
	}
	f, err := parseFlags("kerneldeck repl", args, func(fs *flag.FlagSet) {
		fs.Func("owner", "", nonEmpty("owner", &r.owner))
		fs.Func("task", "", nonEmpty("task", &r.task))
		fs.BoolVar(&r.keep, "keep-kernels", false, "")
	})
	if err != nil {
		return nil, nil, err
	}
	if len(f.backends) > 1 {
		return nil, nil, fmt.Errorf("--backend is given %d times; the REPL runs one kernel on one backend, so give it once", len(f.backends))
	}
	r.owner = cmp.Or(r.owner, defaultOwner())
	r.task = cmp.Or(r.task, "default")
	return f, r, nil
}

// defaultOwner is the login name, as in the dashboard.
func defaultOwner() string {
	if u := strings.TrimSpace(os.Getenv("USER")); u != "" {
		return u
	}
	return "me"
}

// stdinIsTerminal decides whether prompts are shown, like Python.
func stdinIsTerminal(stdin io.Reader) bool {
	f, ok := stdin.(*os.File)
	return ok && term.IsTerminal(f.Fd())
}

func runREPL(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	usageErr, fail := reporters(stderr, "kerneldeck repl")
	f, r, err := parseREPLFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, replHelp)
		return exitOK
	}
	if err != nil {
		return usageErr(err)
	}
	s, err := resolve(f)
	if err != nil {
		return usageErr(err)
	}
	uri := s.backendURIs[0]
	eng, cleanup, code, err := openEngine(f, s)
	if err != nil {
		if code == exitUsage {
			return usageErr(err)
		}
		return fail(err)
	}
	defer cleanup()
	adoptKept(context.Background(), eng, s.stateDir, stderr, "kerneldeck repl")

	// ctrl+c goes to the REPL, never to the default handler: it interrupts
	// a cell or clears the block being typed.
	sigint := make(chan os.Signal, 1)
	signal.Notify(sigint, os.Interrupt)
	interrupts := make(chan struct{}, 1)
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
	// A broken output pipe fails a write instead of killing us before the
	// kernel is killed; SIGTERM and a closed terminal end the session.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGHUP)

	interactive := stdinIsTerminal(stdin)
	if interactive {
		atExit := "exits and kills the kernel"
		if r.keep {
			atExit = "exits and leaves the kernel running"
		}
		fmt.Fprintf(stderr, "kerneldeck repl: Python on %s as owner %s, task %s; the kernel starts with the first block.\nctrl+c interrupts a running block, ctrl+d %s.\n",
			uri, r.owner, r.task, atExit)
	}
	runErr := repl.Run(ctx, eng, stdin, stdout, stderr, repl.Options{
		Owner: r.owner, Task: r.task, Backend: uri, Interrupts: interrupts, Prompt: interactive,
	})
	signaled := ctx.Err() != nil
	stop()
	signal.Stop(sigint)
	close(sigint)
	<-forwarded

	var kept []engine.KernelInfo
	if r.keep {
		kept = eng.Kernels()
		if err := saveKept(eng, s.stateDir); err != nil {
			fmt.Fprintf(stderr, "kerneldeck repl: %v; the kernels are not recorded for the next start\n", err)
		}
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	closeErr := eng.Close(closeCtx, r.keep)
	for _, k := range kept {
		fmt.Fprintf(stderr, "kerneldeck repl: kernel %s (pid %d) keeps running on %s in %s; it exits after %v idle\n",
			k.ID, k.PID, k.Backend, k.Dir, s.cfg.IdleExit)
	}
	switch {
	case signaled && r.keep:
		fmt.Fprintln(stderr, "kerneldeck repl: stopped by a signal")
	case signaled:
		fmt.Fprintln(stderr, "kerneldeck repl: stopped by a signal; the kernel was killed")
	case runErr != nil:
		return fail(errors.Join(runErr, closeErr))
	}
	if closeErr != nil {
		return fail(fmt.Errorf("shut down the kernel: %w", closeErr))
	}
	return exitOK
}
