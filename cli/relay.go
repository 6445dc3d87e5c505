package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/client"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/wire"
)

// resendable says whether a relay sends op again after a reconnect: an
// execute carries a cell id, which the engine never runs twice, and the
// others only read. The rest (kill, limits, …) may have been done: their
// callers are told so instead.
func resendable(op wire.Op) bool {
	switch op {
	case wire.OpExecute, wire.OpKernels, wire.OpHello, wire.OpCells, wire.OpSubscribe:
		return true
	}
	return false
}

// relay is `headless --connect` when it may reconnect: it carries stdin's
// lines to the engine and the engine's lines to stdout, remembering each
// request until its answer came. When the engine goes away it dials again
// with backoff and sends again what was not answered.
type relay struct {
	prog   string
	std    stdio
	where  string
	events bool
	dial   func(ctx context.Context) (*client.Conn, error)
	// place is where the agent works, as execute fields (placeFields), for
	// its executes that do not say.
	place []byte

	wmu sync.Mutex // held while writing to the engine, so resent lines stay in order
	mu  sync.Mutex // guards the fields below
	// conn is the engine's connection; nil while reconnecting.
	conn      *client.Conn
	pending   []pendingRequest
	inputOver bool
}

// pendingRequest is a request sent and not answered yet.
type pendingRequest struct {
	id   string // the id as JSON text
	op   wire.Op
	line []byte
}

// placeFields is place as the fields of an execute (wire.Execute's), each
// followed by a comma: what track puts in an execute that says none.
func placeFields(place engine.Place) []byte {
	where, _ := json.Marshal(wire.Execute{Cwd: place.Dir, Python: place.Python, Umask: place.Umask})
	var fields map[string]json.RawMessage
	json.Unmarshal(where, &fields)
	var out []byte
	for _, k := range []string{"cwd", "python", "umask"} {
		if v, ok := fields[k]; ok {
			out = append(append(append(out, `"`+k+`":`...), v...), ',')
		}
	}
	return out
}

// track reads a request line's id and op, and gives an execute without a
// cell id one of its own, so that sending it again never runs it twice,
// and one that does not say where its client works the fields of the
// relay's place (placeFields; none: nothing). Lines without a string id
// are not tracked (the engine answers them with an error, once).
func track(line, place []byte) ([]byte, *pendingRequest) {
	var head struct {
		ID     json.RawMessage `json:"id"`
		Op     wire.Op         `json:"op"`
		Cell   json.RawMessage `json:"cell"`
		Cwd    json.RawMessage `json:"cwd"`
		Python json.RawMessage `json:"python"`
		Umask  json.RawMessage `json:"umask"`
	}
	if json.Unmarshal(line, &head) != nil || len(head.ID) == 0 || head.ID[0] != '"' {
		return line, nil
	}
	if trimmed := bytes.TrimLeft(line, " \t\r"); head.Op == wire.OpExecute && len(trimmed) > 1 && trimmed[0] == '{' {
		var add []byte
		if head.Cell == nil {
			add = append(add, `"cell":"h`+engine.NewCellID()+`",`...)
		}
		if head.Cwd == nil && head.Python == nil && head.Umask == nil {
			add = append(add, place...)
		}
		if add != nil {
			line = append(append([]byte{'{'}, add...), trimmed[1:]...)
		}
	}
	return line, &pendingRequest{id: string(head.ID), op: head.Op, line: line}
}

