package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
)

// What a runner, driven by untrusted kernel code, can make the engine hold:
// one frame being read (maxFrame), the frames of the running cell not yet
// consumed (queueBudget), nothing of a cell not running. A runner that
// sends more than floodLimit outside its cell has its stream closed.
const (
	// maxFrame bounds one line from a runner: a result carries at most the
	// clip (50,000 characters, escaped), a forwarded tool request about 1 MB.
	maxFrame = 8 << 20
	// queueBudget bounds the bytes of accepted frames the engine has not
	// consumed yet; past it the stream is read no further until it has.
	queueBudget = 16 << 20
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
	PID     int            `json:"pid"`
	// Name and Data carry a forwarded tool request file (op "rpc"); Error
	// then says why it could not be read.
	Name string `json:"name"`
	Data string `json:"data"`
	// Nonce and MAC are the handshake (ops "hello", "auth_ok").
	Nonce string `json:"nonce"`
	MAC   string `json:"mac"`

	size int // bytes of the line, for the queue budget
}

// runnerConn is the fast path to one runner: JSON lines over a Unix socket,
// opened only once the runner proved it holds the kernel's secret. A reader
// goroutine turns lines into frames for the cell that runs; frames is closed
// when the connection ends, which is how the engine notices a dead runner at
// once.
type runnerConn struct {
	c      net.Conn
	frames chan runnerFrame
	done   chan struct{}
	once   sync.Once
	wmu    sync.Mutex
	// flooded is told once when the runner sent too much outside its cell.
	flooded func(bytes int64)

	mu      sync.Mutex
	room    *sync.Cond // signalled when queued frames are consumed
	cell    string     // the cell whose frames are wanted; "" for none
	queued  int        // bytes of frames in frames
	dropped int64      // bytes dropped since a cell last ran
}

// errNotRunner: the peer on a kernel's socket did not prove it holds the
// kernel's secret.
var errNotRunner = errors.New("the peer did not prove it holds the kernel's secret")

// dialRunner authenticates nc both ways (each side answers the other's
// challenge with a MAC under token) and starts reading it.
func dialRunner(ctx context.Context, nc net.Conn, token string, wg *sync.WaitGroup, flooded func(int64)) (*runnerConn, error) {
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	} else {
		nc.SetDeadline(time.Now().Add(10 * time.Second))
	}
	br := bufio.NewReaderSize(nc, 64<<10)
	var hello, ok runnerFrame
	fail := func(err error) (*runnerConn, error) {
		nc.Close()
		return nil, err
	}
	line, err := readLine(br)
	if err != nil || json.Unmarshal(line, &hello) != nil || hello.Op != "hello" || hello.Nonce == "" || len(hello.Nonce) > 128 {
		return fail(fmt.Errorf("runner handshake: no challenge: %w", errNotRunner))
	}
	mine := kernelauth.NewNonce()
	auth, _ := json.Marshal(map[string]string{"op": "auth", "mac": kernelauth.MAC(token, kernelauth.Engine, hello.Nonce), "nonce": mine})
	if _, err := nc.Write(append(auth, '\n')); err != nil {
		return fail(fmt.Errorf("runner handshake: %w", err))
	}
	line, err = readLine(br)
	if err != nil || json.Unmarshal(line, &ok) != nil || ok.Op != "auth_ok" || !kernelauth.Valid(token, ok.MAC, kernelauth.Runner, mine) {
		return fail(fmt.Errorf("runner handshake: %w", errNotRunner))
	}
	nc.SetDeadline(time.Time{})
	return startConn(nc, br, wg, flooded), nil
}

// startConn reads frames off an authenticated connection until it ends.
func startConn(nc net.Conn, br *bufio.Reader, wg *sync.WaitGroup, flooded func(int64)) *runnerConn {
	rc := &runnerConn{c: nc, frames: make(chan runnerFrame, 64), done: make(chan struct{}), flooded: flooded}
	rc.room = sync.NewCond(&rc.mu)
	wg.Add(1)
	go func() {
		defer wg.Done()
		rc.read(br)
	}()
	return rc
}

func (rc *runnerConn) read(br *bufio.Reader) {
	defer close(rc.frames)
	for {
		line, err := readLine(br)
		if err != nil {
			rc.close()
			return
		}
		var f runnerFrame
		if json.Unmarshal(line, &f) != nil {
			continue
		}
		f.size = len(line)
		if !rc.admit(&f) {
			if rc.closed() {
				return
			}
			continue
		}
		select {
		case rc.frames <- f:
		case <-rc.done:
			return
		}
	}
}

// admit decides whether f is queued: only frames of the running cell are,
// within the budget (it waits for room); others are dropped and counted.
func (rc *runnerConn) admit(f *runnerFrame) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.cell == "" || (f.ID != rc.cell && f.Op != "rpc") {
		rc.dropped += int64(f.size)
		if rc.dropped > floodLimit {
			n := rc.dropped
			rc.mu.Unlock()
			if rc.flooded != nil {
				rc.flooded(n)
			}
			rc.close()
			rc.mu.Lock()
		}
		return false
	}
	for rc.queued > 0 && rc.queued+f.size > queueBudget && !rc.closed() {
		rc.room.Wait()
	}
	rc.queued += f.size
	return true
}

// want makes the frames of cell the ones queued (a cell is starting).
func (rc *runnerConn) want(cell string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.cell, rc.dropped = cell, 0
}

// unwant stops queuing frames (the cell ended) and drops what is queued.
func (rc *runnerConn) unwant() {
	rc.mu.Lock()
	rc.cell = ""
	rc.mu.Unlock()
	for {
		select {
		case f, ok := <-rc.frames:
			if !ok {
				return
			}
			rc.consumed(f)
		default:
			return
		}
	}
}

// consumed gives f's bytes back to the budget.
func (rc *runnerConn) consumed(f runnerFrame) {
	rc.mu.Lock()
	rc.queued -= f.size
	rc.mu.Unlock()
	rc.room.Broadcast()
}

func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if err == nil {
			// The last chunk counts too (its newline does not), or a line
			// could end up to a read buffer over the limit.
			if len(buf)+len(chunk)-1 > maxFrame {
				return nil, fmt.Errorf("runner frame larger than %d bytes", maxFrame)
			}
			if buf == nil {
				return bytes.Clone(chunk), nil
			}
			return append(buf, chunk...), nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
		if len(buf)+len(chunk) > maxFrame {
			return nil, fmt.Errorf("runner frame larger than %d bytes", maxFrame)
		}
		buf = append(buf, chunk...)
	}
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
		rc.mu.Lock()
		rc.mu.Unlock()
		rc.room.Broadcast()
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
