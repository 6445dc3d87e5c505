package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

// MaxLineBytes bounds one line from the engine (a kernels listing of many
// kernels is the biggest).
const MaxLineBytes = 64 << 20

// ErrClosed is returned by calls on a client whose connection is gone.
var ErrClosed = errors.New("the connection to the engine is closed")

// Options tunes New.
type Options struct {
	// Since replays the events of that much past first (marked History).
	Since time.Duration
	// Output also delivers the output of every cell as EventCellOutput.
	Output bool
	// Batch lets the engine hold events that long to send them together
	// (a dashboard: 50 ms is invisible and saves a wake-up per event).
	Batch time.Duration
	// EventBuffer is how many events may wait in Events (default 4096);
	// past it they are dropped and one EventMissed says how many.
	EventBuffer int
	// RefreshEvery is how often the kernels snapshot is renewed (default
	// 1 s); events renew it sooner, at most every RefreshEvery/2. A renewal
	// while nothing changed costs the engine a hash, not a listing.
	RefreshEvery time.Duration
}

// Hello is what the engine said of itself.
type Hello struct {
	Version     string   `json:"version"`
	Protocol    int      `json:"protocol"`
	PID         int      `json:"pid"`
	Backends    []string `json:"backends"`
	MaxKernels  int      `json:"max_kernels"`
	IdleExit    float64  `json:"idle_exit"`
	CellTimeout float64  `json:"cell_timeout"`
	You         struct {
		UID   int    `json:"uid"`
		Login string `json:"login"`
		Owner string `json:"owner"`
	} `json:"you"`
}

// Client is an engine on the other end of a connection. Kernels, Limits
// and Backends answer from a snapshot renewed in the background, so they
// never block; the other calls are round trips. Safe for concurrent use.
type Client struct {
	conn  io.ReadWriteCloser
	where string
	opts  Options
	hello Hello

	wmu    sync.Mutex
	nextID atomic.Uint64

	mu      sync.Mutex
	pending map[string]*call
	kernels []engine.KernelInfo
	version string // of the engine's last listing
	gen     uint64 // counts the listings that changed, for KernelsSince
	spares  int    // the engine's spare runners, as last listed
	max     int
	idle    time.Duration
	err     error // why the connection ended
	refresh chan struct{}
	limitsQ chan map[string]any

	events chan engine.Event
	emu    sync.Mutex // guards sending on events, missed, closing events
	missed int
	done   chan struct{}
	wg     sync.WaitGroup
}

// call is one request waiting for its answer; lines are the lines of it
// that are not the answer (started, output).
type call struct {
	answer chan map[string]json.RawMessage
	lines  func(op string, m map[string]json.RawMessage)
}

// New says hello on conn, subscribes to the engine's events as o asks,
// takes a first kernels snapshot and starts renewing it. where names the
// engine in messages.
func New(ctx context.Context, conn io.ReadWriteCloser, where string, o Options) (*Client, error) {
	if o.EventBuffer <= 0 {
		o.EventBuffer = 4096
	}
	if o.RefreshEvery <= 0 {
		o.RefreshEvery = time.Second
	}
	c := &Client{conn: conn, where: where, opts: o, pending: map[string]*call{}, refresh: make(chan struct{}, 1),
		limitsQ: make(chan map[string]any, 64), events: make(chan engine.Event, o.EventBuffer), done: make(chan struct{})}
	c.wg.Go(c.read)
	fail := func(err error) (*Client, error) {
		c.Close()
		return nil, fmt.Errorf("engine at %s: %w", where, err)
	}
	m, err := c.do(ctx, map[string]any{"op": "hello"}, nil)
	if err != nil {
		return fail(err)
	}
	if err := decode(m, &c.hello); err != nil {
		return fail(err)
	}
	if c.hello.Protocol < 2 {
		return fail(fmt.Errorf("it speaks protocol %d; this kerneldeck needs 2 or newer (upgrade the engine's host)", c.hello.Protocol))
	}
	c.max, c.idle = c.hello.MaxKernels, seconds(c.hello.IdleExit)
	sub := map[string]any{"op": "subscribe", "since": o.Since.Seconds(), "output": o.Output}
	if o.Batch > 0 {
		sub["batch_ms"] = o.Batch.Milliseconds()
	}
	if _, err := c.do(ctx, sub, nil); err != nil {
		return fail(err)
	}
	if err := c.fetchKernels(ctx); err != nil {
		return fail(err)
	}
	c.wg.Go(c.refresher)
	c.wg.Go(c.limitsSender)
	return c, nil
}

// Hello is what the engine said when the client connected.
func (c *Client) Hello() Hello { return c.hello }

// Where names the engine.
func (c *Client) Where() string { return c.where }

