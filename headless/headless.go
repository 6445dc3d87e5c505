// Package headless serves an engine over JSON lines: one request object per
// input line, one response object per output line. It is the external
// contract of `kerneldeck headless` and of every connection to `kerneldeck
// serve`, which scripts outside this repository depend on, so field names
// and shapes here must not drift: fields are added, never renamed.
package headless

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/wire"
)

// MaxLineBytes is the longest request line accepted; longer lines are
// answered with an error and skipped, so one huge line cannot exhaust memory.
const MaxLineBytes = 16 << 20

// DefaultEventBuffer is how many events may wait for the output before the
// engine starts dropping them for this reader.
const DefaultEventBuffer = 1024

// Options tunes Serve.
type Options struct {
	// Events interleaves every lifecycle event with the responses. Without
	// it only approval_request and approval_decided events are written,
	// because a tool call that asks the operator waits for an approve op,
	// until a subscribe op asks for more.
	Events bool
	// EventBuffer overrides DefaultEventBuffer.
	EventBuffer int
	// Peer is who is on the other end; nil is the engine's own user on its
	// stdin, who may do everything.
	Peer *Peer
	// Version is the kerneldeck version hello reports.
	Version string
	// Drain, once closed, stops reading requests as the end of the input
	// would (running ones finish), and Serve says goodbye first: a line
	// {"op":"goodbye","reason":...} with Goodbye's reason.
	Drain   <-chan struct{}
	Goodbye func() string
}

// Serve reads requests from in and writes responses to out until in ends,
// then waits for the requests still running and returns nil. Requests run
// concurrently, so responses come in completion order; each echoes its id.
// Cells for the same kernel still run in the order their lines arrived.
// Serve never closes the engine: the caller decides whether kernels survive.
//
// When ctx ends, Serve stops reading, waits for running requests (which see
// the cancelled ctx) and returns the cancellation cause. A goroutine blocked
// in in.Read stays until that Read returns, so callers that cancel should
// also close in. A failing out (the client went away) stops reading too,
// but running cells finish, exactly once, and stay in the engine's cell
// records: a client that disconnects never kills or interrupts a kernel.
func Serve(ctx context.Context, eng *engine.Engine, in io.Reader, out io.Writer, opts Options) error {
	loop, stopLoop := context.WithCancelCause(ctx)
	defer stopLoop(nil)
	w := &lineWriter{w: out, fail: stopLoop}
	s := &server{eng: eng, w: w, peer: opts.Peer, version: opts.Version}
	if p := opts.Peer; p.restricted() {
		s.refusals = eng.NewRefusals(fmt.Sprintf("user %s (uid %d)", p.Login, p.UID), p.Owner)
		defer s.refusals.Close()
	}
	p := newPump(eng, w, opts.Peer, opts.Events, cmp.Or(opts.EventBuffer, DefaultEventBuffer))
	s.pump = p
	var pumping sync.WaitGroup
	pumping.Go(p.run)

	lines := make(chan inputLine)
	stop := make(chan struct{})
	go readLines(in, lines, stop)

	var inflight sync.WaitGroup
	var err error
read:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				break read
			}
			if l.err != nil {
				err = fmt.Errorf("read requests: %w", l.err)
				break read
			}
			if l.tooLong > 0 {
				w.writeError(nil, fmt.Sprintf("request line is longer than %d MiB (%d bytes before the newline) and was skipped; "+
					"keep each request on one line under that size, e.g. put large code in a file on the host and exec() it", MaxLineBytes>>20, l.tooLong))
				continue
			}
			if len(bytes.TrimSpace(l.data)) == 0 {
				continue // a blank line is no request; skip it as JSON-lines readers do
			}
			req, id, perr := s.parse(l.data)
			if perr != nil {
				w.writeErrorRaw(id, perr.Error())
				continue
			}
			if req.op != wire.OpExecute {
				// Never behind a cell: an approve answers the very tool call
				// a running cell waits on.
				inflight.Go(func() { s.handle(ctx, req) })
				continue
			}
			// The next line is read only once this cell has its place in its
			// kernel's line (or has failed), so cells for one kernel run in
			// the order their lines arrived.
			queued := make(chan struct{})
			var once sync.Once
			req.exec.OnQueued = func() { once.Do(func() { close(queued) }) }
			inflight.Go(func() {
				defer req.exec.OnQueued()
				s.handle(ctx, req)
			})
			<-queued
		case <-loop.Done():
			err = context.Cause(loop)
			break read
		case <-opts.Drain:
			reason := "the engine is shutting down"
			if opts.Goodbye != nil {
				reason = cmp.Or(opts.Goodbye(), reason)
			}
			w.write(wire.Goodbye{Op: wire.OpGoodbye, Reason: reason})
			break read
		}
	}
	close(stop)
	inflight.Wait()
	p.stop()
	pumping.Wait()
	if err == nil {
		err = w.failure()
	}
	return err
}

