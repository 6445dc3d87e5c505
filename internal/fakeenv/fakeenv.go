// Package fakeenv is a scripted fake backends.Env for protocol-level unit
// tests of the engine.
//
// An Env records every command it is given, with its stdin, and answers from
// an ordered list of Handlers: the first handler that matches a command (by
// its "# kerneldeck:<marker>" first line, a substring or a predicate) and has
// uses left answers it. Host simulates a well-behaved kernel host at the
// protocol level (no processes, no files): spawn (registry kernels and the
// transient kernels of the per-call fallback), cells with execution counts
// and tool calls, kill, ring and fetch. Faults are handlers put in front of
// the healthy ones with Prepend.
//
// Env deliberately does not implement backends.StreamDialer, so an engine
// drives it through plain Execute only.
package fakeenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
)

// ErrTransport is wrapped by the errors of TransportError and AnswerLost.
var ErrTransport = errors.New("fakeenv: transport failed")

// Call is one recorded command.
type Call struct {
	// Seq is the arrival order, from 0.
	Seq     int
	Command string
	Stdin   []byte
	// Marker is the word after "# kerneldeck:" on the command's first line
	// ("spawn", "cell", "kill", ...), or "" when there is none.
	Marker string
	// Begin and End are ticks of one logical clock that advances when a call
	// starts and when it returns; two calls overlapped in time exactly when
	// each began before the other ended. End is 0 while the call runs.
	Begin, End int64
	// Handler names the handler that answered ("" when none matched).
	Handler string
	Result  backends.Result
	Err     error
}

// Running reports whether the call had not returned when it was recorded.
func (c Call) Running() bool { return c.End == 0 }

// Overlaps reports whether c and d ran at the same time.
func (c Call) Overlaps(d Call) bool {
	cEnd, dEnd := c.End, d.End
	if cEnd == 0 {
		cEnd = 1<<63 - 1
	}
	if dEnd == 0 {
		dEnd = 1<<63 - 1
	}
	return c.Begin < dEnd && d.Begin < cEnd
}

// HandlerFunc answers one command. A returned error is a transport failure
// (backends.Env semantics); a non-zero ReturnCode is a result.
type HandlerFunc func(ctx context.Context, c Call) (backends.Result, error)

// Handler pairs a match with a HandlerFunc. Build one with On, OnContains or
// OnAny and refine it with If, Times, Once and Named before handing it to an
// Env; its use count is guarded by the Env it is in.
type Handler struct {
	name  string
	match func(Call) bool
	fn    HandlerFunc
	limit int // 0: unlimited
	used  int
}

// On matches commands whose marker is marker ("spawn", "cell", "kill",
// "ring", "fetch").
func On(marker string, fn HandlerFunc) *Handler {
	return &Handler{name: marker, match: func(c Call) bool { return c.Marker == marker }, fn: fn}
}

// OnContains matches commands that contain sub.
func OnContains(sub string, fn HandlerFunc) *Handler {
	return &Handler{name: "contains " + sub, match: func(c Call) bool { return strings.Contains(c.Command, sub) }, fn: fn}
}

// OnAny matches every command.
func OnAny(fn HandlerFunc) *Handler {
	return &Handler{name: "any", match: func(Call) bool { return true }, fn: fn}
}

// If narrows the match to calls for which pred also holds.
func (h *Handler) If(pred func(Call) bool) *Handler {
	prev := h.match
	h.match = func(c Call) bool { return prev(c) && pred(c) }
	return h
}

// Times lets the handler answer at most n commands; after that it no longer
// matches and later handlers answer.
func (h *Handler) Times(n int) *Handler {
	h.limit = n
	return h
}

// Once is Times(1).
func (h *Handler) Once() *Handler { return h.Times(1) }

// Named sets the name recorded in Call.Handler.
func (h *Handler) Named(name string) *Handler {
	h.name = name
	return h
}

// Env is the fake backend. The zero value is not usable; call New.
type Env struct {
	mu       sync.Mutex
	tempDir  string
	uri      string
	handlers []*Handler
	calls    []*Call
	clock    int64
}

// New returns an Env with TempDir "/tmp", URI "fake" and no handlers: every
// command gets return code 127 and the output "fakeenv: no handler ...".
func New() *Env { return &Env{tempDir: "/tmp", uri: "fake"} }

