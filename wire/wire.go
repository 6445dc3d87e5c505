// Package wire defines the lines of kerneldeck's JSON-lines protocol (the
// headless mode, serve and every client attached to it): one Go type for
// each request and answer, used by both ends. Field names are a contract
// with scripts outside this repository: fields are added, never renamed.
package wire

import (
	"encoding/json"
	"time"
)

// Protocol is the version hello reports. 1: the original ops; 2: hello,
// subscribe, cells, execute with stream, unknown fields refused.
const Protocol = 2

// Op names a line: a request's op, or the kind of an answer.
type Op string

// The requests.
const (
	OpExecute       Op = "execute"
	OpKernels       Op = "kernels"
	OpLimits        Op = "limits"
	OpInterrupt     Op = "interrupt"
	OpKill          Op = "kill"
	OpShutdownOwner Op = "shutdown_owner"
	OpShutdownAll   Op = "shutdown_all"
	OpApprove       Op = "approve"
	OpHello         Op = "hello"
	OpSubscribe     Op = "subscribe"
	OpCells         Op = "cells"
	OpComplete      Op = "complete"
	OpInputReply    Op = "input_reply"
	// OpPark parks a kernel now; OpDropParked discards a parked state.
	OpPark       Op = "park"
	OpDropParked Op = "drop_parked"
)

// The answers and unasked lines that are not also requests.
const (
	OpOK      Op = "ok"
	OpResult  Op = "result"
	OpStarted Op = "started"
	OpOutput  Op = "output"
	OpError   Op = "error"
	OpEvent   Op = "event"
	OpGoodbye Op = "goodbye"
	// OpCompletions answers complete.
	OpCompletions Op = "completions"
	// OpInputRequest asks the client of an execute with "input" for a
	// line its cell's input() waits on.
	OpInputRequest Op = "input_request"
)

// Ops lists the requests in the order the README and hello list them.
func Ops() []Op {
	return []Op{OpExecute, OpKernels, OpLimits, OpInterrupt, OpKill, OpShutdownOwner, OpShutdownAll, OpApprove,
		OpHello, OpSubscribe, OpCells, OpComplete, OpInputReply, OpPark, OpDropParked}
}

// Head begins every request and every answer to one: the id the client
// chose, which the answer echoes, and the op.
type Head struct {
	ID string `json:"id"`
	Op Op     `json:"op"`
}

// Stamp gives a request its id.
func (h *Head) Stamp(id string) { h.ID = id }

// Envelope is what a reader needs of any line to dispatch it: its op and,
// as it was sent, its id (a string, or null on an error that could not name
// its request).
type Envelope struct {
	Op Op              `json:"op"`
	ID json.RawMessage `json:"id"`
}

// Error answers a request that failed or could not be read; ID echoes the
// request's id as it was given (a string or a short number), or null.
type Error struct {
	ID    json.RawMessage `json:"id"`
	Op    Op              `json:"op"`
	Error string          `json:"error"`
}

// Goodbye tells a client that the engine stops serving it.
type Goodbye struct {
	Op     Op     `json:"op"`
	Reason string `json:"reason"`
}

// Millis is d in milliseconds, to the microsecond, as durations travel.
func Millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// FromMillis is the duration of ms milliseconds.
func FromMillis(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// FromSeconds is the duration of s seconds.
func FromSeconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
