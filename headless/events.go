package headless

import (
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/wire"
)

// pump copies the engine's events to one connection: approval events only,
// every event (Options.Events or after subscribe), and cell output after a
// subscribe that asks for it; a restricted peer sees only its own owner's.
// It may block on a slow reader; the engine's fan-out drops instead.
type pump struct {
	eng    *engine.Engine
	w      *lineWriter
	peer   *Peer
	buffer int
	swap   chan *request
	done   chan struct{}

	// Owned by run.
	sub   *engine.Subscription
	all   bool
	batch time.Duration // how long events may wait to go out together
}

func newPump(eng *engine.Engine, w *lineWriter, peer *Peer, all bool, buffer int) *pump {
	return &pump{eng: eng, w: w, peer: peer, buffer: buffer, all: all, swap: make(chan *request), done: make(chan struct{}),
		sub: eng.Subscribe(buffer)}
}

func (p *pump) wants(ev engine.Event) bool {
	if !p.peer.sees(ev) {
		return false
	}
	return p.all || ev.Type == engine.EventApprovalRequest || ev.Type == engine.EventApprovalDecided
}

// run writes events until stop; each subscribe is served here, so its
// answer, its replay and its live events come in that order, with no event
// lost or repeated across the switch.
func (p *pump) run() {
	for {
		select {
		case ev, ok := <-p.sub.C:
			if !ok {
				return
			}
			// What else is already waiting (or, with a batch time, comes
			// within it) goes in the same write: under load, one wake-up of
			// the reader per batch, not per event.
			batch := []any{}
			var linger <-chan time.Time
			if p.batch > 0 {
				linger = time.After(p.batch)
			}
			for more := true; more; {
				if p.wants(ev) {
					batch = append(batch, wire.EventOf(ev))
				}
				if len(batch) >= maxEventBatch {
					break
				}
				if linger == nil {
					select {
					case ev, more = <-p.sub.C:
					default:
						more = false
					}
				} else {
					select {
					case ev, more = <-p.sub.C:
					case <-linger:
						more = false
					}
				}
				if !more {
					break
				}
			}
			p.w.write(batch...)
		case r := <-p.swap:
			p.switchTo(r)
		case <-p.done:
			p.sub.Close()
			for ev := range p.sub.C { // what was published before the end
				if p.wants(ev) {
					p.w.write(wire.EventOf(ev))
				}
			}
			return
		}
	}
}

// maxEventBatch bounds the events written at once.
const maxEventBatch = 256

// subscribe hands a subscribe request to the pump.
func (p *pump) subscribe(r *request) {
	select {
	case p.swap <- r:
	case <-p.done:
	}
}

func (p *pump) stop() { close(p.done) }

func (p *pump) switchTo(r *request) {
	o := engine.SubscribeOptions{Buffer: p.buffer, Output: r.output}
	if r.since > 0 {
		o.Since = time.Now().Add(-r.since)
	}
	next := p.eng.SubscribeWith(o)
	// What the old subscription still holds up to the switch is written
	// as before; what came after is in the new one too.
	old := p.sub
	old.Close()
	for ev := range old.C {
		if (ev.Seq == 0 || ev.Seq <= next.From) && p.wants(ev) {
			p.w.write(wire.EventOf(ev))
		}
	}
	p.sub, p.all, p.batch = next, true, r.batch
	var replay []engine.Event
	for _, ev := range next.History {
		if p.peer.sees(ev) {
			replay = append(replay, ev)
		}
	}
	p.w.write(wire.Subscribed{Head: wire.Head{ID: r.id, Op: wire.OpOK}, Replayed: len(replay), Output: r.output})
	for _, ev := range replay {
		p.w.write(wire.EventOf(ev))
	}
}