// answered drops the request the engine's line answers, if it is a final
// answer (not a started or output line of a running cell).
func (r *relay) answered(line []byte) {
	var head struct {
		ID json.RawMessage `json:"id"`
		Op wire.Op         `json:"op"`
	}
	if json.Unmarshal(line, &head) != nil || len(head.ID) == 0 || head.Op == wire.OpStarted || head.Op == wire.OpOutput {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if i := slices.IndexFunc(r.pending, func(p pendingRequest) bool { return p.id == string(head.ID) }); i >= 0 {
		r.pending = slices.Delete(r.pending, i, i+1)
	}
}

// readInput sends stdin's lines to the engine until stdin ends; done gets
// the read error (nil at the end of input).
func (r *relay) readInput(done chan<- error) {
	br := bufio.NewReaderSize(r.std.in, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if line[len(line)-1] != '\n' {
				line = append(line, '\n')
			}
			line, p := track(line, r.place)
			r.wmu.Lock()
			r.mu.Lock()
			if p != nil {
				r.pending = append(r.pending, *p)
			}
			conn := r.conn
			r.mu.Unlock()
			if conn != nil {
				// A write that fails is the engine going away: the answer
				// reader sees it, and the line is sent again after.
				conn.Write(line)
			}
			r.wmu.Unlock()
		}
		if err != nil {
			r.wmu.Lock()
			r.mu.Lock()
			r.inputOver = true
			if r.conn != nil {
				endWrites(r.conn)
			}
			r.mu.Unlock()
			r.wmu.Unlock()
			if errors.Is(err, io.EOF) {
				err = nil
			}
			done <- err
			return
		}
	}
}

// openConnection sends the line that opens a relayed connection: --events'
// own subscription, or a blank line (no request), which speaks at once: a
// connection silent for long is closed by the engine, and a person at a
// terminal may take their time.
func openConnection(conn *client.Conn, events bool) error {
	first := "\n"
	if events {
		first = fmt.Sprintf(`{"id":%q,"op":"subscribe"}`+"\n", eventsSubscription)
	}
	if _, err := io.WriteString(conn, first); err != nil {
		return fmt.Errorf("speak to the engine at %s: %w", conn.Where, err)
	}
	return nil
}

// endWrites tells the engine no more requests come on conn: it answers
// what runs, then closes.
func endWrites(conn *client.Conn) {
	if cw, ok := conn.Conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		conn.Close()
	}
}

// attach makes conn the engine's connection: it opens it as --connect does,
// sends again the requests still unanswered that may be, and answers the
// others with an error.
func (r *relay) attach(conn *client.Conn) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if err := openConnection(conn, r.events); err != nil {
		return err
	}
	r.mu.Lock()
	var again, lost []pendingRequest
	for _, p := range r.pending {
		if resendable(p.op) {
			again = append(again, p)
		} else {
			lost = append(lost, p)
		}
	}
	r.pending = again
	r.conn = conn
	inputOver := r.inputOver
	r.mu.Unlock()
	for _, p := range lost {
		fmt.Fprintf(r.std.out, `{"id":%s,"op":"error","error":%q}`+"\n", p.id, fmt.Sprintf(
			"the engine went away before it answered this %s, which may or may not have been done: look before asking again (kernels lists the kernels)", p.op))
	}
	for _, p := range again {
		if _, err := conn.Write(p.line); err != nil {
			break // gone again: the answer reader sees it
		}
	}
	if inputOver {
		endWrites(conn)
	}
	return nil
}

// relayed is how one connection ended.
type relayed struct {
	err     error
	goodbye string
	refused string
}

// copyAnswers copies the engine's lines on conn to stdout, whole lines
// only, until the connection ends.
func (r *relay) copyAnswers(conn io.Reader) relayed {
	br := bufio.NewReaderSize(conn, 64<<10)
	subscribed := r.events
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			// A line cut short by the end is dropped: its request is sent again.
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return relayed{err: err}
		}
		switch {
		case subscribed && bytes.HasPrefix(line, []byte(`{"id":"`+eventsSubscription+`",`)):
			subscribed = false
			continue
		case bytes.HasPrefix(line, []byte(`{"op":"goodbye"`)):
			var g struct{ Reason string }
			json.Unmarshal(line, &g)
			// Said on stderr: the relay goes on with the next engine.
			fmt.Fprintf(r.std.err, "%s: the engine at %s said goodbye: %s\n", r.prog, r.where, g.Reason)
			continue
		case bytes.HasPrefix(line, []byte(`{"id":null,"op":"error","error":"refused: `)):
			var e struct{ Error string }
			json.Unmarshal(line, &e)
			return relayed{refused: e.Error}
		}
		r.answered(line)
		if _, werr := r.std.out.Write(line); werr != nil {
			return relayed{err: fmt.Errorf("write an answer: %w", werr)}
		}
	}
}

