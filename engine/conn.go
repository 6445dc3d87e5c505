package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
)

// What a runner, driven by untrusted kernel code, can make the engine hold:
// one frame being read (maxFrame), nothing of a cell not running. A runner
// that sends more than floodLimit outside its cell has its stream closed.
const (
	// maxFrame bounds one line from a runner: a result carries at most the
	// clip (50,000 characters, escaped), a forwarded tool request about 1 MB.
	maxFrame = 8 << 20
	// floodLimit is how much a runner may send outside its cell before its
	// stream is closed.
	floodLimit = 64 << 20
)

// Runner result statuses (runnerFrame.Status).
const (
	runnerOK          = "ok"
	runnerExit        = "exit"
	runnerInterrupted = "interrupted"
	runnerError       = "error"
)

// runnerFrame is one JSON line a runner sends: a result, streamed output, a
// forwarded tool request, an error, or a step of the handshake.
type runnerFrame struct {
	Op             string  `json:"op"`
	ID             string  `json:"id"`
	Status         string  `json:"status"`
	Stdout         string  `json:"stdout"`
	Stderr         string  `json:"stderr"`
	StdoutClipped  bool    `json:"stdout_clipped"`
	StderrClipped  bool    `json:"stderr_clipped"`
	StdoutSpill    string  `json:"stdout_spill"`
	StderrSpill    string  `json:"stderr_spill"`
	Traceback      string  `json:"traceback"`
	ExecutionCount int     `json:"execution_count"`
	DurationMS     float64 `json:"duration_ms"`
	// Displays are the cell's rich outputs (checked by displaysFromFrame).
	Displays        []runnerDisplay `json:"displays"`
	DisplaysDropped int             `json:"displays_dropped"`
	// Display and Index are one display streamed while the cell runs (op
	// "display").
	Display *runnerDisplay `json:"display"`
	Index   int            `json:"index"`
	Stream  string         `json:"stream"`
	Text    string         `json:"text"`
	Error   string         `json:"error"`
	// Collected marks an error for a cell id that already ran and whose
	// result was given out (a caller asking again for an old cell).
	Collected bool `json:"collected"`
	// Pending lists the cells submitted and not finished, and Last is the
	// latest finished one (op "pong").
	Pending []string `json:"pending"`
	Last    string   `json:"last"`
	// PendingCode is the first pending cell's code, as the runner has it
	// (bounded there; untrusted like all it says).
	PendingCode string `json:"pending_code"`
	// Start and Matches are a completion (op "completions").
	Start   int      `json:"start"`
	Matches []string `json:"matches"`
	PID     int      `json:"pid"`
	// Name and Data carry a forwarded tool request file (op "rpc"); Error
	// then says why it could not be read.
	Name string `json:"name"`
	Data string `json:"data"`
	// N counts the raw bytes of a parked state that follow a "park_data"
	// line; the rest is what it holds (op "parked") or what came back (op
	// "restored"), and Bytes how large a namespace over park_max_mb got
	// (op "error").
	N       int64      `json:"n"`
	Pickler string     `json:"pickler"`
	Names   []string   `json:"names"`
	Modules [][]string `json:"modules"`
	Skipped [][]string `json:"skipped"`
	Failed  [][]string `json:"failed"`
	Bytes   int64      `json:"bytes"`
	// Incomplete: a whole park was refused, for what would not survive it.
	Incomplete bool `json:"incomplete"`
	// Nonce and MAC are the handshake (ops "hello", "auth_ok").
	Nonce string `json:"nonce"`
	MAC   string `json:"mac"`
}

// runnerConn is the fast path to one runner: JSON lines over a Unix socket,
// opened only once the runner proved it holds the kernel's secret. The
// goroutine that runs a cell reads that cell's frames itself, so a frame
// costs no handoff between goroutines; between cells nothing reads, and
// what a runner sends then waits in the socket until the next cell drops
// it (the transport's buffer bounds it).
type runnerConn struct {
	c    net.Conn
	br   *bufio.Reader
	done chan struct{}
	once sync.Once
	wmu  sync.Mutex
	// flooded is told once when the runner sent too much outside its cell.
	flooded func(bytes int64)

	// Only the goroutine running a cell touches these.
	partial []byte // a line a read deadline cut short, continued by the next read
	dropped int64  // bytes dropped since the running cell started

	dmu      sync.Mutex // guards the read deadline against a cancel
	gen      uint64     // counts cells; a cancel applies to its own cell only
	canceled bool
}

// errNotRunner: the peer on a kernel's socket did not prove it holds the
// kernel's secret.
var errNotRunner = errors.New("the peer did not prove it holds the kernel's secret")

// errReadCanceled: the context of the cell being read was canceled.
var errReadCanceled = errors.New("the cell's context was canceled")

// dialRunner authenticates nc both ways (each side answers the other's
// challenge with a MAC under token).
func dialRunner(ctx context.Context, nc net.Conn, token string, flooded func(int64)) (*runnerConn, error) {
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	} else {
		nc.SetDeadline(time.Now().Add(10 * time.Second))
	}
	rc := newConn(nc, bufio.NewReaderSize(nc, 64<<10), flooded)
	var hello, ok runnerFrame
	fail := func(err error) (*runnerConn, error) {
		nc.Close()
		return nil, err
	}
	line, err := rc.line()
	if err != nil || json.Unmarshal(line, &hello) != nil || hello.Op != "hello" || hello.Nonce == "" || len(hello.Nonce) > 128 {
		return fail(fmt.Errorf("runner handshake: no challenge: %w", errNotRunner))
	}
	mine := kernelauth.NewNonce()
	auth, _ := json.Marshal(map[string]string{"op": "auth", "mac": kernelauth.MAC(token, kernelauth.Engine, hello.Nonce), "nonce": mine})
	if _, err := nc.Write(append(auth, '\n')); err != nil {
		return fail(fmt.Errorf("runner handshake: %w", err))
	}
	line, err = rc.line()
	if err != nil || json.Unmarshal(line, &ok) != nil || ok.Op != "auth_ok" || !kernelauth.Valid(token, ok.MAC, kernelauth.Runner, mine) {
		return fail(fmt.Errorf("runner handshake: %w", errNotRunner))
	}
	nc.SetDeadline(time.Time{})
	return rc, nil
}

