package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/english"
)

// sockPathMax mirrors the runner's SOCK_PATH_MAX: longer socket paths do not
// fit sun_path, so such kernels are served over Execute only.
const sockPathMax = 104

// Request asks for one cell to run in the kernel of (owner, backend, task,
// child, tools).
type Request struct {
	Owner   string
	Task    string
	Backend string
	Child   string
	Tools   []string
	Code    string
	// Timeout bounds the whole call, queueing included; zero means the
	// configured cell timeout.
	Timeout time.Duration
	// Reset kills the kernel first and runs the cell in a fresh one.
	Reset bool
	// Member marks a request of a member of the engine's group, held to
	// its owner: its owner's kernels are bounded even when
	// MaxKernelsPerOwner is 0, so that it cannot evict everyone else's.
	Member bool
	// OnOutput, when set, receives output while the cell runs (fast path
	// only); it must not block.
	OnOutput func(stream, text string)
	// OnDisplay, when set, receives each display as the cell makes it (fast
	// path only; the result carries them all again, with parts too large for
	// the stream); it must not block.
	OnDisplay func(Display)
	// OnInput, when set, answers the cell's input() and getpass(): it may
	// wait for a person, up to the cell's deadline (ctx ends there), and
	// returns the typed line without its newline, or an error (ErrInputEOF
	// for an end of input) that the cell's input() raises as EOFError.
	// Without it, input() raises EOFError saying no one can answer.
	OnInput func(ctx context.Context, ask InputRequest) (string, error)
	// OnQueued, when set, runs once the call has its place in its kernel's
	// first-come-first-served line, before any backend work. A caller that
	// starts the next call only after it keeps its calls in order.
	OnQueued func()
	// OnStart, when set, is told the cell's id once it has one, before any
	// event or output of the cell: a caller that also watches the events
	// can tell its own cells from others'.
	OnStart func(cell string)
	// Cell, when set, is the caller's id for the cell (ValidCellID), so
	// that it can ask again after a lost connection or an engine restart
	// without the code running twice: a cell this engine knows by that id
	// is answered from what it kept of it, once it finished, and a runner
	// never runs an id twice (it gives the result again).
	Cell string
	// Place is where the caller works (a client of a shared engine): a
	// kernel made for this request on a local backend runs there, and
	// keeps it.
	Place Place
}

// Result is the outcome of a cell.
type Result struct {
	Status          CellStatus
	Stdout          string
	Stderr          string
	Traceback       string
	StdoutClipped   bool
	StderrClipped   bool
	SpillPath       string // full stdout on this machine when clipped
	StderrSpillPath string // full stderr on this machine when clipped
	ToolCallsMade   int
	Duration        time.Duration
	Fallback        string // "" or "per_call"
	// Displays are the cell's rich outputs in order (images, HTML, …);
	// DisplayNote says what of them was dropped or clipped.
	Displays    []Display
	DisplayNote string
	Kernel      *KernelResult
	// Cell is the cell's id, as its events and Engine.Cells name it.
	Cell string
}

// KernelResult tells which kernel ran a cell and what happened to its state.
type KernelResult struct {
	ID             string
	PID            int
	Dir            string
	Backend        string
	Reused         bool
	ExecutionCount int
	StateLost      bool
	StateReset     bool
	// StateRestored: the key's earlier kernel was parked and this new one
	// got its state back before the cell (Note names what did not come).
	StateRestored bool
	Note          string
}

