// Package headless serves an engine over JSON lines: one request object per
// input line, one response object per output line. It is the external
// contract of `kerneldeck headless`, which scripts outside this repository
// depend on, so field names and shapes here must not drift.
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
	"math"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/jsonobj"
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
	// because a tool call that asks the operator waits for an approve op.
	Events bool
	// EventBuffer overrides DefaultEventBuffer.
	EventBuffer int
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
// also close in. A failing out stops Serve the same way, with the write error.
func Serve(ctx context.Context, eng *engine.Engine, in io.Reader, out io.Writer, opts Options) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &lineWriter{w: out, fail: cancel}
	s := &server{eng: eng, w: w}

	var pump sync.WaitGroup
	sub := eng.Subscribe(cmp.Or(opts.EventBuffer, DefaultEventBuffer))
	pump.Go(func() { pumpEvents(sub.C, w, opts.Events) })

	lines := make(chan inputLine)
	stop := make(chan struct{})
	go readLines(in, lines, stop)

	var inflight sync.WaitGroup
	var err error
loop:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				break loop
			}
			if l.err != nil {
				err = fmt.Errorf("read requests: %w", l.err)
				break loop
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
				w.writeError(id, perr.Error())
				continue
			}
			if req.op != "execute" {
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
		case <-ctx.Done():
			err = context.Cause(ctx)
			break loop
		}
	}
	close(stop)
	inflight.Wait()
	sub.Close()
	pump.Wait()
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

