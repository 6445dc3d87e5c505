// Package backends defines the Env contract that every kernel host offers
// (a run-to-completion command with a stdin payload) and its implementations.
package backends

import (
	"context"
	"errors"
	"net"
	"time"
)

// ExecOptions carries what a command needs besides its text.
type ExecOptions struct {
	// Stdin is the payload (files, tokens, cell code). Payloads always travel
	// here, never in the command string, because argv is world-readable.
	Stdin []byte
	// Timeout bounds the whole command, reaching the host included, but not
	// its wait behind the backend's own commands for a free slot (an ssh
	// connection's sessions), which only ctx bounds; zero means only ctx
	// bounds the command.
	Timeout time.Duration
}

// Result is what a command produced. A non-zero ReturnCode is a result, not
// an error.
type Result struct {
	Output     string // stdout followed by stderr
	ReturnCode int
}

// Env is a host that kernels run on. Execute runs command with bash on the
// host and returns its output; an error means the transport failed, not the
// command. Every implementation must:
//   - run the command with bash (not the login shell's rc files) in a
//     process group of its own, and kill the whole group when ctx ends or
//     opts.Timeout passes, reporting the timeout as ErrTimeout;
//   - feed opts.Stdin to the command, never put it in a command line;
//   - return stdout then stderr, without what a login shell printed before
//     the command, capped so a runaway command cannot exhaust memory;
//   - report a death by signal n as exit status 128+n.
//
// An error from before the command reached the host may wrap ErrNotStarted;
// the engine then knows there is nothing of it to clean up there.
//
// A backend that starts commands through a remote shell gets all of this
// from runShell (shell.go) by implementing shellTransport. Adding a backend
// is implementing Env and passing internal/backendtest's contract suite.
type Env interface {
	Execute(ctx context.Context, command string, opts ExecOptions) (Result, error)
	// TempDir is the host directory under which kernel roots are created.
	TempDir() string
	// URI names the backend (local, ssh://user@host:port).
	URI() string
}

// StreamDialer is an optional fast path: a byte stream to a Unix socket on the
// host, so that a warm cell costs one message exchange instead of a command.
type StreamDialer interface {
	DialUnix(ctx context.Context, path string) (net.Conn, error)
}

// Wrapper is implemented by Envs that decorate another Env (tracing,
// counting), so optional fast paths can be found through them.
type Wrapper interface {
	Unwrap() Env
}

// StreamsOf returns the first StreamDialer found on env or the Envs it wraps,
// or nil when the backend offers only plain Execute.
func StreamsOf(env Env) StreamDialer {
	for env != nil {
		if d, ok := env.(StreamDialer); ok {
			return d
		}
		w, ok := env.(Wrapper)
		if !ok {
			return nil
		}
		env = w.Unwrap()
	}
	return nil
}

// ErrHostGone is returned (wrapped) when the host itself is gone for good
// (its container was removed or stopped): whatever ran there is lost.
var ErrHostGone = errors.New("the host is gone")

// ErrTimeout is returned (wrapped) when a command exceeds its Timeout.
var ErrTimeout = errors.New("command timed out")

// ErrNotStarted is returned (wrapped) when a command failed before it
// reached the host (no connection, no free session): nothing of it ran
// there, so nothing of it needs to be cleaned up.
var ErrNotStarted = errors.New("the command never reached the host")

// notStarted wraps err with ErrNotStarted without changing its message.
type notStarted struct{ err error }

func (n notStarted) Error() string   { return n.err.Error() }
func (n notStarted) Unwrap() []error { return []error{n.err, ErrNotStarted} }

// Provisioner is a backend that gives each kernel a host of its own (a
// container per kernel): the engine asks it for one before the kernel's
// spawn and disposes of it (Disposer) when the kernel goes.
type Provisioner interface {
	Provision(ctx context.Context, key string) (Env, error)
}

// Disposer is a host made for one kernel; Dispose removes it with
// everything running in it.
type Disposer interface {
	Dispose(ctx context.Context) error
}

// DeathExplainer is a host that can say why its kernel died when it knows
// more than that it died ("out of memory"); "" when it does not.
type DeathExplainer interface {
	DeathCause(ctx context.Context) string
}

// Placement is a kernel's own host that can say where it is.
type Placement interface {
	Place() Place
}

// Place is where a kernel's own host is: its kind ("pod", "container"),
// its name, and the node it runs on where known.
type Place struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	Node string `json:"node,omitempty"`
}

// String says it in words: "pod agents/kd-bob-5bc92f on node n1".
func (p Place) String() string {
	if p.Kind == "" {
		return ""
	}
	s := p.Kind + " " + p.Name
	if p.Node != "" {
		s += " on node " + p.Node
	}
	return s
}

// OrphanReporter is a backend that, when opened, removed what an engine
// that is gone left behind; the engine reports it once as an event.
type OrphanReporter interface {
	OrphansRemoved() []string
}

// Find returns the first T found on env or the Envs it wraps: the optional
// interfaces (Provisioner, Disposer, DeathExplainer…) are found through
// tracing and counting wrappers.
func Find[T any](env Env) (T, bool) {
	for env != nil {
		if v, ok := env.(T); ok {
			return v, true
		}
		w, ok := env.(Wrapper)
		if !ok {
			break
		}
		env = w.Unwrap()
	}
	var zero T
	return zero, false
}
