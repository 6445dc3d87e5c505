package headless

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/jsonobj"
	"github.com/kerneldeck/kerneldeck/settings"
	"github.com/kerneldeck/kerneldeck/wire"
)

// request is one validated request.
type request struct {
	id         string
	op         wire.Op
	exec       engine.Request
	stream     bool   // execute: output lines while the cell runs
	input      bool   // execute: the client answers input_request lines
	to         string // input_reply: the execute it answers, the line and whether input ends
	value      string
	eof        bool
	maxKernels *int
	idleExit   *time.Duration
	perOwner   *int // limits: max_kernels_per_owner
	// hibernateAfter is limits' hibernate_after.
	hibernateAfter *time.Duration
	kernel         string
	code           string // complete: the code, and the cursor in it
	cursor         int
	owner          string
	approval       string // the approval request id (approve)
	decision       engine.Decision
	since          time.Duration // subscribe: replay this far back
	output         bool          // subscribe: cell output too
	version        string        // kernels: "unchanged" if the listing is still this
	batch          time.Duration // subscribe: how long events may wait to go out together
}

// opList names the ops for an error that says which there are.
func opList() string {
	names := make([]string, 0, len(wire.Ops()))
	for _, o := range wire.Ops() {
		names = append(names, string(o))
	}
	return strings.Join(names, ", ")
}

// maxEchoedID bounds an id that is not a string but is still echoed.
const maxEchoedID = 64

// parse validates one line. On failure it returns the request's id as the
// line gave it, when it has one worth echoing (a string, or a short number
// or boolean), so the error can still be matched to the request.
func (s *server) parse(line []byte) (*request, json.RawMessage, error) {
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
				return nil, quote(id), msg
			}
		}
		return nil, nil, msg
	case err != nil:
		return nil, nil, errors.New(`request must be a JSON object, e.g. {"id":"1","op":"kernels"}`)
	}
	f := fields(m)
	id, ok, err := f.str("id")
	if err != nil || !ok {
		var echo json.RawMessage
		if raw, present := f.raw("id"); present && (jsonobj.Kind(raw) == "number" || jsonobj.Kind(raw) == "boolean") && len(raw) <= maxEchoedID {
			echo = raw
		}
		return nil, echo, fmt.Errorf(`every request needs "id" as a JSON string, which its response echoes (%s); e.g. "id":"4", not "id":4`, describe(m["id"]))
	}
	r := &request{id: id}
	fail := func(err error) (*request, json.RawMessage, error) { return nil, quote(id), err }
	name, ok, err := f.str("op")
	if err != nil {
		return fail(err)
	}
	if !ok {
		return fail(fmt.Errorf(`request has no "op"; use one of %s`, opList()))
	}
	r.op = wire.Op(name)
	msg := wire.NewRequest(r.op)
	if msg == nil {
		return fail(fmt.Errorf("unknown op %q; use one of %s", name, opList()))
	}
	sh := shapes()[r.op]
	for k := range m {
		if !slices.Contains(sh.known, k) {
			return fail(fmt.Errorf("unknown field %.80q in %s; its fields are: %s", k, r.op, strings.Join(sh.known, ", ")))
		}
	}
	if err := f.check(sh.checks); err != nil {
		return fail(err)
	}
	if err := json.Unmarshal(line, msg); err != nil {
		// check lets through only what decodes; this is a bug, said plainly.
		return fail(fmt.Errorf("request does not decode: %w", err))
	}
	switch msg := msg.(type) {
	case *wire.Execute:
		err = s.parseExecute(f, msg, r)
	case *wire.KernelsQuery:
		r.version = msg.UnlessVersion
	case *wire.Limits:
		err = parseLimits(msg, r)
	case *wire.KernelOp:
		if r.kernel = msg.Kernel; r.kernel == "" {
			err = fmt.Errorf(`%s needs "kernel": the kernel id (see the "kernels" op)`, r.op)
		}
	case *wire.DropParked:
		r.owner = msg.Owner
		r.exec = engine.Request{Owner: msg.Owner, Task: msg.Task, Backend: msg.Backend, Child: msg.Child, Tools: msg.Tools}
		if r.owner == "" {
			err = errors.New(`drop_parked needs "owner", and "task", "backend", "child" and "tools" as the execute gave them`)
		}
	case *wire.Complete:
		r.kernel, r.code, r.cursor = msg.Kernel, msg.Code, msg.Cursor
		if r.kernel == "" {
			err = errors.New(`complete needs "kernel": the kernel id (see the "kernels" op)`)
		}
	case *wire.InputReply:
		r.to, r.value, r.eof = msg.To, msg.Value, msg.EOF
		switch {
		case r.to == "":
			err = errors.New(`input_reply needs "to": the id of the execute whose input_request it answers`)
		case len(r.value) > engine.MaxInputAnswer:
			err = fmt.Errorf(`"value" is %d bytes; input() takes at most %d`, len(r.value), engine.MaxInputAnswer)
		}
	case *wire.ShutdownOwner:
		r.owner = msg.Owner
		if _, present := f.raw("owner"); !present {
			err = errors.New(`shutdown_owner needs "owner": the owner whose kernels to kill`)
		}
	case *wire.Approve:
		err = parseApprove(f, msg, r)
	case *wire.Subscribe:
		err = parseSubscribe(msg, r)
	}
	if err != nil {
		return fail(err)
	}
	return r, quote(id), nil
}

