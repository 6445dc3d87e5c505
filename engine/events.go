package engine

import (
	"encoding/json"
	"sync"
	"time"
)

// EventType names a lifecycle event.
type EventType string

// The events the engine publishes.
const (
	EventSpawned          EventType = "spawned"
	EventSpawnFailed      EventType = "spawn_failed"
	EventReused           EventType = "reused"
	EventReset            EventType = "reset"
	EventStateLost        EventType = "state_lost"
	EventCellStarted      EventType = "cell_started"
	EventCellFinished     EventType = "cell_finished"
	EventCellTimeout      EventType = "cell_timeout"
	EventInterrupted      EventType = "interrupted"
	EventKilled           EventType = "killed"
	EventReapedIdle       EventType = "reaped_idle"
	EventEvictedCap       EventType = "evicted_cap"
	EventEvictSkippedBusy EventType = "evict_skipped_busy"
	EventOwnerShutdown    EventType = "owner_shutdown"
	EventRPCCall          EventType = "rpc_call"
	EventRPCRejected      EventType = "rpc_rejected"
	EventFallbackPerCall  EventType = "fallback_per_call"
	EventTransportError   EventType = "transport_error"
	EventReconnected      EventType = "reconnected"
	EventLimits           EventType = "limits"
	// EventAdopted: a kernel left running by an earlier engine was taken over.
	EventAdopted EventType = "adopted"
	// EventApprovalRequest asks the operator to answer a tool call
	// (Engine.Approve); EventApprovalDecided tells how it was answered.
	EventApprovalRequest EventType = "approval_request"
	EventApprovalDecided EventType = "approval_decided"
	// EventUnconfined: runners on a host cannot confine themselves with
	// Landlock (said once per host).
	EventUnconfined EventType = "unconfined"
	// EventRunnerFlood: a runner sent the engine more than it may outside a
	// cell, and its stream was closed.
	EventRunnerFlood EventType = "runner_flood"
	// EventMissed tells a subscriber that Detail events were dropped because
	// it fell behind.
	EventMissed EventType = "missed"
)

// EventTypes lists every event type the engine publishes, in the order
// they are declared above.
func EventTypes() []EventType {
	return []EventType{EventSpawned, EventSpawnFailed, EventReused, EventReset, EventStateLost,
		EventCellStarted, EventCellFinished, EventCellTimeout, EventInterrupted, EventKilled,
		EventReapedIdle, EventEvictedCap, EventEvictSkippedBusy, EventOwnerShutdown, EventRPCCall,
		EventRPCRejected, EventFallbackPerCall, EventTransportError, EventReconnected, EventLimits,
		EventAdopted, EventApprovalRequest, EventApprovalDecided, EventUnconfined, EventRunnerFlood, EventMissed}
}

// Event is one lifecycle event. It never carries a token, key material or
// cell code.
type Event struct {
	Type   EventType `json:"type"`
	Time   time.Time `json:"time"`
	Kernel string    `json:"kernel,omitempty"`
	Owner  string    `json:"owner,omitempty"`
	Key    string    `json:"key,omitempty"`
	Detail string    `json:"detail,omitempty"`
	// Request, Tool and Args describe a tool call waiting for approval
	// (Args clipped to a few KiB); Request is also set on its decision.
	Request string          `json:"request,omitempty"`
	Tool    string          `json:"tool,omitempty"`
	Args    json.RawMessage `json:"args,omitempty"`
	// Missed counts the events dropped before this one (EventMissed only).
	Missed int `json:"missed,omitempty"`
}

// Subscription receives events on C. A slow subscriber never blocks the
// engine: what does not fit is dropped and reported as one EventMissed.
type Subscription struct {
	C      <-chan Event
	ch     chan Event
	missed int
	bus    *bus
}

// Close stops delivery and closes C.
func (s *Subscription) Close() { s.bus.unsubscribe(s) }

type bus struct {
	mu     sync.Mutex
	subs   map[*Subscription]struct{}
	closed bool
}

func newBus() *bus { return &bus{subs: map[*Subscription]struct{}{}} }

func (b *bus) subscribe(buffer int) *Subscription {
	if buffer < 1 {
		buffer = 1
	}
	ch := make(chan Event, buffer)
	s := &Subscription{C: ch, ch: ch, bus: b}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		close(ch)
		return s
	}
	b.subs[s] = struct{}{}
	return s
}

func (b *bus) unsubscribe(s *Subscription) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[s]; ok {
		delete(b.subs, s)
		close(s.ch)
	}
}

func (b *bus) publish(ev Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		if s.missed > 0 {
			select {
			case s.ch <- Event{Type: EventMissed, Time: ev.Time, Missed: s.missed}:
				s.missed = 0
			default:
				s.missed++
				continue
			}
		}
		select {
		case s.ch <- ev:
		default:
			s.missed++
		}
	}
}

func (b *bus) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for s := range b.subs {
		delete(b.subs, s)
		close(s.ch)
	}
}