// inputLine is one line read from the input, or the reason reading stopped.
type inputLine struct {
	data    []byte
	tooLong int // length of a skipped over-long line
	err     error
}

// readLines feeds lines to the serve loop until EOF, a read error, or stop.
func readLines(in io.Reader, lines chan<- inputLine, stop <-chan struct{}) {
	defer close(lines)
	br := bufio.NewReaderSize(in, 64<<10)
	for {
		l, eof := readLine(br)
		if l.data == nil && l.tooLong == 0 && l.err == nil && eof {
			return
		}
		select {
		case lines <- l:
		case <-stop:
			return
		}
		if eof || l.err != nil {
			return
		}
	}
}

// readLine reads up to the next newline. A line over MaxLineBytes is read to
// its end and dropped, so the stream stays in step with line boundaries. At
// EOF with nothing read, it returns an empty inputLine and eof set.
func readLine(br *bufio.Reader) (l inputLine, eof bool) {
	var buf []byte
	n := 0 // bytes in this line, newline excluded
	for {
		chunk, err := br.ReadSlice('\n')
		eof = errors.Is(err, io.EOF)
		if err != nil && !eof && !errors.Is(err, bufio.ErrBufferFull) {
			return inputLine{err: err}, true
		}
		if err == nil {
			chunk = chunk[:len(chunk)-1]
		}
		n += len(chunk)
		if n > MaxLineBytes {
			buf = nil
		} else {
			buf = append(buf, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if n > MaxLineBytes {
			return inputLine{tooLong: n}, eof
		}
		return inputLine{data: buf}, eof
	}
}

// lineWriter serializes output so that every line is one whole JSON object,
// whichever goroutine writes it.
type lineWriter struct {
	mu   sync.Mutex
	w    io.Writer
	err  error
	fail context.CancelCauseFunc
}

// write writes each value as a line, all of them in one write.
func (lw *lineWriter) write(vs ...any) {
	if len(vs) == 0 {
		return
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// Code and output often contain <, > and &; escaping them helps no reader.
	enc.SetEscapeHTML(false)
	for _, v := range vs {
		// Only non-finite floats fail here, and we never send one.
		enc.Encode(v)
	}
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err != nil {
		return
	}
	if _, err := lw.w.Write(buf.Bytes()); err != nil {
		lw.err = fmt.Errorf("write response: %w", err)
		lw.fail(lw.err)
	}
}

func (lw *lineWriter) failure() error {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.err
}

// writeError answers with an error; id nil is written as null.
func (lw *lineWriter) writeError(id *string, msg string) {
	var raw json.RawMessage
	if id != nil {
		raw, _ = json.Marshal(*id)
	}
	lw.writeErrorRaw(raw, msg)
}

// writeErrorRaw answers with an error that echoes id as the request gave
// it (a number, say), or null.
func (lw *lineWriter) writeErrorRaw(id json.RawMessage, msg string) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	lw.write(wire.Error{ID: id, Op: wire.OpError, Error: msg})
}