func (lw *lineWriter) write(v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// Code and output often contain <, > and &; escaping them helps no reader.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only non-finite floats fail here, and we never send one.
		return
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

type errorLine struct {
	ID    *string `json:"id"`
	Op    string  `json:"op"`
	Error string  `json:"error"`
}

func (lw *lineWriter) writeError(id *string, msg string) {
	lw.write(errorLine{ID: id, Op: "error", Error: msg})
}

type eventLine struct {
	Op     string    `json:"op"`
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
	// Count is how many events were dropped (type "missed" only).
	Count int `json:"count,omitempty"`
}

// pumpEvents copies events to the output until the subscription closes;
// unless all is set, only approval events. It may block on a slow reader;
// the engine's fan-out drops instead of waiting.
func pumpEvents(events <-chan engine.Event, w *lineWriter, all bool) {
	for ev := range events {
		if !all && ev.Type != engine.EventApprovalRequest && ev.Type != engine.EventApprovalDecided {
			continue
		}
		line := eventLine{Op: "event", Type: string(ev.Type), Time: ev.Time, Kernel: ev.Kernel, Owner: ev.Owner, Detail: ev.Detail,
			Request: ev.Request, Tool: ev.Tool, Args: ev.Args}
		if ev.Type == engine.EventMissed {
			line.Count = ev.Missed
			line.Detail = fmt.Sprintf("%d events were dropped because this reader fell behind", ev.Missed)
		}
		w.write(line)
	}
}

type server struct {
	eng *engine.Engine
	w   *lineWriter
}

// request is one validated request.
type request struct {
	id         string
	op         string
	exec       engine.Request
	maxKernels *int
	idleExit   *time.Duration
	kernel     string
	owner      string
	approval   string // the approval request id (approve)
	decision   engine.Decision
}

const opList = "execute, kernels, limits, interrupt, kill, shutdown_owner, shutdown_all, approve"

// parse validates one line. On failure it returns the request's id when it
// has a string one, so the error can still be matched to the request.
func (s *server) parse(line []byte) (*request, *string, error) {
	m, err := jsonobj.Decode(line)
	var syn *json.SyntaxError
	var dup *jsonobj.DuplicateKeyError
	switch {
	case errors.As(err, &syn):
		return nil, nil, fmt.Errorf("request is not valid JSON (%v at byte %d); send one JSON object per line, e.g. {\"id\":\"1\",\"op\":\"kernels\"}", syn, syn.Offset)
	case errors.As(err, &dup):
		// Which of two values was meant is unknown: refused, and the id
		// echoed only when it is not the field given twice.
		msg := fmt.Errorf("request gives %.80q twice; send each field once", dup.Key)
		var obj map[string]json.RawMessage
		if dup.Key != "id" && json.Unmarshal(line, &obj) == nil {
			if id, ok, err := fields(obj).str("id"); ok && err == nil {
				return nil, &id, msg
			}
		}
		return nil, nil, msg
	case err != nil:
		return nil, nil, errors.New(`request must be a JSON object, e.g. {"id":"1","op":"kernels"}`)
	}
	f := fields(m)
	id, ok, err := f.str("id")
	if err != nil || !ok {
		return nil, nil, fmt.Errorf(`every request needs "id" as a JSON string, which its response echoes (%s)`, describe(m["id"]))
	}
	r := &request{id: id}
	fail := func(err error) (*request, *string, error) { return nil, &id, err }
	op, ok, err := f.str("op")
	if err != nil {
		return fail(err)
	}
	if !ok {
		return fail(fmt.Errorf(`request has no "op"; use one of %s`, opList))
	}
	r.op = op
	switch op {
	case "execute":
		if err := s.parseExecute(f, r); err != nil {
			return fail(err)
		}
	case "kernels", "shutdown_all":
	case "limits":
		if err := parseLimits(f, r); err != nil {
			return fail(err)
		}
	case "interrupt", "kill":
		k, ok, err := f.str("kernel")
		if err != nil {
			return fail(err)
		}
		if !ok || k == "" {
			return fail(fmt.Errorf(`%s needs "kernel": the kernel id (see the "kernels" op)`, op))
		}
		r.kernel = k
	case "shutdown_owner":
		o, ok, err := f.str("owner")
		if err != nil {
			return fail(err)
		}
		if !ok {
			return fail(errors.New(`shutdown_owner needs "owner": the owner whose kernels to kill`))
		}
		r.owner = o
	case "approve":
		if err := parseApprove(f, r); err != nil {
			return fail(err)
		}
	default:
		return fail(fmt.Errorf("unknown op %q; use one of %s", op, opList))
	}
	return r, &id, nil
}

func (s *server) parseExecute(f fields, r *request) error {
	code, ok, err := f.str("code")
	if err != nil {
		return err
	}
	if !ok {
		return errors.New(`execute needs "code": the Python source to run, as a string ("" is allowed)`)
	}
	x := engine.Request{Code: code}
	for _, p := range []struct {
		name string
		dst  *string
	}{{"owner", &x.Owner}, {"task", &x.Task}, {"backend", &x.Backend}, {"child", &x.Child}} {
		if *p.dst, _, err = f.str(p.name); err != nil {
			return err
		}
	}
	if x.Tools, err = f.strs("tools"); err != nil {
		return err
	}
	if x.Reset, err = f.boolean("reset"); err != nil {
		return err
	}
	secs, ok, err := f.number("timeout")
	if err != nil {
		return err
	}
	if ok {
		if secs < 0 || secs > maxSeconds {
			return fmt.Errorf(`"timeout" is in seconds and must be >= 0 and below %d years (0 or absent means the configured cell timeout), got %g`, maxYears, secs)
		}
		x.Timeout = time.Duration(math.Ceil(secs * float64(time.Second)))
	}
	if _, err := engine.NewKey(x.Owner, x.Backend, x.Task, x.Child, x.Tools); err != nil {
		var ke *engine.KeyError
		if errors.As(err, &ke) {
			return fmt.Errorf("%q: %w", ke.Field, err)
		}
		return err
	}
	r.exec = x
	return nil
}

// maxSeconds keeps second counts convertible to a time.Duration.
const (
	maxSeconds = float64(math.MaxInt64/int64(time.Second)) - 1
	maxYears   = 290
)

func parseLimits(f fields, r *request) error {
	if n, ok, err := f.number("max_kernels"); err != nil {
		return err
	} else if ok {
		if n != math.Trunc(n) || n < 1 || n > math.MaxInt32 {
			return fmt.Errorf(`"max_kernels" must be a whole number >= 1, got %g`, n)
		}
		v := int(n)
		r.maxKernels = &v
	}
	if secs, ok, err := f.number("idle_exit"); err != nil {
		return err
	} else if ok {
		if secs < 1 || secs > maxSeconds {
			return fmt.Errorf(`"idle_exit" is in seconds and must be at least 1 and below %d years, got %g`, maxYears, secs)
		}
		d := time.Duration(secs * float64(time.Second))
		r.idleExit = &d
	}
	if r.maxKernels == nil && r.idleExit == nil {
		return errors.New(`limits needs "max_kernels" (whole number >= 1) and/or "idle_exit" (seconds >= 1)`)
	}
	return nil
}

func parseApprove(f fields, r *request) error {
	id, ok, err := f.str("request")
	if err != nil {
		return err
	}
	if !ok || id == "" {
		return errors.New(`approve needs "request": the id from an approval_request event`)
	}
	d, ok, err := f.str("decision")
	if err != nil {
		return err
	}
	switch dec := engine.Decision(d); {
	case !ok:
		return errors.New(`approve needs "decision": "once" (run this call), "always" (run every call of this tool by this owner from now on) or "deny"`)
	case dec != engine.ApproveOnce && dec != engine.ApproveAlways && dec != engine.ApproveDeny:
		return fmt.Errorf(`"decision" must be "once", "always" or "deny", got %q`, d)
	default:
		r.approval, r.decision = id, dec
	}
	return nil
}

// fields reads typed values out of a request object. JSON null counts as
// absent, since many encoders write null for an unset optional field.
type fields map[string]json.RawMessage

func (f fields) raw(name string) (json.RawMessage, bool) {
	raw, ok := f[name]
	if !ok || string(raw) == "null" {
		return nil, false
	}
	return raw, true
}

func (f fields) str(name string) (string, bool, error) {
	raw, ok := f.raw(name)
	if !ok {
		return "", false, nil
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false, fmt.Errorf("%q must be a string, got %s", name, describe(raw))
	}
	return s, true, nil
}

func (f fields) strs(name string) ([]string, error) {
	raw, ok := f.raw(name)
	if !ok {
		return nil, nil
	}
	var items []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, fmt.Errorf("%q must be an array of strings, e.g. [\"read_file\"], got %s", name, describe(raw))
	}
	out := make([]string, len(items))
	for i, it := range items {
		if len(it) == 0 || it[0] != '"' || json.Unmarshal(it, &out[i]) != nil {
			return nil, fmt.Errorf("%q must be an array of strings, but item %d is %s", name, i, describe(it))
		}
	}
	return out, nil
}