// Execute runs req's code in its kernel, spawning, respawning or resetting
// the kernel as needed. Failures of the cell are in the Result; an error
// means the request was invalid or the engine could not run it safely.
func (e *Engine) Execute(ctx context.Context, req Request) (*Result, error) {
	start := time.Now()
	req.Task = cmp.Or(req.Task, "default")
	req.Owner = cmp.Or(req.Owner, req.Task)
	req.Backend = cmp.Or(req.Backend, e.DefaultBackend())
	backend, err := e.ownerBackend(req.Owner, req.Backend, req.Member)
	if err != nil {
		return nil, err
	}
	req.Backend = backend
	env, ok := e.env(req.Backend)
	if !ok {
		return nil, fmt.Errorf("%w %q; configured backends: %s", ErrUnknownBackend, req.Backend, strings.Join(e.Backends(), ", "))
	}
	key, err := NewKey(req.Owner, req.Backend, req.Task, req.Child, req.Tools)
	if err != nil {
		return nil, err
	}
	if req.Timeout < 0 {
		return nil, fmt.Errorf("timeout must not be negative, got %v", req.Timeout)
	}
	if err := req.Place.Check(); err != nil {
		return nil, err
	}
	timeout := cmp.Or(req.Timeout, e.cfg.CellTimeout)
	deadline := start.Add(timeout)
	if req.Cell != "" {
		if !ValidCellID(req.Cell) {
			return nil, fmt.Errorf("%w: %q (use 1 to 64 letters, digits, _ or -)", ErrBadCellID, req.Cell)
		}
		if rec, ok := e.cells.get(key, req.Cell); ok {
			return e.answerAgain(ctx, rec, key, start, deadline)
		}
	}

	reaped := ""
	for _, v := range e.reapIdle() {
		if v.key == key {
			reaped = fmt.Sprintf("kernel %s was %s; state from earlier calls was lost", v.id, v.goneReason)
		}
	}
	// A park of the key's kernel under way decides what the next kernel
	// starts from: wait for it.
	e.waitParked(ctx, key)
	if reaped != "" {
		e.mu.Lock()
		reaped = e.lost[key] // "" once parked; why it was not, if it was not
		e.mu.Unlock()
	}
	k, created, err := e.acquire(ctx, key, env, deadline, req.Member, req.OnQueued)
	if errors.Is(err, ErrQueueTimeout) {
		return &Result{Status: StatusTimeout, Duration: time.Since(start),
			Traceback: fmt.Sprintf("the cell never started: kernel %s was busy for the whole timeout of %v", key, timeout)}, nil
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		e.release(k)
		// A kernel that settles may now be evicted if a busy one kept us over the cap.
		e.enforceCap("")
	}()
	// The cell is remembered (Engine.Cells) and its output goes to the
	// subscribers that watch, whoever asked for it.
	cellID := cmp.Or(req.Cell, "c"+randomHex(8))
	e.mu.Lock()
	e.cells.start(k, cellID, req.Code, e.cfg.Now())
	e.mu.Unlock()
	if req.OnStart != nil {
		req.OnStart(cellID)
	}
	userStream := req.OnOutput != nil || req.OnDisplay != nil
	req.OnOutput = e.outputTap(key, cellID, req.OnOutput)
	req.OnDisplay = e.displayTap(key, cellID, req.OnDisplay)
	res, err := e.executeAcquired(ctx, req, k, created, reaped, cellID, userStream, start, timeout, deadline)
	e.mu.Lock()
	final := k.id
	e.mu.Unlock()
	e.cells.moved(key, cellID, final)
	e.cells.finish(key, cellID, res, err, time.Since(start))
	if res != nil {
		res.Cell = cellID
	}
	return res, err
}

// outputTap records a cell's streamed output and publishes it to the
// subscribers that take output, then hands it to the caller's callback.
func (e *Engine) outputTap(key Key, cellID string, user func(stream, text string)) func(stream, text string) {
	return func(stream, text string) {
		if kernel, owner, ok := e.cells.output(key, cellID, stream, text); ok {
			e.emit(Event{Type: EventCellOutput, Kernel: kernel, Owner: owner, Cell: cellID, Stream: stream, Text: text})
		}
		if user != nil {
			user(stream, text)
		}
	}
}

// StreamDisplay is the stream of EventCellOutput that stands for a display
// made while the cell runs: its Text is the display's Label and a newline.
const StreamDisplay = "display"