// newConn wraps an authenticated connection, read through br.
func newConn(nc net.Conn, br *bufio.Reader, flooded func(int64)) *runnerConn {
	return &runnerConn{c: nc, br: br, done: make(chan struct{}), flooded: flooded}
}

// begin starts reading for a new cell: its frames are read until deadline
// (zero: no limit), and until ctx ends. The returned stop must be called
// when the cell is over.
func (rc *runnerConn) begin(ctx context.Context, deadline time.Time) (stop func() bool) {
	rc.dmu.Lock()
	rc.gen++
	gen := rc.gen
	rc.canceled = false
	rc.c.SetReadDeadline(deadline)
	rc.dmu.Unlock()
	rc.dropped = 0
	return context.AfterFunc(ctx, func() {
		rc.dmu.Lock()
		defer rc.dmu.Unlock()
		if rc.gen == gen {
			rc.canceled = true
			rc.c.SetReadDeadline(time.Unix(1, 0)) // wakes a read at once
		}
	})
}

// broken tells whether the stream ended while nobody read it (between
// cells), and closes it then. A stream through a pipe (ssh, docker) shows
// its end at once; a socket's shows when it is written to.
func (rc *runnerConn) broken() bool {
	rc.c.SetReadDeadline(time.Unix(1, 0))
	_, err := rc.br.Peek(1)
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	rc.close()
	return true
}

// readUntil moves the running cell's read deadline (not past a cancel).
func (rc *runnerConn) readUntil(t time.Time) {
	rc.dmu.Lock()
	defer rc.dmu.Unlock()
	if !rc.canceled {
		rc.c.SetReadDeadline(t)
	}
}

// next returns the next frame of cell, or a forwarded tool request; it
// drops every other line, counting it toward the flood limit. It returns
// os.ErrDeadlineExceeded at the read deadline (the next call goes on where
// this one stopped), errReadCanceled once the cell's context ended, and
// any other error when the connection is over (it is then closed).
func (rc *runnerConn) next(cell string) (runnerFrame, error) {
	for {
		line, err := rc.line()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				rc.dmu.Lock()
				canceled := rc.canceled
				rc.dmu.Unlock()
				if canceled {
					return runnerFrame{}, errReadCanceled
				}
				return runnerFrame{}, err
			}
			rc.close()
			return runnerFrame{}, err
		}
		var f runnerFrame
		if json.Unmarshal(line, &f) == nil && (f.ID == cell || f.Op == "rpc") {
			return f, nil
		}
		rc.dropped += int64(len(line))
		if rc.dropped > floodLimit {
			if rc.flooded != nil {
				rc.flooded(rc.dropped)
			}
			rc.close()
			return runnerFrame{}, fmt.Errorf("runner stream flooded: %d bytes outside its cell", rc.dropped)
		}
	}
}

// line reads one line, without copying it when it came in one piece: it is
// valid until the next read. A line a deadline cuts short is kept, and
// continued by the next call.
func (rc *runnerConn) line() ([]byte, error) {
	for {
		chunk, err := rc.br.ReadSlice('\n')
		// The newline does not count toward the limit; a line cut short
		// counts whole, or a line could end up to a read buffer over it.
		n := len(rc.partial) + len(chunk)
		if err == nil {
			n--
		}
		if n > maxFrame {
			rc.partial = nil
			return nil, fmt.Errorf("runner frame larger than %d bytes", maxFrame)
		}
		if err == nil {
			if rc.partial == nil {
				return chunk, nil
			}
			line := append(rc.partial, chunk...)
			rc.partial = nil
			return line, nil
		}
		if len(chunk) > 0 {
			rc.partial = append(rc.partial, chunk...)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

// raw copies the n raw bytes that follow the line just read to w, within
// the read deadline.
func (rc *runnerConn) raw(w io.Writer, n int64) error {
	if _, err := io.CopyN(w, rc.br, n); err != nil {
		rc.close()
		return err
	}
	return nil
}

// sendRaw writes frame v, then n raw bytes from r (v says how many), by
// deadline.
func (rc *runnerConn) sendRaw(v any, r io.Reader, n int64, deadline time.Time) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	rc.wmu.Lock()
	defer rc.wmu.Unlock()
	rc.c.SetWriteDeadline(deadline)
	defer rc.c.SetWriteDeadline(time.Time{})
	if _, err := rc.c.Write(append(line, '\n')); err != nil {
		return err
	}
	_, err = io.CopyN(rc.c, r, n)
	return err
}

// send writes one frame; safe from several goroutines.
func (rc *runnerConn) send(v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	rc.wmu.Lock()
	defer rc.wmu.Unlock()
	_, err = rc.c.Write(append(line, '\n'))
	return err
}

func (rc *runnerConn) close() {
	rc.once.Do(func() {
		close(rc.done)
		rc.c.Close()
	})
}

func (rc *runnerConn) closed() bool {
	select {
	case <-rc.done:
		return true
	default:
		return false
	}
}
