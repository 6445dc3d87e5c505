package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

// How every client dials an engine that went away: first after
// RedialFirst, then waiting twice as long each time up to RedialMost, for
// up to RedialFor (an attached dashboard, which shows it, for as long as it
// runs).
const (
	RedialFor   = 5 * time.Minute
	RedialFirst = 250 * time.Millisecond
	RedialMost  = 5 * time.Second
)

// ErrEngineAway: the engine went away and did not come back within
// RedialFor.
var ErrEngineAway = errors.New("the engine went away and did not come back")

// Redialer is a client that outlives its connection: when the engine goes
// away (a restart, a crash), it dials it again with backoff, and a call cut
// by the drop is made again on the new connection. An Execute carries a
// cell id (one is given when it has none), which the engine never runs
// twice: its cell runs once, and its result comes back.
type Redialer struct {
	dial   func(ctx context.Context) (*Client, error)
	where  string
	events chan engine.Event
	notify func(string)

	mu     sync.Mutex
	cur    *Client       // nil while redialing
	ready  chan struct{} // closed once cur is set again, or the redialing gave up
	err    error         // why the redialing gave up
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
}

// NewRedialer wraps first, dialed with dial, which dials it again;
// notify (if set) is told, in words, when the engine goes and comes back.
func NewRedialer(first *Client, dial func(ctx context.Context) (*Client, error), notify func(string)) *Redialer {
	r := &Redialer{dial: dial, where: first.Where(), events: make(chan engine.Event, 1024), notify: notify, stop: make(chan struct{})}
	r.adopt(first)
	return r
}

// adopt makes c the connection and relays its events until it ends.
func (r *Redialer) adopt(c *Client) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		c.Close()
		return
	}
	r.cur = c
	if r.ready != nil {
		close(r.ready)
	}
	r.ready = nil
	r.wg.Add(1) // under mu: Close waits only once no more can start
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		for {
			select {
			case ev, ok := <-c.Events():
				if !ok { // the connection ended
					<-c.Done()
					r.lost(c)
					return
				}
				select {
				case r.events <- ev:
				default: // a slow reader loses events, as on one connection
				}
			case <-c.Done():
				r.lost(c)
				return
			case <-r.stop:
				return
			}
		}
	}()
}