// displayTap publishes a display made while the cell runs, as its label, to
// the subscribers that watch output, and hands it to the caller.
func (e *Engine) displayTap(key Key, cellID string, user func(Display)) func(Display) {
	return func(d Display) {
		text := d.Label() + "\n"
		if kernel, owner, ok := e.cells.output(key, cellID, StreamDisplay, text); ok {
			e.emit(Event{Type: EventCellOutput, Kernel: kernel, Owner: owner, Cell: cellID, Stream: StreamDisplay, Text: text})
		}
		if user != nil {
			user(d)
		}
	}
}

// cellCall is the id Execute gave a cell and whether its caller wants the
// output as it comes.
type cellCall struct {
	id         string
	userStream bool
}

// executeAcquired runs the cell once Execute holds its kernel.
func (e *Engine) executeAcquired(ctx context.Context, req Request, k *Kernel, created bool, reaped, cellID string, userStream bool,
	start time.Time, timeout time.Duration, deadline time.Time) (*Result, error) {

	kr := &KernelResult{StateLost: reaped != "", Note: reaped}
	switch {
	case created:
		place := placeFor(req.Place, k.backendEnv())
		if place.Dir == "" && k.backendEnv().URI() == "local" {
			place.Dir = e.cwd // said in the listing; the runner starts there anyway
		}
		e.mu.Lock()
		k.place = place
		e.mu.Unlock()
		if k.lostNote != "" {
			// The key's previous kernel was evicted, reaped or lost: its
			// state is gone, whoever removed it.
			kr.StateLost, kr.Note = true, k.lostNote
		}
		e.enforceCapFor(k)
		if err := e.spawn(ctx, k); err != nil {
			return e.failOpen(ctx, k, req, cellCall{cellID, userStream}, timeout, start, err)
		}
		if req.Reset {
			e.dropForReset(k)
		} else if r := e.restore(ctx, k); r.later != nil {
			// Its state is still parked: this kernel, fresh, must not stand
			// for it. The call fails; the next one restores (release, in
			// Execute, passes the turn on to any waiter, which starts over).
			e.mu.Lock()
			e.removeLocked(k, "its parked state could not be restored in time")
			delete(e.lost, k.key)
			e.mu.Unlock()
			e.killAsync([]*Kernel{k})
			return nil, r.later
		} else if r.note != "" {
			kr.StateRestored, kr.StateLost, kr.Note = r.restored, !r.restored, r.note
		}
	case req.Reset && !e.knowsCell(ctx, k, req.Cell):
		e.killOnHost(ctx, k)
		e.emit(kernelEvent(EventReset, k, "reset requested"))
		if err := e.spawn(ctx, k); err != nil {
			return e.failOpen(ctx, k, req, cellCall{cellID, userStream}, timeout, start, err)
		}
		kr.StateReset = true
	default:
		// (A reset asked again for a cell k's runner has: it gives that
		// cell's result and nothing is reset again.)
		kr.Reused = true
		e.emit(kernelEvent(EventReused, k, ""))
	}

	c := newCellRun(cellID, req.Code, deadline, req.OnOutput, userStream)
	c.onDisplay, c.onInput = req.OnDisplay, req.OnInput
	c.rpc = e.newRPCSession(ctx, k, c)
	e.mu.Lock()
	if slices.Contains(k.earlier, cellID) {
		c.reached(reachSocket) // sent by the engine before: it may have run
	}
	e.mu.Unlock()
	var out outcome
	for attempt := 0; ; attempt++ {
		e.mu.Lock()
		k.runningCell, k.runningSince = c.id, e.cfg.Now()
		id := k.id
		if p := k.firstPlaceLocked(); p != nil {
			c.place = p // the runner is new: a respawn's takes it again
		}
		e.mu.Unlock()
		// A spawn gives the kernel a new id (a spare runner, a reset, a
		// respawn): the cell is filed under the id it runs in, so whoever
		// looks at the kernel sees it while it runs.
		e.cells.moved(k.key, cellID, id)
		e.emit(cellEvent(EventCellStarted, k, c.id, "cell "+c.id))
		out = e.runCell(ctx, k, c)
		if out.kind != outDead {
			break
		}
		if attempt > 0 {
			c.rpc.close()
			// Dead again right after a respawn: nothing ran, so the per-call
			// run is still safe and says what happened.
			e.killOnHost(ctx, k)
			return e.failOpen(ctx, k, req, cellCall{cellID, userStream}, timeout, start, fmt.Errorf("kernel %s died before its first cell", k.id))
		}
		// Found dead before the cell was published: nothing ran, so respawning
		// and running it once in the new kernel is safe.
		oldID := k.id
		e.emit(kernelEvent(EventStateLost, k, "runner found dead before the cell"+out.detail))
		if err := e.spawn(ctx, k); err != nil {
			c.rpc.close()
			return e.failOpen(ctx, k, req, cellCall{cellID, userStream}, timeout, start, err)
		}
		kr.StateLost, kr.Reused = true, false
		kr.Note = fmt.Sprintf("kernel %s was found dead%s and respawned as %s; state from earlier calls was lost", oldID, out.detail, k.id)
	}
	made := c.rpc.close()
	res, err := e.finishCell(ctx, k, c, out, kr, start)
	if res != nil {
		res.ToolCallsMade = made
	}
	return res, err
}