// Events delivers the engine's events: the replayed history first, then
// live ones. It is closed when the connection ends.
func (c *Client) Events() <-chan engine.Event { return c.events }

// Done is closed when the connection ends; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err says why the connection ended (nil while it lasts).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection; kernels on the engine are left alone.
func (c *Client) Close() error {
	c.end(ErrClosed)
	err := c.conn.Close()
	c.wg.Wait()
	return err
}

func (c *Client) end(why error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = why
	close(c.done)
}

// read dispatches every line from the engine until the connection ends.
func (c *Client) read() {
	defer func() {
		c.emu.Lock()
		close(c.events)
		c.emu.Unlock()
	}()
	br := bufio.NewReaderSize(c.conn, 64<<10)
	for {
		line, err := readLine(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the engine closed the connection")
			}
			c.end(err)
			c.failPending()
			return
		}
		var env struct {
			Op     string          `json:"op"`
			ID     json.RawMessage `json:"id"`
			Reason string          `json:"reason"`
		}
		if json.Unmarshal(line, &env) != nil {
			continue // not ours to interpret; the protocol writes objects
		}
		switch env.Op {
		case "event":
			c.onEvent(line)
			continue
		case "goodbye":
			c.end(fmt.Errorf("the engine said goodbye: %s", env.Reason))
			continue
		}
		var m map[string]json.RawMessage
		var id string
		if json.Unmarshal(line, &m) != nil || json.Unmarshal(env.ID, &id) != nil {
			continue // an error without an id answers nothing we sent
		}
		op := env.Op
		switch op {
		case "started", "output":
			c.mu.Lock()
			p := c.pending[id]
			c.mu.Unlock()
			if p != nil && p.lines != nil {
				p.lines(op, m)
			}
		default:
			c.mu.Lock()
			p := c.pending[id]
			delete(c.pending, id)
			c.mu.Unlock()
			if p != nil {
				p.answer <- m
			}
		}
	}
}

func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(buf)+len(chunk) > MaxLineBytes {
			return nil, fmt.Errorf("the engine sent a line over %d MiB", MaxLineBytes>>20)
		}
		buf = append(buf, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return buf, err
	}
}

func (c *Client) failPending() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, p := range c.pending {
		delete(c.pending, id)
		close(p.answer)
	}
}

// onEvent converts an event line and passes it on; a full buffer drops it
// and the next delivered EventMissed counts what was lost.
func (c *Client) onEvent(line []byte) {
	var l struct {
		engine.Event
		Count int `json:"count"`
	}
	if json.Unmarshal(line, &l) != nil {
		return
	}
	ev := l.Event
	if ev.Type == engine.EventMissed {
		ev.Missed = l.Count
	}
	if ev.Type != engine.EventCellOutput {
		select {
		case c.refresh <- struct{}{}:
		default:
		}
	}
	c.deliver(ev)
}

// deliver passes ev on, or drops it when Events is full; the next delivered
// event is then an EventMissed with the count. Only the reader and the
// limits sender deliver, under emu.
func (c *Client) deliver(ev engine.Event) {
	c.emu.Lock()
	defer c.emu.Unlock()
	select {
	case <-c.done:
		return // the reader may have closed events
	default:
	}
	if c.missed > 0 {
		select {
		case c.events <- engine.Event{Type: engine.EventMissed, Time: ev.Time, Missed: c.missed}:
			c.missed = 0
		default:
			c.missed++
			return
		}
	}
	select {
	case c.events <- ev:
	default:
		c.missed++
	}
}

// do sends one request and waits for its answer; an error answer is an
// error.
func (c *Client) do(ctx context.Context, req map[string]any, lines func(op string, m map[string]json.RawMessage)) (map[string]json.RawMessage, error) {
	id := "c" + strconv.FormatUint(c.nextID.Add(1), 10)
	req["id"] = id
	p := &call{answer: make(chan map[string]json.RawMessage, 1), lines: lines}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.pending[id] = p
	c.mu.Unlock()
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	c.wmu.Lock()
	_, err = c.conn.Write(append(b, '\n'))
	c.wmu.Unlock()
	if err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return nil, fmt.Errorf("send to the engine at %s: %w", c.where, err)
	}
	select {
	case m, ok := <-p.answer:
		if !ok {
			return nil, fmt.Errorf("engine at %s: %w", c.where, c.Err())
		}
		var op, msg string
		json.Unmarshal(m["op"], &op)
		if op == "error" {
			json.Unmarshal(m["error"], &msg)
			return nil, errors.New(msg)
		}
		return m, nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return nil, ctx.Err()
	}
}

func decode(m map[string]json.RawMessage, v any) error {
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, v)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
