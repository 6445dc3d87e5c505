package client

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/wire"
)

// Kernels returns the latest snapshot of the engine's kernels; its times
// are on this machine's clock.
func (c *Client) Kernels() []engine.KernelInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.kernels)
}

// KernelsSince is Kernels for a caller that holds the listing of generation
// gen: while the engine says nothing changed it returns false and no copy;
// otherwise the listing and its generation.
func (c *Client) KernelsSince(gen uint64) ([]engine.KernelInfo, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen == c.gen && gen != 0 {
		return nil, gen, false
	}
	return slices.Clone(c.kernels), c.gen, true
}

// Spares returns the engine's spare runners as last listed (they count
// toward the cap; the dashboard's header says "spares N").
func (c *Client) Spares() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.spares
}

// Parked returns the parked states as last listed, oldest first.
func (c *Client) Parked() []engine.ParkedKernel {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.parked)
}

// Park parks kernel id now; its owner's next call restores it.
func (c *Client) Park(ctx context.Context, id string) (engine.ParkedKernel, error) {
	var done wire.ParkDone
	err := c.call(ctx, kernelOp(wire.OpPark, id), &done, nil)
	c.kick()
	return done.Parked, err
}

// DropParked discards the parked state of the key named, as an execute
// names it.
func (c *Client) DropParked(owner, backend, task, child string, tools []string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := wire.NewRequest(wire.OpDropParked).(*wire.DropParked)
	req.Owner, req.Backend, req.Task, req.Child, req.Tools = owner, backend, task, child, tools
	var d wire.Dropped
	err := c.call(ctx, req, &d, nil)
	c.kick()
	return d.Dropped, err
}

// Limits returns the cap and idle_exit as last seen.
func (c *Client) Limits() (int, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.max, c.idle
}

// Backends lists the engine's backends.
func (c *Client) Backends() []string { return slices.Clone(c.hello.Backends) }

// SetLimits changes the engine's limits without waiting for it (the
// dashboard calls it in its update loop): the snapshot takes the new
// values at once, the request goes in the background in call order, and a
// refusal arrives on Events as an EventNotice (the snapshot then shows the
// engine's values again).
func (c *Client) SetLimits(maxKernels *int, idleExit *time.Duration) error {
	req := wire.NewRequest(wire.OpLimits).(*wire.Limits)
	// The engine checks the values, by the settings' records, as it checks
	// every client's.
	if maxKernels != nil {
		n := *maxKernels
		req.MaxKernels = &n
	}
	if idleExit != nil {
		secs := idleExit.Seconds()
		req.IdleExit = &secs
	}
	if err := c.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	if maxKernels != nil {
		c.max = *maxKernels
	}
	if idleExit != nil {
		c.idle = *idleExit
	}
	c.mu.Unlock()
	select {
	case c.limitsQ <- req:
		return nil
	default:
		return errors.New("too many limit changes are waiting for the engine; try again in a moment")
	}
}

// limitsSender sends SetLimits' requests in order.
func (c *Client) limitsSender() {
	for {
		select {
		case <-c.done:
			return
		case req := <-c.limitsQ:
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := c.call(ctx, req, nil, nil)
			cancel()
			if err != nil {
				c.deliver(engine.Event{Type: engine.EventNotice, Time: time.Now(), Detail: "limits not changed on the engine at " + c.where + ": " + err.Error()})
			}
			c.kick()
		}
	}
}

// kick asks for a fresh kernels snapshot soon.
func (c *Client) kick() {
	select {
	case c.refresh <- struct{}{}:
	default:
	}
}

// Execute runs a cell on the engine, with its output as it comes when
// req.OnOutput is set. If ctx ends first, the cell goes on there; only the
// waiting stops.
func (c *Client) Execute(ctx context.Context, req engine.Request) (*engine.Result, error) {
	r := wire.NewRequest(wire.OpExecute).(*wire.Execute)
	r.Code, r.Owner, r.Task, r.Backend, r.Child, r.Tools, r.Reset, r.Cell = req.Code, req.Owner, req.Task, req.Backend, req.Child, req.Tools, req.Reset, req.Cell
	place := req.Place
	if place.IsZero() {
		place = c.opts.Place
	}
	r.Cwd, r.Python, r.Umask = place.Dir, place.Python, place.Umask
	r.Stream = req.OnOutput != nil || req.OnStart != nil || req.OnDisplay != nil
	r.Input = req.OnInput != nil
	if req.Timeout > 0 {
		r.Timeout = req.Timeout.Seconds()
	}
	// An input() is answered off the reader (OnInput may wait for a
	// person), and only while this call waits.
	askCtx, stopAsking := context.WithCancel(ctx)
	defer stopAsking()
	lines := func(op wire.Op, line []byte) {
		switch op {
		case wire.OpInputRequest:
			var l wire.InputRequest
			if req.OnInput != nil && json.Unmarshal(line, &l) == nil {
				go c.answerInput(askCtx, req.OnInput, l)
			}
		case wire.OpStarted:
			var l wire.Started
			if req.OnStart != nil && json.Unmarshal(line, &l) == nil {
				req.OnStart(l.Cell)
			}
		case wire.OpOutput:
			var l wire.DisplayOutput
			if json.Unmarshal(line, &l) != nil {
				return
			}
			switch {
			case l.Stream == engine.StreamDisplay && req.OnDisplay != nil:
				req.OnDisplay(l.Display)
			case l.Stream != engine.StreamDisplay && req.OnOutput != nil:
				req.OnOutput(l.Stream, l.Text)
			}
		}
	}
	if req.OnQueued != nil {
		req.OnQueued() // the engine orders this connection's cells itself
	}
	var res wire.Result
	if err := c.call(ctx, r, &res, lines); err != nil {
		return nil, err
	}
	c.kick()
	return res.Engine(), nil
}

