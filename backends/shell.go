package backends

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// What a backend that starts commands in a shell on its host must do (see
// Env): this file does it for any transport that can start a command line
// with stdin and the two output streams wired, and kill a process group out
// of band. A transport implements shellTransport; runShell does the rest.

// maxOutput bounds what one command may return, so a runaway command cannot
// exhaust the engine's memory.
const maxOutput = 32 << 20

// shellTransport starts command lines on a host.
type shellTransport interface {
	// name prefixes error messages ("ssh ssh://me@box").
	name() string
	// start runs cmdline with stdin fed to it, its output written to
	// stdout and stderr, and returns the running command.
	start(ctx context.Context, cmdline string, stdin []byte, stdout, stderr io.Writer) (shellProcess, error)
	// killGroup kills a process group on the host, on a channel of its own.
	killGroup(pgid int)
}

// queuedTransport is a shellTransport that runs a bounded number of
// commands at once (an ssh connection's sessions).
type queuedTransport interface {
	// acquire waits until a command may start, or ctx ends; release lets
	// the next one start.
	acquire(ctx context.Context) (release func(), err error)
}

// shellProcess is one started command.
type shellProcess interface {
	// wait returns the exit status (128+n for a death by signal n) once
	// the command ended and its output was written; an error means the
	// transport failed before the command's end was known.
	wait() (code int, err error)
	// close releases the command's channel; it ends a command still running.
	close()
}

// runShell runs command on t the way the Env contract wants: with bash
// whatever the login shell, in a process group of its own that a timeout
// kills whole, with what the login shell's rc files print dropped, and the
// output capped. A timeout of opts.Timeout is reported as ErrTimeout.
func runShell(ctx context.Context, t shellTransport, command string, opts ExecOptions) (Result, error) {
	parent := ctx
	if q, ok := t.(queuedTransport); ok {
		// Waiting behind our own commands is not the command's time: only
		// the caller's ctx bounds it (every slot's holder has its own bound).
		release, err := q.acquire(ctx)
		if err != nil {
			return Result{}, notStarted{err}
		}
		defer release()
	}
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
	}
	fail := func(err error) (Result, error) {
		if ctxDone(ctx) != nil && parent.Err() == nil && errors.Is(ctxDone(ctx), context.DeadlineExceeded) {
			return Result{}, fmt.Errorf("%s: %w after %v", t.name(), ErrTimeout, opts.Timeout)
		}
		return Result{}, err
	}
	out := &cappedBuffer{limit: maxOutput}
	stdout := &afterMarker{marker: []byte(startMarker + "\n"), w: out}
	stderr := &groupAnnounce{}
	proc, err := t.start(ctx, wrapRemote(command), opts.Stdin, stdout, stderr)
	if err != nil {
		_, err = fail(err)
		return Result{}, notStarted{err}
	}
	defer proc.close()
	type exit struct {
		code int
		err  error
	}
	waited := make(chan exit, 1)
	go func() {
		code, err := proc.wait()
		waited <- exit{code, err}
	}()
	var x exit
	select {
	case x = <-waited:
	case <-ctx.Done():
		if g, ok := stderr.group(); ok {
			t.killGroup(g)
		}
		proc.close()
		return fail(fmt.Errorf("%s: %w", t.name(), parent.Err()))
	}
	stdout.flush()
	return Result{Output: out.String() + stderr.String(), ReturnCode: x.code}, x.err
}

// wrapRemote runs command with bash whatever the login shell is, in a
// process group of its own (job control on for the launch only), whose id it
// announces first on stderr so a timeout can kill everything it started.
// Exit codes and signal deaths (128+n) come through unchanged.
func wrapRemote(command string) string {
	// --norc on every nested bash: bash reads ~/.bashrc whenever it thinks
	// sshd started it (stdin a socket, SSH_CLIENT set), so without it each
	// level would pay the user's rc again (about 90 ms for root here).
	const wrapper = `set -m; bash --norc --noprofile -c "echo ` + groupMarker + ` \$\$ >&2; echo ` + startMarker +
		`; exec bash --norc --noprofile -c \"\$1\"" kerneldeck "$1" & p=$!; set +m; wait $p`
	return "exec bash --norc --noprofile -c " + ShellQuote(wrapper) + " kerneldeck " + ShellQuote(command)
}

