package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/kerneldeck/kerneldeck/engine"
)

// modeRun is one run of a mode that runs an engine or connects to one: its
// name for messages, its stdio and the flags it parsed. Every such mode
// starts with startMode, and opens its own engine with openEngine.
type modeRun struct {
	prog string
	std  stdio
	eng  *engineFlags
	set  map[string]bool // the flags given
}

// startMode parses a mode's flags, the engine flags among them. When ok is
// false the mode is done and returns code: --help was shown (0), or the
// flags are wrong, which has been said (2).
func startMode(prog string, fs *flagSet, eng *engineFlags, args []string, std stdio, help func(io.Writer)) (r *modeRun, code int, ok bool) {
	r = &modeRun{prog: prog, std: std, eng: eng}
	set, done, err := parseMode(fs, args, std, help)
	if done {
		return nil, exitOK, false
	}
	if err == nil {
		err = eng.parsed(set)
	}
	if err != nil {
		return nil, r.usage(err), false
	}
	r.set = set
	return r, exitOK, true
}

// usage says err, which the command line must fix, and returns the exit
// code for it.
func (r *modeRun) usage(err error) int {
	fmt.Fprintf(r.std.err, "%s: %v\nRun '%s --help' for the flags.\n", r.prog, err, r.prog)
	return exitUsage
}

// fail says err, a failure of the run, and returns the exit code for it.
func (r *modeRun) fail(err error) int {
	fmt.Fprintf(r.std.err, "%s: %v\n", r.prog, err)
	return exitFail
}

// say writes one line of the mode's to stderr.
func (r *modeRun) say(format string, args ...any) {
	fmt.Fprintf(r.std.err, r.prog+": "+format+"\n", args...)
}

// connects says whether flag (--connect, --attach) was given: the run then
// uses an engine elsewhere, and the engine flags that would set one up here
// are refused (own are the mode's flags that still apply).
func (r *modeRun) connects(flag string, own ...string) (bool, error) {
	if !r.set[flag] {
		return false, nil
	}
	return true, checkConnectFlags(r.eng, flag, append([]string{flag}, own...)...)
}

// settings resolves the flags over the config file; ok false: the error is
// said, return code.
func (r *modeRun) settings() (s *resolved, code int, ok bool) {
	s, err := resolve(r.eng)
	if err != nil {
		return nil, r.usage(err), false
	}
	return s, exitOK, true
}

// localEngine is a mode's engine of its own, with what it opened for it.
type localEngine struct {
	*engine.Engine
	run      *modeRun
	settings *resolved
	cleanup  func()
}

// openEngine opens the mode's own engine with settings s. ok false: the
// error is said, return code. The caller takes the kept kernels with
// takeKept once it is sure to run, and closes the engine with close.
func (r *modeRun) openEngine(s *resolved) (le *localEngine, code int, ok bool) {
	eng, cleanup, code, err := openEngine(r.eng, s)
	if err != nil {
		if code == exitUsage {
			return nil, r.usage(err), false
		}
		return nil, r.fail(err), false
	}
	return &localEngine{Engine: eng, run: r, settings: s, cleanup: cleanup}, exitOK, true
}

// ownEngine is the start of a mode that runs at once on an engine of its
// own: its settings, the engine, and the kept kernels taken over. The
// settings are le.settings.
func (r *modeRun) ownEngine(ctx context.Context) (le *localEngine, code int, ok bool) {
	s, code, ok := r.settings()
	if !ok {
		return nil, code, false
	}
	if le, code, ok = r.openEngine(s); ok {
		le.takeKept(ctx, false)
	}
	return le, code, ok
}

// takeKept takes over the kernels an earlier run left running, when this
// run was asked to (--keep-kernels, --adopt; takeBack: those of an engine
// that died, always), and says what it did.
func (le *localEngine) takeKept(ctx context.Context, takeBack bool) {
	takeKept(ctx, le.Engine, le.run.eng, le.settings.stateDir, takeBack, le.run.std.err, le.run.prog)
}

// close records the kernels for the next start under --keep-kernels (a
// failure to is said), closes the engine, which kills every kernel unless
// --keep-kernels, and releases what was opened for it. It returns how many
// kernels there were.
func (le *localEngine) close() (n int, err error) {
	defer le.cleanup()
	n, recordErr, err := closeEngine(le.Engine, le.settings.stateDir, le.run.eng.keep)
	if recordErr != nil {
		le.run.say("%v; the kernels are not recorded for the next start", recordErr)
	}
	return n, err
}

// finish says how a run that ended with its engine closed went, and returns
// its exit status: stopped by a signal (kept or killed says what became of
// the kernels), or runErr, or closeErr (what says what closing did).
func (r *modeRun) finish(signaled bool, runErr, closeErr error, kept, killed, what string) int {
	switch {
	case signaled && r.eng.keep:
		r.say("stopped by a signal%s", kept)
	case signaled:
		r.say("stopped by a signal; %s", killed)
	case runErr != nil:
		return r.fail(errors.Join(runErr, closeErr))
	}
	if closeErr != nil {
		return r.fail(fmt.Errorf("%s: %w", what, closeErr))
	}
	return exitOK
}