// newCellRun prepares cell id; the runner learns the timeout so that a tool
// call inside the cell never waits past it. userStream says the caller
// wants the output as it comes, whether or not anyone else watches.
func newCellRun(id, code string, deadline time.Time, onOutput func(stream, text string), userStream bool) *cellRun {
	c := &cellRun{id: id, code: code, deadline: deadline, onOutput: onOutput, userStream: userStream}
	c.timeoutSec = max(1, math.Ceil(time.Until(deadline).Seconds()))
	return c
}

// kernelIDs finds kernel ids in a message (two spawns' errors differ by them).
var kernelIDs = regexp.MustCompile(`\bk[0-9a-f]{12}\b`)

// failOpen is the spawn-failure path: the kernel leaves the registry and the
// code runs once in a fresh private dir, and the result says so.
func (e *Engine) failOpen(ctx context.Context, k *Kernel, req Request, call cellCall, timeout time.Duration, start time.Time, cause error) (*Result, error) {
	e.mu.Lock()
	e.removeLocked(k, "spawn failed")
	e.mu.Unlock()
	e.emit(kernelEvent(EventSpawnFailed, k, cause.Error()))
	te, pe := (*transportError)(nil), (*provisionError)(nil)
	if errors.As(cause, &te) || errors.As(cause, &pe) {
		// A per-call run needs the same transport, or a host made the same
		// way: trying it would only repeat the error.
		return nil, cause
	}
	e.emit(kernelEvent(EventFallbackPerCall, k, "running the cell once in a private dir"))
	remaining := time.Until(start.Add(timeout))
	if remaining <= 0 {
		return &Result{Status: StatusTimeout, Fallback: "per_call", Duration: time.Since(start),
			Traceback: "spawn failed and no time was left for a per-call run: " + cause.Error()}, nil
	}
	res, err := e.runOnce(ctx, k, req, call, start.Add(timeout))
	if err != nil {
		if kernelIDs.ReplaceAllString(err.Error(), "") == kernelIDs.ReplaceAllString(cause.Error(), "") {
			return nil, fmt.Errorf("%w; the per-call fallback failed the same way", cause)
		}
		return nil, fmt.Errorf("%w; the per-call fallback failed too: %w", cause, err)
	}
	res.Fallback = "per_call"
	res.Kernel = nil
	res.Stderr = strings.TrimSuffix("kerneldeck: no persistent kernel ("+cause.Error()+"); ran once in a private dir\n"+res.Stderr, "\n") + "\n"
	res.Duration = time.Since(start)
	return res, nil
}