func (f fields) boolean(name string) (bool, error) {
	raw, ok := f.raw(name)
	if !ok {
		return false, nil
	}
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("%q must be true or false, got %s", name, describe(raw))
}

func (f fields) number(name string) (float64, bool, error) {
	raw, ok := f.raw(name)
	if !ok {
		return 0, false, nil
	}
	var n float64
	if jsonType(raw) != "number" || json.Unmarshal(raw, &n) != nil {
		return 0, false, fmt.Errorf("%q must be a number, got %s", name, describe(raw))
	}
	return n, true, nil
}

func jsonType(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// describe names a value's JSON type for an error, with short values shown.
func describe(raw json.RawMessage) string {
	t := jsonType(raw)
	if t == "nothing" {
		return "it is missing"
	}
	if len(raw) <= 40 {
		return fmt.Sprintf("%s %s", t, raw)
	}
	return "a long " + t
}

func (s *server) handle(ctx context.Context, r *request) {
	switch r.op {
	case "execute":
		s.execute(ctx, r)
	case "kernels":
		s.kernels(r)
	case "limits":
		if err := s.eng.SetLimits(r.maxKernels, r.idleExit); err != nil {
			s.w.writeError(&r.id, err.Error())
			return
		}
		s.w.write(okLine{ID: r.id, Op: "ok"})
	case "interrupt":
		s.answer(r, s.eng.Interrupt(ctx, r.kernel))
	case "kill":
		s.answer(r, s.eng.Kill(ctx, r.kernel))
	case "shutdown_owner":
		n := s.eng.ShutdownOwner(ctx, r.owner)
		s.w.write(killedLine{ID: r.id, Op: "ok", Killed: n})
	case "shutdown_all":
		s.w.write(killedLine{ID: r.id, Op: "ok", Killed: s.eng.ShutdownAll(ctx)})
	case "approve":
		s.answer(r, s.eng.Approve(r.approval, r.decision))
	}
}

type okLine struct {
	ID string `json:"id"`
	Op string `json:"op"`
}

type killedLine struct {
	ID     string `json:"id"`
	Op     string `json:"op"`
	Killed int    `json:"killed"`
}

func (s *server) answer(r *request, err error) {
	if err != nil {
		s.w.writeError(&r.id, err.Error())
		return
	}
	s.w.write(okLine{ID: r.id, Op: "ok"})
}

type resultLine struct {
	ID              string            `json:"id"`
	Op              string            `json:"op"`
	Status          engine.CellStatus `json:"status"`
	Stdout          string            `json:"stdout"`
	Stderr          string            `json:"stderr"`
	Traceback       string            `json:"traceback"`
	StdoutClipped   bool              `json:"stdout_clipped"`
	StderrClipped   bool              `json:"stderr_clipped"`
	SpillPath       string            `json:"spill_path"`
	StderrSpillPath string            `json:"stderr_spill_path"`
	ToolCallsMade   int               `json:"tool_calls_made"`
	DurationMS      float64           `json:"duration_ms"`
	Fallback        string            `json:"fallback"`
	Kernel          *kernelLine       `json:"kernel"`
}

type kernelLine struct {
	ID             string `json:"id"`
	PID            int    `json:"pid"`
	Dir            string `json:"dir"`
	Backend        string `json:"backend"`
	Reused         bool   `json:"reused"`
	ExecutionCount int    `json:"execution_count"`
	StateLost      bool   `json:"state_lost"`
	StateReset     bool   `json:"state_reset"`
	Note           string `json:"note"`
}

func (s *server) execute(ctx context.Context, r *request) {
	s.w.write(s.run(ctx, r))
}

func (s *server) run(ctx context.Context, r *request) any {
	res, err := s.eng.Execute(ctx, r.exec)
	if err != nil {
		return errorLine{ID: &r.id, Op: "error", Error: err.Error()}
	}
	line := resultLine{
		ID: r.id, Op: "result", Status: res.Status, Stdout: res.Stdout, Stderr: res.Stderr, Traceback: res.Traceback,
		StdoutClipped: res.StdoutClipped, StderrClipped: res.StderrClipped, SpillPath: res.SpillPath,
		StderrSpillPath: res.StderrSpillPath, ToolCallsMade: res.ToolCallsMade, DurationMS: millis(res.Duration),
		Fallback: res.Fallback,
	}
	if k := res.Kernel; k != nil {
		line.Kernel = &kernelLine{ID: k.ID, PID: k.PID, Dir: k.Dir, Backend: k.Backend, Reused: k.Reused,
			ExecutionCount: k.ExecutionCount, StateLost: k.StateLost, StateReset: k.StateReset, Note: k.Note}
	}
	return line
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type kernelsLine struct {
	ID       string       `json:"id"`
	Op       string       `json:"op"`
	Count    int          `json:"count"`
	Cap      int          `json:"cap"`
	IdleExit float64      `json:"idle_exit"`
	Kernels  []kernelInfo `json:"kernels"`
}

type kernelInfo struct {
	ID             string   `json:"id"`
	Owner          string   `json:"owner"`
	Task           string   `json:"task"`
	Backend        string   `json:"backend"`
	Child          string   `json:"child"`
	Tools          []string `json:"tools"`
	PID            int      `json:"pid"`
	Dir            string   `json:"dir"`
	Attached       bool     `json:"attached"`
	Queued         int      `json:"queued"`
	IdleS          float64  `json:"idle_s"`
	ExecutionCount int      `json:"execution_count"`
}

func (s *server) kernels(r *request) {
	maxKernels, idleExit := s.eng.Limits()
	infos := s.eng.Kernels()
	line := kernelsLine{ID: r.id, Op: "kernels", Count: len(infos), Cap: maxKernels, IdleExit: idleExit.Seconds(),
		Kernels: make([]kernelInfo, 0, len(infos))}
	for _, k := range infos {
		tools := k.Tools
		if tools == nil {
			tools = []string{} // the contract promises an array, never null
		}
		line.Kernels = append(line.Kernels, kernelInfo{
			ID: k.ID, Owner: k.Owner, Task: k.Task, Backend: k.Backend, Child: k.Child,
			Tools: tools, PID: k.PID, Dir: k.Dir, Attached: k.Attached, Queued: k.Queued,
			IdleS: math.Round(k.Idle.Seconds()*1000) / 1000, ExecutionCount: k.ExecutionCount,
		})
	}
	s.w.write(line)
}