func quote(s string) json.RawMessage {
	raw, _ := json.Marshal(s)
	return raw
}

func (s *server) parseExecute(f fields, msg *wire.Execute, r *request) error {
	if _, ok := f.raw("code"); !ok {
		return errors.New(`execute needs "code": the Python source to run, as a string ("" is allowed)`)
	}
	x := engine.Request{Code: msg.Code, Owner: msg.Owner, Task: msg.Task, Backend: msg.Backend, Child: msg.Child,
		Tools: msg.Tools, Reset: msg.Reset, Cell: msg.Cell, Place: engine.Place{Dir: msg.Cwd, Python: msg.Python, Umask: msg.Umask}}
	if err := x.Place.Check(); err != nil {
		return fmt.Errorf(`"cwd", "python" and "umask" say where you work (an absolute dir, an absolute interpreter path, a umask from 0 to 511): %w`, err)
	}
	if _, given := f.raw("cell"); given && !engine.ValidCellID(msg.Cell) {
		return fmt.Errorf(`"cell" is your id for the cell, so that asking again never runs it twice: 1 to 64 letters, digits, _ or -, got %q`, msg.Cell)
	}
	r.stream, r.input = msg.Stream, msg.Input
	if secs := msg.Timeout; secs != 0 {
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

// parseLimits checks each limit by its setting's record, as the flags and
// the config file are checked.
func parseLimits(msg *wire.Limits, r *request) error {
	live := func(key string) settings.Setting {
		set, _ := settings.Lookup(key)
		return set
	}
	if n := msg.MaxKernels; n != nil {
		v, err := live("max_kernels").CheckCount(`"max_kernels":`, int64(*n))
		if err != nil {
			return err
		}
		r.maxKernels = &v
	}
	seconds := func(key string, secs float64) (*time.Duration, error) {
		given := strconv.FormatFloat(secs, 'g', -1, 64)
		if secs > maxSeconds || secs < 0 {
			return nil, fmt.Errorf(`"%s": %s is invalid: it is in seconds, below %d years`, key, given, maxYears)
		}
		d, err := live(key).CheckDuration(`"`+key+`":`, time.Duration(secs*float64(time.Second)), given+" (seconds)")
		return &d, err
	}
	var err error
	if secs := msg.IdleExit; secs != nil {
		if r.idleExit, err = seconds("idle_exit", *secs); err != nil {
			return err
		}
	}
	if secs := msg.HibernateAfter; secs != nil {
		if r.hibernateAfter, err = seconds("hibernate_after", *secs); err != nil {
			return err
		}
	}
	if n := msg.MaxKernelsPerOwner; n != nil {
		v, err := live("max_kernels_per_owner").CheckCount(`"max_kernels_per_owner":`, int64(*n))
		if err != nil {
			return err
		}
		r.perOwner = &v
	}
	if r.maxKernels == nil && r.idleExit == nil && r.perOwner == nil && r.hibernateAfter == nil {
		return errors.New(`limits needs "max_kernels" (whole number >= 1), "idle_exit" (seconds >= 1), "hibernate_after" (seconds >= 1, 0: never) and/or "max_kernels_per_owner" (whole number >= 0)`)
	}
	return nil
}

func parseApprove(f fields, msg *wire.Approve, r *request) error {
	if msg.Request == "" {
		return errors.New(`approve needs "request": the id from an approval_request event`)
	}
	_, given := f.raw("decision")
	switch dec := engine.Decision(msg.Decision); {
	case !given:
		return errors.New(`approve needs "decision": "once" (run this call), "always" (run every call of this tool by this owner from now on) or "deny"`)
	case dec != engine.ApproveOnce && dec != engine.ApproveAlways && dec != engine.ApproveDeny:
		return fmt.Errorf(`"decision" must be "once", "always" or "deny", got %q`, msg.Decision)
	default:
		r.approval, r.decision = msg.Request, dec
	}
	return nil
}

// maxReplay bounds subscribe's since: the event log keeps no more anyway.
const maxReplay = 366 * 24 * time.Hour

func parseSubscribe(msg *wire.Subscribe, r *request) error {
	if secs := msg.Since; secs != 0 {
		if secs < 0 || secs > maxReplay.Seconds() {
			return fmt.Errorf(`"since" is how many seconds back to replay events from (0 to %d), got %g`, int(maxReplay.Seconds()), secs)
		}
		r.since = time.Duration(secs * float64(time.Second))
	}
	r.output = msg.Output
	if ms := msg.BatchMS; ms != 0 {
		if ms < 0 || ms > 1000 {
			return fmt.Errorf(`"batch_ms" is how many milliseconds events may wait to be sent together (0 to 1000), got %g`, ms)
		}
		r.batch = time.Duration(ms * float64(time.Millisecond))
	}
	return nil
}

// shape is what parse needs of one op's request type, worked out once.
type shape struct {
	known  []string     // every field, for the unknown-field error
	checks []fieldCheck // the fields past the head, by their Go kind
}

// fieldCheck is one field to check: its JSON name and the kind of its Go
// type (a pointer's element).
type fieldCheck struct {
	name string
	kind reflect.Kind
}

// shapes is the shape of every op, made on first use and only read after.
var shapes = sync.OnceValue(func() map[wire.Op]shape {
	out := map[wire.Op]shape{}
	for _, op := range wire.Ops() {
		msg := wire.NewRequest(op)
		sh := shape{known: wire.Fields(msg)}
		t := reflect.TypeOf(msg).Elem()
		for sf := range t.Fields() {
			if sf.Anonymous {
				continue // the head: id and op are read already
			}
			name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
			ft := sf.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch ft.Kind() {
			case reflect.String, reflect.Bool, reflect.Slice, reflect.Float64, reflect.Int:
			default:
				panic(fmt.Sprintf("headless: field %q of %s has a type the protocol does not read", name, t.Name()))
			}
			sh.checks = append(sh.checks, fieldCheck{name: name, kind: ft.Kind()})
		}
		out[op] = sh
	}
	return out
})

// check validates the JSON type of each field of f that the request type
// has, by its Go type, so that decoding it cannot fail; a whole-number
// field takes only whole numbers of 32 bits.
func (f fields) check(checks []fieldCheck) error {
	for _, c := range checks {
		var err error
		switch c.kind {
		case reflect.String:
			_, _, err = f.str(c.name)
		case reflect.Bool:
			_, err = f.boolean(c.name)
		case reflect.Slice:
			_, err = f.strs(c.name)
		case reflect.Float64:
			_, _, err = f.number(c.name)
		case reflect.Int:
			var n float64
			var ok bool
			if n, ok, err = f.number(c.name); err == nil && ok && (n != math.Trunc(n) || math.Abs(n) > math.MaxInt32) {
				err = fmt.Errorf("%q must be a whole number, got %g", c.name, n)
			}
		}
		if err != nil {
			return err
		}
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
	if jsonobj.Kind(raw) != "number" || json.Unmarshal(raw, &n) != nil {
		return 0, false, fmt.Errorf("%q must be a number, got %s", name, describe(raw))
	}
	return n, true, nil
}

// describe names a value's JSON type for an error, with short values shown.
func describe(raw json.RawMessage) string {
	t := jsonobj.Kind(raw)
	if t == "nothing" {
		return "it is missing"
	}
	if len(raw) <= 40 {
		return fmt.Sprintf("%s %s", t, raw)
	}
	return "a long " + t
}
