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
	// EventCellOutput carries a chunk of a running cell's output (Cell,
	// Stream, Text); only subscribers that ask for output get it, and the
	// history does not keep it.
	EventCellOutput EventType = "cell_output"
	// EventNotice is said by the parts around the engine (the server, the
	// event log) through Engine.Publish: a refused client, a failing disk.
	EventNotice EventType = "notice"
	// EventMissed tells a subscriber that Detail events were dropped because
	// it fell behind.
	EventMissed EventType = "missed"
	// EventParked: an evicted, reaped or parked kernel's namespace was
	// saved (Detail: what was and what was not); EventParkFailed: it could
	// not be, and its state was lost.
	EventParked     EventType = "parked"
	EventParkFailed EventType = "park_failed"
	// EventRestored: a key's new kernel got its parked state back;
	// EventRestoreRefused: a parked state was not loaded (its MAC did not
	// match, or the new runner could not take it).
	EventRestored       EventType = "restored"
	EventRestoreRefused EventType = "restore_refused"
	// EventParkDropped: a parked state was discarded (its retention, the
	// total cap, or on request).
	EventParkDropped EventType = "park_dropped"
	// EventHibernated: an idle kernel is being parked and its runner ended
	// after hibernate_after; its key's next call restores it.
	EventHibernated EventType = "hibernated"
)

// EventTypes lists every event type the engine publishes, in the order
// they are declared above.
func EventTypes() []EventType {
	return []EventType{EventSpawned, EventSpawnFailed, EventReused, EventReset, EventStateLost,
		EventCellStarted, EventCellFinished, EventCellTimeout, EventInterrupted, EventKilled,
		EventReapedIdle, EventEvictedCap, EventEvictSkippedBusy, EventOwnerShutdown, EventRPCCall,
		EventRPCRejected, EventFallbackPerCall, EventTransportError, EventReconnected, EventLimits,
		EventAdopted, EventApprovalRequest, EventApprovalDecided, EventUnconfined, EventRunnerFlood, EventCellOutput,
		EventNotice, EventMissed, EventParked, EventParkFailed, EventRestored, EventRestoreRefused, EventParkDropped, EventHibernated}
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
	// Cell is the cell an event is about (cell_started, cell_finished,
	// cell_output); Stream and Text are a cell_output's chunk.
	Cell   string `json:"cell,omitempty"`
	Stream string `json:"stream,omitempty"`
	Text   string `json:"text,omitempty"`
	// History marks an event replayed from before the subscription.
	History bool `json:"history,omitempty"`
	// Seq numbers the events of one engine run in publication order (a
	// preloaded history first); EventMissed has none.
	Seq uint64 `json:"seq,omitempty"`
	// Request, Tool and Args describe a tool call waiting for approval
	// (Args clipped to a few KiB); Request is also set on its decision.
	Request string          `json:"request,omitempty"`
	Tool    string          `json:"tool,omitempty"`
	Args    json.RawMessage `json:"args,omitempty"`
	// Until is when an approval request is denied unless answered.
	Until time.Time `json:"until,omitzero"`
	// Missed counts the events dropped before this one (EventMissed only).
	Missed int `json:"missed,omitempty"`
}

// Subscription receives events on C. A slow subscriber never blocks the
// engine: what does not fit is dropped and reported as one EventMissed.
type Subscription struct {
	C <-chan Event
	// History holds the events since SubscribeOptions.Since, oldest first,
	// marked History; C continues right after the last of them.
	History []Event
	// From is the Seq of the last event published before the subscription:
	// C delivers the ones after it.
	From   uint64
	ch     chan Event
	missed int
	output bool
	bus    *bus
}

// SubscribeOptions tunes a subscription.
type SubscribeOptions struct {
	// Buffer is how many events may wait in C (at least 1).
	Buffer int
	// Output also delivers EventCellOutput; the engine then streams the
	// output of every cell that runs over a runner's socket.
	Output bool
	// Since, when set, fills History with the remembered events from then.
	Since time.Time
}

// Close stops delivery and closes C.
func (s *Subscription) Close() { s.bus.unsubscribe(s) }

// DefaultHistory is how many events the engine remembers for replay.
const DefaultHistory = 10000

type bus struct {
	mu      sync.Mutex
	subs    map[*Subscription]struct{}
	outputs int // subscriptions that want cell output
	closed  bool
	// hist is the last events (cell output excepted), with a share for
	// each owner.
	hist *history
	seq  uint64 // of the last event published

	// earlier gives the events said before started (Config.Earlier), read
	// into hist once (earlierOnce), by the first subscription that wants
	// history.
	earlier     func(n int) ([]Event, error)
	earlierOnce sync.Once
	started     time.Time
}

func newBus(limit int, earlier func(n int) ([]Event, error), started time.Time) *bus {
	return &bus{subs: map[*Subscription]struct{}{}, hist: newHistory(limit), earlier: earlier, started: started}
}

// loadEarlier puts the events said before this engine started ahead of
// its own in hist (numbered 0: they were no event of this bus), once. It
// reads outside the lock: publishing goes on meanwhile.
func (b *bus) loadEarlier() {
	if b.earlier == nil {
		return
	}
	b.earlierOnce.Do(func() {
		b.mu.Lock()
		limit := b.hist.limit
		b.mu.Unlock()
		evs, err := b.earlier(limit)
		b.mu.Lock()
		defer b.mu.Unlock()
		h := newHistory(limit)
		for _, ev := range evs {
			if ev.Time.Before(b.started) { // the log holds this engine's own by now too
				ev.Seq, ev.History = 0, false
				h.add(ev)
			}
		}
		if err != nil {
			h.add(Event{Type: EventNotice, Time: b.started, Detail: "the history of earlier engines could not all be read: " + err.Error()})
		}
		b.hist.each(h.add)
		b.hist = h
	})
}

func (b *bus) remember(ev Event) {
	ev.History = false
	b.hist.add(ev)
}

func (b *bus) subscribe(o SubscribeOptions) *Subscription {
	ch := make(chan Event, max(1, o.Buffer))
	s := &Subscription{C: ch, ch: ch, bus: b, output: o.Output}
	if !o.Since.IsZero() {
		b.loadEarlier()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s.From = b.seq
	if !o.Since.IsZero() {
		b.hist.each(func(ev Event) {
			if !ev.Time.Before(o.Since) {
				ev.History = true
				s.History = append(s.History, ev)
			}
		})
	}
	if b.closed {
		close(ch)
		return s
	}
	b.subs[s] = struct{}{}
	if s.output {
		b.outputs++
	}
	return s
}

// wantsOutput reports whether any subscriber takes cell output.
func (b *bus) wantsOutput() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.outputs > 0
}

func (b *bus) unsubscribe(s *Subscription) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[s]; ok {
		delete(b.subs, s)
		if s.output {
			b.outputs--
		}
		close(s.ch)
	}
}

func (b *bus) publish(ev Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	ev.Seq = b.seq
	output := ev.Type == EventCellOutput
	if !output {
		b.remember(ev)
	}
	for s := range b.subs {
		if output && !s.output {
			continue
		}
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
	b.outputs = 0
	for s := range b.subs {
		delete(b.subs, s)
		close(s.ch)
	}
}
