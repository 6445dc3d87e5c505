package wire

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

// Event is an engine event as a line; the engine's key of the kernel stays
// on the engine.
type Event struct {
	Op     Op        `json:"op"`
	Type   string    `json:"type"`
	Time   time.Time `json:"time"`
	Kernel string    `json:"kernel"`
	Owner  string    `json:"owner"`
	Detail string    `json:"detail"`
	// Request, Tool and Args describe a tool call waiting for the operator
	// (approval_request; Request and Tool also on approval_decided).
	Request string          `json:"request,omitempty"`
	Tool    string          `json:"tool,omitempty"`
	Args    json.RawMessage `json:"args,omitempty"`
	Until   time.Time       `json:"until,omitzero"`
	// Count is how many events were dropped (type "missed" only).
	Count int `json:"count,omitempty"`
	// Cell, Stream and Text: the cell of a cell event, and a cell_output's
	// chunk.
	Cell   string `json:"cell,omitempty"`
	Stream string `json:"stream,omitempty"`
	Text   string `json:"text,omitempty"`
	// History marks an event replayed by subscribe; Seq orders the events
	// of one engine run.
	History bool   `json:"history,omitempty"`
	Seq     uint64 `json:"seq,omitempty"`
}

// EventOf is ev as a line.
func EventOf(ev engine.Event) Event {
	line := Event{Op: OpEvent, Type: string(ev.Type), Time: ev.Time, Kernel: ev.Kernel, Owner: ev.Owner, Detail: ev.Detail,
		Request: ev.Request, Tool: ev.Tool, Args: ev.Args, Until: ev.Until, Cell: ev.Cell, Stream: ev.Stream, Text: ev.Text,
		History: ev.History, Seq: ev.Seq}
	if ev.Type == engine.EventMissed {
		line.Count = ev.Missed
		line.Detail = fmt.Sprintf("%d events were dropped because this reader fell behind", ev.Missed)
	}
	return line
}

// Engine is the event as the engine published it (but its key).
func (l Event) Engine() engine.Event {
	ev := engine.Event{Type: engine.EventType(l.Type), Time: l.Time, Kernel: l.Kernel, Owner: l.Owner, Detail: l.Detail,
		Request: l.Request, Tool: l.Tool, Args: l.Args, Until: l.Until, Cell: l.Cell, Stream: l.Stream, Text: l.Text,
		History: l.History, Seq: l.Seq}
	if ev.Type == engine.EventMissed {
		ev.Missed = l.Count
	}
	return ev
}