// run relays on conn and every connection after it until the input ended
// and every request is answered (exit 0), a signal, or an engine that
// stays away for client.RedialFor.
func (r *relay) run(conn *client.Conn, sigs <-chan os.Signal) int {
	_, fail := reporters(r.std.err, r.prog)
	inDone := make(chan error, 1)
	if err := r.attach(conn); err != nil {
		conn.Close()
		return fail(err)
	}
	go r.readInput(inDone)
	var inErr error
	for {
		ended := make(chan relayed, 1)
		go func() { ended <- r.copyAnswers(conn) }()
		var how relayed
		for waiting := true; waiting; {
			select {
			case <-sigs:
				fmt.Fprintf(r.std.err, "%s: stopped by a signal; the kernels stay on the engine at %s\n", r.prog, r.where)
				return exitOK
			case inErr = <-inDone:
				inDone = nil
			case how = <-ended:
				waiting = false
			}
		}
		r.mu.Lock()
		r.conn = nil
		over, left := r.inputOver, len(r.pending)
		r.mu.Unlock()
		conn.Close()
		switch {
		case how.refused != "":
			return fail(fmt.Errorf("the engine at %s %s", r.where, how.refused))
		case over && left == 0:
			if inErr != nil {
				return fail(fmt.Errorf("read the requests: %w", inErr))
			}
			return exitOK
		}
		why := "closed the connection"
		if how.err != nil {
			why = how.err.Error()
		}
		fmt.Fprintf(r.std.err, "%s: the engine at %s went away (%s) with %s unanswered; reconnecting\n",
			r.prog, r.where, why, english.Count(left, "request"))
		var err error
		if conn, err = r.redial(sigs); err != nil {
			return fail(err)
		}
		if conn == nil {
			return exitOK // said by redial
		}
		if err := r.attach(conn); err != nil {
			conn.Close()
			return fail(err)
		}
		r.mu.Lock()
		now := len(r.pending)
		r.mu.Unlock()
		// Requests read while it was away go now too: said apart, so the
		// counts of the two lines agree.
		switch {
		case now == left:
			fmt.Fprintf(r.std.err, "%s: reconnected to the engine at %s; sent %s again\n", r.prog, r.where, english.Count(left, "request"))
		case left == 0:
			fmt.Fprintf(r.std.err, "%s: reconnected to the engine at %s; sent the %s that came meanwhile\n", r.prog, r.where, english.Count(now-left, "request"))
		default:
			fmt.Fprintf(r.std.err, "%s: reconnected to the engine at %s; sent %s again and %s that came meanwhile\n",
				r.prog, r.where, english.Count(left, "request"), strconv.Itoa(max(now-left, 0))+" more")
		}
	}
}

// redial dials the engine again, with backoff, for up to client.RedialFor; nil
// with no error: a signal came, or the input ended with nothing left to
// answer (said here).
func (r *relay) redial(sigs <-chan os.Signal) (*client.Conn, error) {
	give := time.Now().Add(client.RedialFor)
	wait := client.RedialFirst
	var last error
	for time.Now().Before(give) {
		select {
		case <-sigs:
			fmt.Fprintf(r.std.err, "%s: stopped by a signal while reconnecting\n", r.prog)
			return nil, nil
		case <-time.After(wait):
		}
		r.mu.Lock()
		done := r.inputOver && len(r.pending) == 0
		r.mu.Unlock()
		if done {
			return nil, nil // nothing more to send or to wait for
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := r.dial(ctx)
		cancel()
		if err == nil {
			return conn, nil
		}
		last = err
		wait = min(2*wait, client.RedialMost)
	}
	return nil, fmt.Errorf("the engine at %s stayed away for %v (last try: %w)", r.where, client.RedialFor, last)
}