// Healthy returns a new Env answered by a new healthy Host.
func Healthy() (*Env, *Host) {
	e := New()
	h := NewHost()
	e.Use(h.Handlers()...)
	return e, h
}

// SetTempDir sets what TempDir returns.
func (e *Env) SetTempDir(dir string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tempDir = dir
}

// SetURI sets what URI returns.
func (e *Env) SetURI(uri string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.uri = uri
}

// TempDir implements backends.Env.
func (e *Env) TempDir() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tempDir
}

// URI implements backends.Env.
func (e *Env) URI() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.uri
}

// Use appends handlers: they answer what earlier handlers do not.
func (e *Env) Use(hs ...*Handler) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.handlers = append(e.handlers, hs...)
}

// Prepend puts handlers in front of the existing ones (in the given order),
// which is how a fault overrides a healthy host.
func (e *Env) Prepend(hs ...*Handler) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.handlers = append(append([]*Handler{}, hs...), e.handlers...)
}

// Execute implements backends.Env: it records the command and its stdin and
// answers from the first matching handler. opts.Timeout bounds the handler's
// context, as a real backend bounds the command.
func (e *Env) Execute(ctx context.Context, command string, opts backends.ExecOptions) (backends.Result, error) {
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
	}
	e.mu.Lock()
	e.clock++
	c := &Call{Seq: len(e.calls), Command: command, Stdin: append([]byte(nil), opts.Stdin...),
		Marker: Marker(command), Begin: e.clock}
	e.calls = append(e.calls, c)
	var h *Handler
	for _, cand := range e.handlers {
		if (cand.limit == 0 || cand.used < cand.limit) && cand.match(*c) {
			h = cand
			h.used++
			break
		}
	}
	if h != nil {
		c.Handler = h.name
	}
	snapshot := *c
	e.mu.Unlock()

	var res backends.Result
	var err error
	if h == nil {
		res = backends.Result{Output: "fakeenv: no handler for this command\n", ReturnCode: 127}
	} else {
		res, err = h.fn(ctx, snapshot)
	}
	if err == nil && ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && opts.Timeout > 0 {
		err = fmt.Errorf("fakeenv: %w after %v", backends.ErrTimeout, opts.Timeout)
	}

	e.mu.Lock()
	e.clock++
	c.End, c.Result, c.Err = e.clock, res, err
	e.mu.Unlock()
	return res, err
}

// Calls returns a copy of every recorded call, in arrival order.
func (e *Env) Calls() []Call {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Call, len(e.calls))
	for i, c := range e.calls {
		out[i] = *c
	}
	return out
}

// CallsOf returns the recorded calls with the given marker, in arrival order.
func (e *Env) CallsOf(marker string) []Call {
	var out []Call
	for _, c := range e.Calls() {
		if c.Marker == marker {
			out = append(out, c)
		}
	}
	return out
}

// Count returns how many commands with the given marker were recorded.
func (e *Env) Count(marker string) int { return len(e.CallsOf(marker)) }

// Commands returns every recorded command string, in arrival order.
func (e *Env) Commands() []string {
	calls := e.Calls()
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = c.Command
	}
	return out
}

// Unhandled returns the calls no handler matched.
func (e *Env) Unhandled() []Call {
	var out []Call
	for _, c := range e.Calls() {
		if c.Handler == "" {
			out = append(out, c)
		}
	}
	return out
}

// Marker returns the word after "# kerneldeck:" on command's first line.
func Marker(command string) string {
	first, _, _ := strings.Cut(command, "\n")
	m, ok := strings.CutPrefix(strings.TrimSpace(first), "# kerneldeck:")
	if !ok {
		return ""
	}
	return strings.TrimSpace(m)
}

// Reply answers with output and return code 0.
func Reply(output string) HandlerFunc { return ReplyRC(output, 0) }

// ReplyRC answers with output and return code rc.
func ReplyRC(output string, rc int) HandlerFunc {
	return func(context.Context, Call) (backends.Result, error) {
		return backends.Result{Output: output, ReturnCode: rc}, nil
	}
}

// TransportError fails the command before it reaches the host: nothing runs
// there and the caller gets an error wrapping ErrTransport.
func TransportError(msg string) HandlerFunc {
	return func(context.Context, Call) (backends.Result, error) {
		return backends.Result{}, fmt.Errorf("%w: %w: %s", ErrTransport, backends.ErrNotStarted, msg)
	}
}

