package wire

import (
	"reflect"
	"strings"
)

// Request is a request line a client sends; Stamp gives it its id.
type Request interface{ Stamp(id string) }

// Execute runs code in the kernel of owner, task, backend, child and tools,
// spawning it if needed; with Stream the result is preceded by Started and
// Output lines.
type Execute struct {
	Head
	Code    string   `json:"code"`
	Owner   string   `json:"owner,omitempty"`
	Task    string   `json:"task,omitempty"`
	Backend string   `json:"backend,omitempty"`
	Child   string   `json:"child,omitempty"`
	Tools   []string `json:"tools,omitempty"`
	// Timeout is in seconds; 0 is the configured cell timeout.
	Timeout float64 `json:"timeout,omitempty"`
	Reset   bool    `json:"reset,omitempty"`
	Stream  bool    `json:"stream,omitempty"`
	// Cell is the client's id for the cell: asked again with the same
	// cell, the engine gives its result instead of running it twice.
	Cell string `json:"cell,omitempty"`
	// Input says the client answers the cell's input(): an InputRequest
	// line comes, and an InputReply answers it.
	Input bool `json:"input,omitempty"`
	// Cwd, Python and Umask are where the client works (engine.Place): a
	// kernel this request makes on a local backend starts in Cwd, runs
	// Python and makes files with Umask, and keeps them.
	Cwd    string `json:"cwd,omitempty"`
	Python string `json:"python,omitempty"`
	Umask  *int   `json:"umask,omitempty"`
}

// KernelsQuery asks for the kernels listing; given the last listing's
// version, the answer is Unchanged while nothing changed.
type KernelsQuery struct {
	Head
	UnlessVersion string `json:"unless_version,omitempty"`
}

// Limits changes the cap, idle_exit and hibernate_after (seconds; 0
// hibernates never) and the per-owner bound; absent ones stay.
type Limits struct {
	Head
	MaxKernels         *int     `json:"max_kernels,omitempty"`
	IdleExit           *float64 `json:"idle_exit,omitempty"`
	MaxKernelsPerOwner *int     `json:"max_kernels_per_owner,omitempty"`
	HibernateAfter     *float64 `json:"hibernate_after,omitempty"`
}

// KernelOp names a kernel: interrupt, kill and cells.
type KernelOp struct {
	Head
	Kernel string `json:"kernel"`
}

// Complete asks kernel Kernel for the completions of Code at Cursor
// (characters from its start), computed in its namespace.
type Complete struct {
	Head
	Kernel string `json:"kernel"`
	Code   string `json:"code"`
	Cursor int    `json:"cursor"`
}

// InputReply answers the input_request of the execute whose id is To:
// Value is the line typed (without its newline); EOF ends input instead,
// as ctrl+d does.
type InputReply struct {
	Head
	To    string `json:"to"`
	Value string `json:"value"`
	EOF   bool   `json:"eof,omitempty"`
}

// ShutdownOwner kills every kernel of Owner.
type ShutdownOwner struct {
	Head
	Owner string `json:"owner"`
}

// DropParked discards the parked state of the key it names, as an
// execute names it.
type DropParked struct {
	Head
	Owner   string   `json:"owner"`
	Task    string   `json:"task,omitempty"`
	Backend string   `json:"backend,omitempty"`
	Child   string   `json:"child,omitempty"`
	Tools   []string `json:"tools,omitempty"`
}

// Approve answers a tool call's approval request.
type Approve struct {
	Head
	Request  string `json:"request"`
	Decision string `json:"decision"`
}

// Subscribe asks for every event from now on, after those of the last
// Since seconds; with Output also every cell's output.
type Subscribe struct {
	Head
	Since   float64 `json:"since,omitempty"`
	Output  bool    `json:"output,omitempty"`
	BatchMS float64 `json:"batch_ms,omitempty"`
}

// NewRequest returns a new request of op, or nil for an op that is not a
// request. Its fields are the only ones the op takes.
func NewRequest(op Op) Request {
	var r Request
	switch op {
	case OpExecute:
		r = &Execute{}
	case OpKernels:
		r = &KernelsQuery{}
	case OpLimits:
		r = &Limits{}
	case OpInterrupt, OpKill, OpCells, OpPark:
		r = &KernelOp{}
	case OpDropParked:
		r = &DropParked{}
	case OpComplete:
		r = &Complete{}
	case OpInputReply:
		r = &InputReply{}
	case OpShutdownOwner:
		r = &ShutdownOwner{}
	case OpApprove:
		r = &Approve{}
	case OpSubscribe:
		r = &Subscribe{}
	case OpShutdownAll, OpHello:
		r = &Head{}
	default:
		return nil
	}
	reflect.ValueOf(r).Elem().FieldByName("Op").SetString(string(op))
	return r
}

// Fields lists the JSON names of v's fields, in order, those of an
// embedded Head ("id", "op") first.
func Fields(v any) []string {
	var out []string
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	for f := range t.Fields() {
		if f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("json") == "" {
			out = append(out, Fields(reflect.Zero(f.Type).Interface())...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}
