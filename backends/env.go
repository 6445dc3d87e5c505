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
	// Timeout bounds the whole command; zero means only ctx bounds it.
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

// ErrTimeout is returned (wrapped) when a command exceeds its Timeout.
var ErrTimeout = errors.New("command timed out")
