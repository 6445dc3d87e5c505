// Package mcpserver offers kerneldeck's kernels as Model Context Protocol
// tools (python_exec, python_sessions, python_interrupt, python_reset,
// python_close), on the official Go SDK. A caller's session names one
// persistent kernel of its owner; it can never reach another owner's.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kerneldeck/kerneldeck/engine"
)

// Engine is what the tools need of an engine: the embedded one, or a
// client of a shared one (kerneldeck serve).
type Engine interface {
	Kernels() []engine.KernelInfo
	// Parked lists the parked states (kernels evicted or reaped whose
	// state the next call restores).
	Parked() []engine.ParkedKernel
	// DropParked discards a parked state (python_close of a parked session).
	DropParked(owner, backend, task, child string, tools []string) (bool, error)
	Limits() (maxKernels int, idleExit time.Duration)
	Execute(ctx context.Context, req engine.Request) (*engine.Result, error)
	Interrupt(ctx context.Context, id string) error
	Kill(ctx context.Context, id string) error
	Approve(id string, d engine.Decision) error
}

// Options configure a Server.
type Options struct {
	// Owner, when set, owns every caller's kernels. Otherwise a session's
	// owner is the client's name from the MCP handshake, else Login.
	Owner string
	// Login is the owner of a client that gives no name.
	Login string
	// Backend is where kernels run ("" for the engine's default); Tools
	// are the host tools they may call.
	Backend string
	Tools   []string
	// Events carries the engine's events; approval requests of a caller's
	// cell are put to that caller by elicitation when it supports it.
	// Without it, approvals are left to the engine's other clients.
	Events <-chan engine.Event
	// Version is kerneldeck's, for the server's identity.
	Version string
	// MaxCode bounds a cell's code (default DefaultMaxCode).
	MaxCode int
}

// DefaultMaxCode is the largest code python_exec takes by default.
const DefaultMaxCode = 4 << 20

// maxSession bounds a session name.
const maxSession = 128

// ErrOtherOwner is returned when one MCP session names two owners.
var ErrOtherOwner = errors.New("this MCP session already has another owner")

// Server is the MCP server over one engine.
type Server struct {
	eng  Engine
	opts Options
	mcp  *mcp.Server
	base context.Context
	stop context.CancelFunc

	mu      sync.Mutex
	owners  map[*mcp.ServerSession]string
	byCell  map[string]*execution // running cells of callers, by cell id
	byState map[string]*execution // cells waiting for a caller's answer, by request state
}

// New makes the MCP server. Close ends its running work.
func New(eng Engine, opts Options) *Server {
	if opts.MaxCode <= 0 {
		opts.MaxCode = DefaultMaxCode
	}
	opts.Tools = slices.Sorted(slices.Values(opts.Tools))
	base, stop := context.WithCancel(context.Background())
	s := &Server{eng: eng, opts: opts, base: base, stop: stop, owners: map[*mcp.ServerSession]string{},
		byCell: map[string]*execution{}, byState: map[string]*execution{}}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "kerneldeck", Title: "kerneldeck: persistent Python kernels", Version: opts.Version},
		&mcp.ServerOptions{Instructions: instructions})
	s.addTools()
	if opts.Events != nil {
		go s.dispatch(opts.Events)
	}
	return s
}

const instructions = `Each session is a persistent Python kernel of yours: variables, imports and open files stay between python_exec calls with the same session, until you reset or close it, or it is reaped after being idle (python_sessions says when). A result with state_lost means the kernel was replaced and earlier state is gone: run the setup again. A result with state_restored means an evicted kernel's state came back (its note names what did not, such as open files and threads: re-create those).`

// MCP is the SDK's server, to run on a transport.
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Close stops waiting for the engine; cells that run go on there.
func (s *Server) Close() { s.stop() }

// ownerOf is the owner of the caller's kernels: Options.Owner, else the
// client's name, pinned for the MCP session at its first call.
func (s *Server) ownerOf(req *mcp.CallToolRequest) (string, error) {
	if s.opts.Owner != "" {
		return s.opts.Owner, nil
	}
	owner := s.opts.Login
	if ci := req.ClientInfo(); ci != nil && ci.Name != "" {
		owner = ci.Name
	}
	if owner == "" {
		return "", errors.New("no owner: the client gave no name and no login is known; start kerneldeck mcp with --owner NAME")
	}
	if _, err := engine.NewKey(owner, "local", "default", "", nil); err != nil {
		return "", fmt.Errorf("the client's name cannot own kernels (%v); start kerneldeck mcp with --owner NAME", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if pinned, ok := s.owners[req.Session]; ok {
		if pinned != owner {
			return "", fmt.Errorf("%w (%q, not %q): one connection is one owner", ErrOtherOwner, pinned, owner)
		}
		return owner, nil
	}
	s.owners[req.Session] = owner
	go func(ss *mcp.ServerSession) { // forget it with the session
		ss.Wait()
		s.mu.Lock()
		delete(s.owners, ss)
		s.mu.Unlock()
	}(req.Session)
	return owner, nil
}

// checkSession validates a session name; "" is "default".
func checkSession(name string) (string, error) {
	if name == "" {
		return "default", nil
	}
	if len(name) > maxSession {
		return "", fmt.Errorf("session is %d bytes long; at most %d are allowed", len(name), maxSession)
	}
	if _, err := engine.NewKey("o", "local", name, "", nil); err != nil {
		var ke *engine.KeyError
		if errors.As(err, &ke) {
			return "", fmt.Errorf("session %w", ke.Err)
		}
		return "", err
	}
	return name, nil
}

// refresher is an Engine whose Kernels is a snapshot that can be renewed
// (a client of a shared engine).
type refresher interface {
	Refresh(ctx context.Context) error
}

// kernels is the engine's listing, renewed first if it is a snapshot.
func (s *Server) kernels(ctx context.Context) []engine.KernelInfo {
	if r, ok := s.eng.(refresher); ok {
		r.Refresh(ctx) // on failure the snapshot is still the best answer
	}
	return s.eng.Kernels()
}

// kernelOf is the kernel of owner's session, if it has one.
func (s *Server) kernelOf(ctx context.Context, owner, session string) (engine.KernelInfo, bool) {
	for _, k := range s.kernels(ctx) {
		if k.Owner == owner && k.Task == session && k.Child == "" && s.ours(k) {
			return k, true
		}
	}
	return engine.KernelInfo{}, false
}

// ours says whether k has this server's backend and tools.
func (s *Server) ours(k engine.KernelInfo) bool {
	if s.opts.Backend != "" && k.Backend != s.opts.Backend {
		return false
	}
	return slices.Equal(slices.Sorted(slices.Values(k.Tools)), s.opts.Tools)
}
