package engine

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
)

// maxFrame bounds one line from a runner, so a broken or hostile runner
// cannot make the engine buffer without limit.
const maxFrame = 64 << 20

// How a runner says a cell ended (runnerFrame.Status of a result).
const (
	runnerOK          = "ok"
	runnerExit        = "exit"
	runnerInterrupted = "interrupted"
	runnerError       = "error"
)

// runnerFrame is one JSON line a runner sends: a result, streamed output, a
// pong or an error.
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
	Stream         string  `json:"stream"`
	Text           string  `json:"text"`
	Error          string  `json:"error"`
	PID            int     `json:"pid"`
	// Name and Data carry a forwarded tool request file (op "rpc"); Error
	// then says why it could not be read.
	Name string `json:"name"`
	Data string `json:"data"`
}

// runnerConn is the fast path to one runner: JSON lines over a Unix socket.
// A reader goroutine turns lines into frames; frames is closed when the
// connection ends, which is how the engine notices a dead runner at once.
type runnerConn struct {
	c      net.Conn
	frames chan runnerFrame
	done   chan struct{}
	once   sync.Once
	wmu    sync.Mutex
}

func startConn(c net.Conn, wg *sync.WaitGroup) *runnerConn {
	rc := &runnerConn{c: c, frames: make(chan runnerFrame, 64), done: make(chan struct{})}
	wg.Add(1)
	go func() {
		defer wg.Done()
		rc.read()
	}()
	return rc
}

func (rc *runnerConn) read() {
	defer close(rc.frames)
	br := bufio.NewReaderSize(rc.c, 64<<10)
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
		select {
		case rc.frames <- f:
		case <-rc.done:
			return
		}
	}
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