// answerInput asks onInput for the line that l's cell waits on and sends
// it, or an end of input when onInput fails.
func (c *Client) answerInput(ctx context.Context, onInput func(context.Context, engine.InputRequest) (string, error), l wire.InputRequest) {
	value, err := onInput(ctx, engine.InputRequest{Cell: l.Cell, Prompt: l.Prompt, Password: l.Password})
	if ctx.Err() != nil {
		return // the cell is over
	}
	r := wire.NewRequest(wire.OpInputReply).(*wire.InputReply)
	r.To, r.Value, r.EOF = l.ID, value, err != nil
	_ = c.call(ctx, r, nil, nil) // a refusal means the cell no longer waits
}

func (c *Client) simple(ctx context.Context, req wire.Request) error {
	err := c.call(ctx, req, nil, nil)
	c.kick()
	return err
}

// kernelOp is a request of op about kernel id.
func kernelOp(op wire.Op, id string) *wire.KernelOp {
	r := wire.NewRequest(op).(*wire.KernelOp)
	r.Kernel = id
	return r
}

// Interrupt interrupts kernel id's running cell.
func (c *Client) Interrupt(ctx context.Context, id string) error {
	return c.simple(ctx, kernelOp(wire.OpInterrupt, id))
}

// Kill kills kernel id.
func (c *Client) Kill(ctx context.Context, id string) error {
	return c.simple(ctx, kernelOp(wire.OpKill, id))
}

// ShutdownOwner kills owner's kernels and returns how many there were.
func (c *Client) ShutdownOwner(ctx context.Context, owner string) int {
	req := wire.NewRequest(wire.OpShutdownOwner).(*wire.ShutdownOwner)
	req.Owner = owner
	var killed wire.Killed
	err := c.call(ctx, req, &killed, nil)
	c.kick()
	if err != nil {
		return 0
	}
	return killed.Killed
}

// Approve answers a tool call's approval request.
func (c *Client) Approve(id string, d engine.Decision) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := wire.NewRequest(wire.OpApprove).(*wire.Approve)
	req.Request, req.Decision = id, string(d)
	return c.simple(ctx, req)
}

// Cells returns the engine's records of kernel id's recent cells.
func (c *Client) Cells(ctx context.Context, id string) ([]engine.CellRecord, error) {
	var cells wire.Cells
	if err := c.call(ctx, kernelOp(wire.OpCells, id), &cells, nil); err != nil {
		return nil, err
	}
	out := make([]engine.CellRecord, len(cells.Cells))
	for i, l := range cells.Cells {
		out[i] = l.Record()
	}
	return out, nil
}

// Complete asks kernel id for the completions of code at cursor
// (characters).
func (c *Client) Complete(ctx context.Context, id, code string, cursor int) (engine.Completion, error) {
	req := wire.NewRequest(wire.OpComplete).(*wire.Complete)
	req.Kernel, req.Code, req.Cursor = id, code, cursor
	var out wire.Completions
	if err := c.call(ctx, req, &out, nil); err != nil {
		return engine.Completion{}, err
	}
	return engine.Completion{Start: out.Start, Matches: out.Matches}, nil
}

// Refresh renews the kernels snapshot now, for a caller that must not act
// on one up to a second old.
func (c *Client) Refresh(ctx context.Context) error { return c.fetchKernels(ctx) }

// refresher renews the kernels snapshot every RefreshEvery, and sooner
// (at most every half of it) after events.
func (c *Client) refresher() {
	tick := time.NewTicker(c.opts.RefreshEvery)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-c.done:
			return
		case <-tick.C:
		case <-c.refresh:
			if wait := c.opts.RefreshEvery/2 - time.Since(last); wait > 0 {
				select {
				case <-time.After(wait):
				case <-c.done:
					return
				}
			}
		}
		last = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c.fetchKernels(ctx)
		cancel()
	}
}

// fetchKernels takes a new snapshot. The engine's times are moved onto our
// clock by the engine's own "now", so idle timers are right across hosts.
func (c *Client) fetchKernels(ctx context.Context) error {
	req := wire.NewRequest(wire.OpKernels).(*wire.KernelsQuery)
	c.mu.Lock()
	req.UnlessVersion = c.version
	c.mu.Unlock()
	var l wire.Kernels
	if err := c.call(ctx, req, &l, nil); err != nil {
		return err
	}
	received := time.Now()
	if l.Unchanged {
		c.mu.Lock()
		c.max, c.idle = l.Cap, wire.FromSeconds(l.IdleExit)
		c.mu.Unlock()
		return nil
	}
	skew := time.Duration(0)
	if !l.Now.IsZero() {
		skew = received.Sub(l.Now)
	}
	ks := make([]engine.KernelInfo, len(l.Kernels))
	for i, k := range l.Kernels {
		ks[i] = k.Info(skew)
	}
	c.mu.Lock()
	c.kernels, c.max, c.idle, c.version, c.spares = ks, l.Cap, wire.FromSeconds(l.IdleExit), l.Version, l.Spares
	c.parked = l.Parked
	c.gen++
	c.mu.Unlock()
	return nil
}
