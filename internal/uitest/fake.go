// Package uitest holds test helpers for the dashboard (package ui): a fake
// engine with fixed kernels, limits and backends that records every call the
// dashboard makes, and a settable clock.
package uitest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

// Limits is one SetLimits call; a nil field was left unchanged.
type Limits struct {
	MaxKernels *int
	IdleExit   *time.Duration
}

// Approval is one Approve call.
type Approval struct {
	Request  string
	Decision engine.Decision
}

// Engine is a fake ui.Engine. Its kernels, limits and backends are whatever
// the test sets; every mutating call is recorded. It is safe for concurrent
// use (the dashboard calls Execute from a goroutine).
type Engine struct {
	mu         sync.Mutex
	kernels    []engine.KernelInfo
	maxKernels int
	idleExit   time.Duration
	backends   []string

	// ExecResult is what Execute returns (a success with no output when
	// nil); ExecErr is its error. ExecOutput, when set, is streamed through
	// Request.OnOutput as stdout before Execute returns.
	execResult *engine.Result
	execErr    error
	execOutput string
	// block, when non-nil, makes Execute wait for it to be closed (or for
	// its context to end): a cell that keeps running.
	block chan struct{}
	// queue, when non-nil, holds Execute before its cell starts (before
	// OnStart), as a busy kernel's queue does.
	queue chan struct{}

	setLimits   []Limits
	executed    []engine.Request
	interrupted []string
	killed      []string
	shutdown    []string
	approved    []Approval
	kernelsN    int
	cells       map[string][]engine.CellRecord
	cellsAsked  []string
	ownN        int // cells Execute has named (c-own-1, ...)
	completion  engine.Completion
	completions []CompleteCall
	parked      []engine.ParkedKernel
	parkedIDs   []string
	dropped     []string
}

// SetParked replaces the parked states listed.
func (f *Engine) SetParked(ps []engine.ParkedKernel) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.parked = slices.Clone(ps)
}

// Parked implements ui's parking engine: the states set.
func (f *Engine) Parked() []engine.ParkedKernel {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.parked)
}

// Park records the kernel parked and lists it, leaving the kernels.
func (f *Engine) Park(_ context.Context, id string) (engine.ParkedKernel, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.parkedIDs = append(f.parkedIDs, id)
	for i, k := range f.kernels {
		if k.ID == id {
			p := engine.ParkedKernel{Owner: k.Owner, Task: k.Task, Backend: k.Backend, Child: k.Child, Kernel: id,
				Reason: "parked by request", Bytes: 1 << 20, ExecutionCount: k.ExecutionCount}
			f.kernels = slices.Delete(f.kernels, i, i+1)
			f.parked = append(f.parked, p)
			return p, nil
		}
	}
	return engine.ParkedKernel{}, fmt.Errorf("%w %q", engine.ErrUnknownKernel, id)
}

// DropParked records and drops the owner/task's parked state.
func (f *Engine) DropParked(owner, backend, task, child string, tools []string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropped = append(f.dropped, owner+"/"+task)
	for i, p := range f.parked {
		if p.Owner == owner && p.Task == task && (backend == "" || p.Backend == backend) && p.Child == child {
			f.parked = slices.Delete(f.parked, i, i+1)
			return true, nil
		}
	}
	return false, nil
}

// ParkCalls lists the kernels Park was asked for and the owner/tasks
// DropParked was.
func (f *Engine) ParkCalls() (parked, dropped []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.parkedIDs), slices.Clone(f.dropped)
}

// CompleteCall is one Complete call.
type CompleteCall struct {
	Kernel, Code string
	Cursor       int
}

// SetCompletion sets what Complete answers.
func (f *Engine) SetCompletion(c engine.Completion) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.completion = c
}

// Complete implements ui.Engine: the completion set, recorded.
func (f *Engine) Complete(_ context.Context, id, code string, cursor int) (engine.Completion, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.completions = append(f.completions, CompleteCall{id, code, cursor})
	return f.completion, nil
}

// Completed lists the Complete calls.
func (f *Engine) Completed() []CompleteCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.completions)
}

// New returns a fake engine with the given backends, cap and idle_exit and
// no kernels.
func New(backends []string, maxKernels int, idleExit time.Duration) *Engine {
	return &Engine{backends: slices.Clone(backends), maxKernels: maxKernels, idleExit: idleExit}
}

// SetKernels replaces the kernel list (a copy is kept).
func (f *Engine) SetKernels(ks []engine.KernelInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kernels = slices.Clone(ks)
}

// SetExecResult sets what Execute returns and the stdout it streams first.
func (f *Engine) SetExecResult(res *engine.Result, err error, streamed string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.execResult, f.execErr, f.execOutput = res, err, streamed
}

