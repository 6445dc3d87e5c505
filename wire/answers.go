package wire

import (
	"math"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// OK answers a request that needs to say no more.
type OK struct {
	Head
}

// Killed answers shutdown_owner and shutdown_all with how many kernels
// were killed.
type Killed struct {
	Head
	Killed int `json:"killed"`
}

// Subscribed answers subscribe: Replayed events follow it, then live ones.
type Subscribed struct {
	Head
	Replayed int  `json:"replayed"`
	Output   bool `json:"output"`
}

// Result answers execute with the cell's outcome.
type Result struct {
	Head
	Status          engine.CellStatus `json:"status"`
	Stdout          string            `json:"stdout"`
	Stderr          string            `json:"stderr"`
	Traceback       string            `json:"traceback"`
	StdoutClipped   bool              `json:"stdout_clipped"`
	StderrClipped   bool              `json:"stderr_clipped"`
	SpillPath       string            `json:"spill_path"`
	StderrSpillPath string            `json:"stderr_spill_path"`
	ToolCallsMade   int               `json:"tool_calls_made"`
	DurationMS      float64           `json:"duration_ms"`
	Fallback        string            `json:"fallback"`
	// Displays are the cell's rich outputs (images, HTML, …), in order;
	// DisplayNote says what of them was dropped or clipped.
	Displays    []engine.Display `json:"displays,omitempty"`
	DisplayNote string           `json:"display_note,omitempty"`
	// Kernel is null after a per-call fallback.
	Kernel *KernelResult `json:"kernel"`
	// Cell is the cell's id, as events and the cells op name it.
	Cell string `json:"cell"`
}

// KernelResult says which kernel ran a cell and what became of its state.
type KernelResult struct {
	ID             string `json:"id"`
	PID            int    `json:"pid"`
	Dir            string `json:"dir"`
	Backend        string `json:"backend"`
	Reused         bool   `json:"reused"`
	ExecutionCount int    `json:"execution_count"`
	StateLost      bool   `json:"state_lost"`
	StateReset     bool   `json:"state_reset"`
	StateRestored  bool   `json:"state_restored"`
	Note           string `json:"note"`
}

// ResultOf is the answer to request id that ran r.
func ResultOf(id string, r *engine.Result) Result {
	out := Result{
		Head: Head{ID: id, Op: OpResult}, Status: r.Status, Stdout: r.Stdout, Stderr: r.Stderr, Traceback: r.Traceback,
		StdoutClipped: r.StdoutClipped, StderrClipped: r.StderrClipped, SpillPath: r.SpillPath,
		StderrSpillPath: r.StderrSpillPath, ToolCallsMade: r.ToolCallsMade, DurationMS: Millis(r.Duration),
		Fallback: r.Fallback, Cell: r.Cell, Displays: r.Displays, DisplayNote: r.DisplayNote,
	}
	if k := r.Kernel; k != nil {
		out.Kernel = &KernelResult{ID: k.ID, PID: k.PID, Dir: k.Dir, Backend: k.Backend, Reused: k.Reused,
			ExecutionCount: k.ExecutionCount, StateLost: k.StateLost, StateReset: k.StateReset, StateRestored: k.StateRestored, Note: k.Note}
	}
	return out
}

// Engine is the result as the engine gave it.
func (r Result) Engine() *engine.Result {
	out := &engine.Result{Status: r.Status, Stdout: r.Stdout, Stderr: r.Stderr, Traceback: r.Traceback,
		StdoutClipped: r.StdoutClipped, StderrClipped: r.StderrClipped, SpillPath: r.SpillPath,
		StderrSpillPath: r.StderrSpillPath, ToolCallsMade: r.ToolCallsMade, Duration: FromMillis(r.DurationMS),
		Fallback: r.Fallback, Cell: r.Cell, Displays: r.Displays, DisplayNote: r.DisplayNote}
	if k := r.Kernel; k != nil {
		out.Kernel = &engine.KernelResult{ID: k.ID, PID: k.PID, Dir: k.Dir, Backend: k.Backend, Reused: k.Reused,
			ExecutionCount: k.ExecutionCount, StateLost: k.StateLost, StateReset: k.StateReset, StateRestored: k.StateRestored, Note: k.Note}
	}
	return out
}

// Started tells a streamed execute's cell id before any of its output or
// events.
type Started struct {
	Head
	Cell string `json:"cell"`
}

// InputRequest asks for the line a cell's input() or getpass() waits on:
// its ID is the execute's, Prompt a single line of text, Password says not
// to show what is typed.
type InputRequest struct {
	Head
	Cell     string `json:"cell"`
	Prompt   string `json:"prompt"`
	Password bool   `json:"password"`
}

// Output is a chunk of a streamed cell's output.
type Output struct {
	Head
	Stream string `json:"stream"`
	Text   string `json:"text"`
}

// DisplayOutput is a display a streamed cell made, as it made it: an
// Output of stream "display" whose text is the display's label, so a client
// that knows only output lines shows the label.
type DisplayOutput struct {
	Output
	Display engine.Display `json:"display"`
}

// Kernels answers kernels: the engine's kernels and limits.
type Kernels struct {
	Head
	Count    int     `json:"count"`
	Cap      int     `json:"cap"`
	IdleExit float64 `json:"idle_exit"`
	// HibernateAfter is hibernate_after in seconds (0: never).
	HibernateAfter float64  `json:"hibernate_after"`
	Kernels        []Kernel `json:"kernels"`
	// Now is the engine's clock when it listed them, so a client on another
	// host can place the times on its own clock.
	Now time.Time `json:"now"`
	// Version names this listing: a kernels request that gives it back as
	// unless_version is answered Unchanged, with no kernels, while nothing
	// in the listing changed (idle times aside, which follow from
	// last_used), so a dashboard's refresh of an idle engine costs it
	// almost nothing.
	Version   string `json:"version"`
	Unchanged bool   `json:"unchanged,omitempty"`
	// Spares counts the runners started and idle, keyed to no one yet,
	// which count toward the cap.
	Spares int `json:"spares"`
	// Parked are the parked states, oldest first: each owner's next call
	// for its key restores it.
	Parked []engine.ParkedKernel `json:"parked"`
}

// ParkDone answers park: what was parked.
type ParkDone struct {
	Head
	Parked engine.ParkedKernel `json:"parked"`
}

// Dropped answers drop_parked: whether there was a parked state.
type Dropped struct {
	Head
	Dropped bool `json:"dropped"`
}

// Kernel is one kernel of a listing.
type Kernel struct {
	ID             string             `json:"id"`
	Owner          string             `json:"owner"`
	Task           string             `json:"task"`
	Backend        string             `json:"backend"`
	Child          string             `json:"child"`
	Tools          []string           `json:"tools"`
	PID            int                `json:"pid"`
	Dir            string             `json:"dir"`
	Attached       bool               `json:"attached"`
	Queued         int                `json:"queued"`
	IdleS          float64            `json:"idle_s"`
	ExecutionCount int                `json:"execution_count"`
	State          engine.KernelState `json:"state"`
	RunningCell    string             `json:"running_cell"`
	RunningSince   *time.Time         `json:"running_since"`
	LastUsed       time.Time          `json:"last_used"`
	NextEvict      bool               `json:"next_evict"`
	Confinement    string             `json:"confinement"`
	Python         string             `json:"python,omitempty"`
	Cwd            string             `json:"cwd,omitempty"`
	Host           backends.Place     `json:"host,omitzero"`
}

// KernelOf is k as a listing shows it.
func KernelOf(k engine.KernelInfo) Kernel {
	tools := k.Tools
	if tools == nil {
		tools = []string{} // the contract promises an array, never null
	}
	out := Kernel{
		ID: k.ID, Owner: k.Owner, Task: k.Task, Backend: k.Backend, Child: k.Child,
		Tools: tools, PID: k.PID, Dir: k.Dir, Attached: k.Attached, Queued: k.Queued,
		IdleS: math.Round(k.Idle.Seconds()*1000) / 1000, ExecutionCount: k.ExecutionCount,
		State: k.State, RunningCell: k.RunningCell, LastUsed: k.LastUsed, NextEvict: k.NextEvict, Confinement: k.Confinement,
		Python: k.Python, Cwd: k.Cwd, Host: k.Host,
	}
	if k.RunningCell != "" {
		since := k.RunningSince
		out.RunningSince = &since
	}
	return out
}

// Info is the kernel as the engine listed it, its times moved by skew
// onto the reader's clock.
func (k Kernel) Info(skew time.Duration) engine.KernelInfo {
	out := engine.KernelInfo{ID: k.ID, Owner: k.Owner, Task: k.Task, Backend: k.Backend, Child: k.Child,
		Tools: k.Tools, PID: k.PID, Dir: k.Dir, Attached: k.Attached, Queued: k.Queued,
		Idle: FromSeconds(k.IdleS), ExecutionCount: k.ExecutionCount, State: k.State, RunningCell: k.RunningCell,
		LastUsed: k.LastUsed.Add(skew), NextEvict: k.NextEvict, Confinement: k.Confinement, Python: k.Python, Cwd: k.Cwd, Host: k.Host}
	if k.RunningSince != nil {
		out.RunningSince = k.RunningSince.Add(skew)
	}
	return out
}

// Hello answers hello: the engine, its limits, the caller as the engine
// sees it and the ops it takes.
type Hello struct {
	Head
	Engine      string   `json:"engine"`
	Version     string   `json:"version"`
	Protocol    int      `json:"protocol"`
	PID         int      `json:"pid"`
	Backends    []string `json:"backends"`
	MaxKernels  int      `json:"max_kernels"`
	IdleExit    float64  `json:"idle_exit"`
	CellTimeout float64  `json:"cell_timeout"`
	You         You      `json:"you"`
	Ops         []Op     `json:"ops"`
	// Python and Cwd are where the engine's local kernels run for an
	// execute that does not say where its client works (cwd, python).
	Python string `json:"python,omitempty"`
	Cwd    string `json:"cwd,omitempty"`
}

// You is the caller as the engine sees it.
type You struct {
	UID   int    `json:"uid"`
	Login string `json:"login"`
	// Owner is the only owner the caller may act as; "" means any.
	Owner string `json:"owner"`
}

// Completions answers complete: each of Matches replaces the code from
// Start (characters) to the cursor.
type Completions struct {
	Head
	Start   int      `json:"start"`
	Matches []string `json:"matches"`
}

// Cells answers cells: the kernel's recent cells, whoever ran them.
type Cells struct {
	Head
	Kernel string `json:"kernel"`
	Cells  []Cell `json:"cells"`
}

// Cell is one cell of Cells.
type Cell struct {
	engine.CellRecord
	DurationMS float64 `json:"duration_ms"`
}

// CellOf is rec as Cells shows it.
func CellOf(rec engine.CellRecord) Cell {
	return Cell{CellRecord: rec, DurationMS: Millis(rec.Duration)}
}

// Record is the cell as the engine recorded it.
func (c Cell) Record() engine.CellRecord {
	rec := c.CellRecord
	rec.Duration = FromMillis(c.DurationMS)
	return rec
}