// runOnce runs req's code in a transient kernel in a fresh private dir:
// spawned for this call only, served like any cell (tool calls included),
// and killed afterwards.
func (e *Engine) runOnce(ctx context.Context, k *Kernel, req Request, call cellCall, deadline time.Time) (*Result, error) {
	e.mu.Lock()
	place := k.place
	e.mu.Unlock()
	tk := &Kernel{key: k.key, env: k.transientHost(), backend: k.backendEnv(), id: newKernelID(), state: phaseStarting, holding: true, transient: true, lastUsed: e.cfg.Now(), place: place}
	if err := e.spawn(ctx, tk); err != nil {
		return nil, err
	}
	defer func() {
		e.mu.Lock()
		killed := tk.state == phaseGone // finishCell already killed a lost run
		tk.state, tk.goneReason = phaseGone, cmp.Or(tk.goneReason, "per-call run finished")
		e.mu.Unlock()
		if !killed {
			e.killOnHost(context.WithoutCancel(ctx), tk)
		}
	}()
	c := newCellRun(call.id, req.Code, deadline, req.OnOutput, call.userStream)
	c.onDisplay, c.onInput = req.OnDisplay, req.OnInput
	c.rpc = e.newRPCSession(ctx, tk, c)
	e.mu.Lock()
	c.place = tk.firstPlaceLocked()
	e.mu.Unlock()
	out := e.runCell(ctx, tk, c)
	if out.kind == outDead {
		out = outcome{kind: outLost, detail: "the per-call runner died before its cell"}
	}
	made := c.rpc.close()
	res, err := e.finishCell(ctx, tk, c, out, &KernelResult{}, time.Now())
	if err != nil {
		return nil, err
	}
	res.ToolCallsMade = made
	return res, nil
}

type outcomeKind int

const (
	outDone          outcomeKind = iota // the runner returned a result
	outDead                             // runner gone before the cell was published: safe to respawn
	outLost                             // runner gone after the cell was published
	outTimeoutKilled                    // timeout, interrupt ignored: kernel killed
	outPubFail                          // the request could not be published
	outUnreachable                      // the host did not answer until past the deadline
	outCanceled                         // the caller or the engine gave up
	outCollected                        // the id already ran and its result was given out
)

type outcome struct {
	kind        outcomeKind
	frame       *runnerFrame
	interrupted bool // the engine interrupted the cell at its deadline
	detail      string
}

// cellRun is one cell's progress, carried across the fast path and Execute.
type cellRun struct {
	id       string
	code     string
	deadline time.Time
	onOutput func(stream, text string)
	// onInput answers the cell's input() and getpass(); nil where no one can.
	onInput func(context.Context, InputRequest) (string, error)
	// onDisplay gets the displays streamed while the cell runs; streamed
	// counts them and their bytes, bounded as a result's are.
	onDisplay func(Display)
	streamed  struct{ count, bytes int }
	// userStream: the caller asked for output as it comes.
	userStream bool
	// timeoutSec tells the runner how long the cell may take.
	timeoutSec float64
	// place is the kernel's place, for its runner to apply before the
	// cell: the runner's first cell carries it.
	place *placeFrame
	rpc   *rpcSession
	// reach is how far the cell's request may have got (see mayHaveRun).
	reach         reach
	interrupted   bool // the deadline passed and the grace started
	interruptSent bool // the interrupt reached the host (a KD answer or a stream write)
	graceEnd      time.Time
}

// reach is how far a cell's request may have got toward its runner, each
// level including the ones below. It alone decides whether a runner found
// gone means the cell never ran (it may run again in a new kernel) or may
// have run (its state is lost, and it is never run again).
type reach int

const (
	reachNone   reach = iota // nothing has left the engine
	reachRecord              // it may have been written as the cell's record (.req) on the host
	reachSocket              // it may have come over the runner's socket, which leaves no record
)

// reached notes that the request may now have got as far as r.
func (c *cellRun) reached(r reach) { c.reach = max(c.reach, r) }

// mayHaveRun says whether the cell may have run in a runner now gone.
// recordAbsent: the host showed that the cell's record is not there (the
// runner was found dead before it, or writing it failed), which rules out
// the record but not the socket.
func (c *cellRun) mayHaveRun(recordAbsent bool) bool {
	if recordAbsent {
		return c.reach >= reachSocket
	}
	return c.reach > reachNone
}