// lost starts dialing again once c, the connection, has ended.
func (r *Redialer) lost(c *Client) {
	r.mu.Lock()
	if r.closed || r.cur != c {
		r.mu.Unlock()
		return
	}
	r.cur = nil
	r.ready = make(chan struct{})
	r.wg.Add(1)
	r.mu.Unlock()
	if r.notify != nil {
		r.notify(fmt.Sprintf("the engine at %s went away (%v); reconnecting", r.where, c.Err()))
	}
	go func() {
		defer r.wg.Done()
		give := time.Now().Add(RedialFor)
		wait := RedialFirst
		var last error
		for time.Now().Before(give) {
			select {
			case <-r.stop:
				return
			case <-time.After(wait):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			next, err := r.dial(ctx)
			cancel()
			if err == nil {
				if r.notify != nil {
					r.notify("reconnected to the engine at " + r.where)
				}
				r.adopt(next)
				return
			}
			last = err
			wait = min(2*wait, RedialMost)
		}
		r.mu.Lock()
		r.err = fmt.Errorf("%w: %s, for %v (last try: %v)", ErrEngineAway, r.where, RedialFor, last)
		close(r.ready)
		r.ready = nil
		r.mu.Unlock()
	}()
}

// client returns the connection, waiting while the engine is being dialed
// again.
func (r *Redialer) client(ctx context.Context) (*Client, error) {
	for {
		r.mu.Lock()
		cur, ready, err, closed := r.cur, r.ready, r.err, r.closed
		r.mu.Unlock()
		switch {
		case closed:
			return nil, ErrClosed
		case cur != nil:
			return cur, nil
		case err != nil:
			return nil, err
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// again says whether a call on c that failed with err should be made again
// on the next connection: the connection was lost under it, not closed by
// us, and the caller still waits.
func again(ctx context.Context, c *Client, err error) bool {
	if !errors.Is(err, ErrConnectionLost) || ctx.Err() != nil {
		return false
	}
	select {
	case <-c.Done(): // a failed write comes before the reader sees the end
	case <-ctx.Done():
		return false
	}
	return !errors.Is(c.Err(), ErrClosed)
}

// Execute runs req on the engine; a drop under it sends it again, under
// the same cell id, once the engine is back.
func (r *Redialer) Execute(ctx context.Context, req engine.Request) (*engine.Result, error) {
	if req.Cell == "" {
		req.Cell = "r" + engine.NewCellID()
	}
	for {
		c, err := r.client(ctx)
		if err != nil {
			return nil, err
		}
		res, err := c.Execute(ctx, req)
		if !again(ctx, c, err) {
			return res, err
		}
		// OnQueued has run; what follows the restart waits its turn again.
		req.OnQueued = nil
	}
}

// Refresh renews the kernels listing now.
func (r *Redialer) Refresh(ctx context.Context) error {
	return r.retried(ctx, func(c *Client) error { return c.Refresh(ctx) })
}

// Kernels lists the engine's kernels (none while it is away).
func (r *Redialer) Kernels() []engine.KernelInfo {
	if c := r.now(); c != nil {
		return c.Kernels()
	}
	return nil
}

// Parked are the engine's parked states as last listed (none while it is
// away).
func (r *Redialer) Parked() []engine.ParkedKernel {
	if c := r.now(); c != nil {
		return c.Parked()
	}
	return nil
}

// Park parks kernel id now.
func (r *Redialer) Park(ctx context.Context, id string) (engine.ParkedKernel, error) {
	var p engine.ParkedKernel
	err := r.retried(ctx, func(c *Client) error {
		var err error
		p, err = c.Park(ctx, id)
		return err
	})
	return p, err
}

// DropParked discards the parked state of the key named.
func (r *Redialer) DropParked(owner, backend, task, child string, tools []string) (bool, error) {
	c := r.now()
	if c == nil {
		return false, ErrEngineAway
	}
	return c.DropParked(owner, backend, task, child, tools)
}

// Backends are the engine's backends (none while it is away).
func (r *Redialer) Backends() []string {
	if c := r.now(); c != nil {
		return c.Backends()
	}
	return nil
}

// Limits are the engine's cap and idle exit (zero while it is away).
func (r *Redialer) Limits() (int, time.Duration) {
	if c := r.now(); c != nil {
		return c.Limits()
	}
	return 0, 0
}

// Interrupt interrupts kernel id's running cell.
func (r *Redialer) Interrupt(ctx context.Context, id string) error {
	return r.retried(ctx, func(c *Client) error { return c.Interrupt(ctx, id) })
}

// Complete asks kernel id for the completions of code at cursor; asked
// again on a new engine, it has no side effect to repeat.
func (r *Redialer) Complete(ctx context.Context, id, code string, cursor int) (engine.Completion, error) {
	var out engine.Completion
	err := r.retried(ctx, func(c *Client) error {
		var err error
		out, err = c.Complete(ctx, id, code, cursor)
		return err
	})
	return out, err
}

// Kill kills kernel id.
func (r *Redialer) Kill(ctx context.Context, id string) error {
	return r.retried(ctx, func(c *Client) error { return c.Kill(ctx, id) })
}

// Approve answers a tool call's approval request; one asked of an engine
// that went away is gone with it.
func (r *Redialer) Approve(id string, d engine.Decision) error {
	c := r.now()
	if c == nil {
		return fmt.Errorf("approval %s: the engine at %s is away", id, r.where)
	}
	return c.Approve(id, d)
}

// retried makes a call, and makes it again on the next connection if the
// engine went away under it (interrupt and kill are the same asked twice).
func (r *Redialer) retried(ctx context.Context, call func(c *Client) error) error {
	for {
		c, err := r.client(ctx)
		if err != nil {
			return err
		}
		if err := call(c); !again(ctx, c, err) {
			return err
		}
	}
}

func (r *Redialer) now() *Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// Where names the engine as the user wrote it.
func (r *Redialer) Where() string { return r.where }

// Events carries the events of every connection in turn.
func (r *Redialer) Events() <-chan engine.Event { return r.events }

// Close ends the connection and the redialing.
func (r *Redialer) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	cur := r.cur
	if r.ready != nil {
		close(r.ready)
		r.ready = nil
	}
	r.mu.Unlock()
	close(r.stop)
	var err error
	if cur != nil {
		err = cur.Close()
	}
	r.wg.Wait()
	return err
}
