package hosttools

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Handler runs one validated tool call. A returned error is the tool's
// failure, reported to the calling kernel as the tool's error message.
type Handler func(ctx context.Context, call Call) (Result, error)

// Tool is a host tool a kernel may call.
type Tool struct {
	Name        string
	Description string // one line, shown in listings and stub docstrings
	Params      Schema
	Handler     Handler
	// DropsBackgroundParams marks terminal-like tools: parameters that
	// IsBackgroundParam matches are removed before validation (see drop.go).
	DropsBackgroundParams bool
}

// Call is one request to run a tool, as the engine hands it over after
// authenticating the kernel's request.
type Call struct {
	Owner    string // the kernel's owner (approval identity)
	KernelID string
	Tool     string
	Args     Args
}

// Result is what a tool returns: Value if it is non-nil (any
// JSON-serializable value), otherwise Text.
type Result struct {
	Value any    `json:"value,omitempty"`
	Text  string `json:"text,omitempty"`
	// Note tells the caller something about the result it should know:
	// clipped output, dropped parameters, where stored output went.
	Note string `json:"note,omitempty"`
	// Dropped lists the background-style parameters removed from the call.
	Dropped []string `json:"dropped,omitempty"`
	// Stored is set when Storage kept the full output on the host and
	// Text holds only a preview.
	Stored *StoredOutput `json:"stored,omitempty"`
}

// addNote appends a sentence to the result's note.
func (r *Result) addNote(note string) {
	if r.Note != "" {
		r.Note += "; "
	}
	r.Note += note
}

// ToolInfo describes a registered tool for listings and stub generation.
type ToolInfo struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Params      Schema `json:"params"`
}

// Registry holds the host tools by name. It is safe for concurrent use.
type Registry struct {
	mu    sync.RWMutex
	tools map[string]Tool
}

// NewRegistry returns an empty registry; see Builtins.Register for the
// built-in tools.
func NewRegistry() *Registry { return &Registry{tools: make(map[string]Tool)} }

// toolName matches the engine's rule: each tool becomes a function in the
// kernel's generated Python stub module.
var toolName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// Register adds a tool. It refuses a duplicate name, a name that is not a
// Python identifier, a missing handler or description, and a malformed
// schema.
func (r *Registry) Register(t Tool) error {
	if !toolName.MatchString(t.Name) {
		return fmt.Errorf("register tool %q: name is not a Python identifier (letters, digits, _; at most 64)", t.Name)
	}
	if t.Handler == nil {
		return fmt.Errorf("register tool %q: no handler", t.Name)
	}
	if strings.TrimSpace(t.Description) == "" || strings.ContainsAny(t.Description, "\r\n") {
		return fmt.Errorf("register tool %q: the description must be one non-empty line", t.Name)
	}
	if err := t.Params.check(); err != nil {
		return fmt.Errorf("register tool %q: %w", t.Name, err)
	}
	if t.DropsBackgroundParams {
		// A declared parameter that Dispatch would always drop could never arrive.
		for _, p := range t.Params {
			if IsBackgroundParam(p.Name) {
				return fmt.Errorf("register tool %q: parameter %q would be dropped as a background-style parameter", t.Name, p.Name)
			}
		}
	}
	t.Params = slices.Clone(t.Params)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.tools[t.Name]; dup {
		return fmt.Errorf("register tool %q: a tool with that name is already registered", t.Name)
	}
	r.tools[t.Name] = t
	return nil
}

// Lookup returns the tool registered under name.
func (r *Registry) Lookup(name string) (Tool, bool) {
	r.mu.RLock()
	t, ok := r.tools[name]
	r.mu.RUnlock()
	t.Params = slices.Clone(t.Params) // callers must not edit the registry's schema
	return t, ok
}

// Names returns the registered tool names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.tools))
	for n := range r.tools {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Describe lists every tool with its description and parameters, sorted by name.
func (r *Registry) Describe() []ToolInfo {
	names := r.Names()
	infos := make([]ToolInfo, 0, len(names))
	for _, n := range names {
		if t, ok := r.Lookup(n); ok {
			infos = append(infos, ToolInfo{Name: t.Name, Description: t.Description, Params: t.Params})
		}
	}
	return infos
}

// Dispatch runs call: it looks the tool up, drops background-style
// parameters for terminal-like tools, validates the remaining arguments and
// runs the handler. Errors name the tool; a validation error matches
// ErrInvalidArgs. Dispatch does not check the kernel's tool set, the call
// budget or approvals: those are the engine's.
func (r *Registry) Dispatch(ctx context.Context, call Call) (Result, error) {
	t, ok := r.Lookup(call.Tool)
	if !ok {
		return Result{}, fmt.Errorf("unknown tool %q; registered tools: %s", call.Tool, strings.Join(r.Names(), ", "))
	}
	var dropped []string
	if t.DropsBackgroundParams {
		call.Args, dropped = dropBackgroundParams(call.Args)
	}
	if err := t.Params.Validate(call.Args); err != nil {
		return Result{}, fmt.Errorf("%s: %w%s", t.Name, err, dropNote(dropped, " ("))
	}
	res, err := t.Handler(ctx, call)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w%s", t.Name, err, dropNote(dropped, " ("))
	}
	if len(dropped) > 0 {
		res.Dropped = dropped
		res.addNote(dropNote(dropped, ""))
	}
	return res, nil
}
