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
	"github.com/kerneldeck/kerneldeck/wire"
)

// MaxLineBytes bounds one line from the engine (a kernels listing of many
// kernels is the biggest).
const MaxLineBytes = 64 << 20

// ErrClosed is returned by calls on a client whose connection is gone.
var ErrClosed = errors.New("the connection to the engine is closed")

// ErrConnectionLost: the connection ended under a call (the engine went
// away, or said goodbye), which may have been done or not.
var ErrConnectionLost = errors.New("the connection to the engine was lost")

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
	// Place is where this client works (engine.PlaceHere): its Execute
	// requests carry it, unless a request names its own.
	Place engine.Place
}

// Hello is what the engine said of itself.
type Hello = wire.Hello

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
	pending map[string]*pendingCall
	kernels []engine.KernelInfo
	version string // of the engine's last listing
	gen     uint64 // counts the listings that changed, for KernelsSince
	spares  int    // the engine's spare runners, as last listed
	parked  []engine.ParkedKernel
	max     int
	idle    time.Duration
	err     error // why the connection ended
	refresh chan struct{}
	limitsQ chan *wire.Limits

	events chan engine.Event
	emu    sync.Mutex // guards sending on events, missed, closing events
	missed int
	done   chan struct{}
	wg     sync.WaitGroup
}

// pendingCall is one request waiting for its answer; lines are the lines of it
// that are not the answer (started, output).
type pendingCall struct {
	answer chan []byte
	lines  func(op wire.Op, line []byte)
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
	c := &Client{conn: conn, where: where, opts: o, pending: map[string]*pendingCall{}, refresh: make(chan struct{}, 1),
		limitsQ: make(chan *wire.Limits, 64), events: make(chan engine.Event, o.EventBuffer), done: make(chan struct{})}
	c.wg.Go(c.read)
	fail := func(err error) (*Client, error) {
		c.Close()
		return nil, fmt.Errorf("engine at %s: %w", where, err)
	}
	if err := c.call(ctx, wire.NewRequest(wire.OpHello), &c.hello, nil); err != nil {
		return fail(err)
	}
	if c.hello.Protocol < 2 {
		return fail(fmt.Errorf("it speaks protocol %d; this kerneldeck needs 2 or newer (upgrade the engine's host)", c.hello.Protocol))
	}
	c.max, c.idle = c.hello.MaxKernels, wire.FromSeconds(c.hello.IdleExit)
	sub := wire.NewRequest(wire.OpSubscribe).(*wire.Subscribe)
	sub.Since, sub.Output, sub.BatchMS = o.Since.Seconds(), o.Output, float64(o.Batch.Milliseconds())
	if err := c.call(ctx, sub, nil, nil); err != nil {
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
		var env wire.Envelope
		if json.Unmarshal(line, &env) != nil {
			continue // not ours to interpret; the protocol writes objects
		}
		switch env.Op {
		case wire.OpEvent:
			c.onEvent(line)
			continue
		case wire.OpGoodbye:
			var bye wire.Goodbye
			json.Unmarshal(line, &bye)
			c.end(fmt.Errorf("the engine said goodbye: %s", bye.Reason))
			continue
		}
		var id string
		if json.Unmarshal(env.ID, &id) != nil {
			continue // an error without an id answers nothing we sent
		}
		switch env.Op {
		case wire.OpStarted, wire.OpOutput, wire.OpInputRequest:
			c.mu.Lock()
			p := c.pending[id]
			c.mu.Unlock()
			if p != nil && p.lines != nil {
				p.lines(env.Op, line)
			}
		default:
			c.mu.Lock()
			p := c.pending[id]
			delete(c.pending, id)
			c.mu.Unlock()
			if p != nil {
				p.answer <- line
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
	var l wire.Event
	if json.Unmarshal(line, &l) != nil {
		return
	}
	ev := l.Engine()
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

// call sends req and waits for its answer, which it decodes into answer
// (unless nil); an error answer is an error. lines takes the lines of the
// request that come before its answer.
func (c *Client) call(ctx context.Context, req wire.Request, answer any, lines func(op wire.Op, line []byte)) error {
	id := "c" + strconv.FormatUint(c.nextID.Add(1), 10)
	req.Stamp(id)
	p := &pendingCall{answer: make(chan []byte, 1), lines: lines}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		if errors.Is(err, ErrClosed) {
			return err
		}
		return errors.Join(ErrConnectionLost, err)
	}
	c.pending[id] = p
	c.mu.Unlock()
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	_, err = c.conn.Write(append(b, '\n'))
	c.wmu.Unlock()
	if err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return fmt.Errorf("send to the engine at %s: %w", c.where, errors.Join(ErrConnectionLost, err))
	}
	select {
	case line, ok := <-p.answer:
		if !ok {
			return fmt.Errorf("engine at %s: %w", c.where, errors.Join(ErrConnectionLost, c.Err()))
		}
		var e wire.Error
		if err := json.Unmarshal(line, &e); err != nil {
			return fmt.Errorf("engine at %s: an answer that does not decode: %w", c.where, err)
		}
		if e.Op == wire.OpError {
			return errors.New(e.Error)
		}
		if answer == nil {
			return nil
		}
		if err := json.Unmarshal(line, answer); err != nil {
			return fmt.Errorf("engine at %s: a %s answer that does not decode: %w", c.where, e.Op, err)
		}
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return ctx.Err()
	}
}