// startMarker is the wrapper's first stdout line; everything before it came
// from the login shell's rc files, not from the command.
const startMarker = "KDSTART-7f3c"

// groupMarker starts the wrapper's first stderr line: "KDPGID <pgid>".
const groupMarker = "KDPGID"

// ShellQuote quotes s as one bash word.
func ShellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// afterMarker drops what is written before the marker (and the marker), then
// passes everything through to w. If the marker never comes (the wrapper did
// not start), flush hands over what was held back.
type afterMarker struct {
	marker []byte
	w      io.Writer
	held   []byte
	open   bool
}

func (a *afterMarker) Write(p []byte) (int, error) {
	if a.open {
		return a.w.Write(p)
	}
	a.held = append(a.held, p...)
	if i := bytes.Index(a.held, a.marker); i >= 0 {
		a.open = true
		rest := a.held[i+len(a.marker):]
		a.held = nil
		if _, err := a.w.Write(rest); err != nil {
			return 0, err
		}
	} else if len(a.held) > maxOutput {
		a.held = a.held[len(a.held)-len(a.marker):] // rc noise without end: keep only a possible marker prefix
	}
	return len(p), nil
}

func (a *afterMarker) flush() {
	if !a.open && len(a.held) > 0 {
		a.w.Write(a.held)
		a.held = nil
	}
}

// groupAnnounce is the command's stderr: it learns the process group from
// the wrapper's first line, drops what the login shell printed before it,
// and keeps (capped) what follows. If the wrapper never starts, what the
// shell said is kept instead: it tells why.
type groupAnnounce struct {
	mu      sync.Mutex
	pgid    int
	found   bool
	partial []byte
	before  cappedBuffer
	out     cappedBuffer
}

func (g *groupAnnounce) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := len(p)
	if g.found {
		return g.out.Write(p)
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(g.partial) < maxOutput {
				g.partial = append(g.partial, p...)
			}
			return n, nil
		}
		line := append(g.partial, p[:i+1]...)
		g.partial, p = nil, p[i+1:]
		if rest, ok := bytes.CutPrefix(line, []byte(groupMarker+" ")); ok {
			if id, err := strconv.Atoi(strings.TrimSpace(string(rest))); err == nil {
				g.pgid, g.found = id, true
				g.out.Write(p)
				return n, nil
			}
		}
		g.before.limit = maxOutput
		g.before.Write(line)
	}
	return n, nil
}

// group returns the announced process group, if it was announced.
func (g *groupAnnounce) group() (int, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pgid, g.found
}

func (g *groupAnnounce) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.found {
		return g.out.String()
	}
	g.before.limit = maxOutput
	g.before.Write(g.partial)
	g.partial = nil
	return g.before.String()
}

// cappedBuffer keeps at most limit bytes and notes that it dropped the rest.
type cappedBuffer struct {
	buf     bytes.Buffer
	limit   int
	dropped bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if c.limit == 0 {
		c.limit = maxOutput
	}
	if room := c.limit - c.buf.Len(); room < len(p) {
		c.dropped = true
		if room > 0 {
			c.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return c.buf.Write(p)
}

func (c *cappedBuffer) String() string {
	if c.dropped {
		return c.buf.String() + "\n[kerneldeck: output clipped]\n"
	}
	return c.buf.String()
}

// ctxDone is ctx.Err(), also once ctx's deadline has passed but its timer
// has not fired yet (a socket deadline set to the same instant can win).
func ctxDone(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// signalExitCode is the exit status of a death by the signal named name
// (as ssh reports it: "KILL"), 128+n; 128 for a name it does not know.
func signalExitCode(name string) int {
	n := map[string]int{"HUP": 1, "INT": 2, "QUIT": 3, "ABRT": 6, "KILL": 9, "SEGV": 11, "PIPE": 13, "ALRM": 14, "TERM": 15}[name]
	return 128 + n
}
