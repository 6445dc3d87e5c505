package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
)

// The fast door to a runner: JSON lines on its socket (runnerConn), one
// exchange per cell, tool calls answered on the same stream.

// streamDoor runs one cell over its runner's socket (the fast path): it
// sends the cell, reads the cell's frames in the goroutine that waits for
// it, and answers the cell's tool calls on the same stream.
type streamDoor struct {
	e *Engine
	k *Kernel
	d backends.StreamDialer
	c *cellRun
}

// run returns ok=false when the stream cannot finish the cell; the Execute
// door then finds out what happened on the host.
func (s *streamDoor) run(ctx context.Context) (outcome, bool) {
	e, k, c := s.e, s.k, s.c
	req := cellFrame{Op: "cell", ID: c.id, Code: c.code, Stream: c.onOutput != nil && (c.userStream || e.bus.wantsOutput()), Timeout: c.timeoutSec, Place: c.place}
	var conn *runnerConn
	before, acked := c.reach, false
	for {
		var fresh bool
		conn, fresh = s.open(ctx)
		if conn == nil {
			return outcome{}, false
		}
		c.reached(reachSocket)
		if conn.send(req) == nil {
			break
		}
		// A write that failed left no whole line, and a runner runs only
		// whole lines.
		c.reach = before
		conn.close()
		// Nothing reads a stream between cells, so a stream that broke
		// then is found here: it is opened again, once.
		if fresh {
			return outcome{}, false
		}
	}
	if !req.Stream && c.onOutput != nil && e.bus.wantsOutput() {
		// A subscriber that came after the choice not to stream, while the
		// stream was still being opened, found no stream to watch: watch it
		// now (a second watch is harmless).
		conn.send(map[string]string{"op": "watch", "id": c.id})
	}
	start := time.Now()
	until := c.deadline
	if c.interrupted {
		until = c.graceEnd
	}
	defer conn.begin(ctx, until)()
	for {
		f, err := conn.next(c.id)
		switch {
		case errors.Is(err, errReadCanceled):
			return outcome{kind: outCanceled, detail: ctx.Err().Error()}, true
		case errors.Is(err, os.ErrDeadlineExceeded) && c.interrupted:
			return outcome{kind: outTimeoutKilled, interrupted: true}, true
		case errors.Is(err, os.ErrDeadlineExceeded):
			c.interrupted, c.graceEnd = true, time.Now().Add(e.cfg.InterruptGrace)
			conn.readUntil(c.graceEnd)
			e.emit(cellEvent(EventCellTimeout, k, c.id, "cell "+c.id+": interrupting"))
			if conn.send(map[string]string{"op": "interrupt", "id": c.id}) != nil {
				return outcome{}, false // the Execute door rings it
			}
			c.interruptSent = true
			continue
		case err != nil:
			if (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) && !acked {
				// The runner's end closed (a reset: with our lines unread)
				// before it took the cell, and its ack comes before any of
				// the cell's code runs: the cell never ran there.
				c.reach = before
			}
			return outcome{}, false
		}
		switch {
		case f.Op == "ack" && f.ID == c.id:
			acked = true
		case f.Op == "result" && f.ID == c.id:
			s.trace("cell "+c.id, start)
			return outcome{kind: outDone, frame: &f, interrupted: c.interrupted}, true
		case f.Op == "output" && f.ID == c.id && c.onOutput != nil:
			c.onOutput(f.Stream, f.Text)
		case f.Op == "display" && f.ID == c.id && f.Display != nil && c.onDisplay != nil:
			// Parts spilled to files come with the result (k is nil:
			// nothing is fetched here).
			if c.streamed.count < maxDisplays {
				c.streamed.count++
				if d := e.checkDisplay(ctx, nil, c.id, f.Index, *f.Display, &c.streamed.bytes); d != nil {
					c.onDisplay(*d)
				}
			}
		case f.Op == "error" && f.ID == c.id && f.Collected:
			return outcome{kind: outCollected, detail: f.Error}, true
		case f.Op == "error" && f.ID == c.id:
			return outcome{kind: outPubFail, detail: f.Error}, true
		case f.Op == "rpc":
			s.toolCall(conn, rpcItem{name: f.Name, data: []byte(f.Data), problem: f.Error})
		}
	}
}

// rpcResultFrame answers a tool call over the stream.
type rpcResultFrame struct {
	Op     string      `json:"op"`
	Seq    int64       `json:"seq"`
	Result rpcResponse `json:"result"`
}

// cellFrame asks a runner to run a cell.
type cellFrame struct {
	Op      string      `json:"op"`
	ID      string      `json:"id"`
	Code    string      `json:"code"`
	Stream  bool        `json:"stream"`
	Timeout float64     `json:"timeout"`
	Place   *placeFrame `json:"place,omitempty"`
}

// open returns the kernel's stream, opening it when it has none or it
// ended (fresh is then true), or nil when it cannot be opened.
func (s *streamDoor) open(ctx context.Context) (conn *runnerConn, fresh bool) {
	e, k := s.e, s.k
	e.mu.Lock()
	conn, dir, token, nc := k.conn, k.dir, k.token, k.dialed
	k.dialed = nil
	e.mu.Unlock()
	if conn != nil && !conn.closed() && !conn.broken() {
		if nc != nil {
			nc.Close()
		}
		return conn, false
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if nc == nil {
		var err error
		if nc, err = s.d.DialUnix(dctx, dir+"/sock"); err != nil {
			return nil, false
		}
	}
	opened, err := dialRunner(dctx, nc, token, func(n int64) {
		e.emit(kernelEvent(EventRunnerFlood, k, fmt.Sprintf(
			"the runner sent %d MB that no cell asked for (kernel code writing to the engine's stream); the stream was closed", n>>20)))
	})
	if err != nil {
		if errors.Is(err, errNotRunner) {
			e.emit(kernelEvent(EventTransportError, k, "stream to "+dir+"/sock refused: "+err.Error()))
		}
		return nil, false
	}
	if conn != nil {
		e.emit(kernelEvent(EventReconnected, k, "stream to the runner re-opened"))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if k.state == phaseGone {
		opened.close()
		return nil, false
	}
	k.conn = opened
	return opened, true
}

// trace records an exchange on the stream as the backends record commands.
func (s *streamDoor) trace(what string, start time.Time) {
	s.e.cfg.Tracer.Record(backends.TraceRecord{Time: start, Backend: s.k.env.URI(), Command: "[stream] " + what,
		MS: float64(time.Since(start).Microseconds()) / 1000})
}

// toolCall serves a tool request the runner forwarded on conn and sends the
// answer back on it; an answer the stream cannot take goes the Execute way.
func (s *streamDoor) toolCall(conn *runnerConn, item rpcItem) {
	rpc := s.c.rpc
	rpc.serveThen(item, func(a *rpcAnswer) {
		if a == nil {
			return
		}
		if conn.send(rpcResultFrame{Op: "rpc_result", Seq: a.seq, Result: a.resp}) == nil {
			rpc.sentOnStream(*a)
			return
		}
		rpc.undelivered(*a)
	})
}
