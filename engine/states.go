package engine

import "errors"

// KernelState is what a kernel is doing, as listings show it.
type KernelState string

// The states of a kernel. StateDead, StateParked and StateHibernated are
// never in the engine's listing of kernels: they are for views that keep a
// kernel after it left the registry, dead or with its state parked
// (ParkedKernel; hibernated while idle_exit has not ended its session).
const (
	StateStarting KernelState = "starting"
	StateIdle     KernelState = "idle"
	StateRunning  KernelState = "running"
	StateQueued   KernelState = "queued"
	// StateHibernating: the engine is parking the kernel to hibernate it;
	// a call that comes meanwhile waits (Queued), then gets it as it was.
	StateHibernating KernelState = "hibernating"
	StateDead        KernelState = "dead"
	StateParked      KernelState = "parked"
	StateHibernated  KernelState = "hibernated"
)

// Busy reports whether a kernel in state s has a cell attached (running or
// queued), so it is never evicted.
func (s KernelState) Busy() bool { return s == StateRunning || s == StateQueued }

// CellStatus is how a cell ended.
type CellStatus string

// The statuses of a cell's result.
const (
	StatusSuccess     CellStatus = "success"
	StatusError       CellStatus = "error"
	StatusTimeout     CellStatus = "timeout"
	StatusInterrupted CellStatus = "interrupted"
)

// Errors callers tell apart with errors.Is.
var (
	// ErrEngineClosed: the engine is shut down and takes no more calls.
	ErrEngineClosed = errors.New("engine is shut down")
	// ErrUnknownKernel: no registered kernel has the id given.
	ErrUnknownKernel = errors.New("no kernel with id")
	// ErrNoRunningCell: the kernel has no cell to interrupt.
	ErrNoRunningCell = errors.New("has no running cell")
	// ErrUnknownBackend: the request names a backend the engine lacks.
	ErrUnknownBackend = errors.New("unknown backend")
	// ErrUnknownApproval: no tool call waits for the approval id given.
	ErrUnknownApproval = errors.New("no pending approval request")
	// ErrQueueTimeout: a call waited its whole timeout for a busy kernel.
	ErrQueueTimeout = errors.New("timed out waiting for the kernel")
	// ErrMemberBackend: a member of the engine's group asked for a kernel
	// on a backend where it would run as the engine's user.
	ErrMemberBackend = errors.New("members of the group get no kernels there")
	// ErrOwnerQuota: the owner has as many kernels as it may, all busy.
	ErrOwnerQuota = errors.New("no room for another kernel of this owner")
	// ErrBadCellID: a caller's cell id that no runner would take.
	ErrBadCellID = errors.New("invalid cell id")
	// ErrKernelBusy: the kernel has a cell running or queued.
	ErrKernelBusy = errors.New("kernel is busy")
)
