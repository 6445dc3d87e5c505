package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
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
	req := map[string]any{"op": "limits"}
	if maxKernels != nil {
		if *maxKernels < 1 {
			return fmt.Errorf("max_kernels must be at least 1, got %d", *maxKernels)
		}
		req["max_kernels"] = *maxKernels
	}
	if idleExit != nil {
		if *idleExit < time.Second {
			return fmt.Errorf("idle_exit must be at least 1s, got %v", *idleExit)
		}
		req["idle_exit"] = idleExit.Seconds()
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
			_, err := c.do(ctx, req, nil)
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
	r := map[string]any{"op": "execute", "code": req.Code, "stream": req.OnOutput != nil || req.OnStart != nil || req.OnDisplay != nil}
	for k, v := range map[string]string{"owner": req.Owner, "task": req.Task, "backend": req.Backend, "child": req.Child} {
		if v != "" {
			r[k] = v
		}
	}
	if len(req.Tools) > 0 {
		r["tools"] = req.Tools
	}
	if req.Reset {
		r["reset"] = true
	}
	if req.Timeout > 0 {
		r["timeout"] = req.Timeout.Seconds()
	}
	lines := func(op string, m map[string]json.RawMessage) {
		var l struct {
			Cell, Stream, Text string
		}
		json.Unmarshal(m["cell"], &l.Cell)
		json.Unmarshal(m["stream"], &l.Stream)
		if op == "output" && l.Stream == engine.StreamDisplay {
			var d engine.Display
			if req.OnDisplay != nil && json.Unmarshal(m["display"], &d) == nil {
				req.OnDisplay(d)
			}
			return
		}
		json.Unmarshal(m["text"], &l.Text)
		switch {
		case op == "started" && req.OnStart != nil:
			req.OnStart(l.Cell)
		case op == "output" && req.OnOutput != nil:
			req.OnOutput(l.Stream, l.Text)
		}
	}
	if req.OnQueued != nil {
		req.OnQueued() // the engine orders this connection's cells itself
	}
	m, err := c.do(ctx, r, lines)
	if err != nil {
		return nil, err
	}
	var res struct {
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
		Cell            string            `json:"cell"`
		Displays        []engine.Display  `json:"displays"`
		DisplayNote     string            `json:"display_note"`
		Kernel          *struct {
			ID             string `json:"id"`
			PID            int    `json:"pid"`
			Dir            string `json:"dir"`
			Backend        string `json:"backend"`
			Reused         bool   `json:"reused"`
			ExecutionCount int    `json:"execution_count"`
			StateLost      bool   `json:"state_lost"`
			StateReset     bool   `json:"state_reset"`
			Note           string `json:"note"`
		} `json:"kernel"`
	}
	if err := decode(m, &res); err != nil {
		return nil, fmt.Errorf("engine at %s: a result that does not decode: %w", c.where, err)
	}
	out := &engine.Result{Status: res.Status, Stdout: res.Stdout, Stderr: res.Stderr, Traceback: res.Traceback,
		StdoutClipped: res.StdoutClipped, StderrClipped: res.StderrClipped, SpillPath: res.SpillPath,
		StderrSpillPath: res.StderrSpillPath, ToolCallsMade: res.ToolCallsMade,
		Duration: time.Duration(res.DurationMS * float64(time.Millisecond)), Fallback: res.Fallback, Cell: res.Cell,
		Displays: res.Displays, DisplayNote: res.DisplayNote}
	if k := res.Kernel; k != nil {
		out.Kernel = &engine.KernelResult{ID: k.ID, PID: k.PID, Dir: k.Dir, Backend: k.Backend, Reused: k.Reused,
			ExecutionCount: k.ExecutionCount, StateLost: k.StateLost, StateReset: k.StateReset, Note: k.Note}
	}
	c.kick()
	return out, nil
}

func (c *Client) simple(ctx context.Context, req map[string]any) error {
	_, err := c.do(ctx, req, nil)
	c.kick()
	return err
}

// Interrupt interrupts kernel id's running cell.
func (c *Client) Interrupt(ctx context.Context, id string) error {
	return c.simple(ctx, map[string]any{"op": "interrupt", "kernel": id})
}

// Kill kills kernel id.
func (c *Client) Kill(ctx context.Context, id string) error {
	return c.simple(ctx, map[string]any{"op": "kill", "kernel": id})
}

// ShutdownOwner kills owner's kernels and returns how many there were.
func (c *Client) ShutdownOwner(ctx context.Context, owner string) int {
	m, err := c.do(ctx, map[string]any{"op": "shutdown_owner", "owner": owner}, nil)
	c.kick()
	if err != nil {
		return 0
	}
	var n int
	json.Unmarshal(m["killed"], &n)
	return n
}

// Approve answers a tool call's approval request.
func (c *Client) Approve(id string, d engine.Decision) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.simple(ctx, map[string]any{"op": "approve", "request": id, "decision": string(d)})
}

// Cells returns the engine's records of kernel id's recent cells.
func (c *Client) Cells(ctx context.Context, id string) ([]engine.CellRecord, error) {
	m, err := c.do(ctx, map[string]any{"op": "cells", "kernel": id}, nil)
	if err != nil {
		return nil, err
	}
	var lines []struct {
		engine.CellRecord
		DurationMS float64 `json:"duration_ms"`
	}
	if err := json.Unmarshal(m["cells"], &lines); err != nil {
		return nil, fmt.Errorf("engine at %s: cells that do not decode: %w", c.where, err)
	}
	out := make([]engine.CellRecord, len(lines))
	for i, l := range lines {
		out[i] = l.CellRecord
		out[i].Duration = time.Duration(l.DurationMS * float64(time.Millisecond))
	}
	return out, nil
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
	req := map[string]any{"op": "kernels"}
	c.mu.Lock()
	if c.version != "" {
		req["unless_version"] = c.version
	}
	c.mu.Unlock()
	m, err := c.do(ctx, req, nil)
	if err != nil {
		return err
	}
	received := time.Now()
	var l struct {
		Cap       int       `json:"cap"`
		IdleExit  float64   `json:"idle_exit"`
		Now       time.Time `json:"now"`
		Version   string    `json:"version"`
		Unchanged bool      `json:"unchanged"`
		Spares    int       `json:"spares"`
		Kernels   []struct {
			engine.KernelInfo
			RunningSince *time.Time `json:"running_since"`
			IdleS        float64    `json:"idle_s"`
		} `json:"kernels"`
	}
	if err := decode(m, &l); err != nil {
		return fmt.Errorf("engine at %s: a kernels listing that does not decode: %w", c.where, err)
	}
	if l.Unchanged {
		c.mu.Lock()
		c.max, c.idle = l.Cap, seconds(l.IdleExit)
		c.mu.Unlock()
		return nil
	}
	skew := time.Duration(0)
	if !l.Now.IsZero() {
		skew = received.Sub(l.Now)
	}
	ks := make([]engine.KernelInfo, len(l.Kernels))
	for i, k := range l.Kernels {
		ks[i] = k.KernelInfo
		ks[i].Idle = seconds(k.IdleS)
		ks[i].LastUsed = k.LastUsed.Add(skew)
		if k.RunningSince != nil {
			ks[i].RunningSince = k.RunningSince.Add(skew)
		}
	}
	c.mu.Lock()
	c.kernels, c.max, c.idle, c.version, c.spares = ks, l.Cap, seconds(l.IdleExit), l.Version, l.Spares
	c.gen++
	c.mu.Unlock()
	return nil
}