// QueueExecute makes the following Execute calls wait in the kernel's
// queue, before their cell starts, until the returned function is called.
func (f *Engine) QueueExecute() (release func()) {
	ch := make(chan struct{})
	f.mu.Lock()
	f.queue = ch
	f.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// BlockExecute makes the following Execute calls wait until the returned
// function is called (or their context ends).
func (f *Engine) BlockExecute() (release func()) {
	ch := make(chan struct{})
	f.mu.Lock()
	f.block = ch
	f.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// Kernels returns a copy of the kernel list, as the engine does.
func (f *Engine) Kernels() []engine.KernelInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kernelsN++
	out := make([]engine.KernelInfo, len(f.kernels))
	copy(out, f.kernels)
	return out
}

// KernelsCalls counts the calls of Kernels (snapshot refreshes).
func (f *Engine) KernelsCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.kernelsN
}

// Limits returns the current cap and idle_exit.
func (f *Engine) Limits() (int, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxKernels, f.idleExit
}

// SetLimits records the call and applies it.
func (f *Engine) SetLimits(maxKernels *int, idleExit *time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var rec Limits
	if maxKernels != nil {
		if *maxKernels < 1 {
			return fmt.Errorf("max_kernels must be at least 1")
		}
		n := *maxKernels
		rec.MaxKernels, f.maxKernels = &n, n
	}
	if idleExit != nil {
		d := *idleExit
		rec.IdleExit, f.idleExit = &d, d
	}
	f.setLimits = append(f.setLimits, rec)
	return nil
}

// Backends returns the backend URIs.
func (f *Engine) Backends() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.backends)
}

// Execute records the request, streams the canned output and returns the
// canned result.
func (f *Engine) Execute(ctx context.Context, req engine.Request) (*engine.Result, error) {
	f.mu.Lock()
	rec := req
	rec.OnOutput, rec.OnQueued, rec.OnStart, rec.OnInput = nil, nil, nil, nil
	rec.Tools = slices.Clone(req.Tools)
	f.executed = append(f.executed, rec)
	res, err, streamed, block, queue := f.execResult, f.execErr, f.execOutput, f.block, f.queue
	f.ownN++
	cell := fmt.Sprintf("c-own-%d", f.ownN)
	f.mu.Unlock()
	if queue != nil {
		select {
		case <-queue:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if req.OnStart != nil {
		req.OnStart(cell)
	}
	if streamed != "" && req.OnOutput != nil {
		req.OnOutput("stdout", streamed)
	}
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	if res == nil {
		return &engine.Result{Status: "success", Stdout: streamed, Cell: cell}, nil
	}
	cp := *res
	cp.Cell = cell
	return &cp, nil
}

// Interrupt records the call.
func (f *Engine) Interrupt(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.interrupted = append(f.interrupted, id)
	return nil
}

// Kill records the call and removes the kernel from the list.
func (f *Engine) Kill(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.killed = append(f.killed, id)
	i := slices.IndexFunc(f.kernels, func(k engine.KernelInfo) bool { return k.ID == id })
	if i < 0 {
		return fmt.Errorf("no kernel %s", id)
	}
	f.kernels = slices.Delete(f.kernels, i, i+1)
	return nil
}

// ShutdownOwner records the call and removes the owner's kernels.
func (f *Engine) ShutdownOwner(_ context.Context, owner string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shutdown = append(f.shutdown, owner)
	n := len(f.kernels)
	f.kernels = slices.DeleteFunc(f.kernels, func(k engine.KernelInfo) bool { return k.Owner == owner })
	return n - len(f.kernels)
}

// Approve records the decision.
func (f *Engine) Approve(id string, d engine.Decision) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.approved = append(f.approved, Approval{Request: id, Decision: d})
	return nil
}

// SetLimitsCalls returns the SetLimits calls so far.
func (f *Engine) SetLimitsCalls() []Limits {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.setLimits)
}

// Executed returns the Execute requests so far (without their callbacks).
func (f *Engine) Executed() []engine.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.executed)
}

// Interrupted returns the ids passed to Interrupt so far.
func (f *Engine) Interrupted() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.interrupted)
}

// Killed returns the ids passed to Kill so far.
func (f *Engine) Killed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.killed)
}

// ShutdownOwners returns the owners passed to ShutdownOwner so far.
func (f *Engine) ShutdownOwners() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.shutdown)
}

// Approved returns the Approve calls so far.
func (f *Engine) Approved() []Approval {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.approved)
}

// Clock is a settable clock for ui.Options.Now, safe to read from the
// program's goroutine while a test moves it.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock stopped at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// WaitFor polls cond every few milliseconds until it holds or timeout
// passes; it reports whether cond held.
func WaitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// SetCells sets the records Cells returns for kernel.
func (f *Engine) SetCells(kernel string, recs []engine.CellRecord) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cells == nil {
		f.cells = map[string][]engine.CellRecord{}
	}
	f.cells[kernel] = slices.Clone(recs)
}

// Cells returns the records set for kernel and notes the call.
func (f *Engine) Cells(_ context.Context, kernel string) ([]engine.CellRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cellsAsked = append(f.cellsAsked, kernel)
	return slices.Clone(f.cells[kernel]), nil
}

// CellsAsked lists the kernels Cells was called for, in order.
func (f *Engine) CellsAsked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.cellsAsked)
}