// AnswerLost runs next (the command reaches the host and has its effects
// there) and then drops the answer: the caller gets an error wrapping
// ErrTransport, as when a connection breaks after the command was sent.
func AnswerLost(next HandlerFunc) HandlerFunc {
	return func(ctx context.Context, c Call) (backends.Result, error) {
		next(ctx, c)
		return backends.Result{}, fmt.Errorf("%w: connection dropped after the command was sent", ErrTransport)
	}
}

// Sleep waits d (or until ctx ends), then calls next; it stands in for a
// host-side wait.
func Sleep(d time.Duration, next HandlerFunc) HandlerFunc {
	return func(ctx context.Context, c Call) (backends.Result, error) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return backends.Result{}, fmt.Errorf("%w: %w", ErrTransport, ctx.Err())
		}
		return next(ctx, c)
	}
}

// The protocol faults a cell command can meet, and a failed spawn.

// DeadRunner answers a cell with KD:DEAD: the runner was gone before the
// cell was published, so nothing ran.
func DeadRunner() HandlerFunc { return Reply("KD:DEAD\n") }

// Lost answers a cell with KD:LOST: the runner died after the cell was
// published.
func Lost() HandlerFunc { return Reply("KD:LOST\n") }

// Gone answers a cell with KD:GONE: the kernel dir no longer exists.
func Gone() HandlerFunc { return Reply("KD:GONE\n") }

// PubFail answers a cell with KD:PUBFAIL: the request could not be written
// (disk full, permissions).
func PubFail(detail string) HandlerFunc {
	return Reply(strings.TrimSpace(detail+"\nKD:PUBFAIL") + "\n")
}

// Pending answers a cell with KD:PENDING after a simulated host-side wait of
// d: the cell has not finished within the wait window.
func Pending(d time.Duration) HandlerFunc { return Sleep(d, Reply("KD:PENDING\n")) }

// SpawnFailed answers a spawn like spawnScript's fail(): "KD:ERR reason"
// and return code 3.
func SpawnFailed(reason string) HandlerFunc { return ReplyRC("KD:ERR "+reason+"\n", 3) }

// Gate blocks the commands of a wrapped handler until it is opened, so a test
// can hold a kernel mid-cell.
type Gate struct {
	entered chan Call
	open    chan struct{}
	once    sync.Once
}

// NewGate returns a closed gate. Entered buffers up to 64 arrivals.
func NewGate() *Gate { return &Gate{entered: make(chan Call, 64), open: make(chan struct{})} }

// Entered receives each call that reached the gate, as it arrives.
func (g *Gate) Entered() <-chan Call { return g.entered }

// Open releases every blocked call and every later one. It is idempotent.
func (g *Gate) Open() { g.once.Do(func() { close(g.open) }) }

// Wrap returns a HandlerFunc that announces the call on Entered, waits for
// Open (or for the command's context to end, which is a transport error),
// then answers with next.
func (g *Gate) Wrap(next HandlerFunc) HandlerFunc {
	return func(ctx context.Context, c Call) (backends.Result, error) {
		select {
		case g.entered <- c:
		default:
		}
		select {
		case <-g.open:
		case <-ctx.Done():
			return backends.Result{}, fmt.Errorf("%w: %w", ErrTransport, ctx.Err())
		}
		return next(ctx, c)
	}
}

// StdinContains is a predicate for If: the command's stdin contains s (for a
// publishing cell command, stdin is the request JSON with the code).
func StdinContains(s string) func(Call) bool {
	return func(c Call) bool { return strings.Contains(string(c.Stdin), s) }
}

// Publishing is a predicate for If: a cell command that publishes its request.
func Publishing(c Call) bool {
	a, err := ParseCell(c.Command)
	return err == nil && a.Publish
}

// Answering is a predicate for If: a cell command that carries tool-call
// answers (ans=1).
func Answering(c Call) bool {
	a, err := ParseCell(c.Command)
	return err == nil && a.Answers
}

// Transient is a predicate for If: a spawn of a transient (per-call) kernel.
func Transient(c Call) bool {
	a, err := ParseSpawn(c.Command, c.Stdin)
	return err == nil && a.Transient
}

// Not negates a predicate for If, e.g. If(Not(Transient)) for the spawn of a
// registry kernel only.
func Not(pred func(Call) bool) func(Call) bool {
	return func(c Call) bool { return !pred(c) }
}