// runCell runs c on k: over the runner's socket when the backend offers
// streams, else (or when the stream fails) over plain Execute. Both doors
// lead to the same runner, which runs each cell id at most once.
func (e *Engine) runCell(ctx context.Context, k *Kernel, c *cellRun) outcome {
	if d := backends.StreamsOf(k.env); d != nil && len(k.dir+"/sock") < sockPathMax {
		if out, ok := (&streamDoor{e: e, k: k, d: d, c: c}).run(ctx); ok {
			return out
		}
	}
	return (&execDoor{e: e, k: k, c: c}).run(ctx)
}

// finishCell turns an outcome into the caller's result and applies its
// consequences to the registry.
func (e *Engine) finishCell(ctx context.Context, k *Kernel, c *cellRun, out outcome, kr *KernelResult, start time.Time) (*Result, error) {
	e.mu.Lock()
	kr.ID, kr.PID, kr.Dir, kr.Backend = k.id, k.pid, k.dir, k.key.Backend
	goneReason := ""
	if k.state == phaseGone {
		goneReason = k.goneReason
	}
	e.mu.Unlock()
	evict := func(reason string) {
		e.mu.Lock()
		if k.state != phaseGone {
			e.removeLocked(k, reason)
		}
		e.mu.Unlock()
		e.killOnHost(ctx, k)
	}
	lostNote := func(what string) string {
		if goneReason != "" {
			what = "the kernel was " + goneReason
		}
		if k.transient {
			return what // a per-call run has no earlier calls
		}
		return what + "; state from earlier calls was lost"
	}
	var res *Result
	switch out.kind {
	case outDone:
		res = e.resultFromFrame(ctx, k, out.frame, out.interrupted)
		e.mu.Lock()
		k.execCount = out.frame.ExecutionCount
		e.mu.Unlock()
		kr.ExecutionCount = out.frame.ExecutionCount
		if res.Status == StatusTimeout {
			kr.Note = joinNote(kr.Note, fmt.Sprintf("the cell passed its timeout and was interrupted; kernel %s and its state were kept", k.id))
		}
		e.emit(cellEvent(EventCellFinished, k, c.id, fmt.Sprintf("cell %s: %s in %s", c.id, res.Status, english.Duration(time.Duration(out.frame.DurationMS*float64(time.Millisecond))))))
	case outLost:
		if x, ok := backends.Find[backends.DeathExplainer](k.env); ok {
			if cause := x.DeathCause(ctx); cause != "" {
				out.detail = cause + " (" + out.detail + ")"
			}
		}
		evict("lost during a cell")
		kr.StateLost = true
		kr.Note = joinNote(kr.Note, lostNote("the kernel died during the cell ("+out.detail+")"))
		e.emit(cellEvent(EventStateLost, k, c.id, "cell "+c.id+": "+out.detail))
		res = &Result{Status: StatusError, Traceback: "kerneldeck: " + kr.Note + "\n"}
	case outTimeoutKilled:
		evict("killed after its cell ignored an interrupt")
		kr.StateLost = true
		kr.Note = joinNote(kr.Note, lostNote(fmt.Sprintf("the cell did not stop within %v of an interrupt at its timeout, so the kernel was killed", e.cfg.InterruptGrace)))
		e.emit(cellEvent(EventStateLost, k, c.id, "cell "+c.id+": killed after timeout"))
		res = &Result{Status: StatusTimeout, Traceback: "kerneldeck: " + kr.Note + "\n"}
	case outPubFail:
		// Fail closed: a kernel whose state may have missed this cell is not reused.
		evict("publish failed")
		return nil, fmt.Errorf("publish cell %s to kernel %s on %s failed (%s); the kernel was evicted so no later cell runs on state that missed this one",
			c.id, kr.ID, kr.Backend, cmp.Or(out.detail, "no detail"))
	case outUnreachable:
		res = &Result{Status: StatusError, Traceback: fmt.Sprintf("kerneldeck: host %s unreachable past the cell's timeout: %s\n", kr.Backend, out.detail)}
		kr.Note = joinNote(kr.Note, "the host could not be reached; the cell may still finish there")
	case outCanceled:
		return nil, fmt.Errorf("cell %s on kernel %s: %s", c.id, kr.ID, out.detail)
	case outCollected:
		// Asked again for a cell the runner ran and answered: not run again,
		// and the kernel and its state are as they were.
		res = &Result{Status: StatusError, Traceback: fmt.Sprintf("kerneldeck: cell %s already ran in kernel %s and its result was given out; it was not run again\n", c.id, kr.ID)}
		kr.Note = joinNote(kr.Note, "cell "+c.id+" ran once already")
	}
	res.Kernel = kr
	res.Duration = time.Since(start)
	return res, nil
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// resultFromFrame maps a runner result to the API, copying spill files to
// the state dir when a stream was clipped.
func (e *Engine) resultFromFrame(ctx context.Context, k *Kernel, f *runnerFrame, interruptedAtDeadline bool) *Result {
	res := &Result{Stdout: f.Stdout, Stderr: f.Stderr, Traceback: f.Traceback,
		StdoutClipped: f.StdoutClipped, StderrClipped: f.StderrClipped}
	switch f.Status {
	case runnerOK:
		res.Status = StatusSuccess
	case runnerExit:
		res.Status = StatusSuccess
		if f.Traceback != "" {
			res.Status = StatusError
		}
	case runnerInterrupted:
		res.Status = StatusInterrupted
		if interruptedAtDeadline {
			res.Status = StatusTimeout
		}
	default:
		res.Status = StatusError
	}
	if k != nil {
		res.SpillPath = e.copySpill(ctx, k, f.StdoutSpill, f.ID+".stdout")
		res.StderrSpillPath = e.copySpill(ctx, k, f.StderrSpill, f.ID+".stderr")
	}
	if len(f.Displays) > 0 || f.DisplaysDropped > 0 {
		res.Displays, res.DisplayNote = e.displaysFromFrame(ctx, k, f)
	}
	return res
}

// copySpill copies a spill file from the kernel's host into the state dir
// (0700 dirs, 0600 file) and returns the local path, or "" if it cannot.
func (e *Engine) copySpill(ctx context.Context, k *Kernel, hostPath, name string) string {
	return e.copySpillMax(ctx, k, hostPath, name, e.cfg.SpillMax)
}

// copySpillMax is copySpill of at most limit bytes.
func (e *Engine) copySpillMax(ctx context.Context, k *Kernel, hostPath, name string, limit int) string {
	if hostPath == "" || e.cfg.StateDir == "" {
		return ""
	}
	e.mu.Lock()
	dir, id := k.dir, k.id
	e.mu.Unlock()
	if path.Dir(hostPath) != dir+"/cells" {
		return "" // a runner may only point into its own cells dir
	}
	res, err := k.env.Execute(ctx, fetchScript(hostPath, limit), backends.ExecOptions{Timeout: time.Minute})
	if err != nil || res.ReturnCode != 0 {
		return ""
	}
	local := filepath.Join(e.cfg.StateDir, "spill", id)
	if err := EnsurePrivateDir(local); err != nil {
		return ""
	}
	p := filepath.Join(local, name)
	if err := WritePrivateFile(p, []byte(res.Output)); err != nil {
		return ""
	}
	return p
}

// EnsurePrivateDir creates dir (and parents) with mode 0700 and checks that
// it is a directory owned by us with no access for others. It fails closed.
func EnsurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create private dir %s: %w", dir, err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("check private dir %s: %w", dir, err)
	}
	if !st.IsDir() || st.Mode().Perm()&0o077 != 0 || !ownedByMe(st) {
		return fmt.Errorf("dir %s must be a directory owned by you with mode 0700 (found %v); fix it with chmod 700 or remove it", dir, st.Mode())
	}
	return nil
}

// WritePrivateFile publishes data at p atomically with mode 0600.
func WritePrivateFile(p string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}
