package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
)

// A kernel taken over from another engine (Adopt, TakeBack) is registered
// held: resume asks its runner how many cells it ran and whether one is
// still under way, collects that one, and only then lets calls in.

// codeUnknown stands for the code of a cell an engine that is gone sent,
// where its runner did not say it (an older runner).
const codeUnknown = "(sent by the engine before it stopped; its code is not known here)"

// maxPendingCode bounds the code of a cell taken back running that its
// runner tells (it says at most 64 KiB of it).
const maxPendingCode = 64 << 10

// runnerStatus is what a runner says of itself on its stream.
type runnerStatus struct {
	executionCount int
	pending        string // a cell submitted and not finished, or ""
	pendingCode    string // its code, as the runner has it
	last           string // the latest finished cell, or ""
}

// errNoStream: the kernel's runner cannot be reached over a stream.
var errNoStream = errors.New("no stream to the runner")

// statusOf asks k's runner, over its stream, for its status.
func (e *Engine) statusOf(ctx context.Context, k *Kernel) (runnerStatus, error) {
	d := backends.StreamsOf(k.env)
	if d == nil || len(k.dir+"/sock") >= sockPathMax {
		return runnerStatus{}, errNoStream
	}
	conn, _ := (&streamDoor{e: e, k: k, d: d}).open(ctx)
	if conn == nil {
		return runnerStatus{}, errNoStream
	}
	defer conn.begin(ctx, time.Now().Add(10*time.Second))()
	if err := conn.send(map[string]string{"op": "ping"}); err != nil {
		return runnerStatus{}, fmt.Errorf("ask runner %d: %w", k.pid, err)
	}
	for {
		f, err := conn.next("")
		if err != nil {
			return runnerStatus{}, fmt.Errorf("ask runner %d: %w", k.pid, err)
		}
		if f.Op == "pong" {
			st := runnerStatus{executionCount: f.ExecutionCount, last: f.Last}
			if len(f.Pending) > 0 {
				// The runner bounds the code; it is untrusted, so is bounded here too.
				st.pending, st.pendingCode = f.Pending[0], truncate(f.PendingCode, maxPendingCode)
			}
			return st, nil
		}
	}
}

// resume finishes taking over k, registered held: it learns the runner's
// execution count, and collects the cell it was running, if any, in the
// background, releasing k after it. It returns that cell's id ("": none,
// and k is released).
func (e *Engine) resume(ctx context.Context, k *Kernel) string {
	st, err := e.statusOf(ctx, k)
	if err != nil {
		if !errors.Is(err, errNoStream) {
			e.emit(kernelEvent(EventTransportError, k, "taken over without asking its runner which cell it runs: "+err.Error()))
		}
		e.release(k)
		return ""
	}
	e.mu.Lock()
	k.execCount = max(k.execCount, st.executionCount)
	for _, id := range []string{st.pending, st.last} {
		if id != "" {
			k.earlier = append(k.earlier, id)
		}
	}
	e.mu.Unlock()
	if st.pending == "" || !ValidCellID(st.pending) {
		e.release(k)
		return ""
	}
	// Recorded before resume returns: a caller asking for the cell by its
	// id (answerAgain) then waits for this collection.
	e.mu.Lock()
	e.cells.start(k, st.pending, cmp.Or(st.pendingCode, codeUnknown), e.cfg.Now())
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() {
			e.release(k)
			e.enforceCap("")
		}()
		cctx, cancel := context.WithTimeout(e.base, e.cfg.CellTimeout)
		defer cancel()
		e.collect(cctx, k, st.pending)
	}()
	return st.pending
}

// collect waits for the result of cell id, which an engine that is gone
// sent to k's runner, and files it in Cells as if this engine had run it;
// the runner runs no id twice, so asking for it again only joins it.
func (e *Engine) collect(ctx context.Context, k *Kernel, id string) {
	start := time.Now()
	e.mu.Lock()
	k.runningCell, k.runningSince = id, e.cfg.Now()
	e.mu.Unlock()
	c := newCellRun(id, "", start.Add(e.cfg.CellTimeout), e.outputTap(k.key, id, nil), false)
	c.onDisplay = e.displayTap(k.key, id, nil)
	c.reached(reachSocket) // sent before: it may have run
	c.rpc = e.newRPCSession(ctx, k, c)
	e.emit(cellEvent(EventCellStarted, k, id, "cell "+id+" (sent by the engine before this one; collecting its result)"))
	out := e.runCell(ctx, k, c)
	if out.kind == outDead {
		out = outcome{kind: outLost, detail: "the runner died while no engine watched"}
	}
	made := c.rpc.close()
	res, err := e.finishCell(ctx, k, c, out, &KernelResult{Reused: true}, start)
	if res != nil {
		res.ToolCallsMade = made
		res.Cell = id
	}
	e.cells.finish(k.key, id, res, err, time.Since(start))
}

// ValidCellID says whether id can name a cell: what runners accept.
func ValidCellID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// answerAgain answers a call for a cell of key this engine already knows by
// its caller's id: once the cell finished, with what the engine kept of it,
// never by running it again. Only key's own records come here: another
// key's cell of the same id is not known to key at all.
func (e *Engine) answerAgain(ctx context.Context, rec CellRecord, key Key, start, deadline time.Time) (*Result, error) {
	if rec.Running {
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		select {
		case <-rec.done:
		case <-timer.C:
			return &Result{Status: StatusTimeout, Cell: rec.ID, Duration: time.Since(start),
				Traceback: fmt.Sprintf("kerneldeck: cell %s is still running in kernel %s; ask again for its result\n", rec.ID, rec.Kernel)}, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("cell %s: %w", rec.ID, ctx.Err())
		}
		if rec, _ = e.cells.get(key, rec.ID); rec.Running {
			return nil, fmt.Errorf("cell %s: its record was replaced while it ran", rec.ID)
		}
	}
	res := &Result{Status: rec.Status, Stdout: rec.Stdout.text(), Stderr: rec.Stderr.text(), Traceback: rec.Traceback,
		StdoutClipped: rec.Stdout.Clipped || rec.Stdout.cut(), StderrClipped: rec.Stderr.Clipped || rec.Stderr.cut(),
		SpillPath: rec.SpillPath, StderrSpillPath: rec.StderrSpillPath, ToolCallsMade: rec.ToolCallsMade,
		Duration: rec.Duration, Cell: rec.ID,
		Kernel: &KernelResult{ID: rec.Kernel, Backend: key.Backend, Reused: true,
			Note: fmt.Sprintf("cell %s ran once already; this is what the engine kept of its result", rec.ID)}}
	if rec.Error != "" {
		res.Traceback = joinNote(res.Traceback, "kerneldeck: "+rec.Error) + "\n"
	}
	e.mu.Lock()
	if k := e.byID[rec.Kernel]; k != nil {
		res.Kernel.PID, res.Kernel.Dir, res.Kernel.ExecutionCount = k.pid, k.dir, k.execCount
	}
	e.mu.Unlock()
	return res, nil
}

// knowsCell says whether k's runner has cell id, running or as its latest
// result: a call asked again (after an engine restart) must not reset the
// kernel that ran it.
func (e *Engine) knowsCell(ctx context.Context, k *Kernel, id string) bool {
	if id == "" {
		return false
	}
	st, err := e.statusOf(ctx, k)
	return err == nil && (st.pending == id || st.last == id)
}

// NewCellID returns a fresh random cell id, for a caller that gives its
// cells ids of its own (Request.Cell).
func NewCellID() string { return randomHex(12) }
