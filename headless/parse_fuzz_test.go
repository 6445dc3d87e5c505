package headless

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
	"github.com/kerneldeck/kerneldeck/internal/jsonobj"
	"github.com/kerneldeck/kerneldeck/wire"
)

// Request lines come from scripts and agents: hostile input. These targets
// check what server.parse and Serve promise for any line, against an
// independent reading of the line with encoding/json.

// parseSeeds are valid requests of every op and the edge cases around them.
var parseSeeds = []string{
	`{"id":"1","op":"execute","code":"x = 41\nx + 1"}`,
	`{"id":"a","op":"execute","owner":"me","task":"t","backend":"local","child":"c","tools":["read_file","terminal"],"code":"","timeout":1.5,"reset":true}`,
	`{"id":"t0","op":"execute","code":"1","timeout":0}`,
	`{"id":"tn","op":"execute","code":"1","timeout":-1}`,
	`{"id":"tb","op":"execute","code":"1","timeout":1e300}`,
	`{"id":"ts","op":"execute","code":"1","timeout":"5"}`,
	`{"id":"tt","op":"execute","code":"1","timeout":true}`,
	`{"id":"tz","op":"execute","code":"1","timeout":-0}`,
	`{"id":"bad-tool","op":"execute","code":"1","tools":["rm -rf"]}`,
	`{"id":"tool-num","op":"execute","code":"1","tools":[1]}`,
	`{"id":"nulls","op":"execute","code":"1","owner":null,"tools":null,"timeout":null,"reset":null}`,
	`{"id":"nocode","op":"execute"}`,
	`{"id":"2","op":"kernels"}`,
	`{"id":"3","op":"limits","max_kernels":2,"idle_exit":600}`,
	`{"id":"3f","op":"limits","max_kernels":2.5}`,
	`{"id":"3z","op":"limits","idle_exit":0.5}`,
	`{"id":"3e","op":"limits"}`,
	`{"id":"4","op":"interrupt","kernel":"k1"}`,
	`{"id":"5","op":"kill","kernel":""}`,
	`{"id":"6","op":"shutdown_owner","owner":"me"}`,
	`{"id":"6e","op":"shutdown_owner","owner":""}`,
	`{"id":"7","op":"shutdown_all"}`,
	`{"id":"8","op":"approve","request":"r1","decision":"once"}`,
	`{"id":"8d","op":"approve","request":"r1","decision":"maybe"}`,
	`{"id":"9","op":"dance"}`,
	`{"id":"dup","id":"dup2","op":"kernels"}`,
	`{"id":"d","op":"kill","kernel":"k1","kernel":"k2"}`,
	`{"id":"d2","op":"kernels","o\u0070":"kernels"}`,
	`{"id":"\u00e9\ud800","op":"kernels"}`,
	"{\"id\":\"\xff\",\"op\":\"kernels\"}",
	`{"id":7,"op":"kernels"}`,
	`{"op":"kernels"}`,
	`{"id":null,"op":"kernels"}`,
	`{"id":"x","op":"kernels"} trailing`,
	`{"id":"x","op":`,
	`[{"id":"x","op":"kernels"}]`,
	`"just a string"`,
	`null`,
	`42`,
	``,
	`{}`,
	`{"id":"x","op":null}`,
	`{"id":"x","OP":"kernels"}`,
	`{"id":"x","op":"execute","code":"1","timout":1}`,
	`{"id":"x","op":"kernels","verbose":true}`,
	`{"id":4,"op":"kernels"}`,
	`{"id":true,"op":"kernels"}`,
	`{"id":[1],"op":"kernels"}`,
	`{"id":"h","op":"hello"}`,
	`{"id":"s","op":"subscribe","since":3600,"output":true}`,
	`{"id":"s2","op":"subscribe","since":-1}`,
	`{"id":"s3","op":"subscribe","output":"yes"}`,
	`{"id":"c","op":"cells","kernel":"k1"}`,
	`{"id":"c2","op":"cells"}`,
	`{"id":"st","op":"execute","code":"1","stream":true}`,
	`{"id":"st2","op":"execute","code":"1","stream":1}`,
	`{"id":"kv","op":"kernels","unless_version":"abc"}`,
	`{"id":"kv2","op":"kernels","unless_version":5}`,
	`{"id":"sb","op":"subscribe","batch_ms":50}`,
	`{"id":"sb2","op":"subscribe","batch_ms":5000}`,
}

// FuzzParseRequest fuzzes one request line through server.parse: it never
// panics; a line that is not valid JSON is rejected without an id; a
// rejection has a message and echoes the id whenever the line is an object
// whose "id" is a string; an accepted request has a known op and exactly
// the fields the line gave, each of the documented type and range.
func FuzzParseRequest(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add([]byte(s))
	}
	s := &server{}
	f.Fuzz(func(t *testing.T, line []byte) {
		req, id, err := s.parse(line)
		var obj map[string]json.RawMessage
		isObject := json.Unmarshal(line, &obj) == nil && obj != nil
		// The id echoed: a string id as a string, a short number or boolean
		// as given, nothing else.
		var wantID *string
		var wantRaw json.RawMessage
		if isObject {
			if raw, ok := obj["id"]; ok && len(raw) > 0 {
				var s string
				switch {
				case raw[0] == '"' && json.Unmarshal(raw, &s) == nil:
					wantID = &s
				case raw[0] != '"' && raw[0] != 'n' && raw[0] != '[' && raw[0] != '{' && len(raw) <= maxEchoedID:
					wantRaw = raw
				}
			}
		}
		// A field given twice is refused; an id given twice is not echoed,
		// since which one was meant is unknown.
		var dup *jsonobj.DuplicateKeyError
		if _, derr := jsonobj.Decode(line); errors.As(derr, &dup) {
			if err == nil || !strings.Contains(err.Error(), "twice") {
				t.Fatalf("%q: accepted with %q given twice (err %v)", line, dup.Key, err)
			}
			if dup.Key == "id" || wantRaw != nil {
				wantID, wantRaw = nil, nil
			}
		}
		switch {
		case wantID != nil:
			var got string
			if len(id) == 0 || id[0] != '"' || json.Unmarshal(id, &got) != nil || got != *wantID {
				t.Fatalf("%q: echoed id %s, the line says %q (err %v)", line, id, *wantID, err)
			}
		case wantRaw != nil:
			if string(id) != string(wantRaw) {
				t.Fatalf("%q: echoed id %s, the line says %s (err %v)", line, id, wantRaw, err)
			}
		case len(id) != 0:
			t.Fatalf("%q: echoed id %s, but the line has no id to echo", line, id)
		}
		if !json.Valid(line) && err == nil {
			t.Fatalf("accepted a line that is not valid JSON: %q", line)
		}
		if err != nil {
			if req != nil {
				t.Fatalf("%q: rejected (%v) but returned a request %+v", line, err, req)
			}
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("%q: rejected with an empty message", line)
			}
			return
		}
		if !isObject || wantID == nil || req == nil {
			t.Fatalf("accepted %q, which is not an object with a string id", line)
		}
		if req.id != *wantID {
			t.Fatalf("%q: request id %q, want %q", line, req.id, *wantID)
		}
		for k := range obj {
			if k != "id" && k != "op" && !slices.Contains(wire.Fields(wire.NewRequest(req.op)), k) {
				t.Fatalf("%q: accepted with the unknown field %q", line, k)
			}
		}
		checkAccepted(t, line, obj, req)
	})
}

// checkAccepted holds an accepted request to the contract, field by field.
func checkAccepted(t *testing.T, line []byte, obj map[string]json.RawMessage, req *request) {
	t.Helper()
	present := func(name string) (json.RawMessage, bool) {
		raw, ok := obj[name]
		if !ok || string(raw) == "null" {
			return nil, false
		}
		return raw, true
	}
	// str decodes an optional string field; a present field of another
	// type must have been refused.
	str := func(name string) (string, bool) {
		raw, ok := present(name)
		if !ok {
			return "", false
		}
		var s string
		if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
			t.Fatalf("%q: accepted, but %q is %s, not a string", line, name, raw)
		}
		return s, true
	}
	num := func(name string) (float64, bool) {
		raw, ok := present(name)
		if !ok {
			return 0, false
		}
		var n float64
		if !(raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') || json.Unmarshal(raw, &n) != nil {
			t.Fatalf("%q: accepted, but %q is %s, not a number", line, name, raw)
		}
		return n, true
	}
	name, ok := str("op")
	op := wire.Op(name)
	if !ok || op != req.op {
		t.Fatalf("%q: accepted with op %q, the line says %q", line, req.op, op)
	}
	switch op {
	case wire.OpExecute:
		x := req.exec
		code, ok := str("code")
		if !ok || code != x.Code {
			t.Fatalf("%q: code %q, the line says %q (present %v)", line, x.Code, code, ok)
		}
		for name, got := range map[string]string{"owner": x.Owner, "task": x.Task, "backend": x.Backend, "child": x.Child} {
			if want, _ := str(name); got != want {
				t.Fatalf("%q: %s %q, the line says %q", line, name, got, want)
			}
		}
		var tools []string
		if raw, ok := present("tools"); ok {
			if raw[0] != '[' || json.Unmarshal(raw, &tools) != nil {
				t.Fatalf("%q: accepted, but tools is %s, not an array of strings", line, raw)
			}
		}
		if !slices.Equal(x.Tools, tools) {
			t.Fatalf("%q: tools %q, the line says %q", line, x.Tools, tools)
		}
		if _, err := engine.NewKey(x.Owner, x.Backend, x.Task, x.Child, x.Tools); err != nil {
			t.Fatalf("%q: accepted a request the engine refuses: %v", line, err)
		}
		wantReset := false
		if raw, ok := present("reset"); ok {
			if string(raw) != "true" && string(raw) != "false" {
				t.Fatalf("%q: accepted, but reset is %s", line, raw)
			}
			wantReset = string(raw) == "true"
		}
		if x.Reset != wantReset {
			t.Fatalf("%q: reset %v, want %v", line, x.Reset, wantReset)
		}
		if x.Timeout < 0 {
			t.Fatalf("%q: negative timeout %v", line, x.Timeout)
		}
		secs, ok := num("timeout")
		switch {
		case !ok && x.Timeout != 0:
			t.Fatalf("%q: no timeout given, but got %v", line, x.Timeout)
		case ok && (secs < 0 || secs > maxSeconds):
			t.Fatalf("%q: accepted timeout %g seconds, outside [0, %d years]", line, secs, maxYears)
		case ok && x.Timeout != time.Duration(math.Ceil(secs*float64(time.Second))):
			t.Fatalf("%q: timeout %v for %g seconds", line, x.Timeout, secs)
		}
		if x.OnQueued != nil || x.OnOutput != nil {
			t.Fatalf("%q: the parser set callbacks", line)
		}
		if raw, ok := present("stream"); ok != req.stream && !(ok && string(raw) == "false") {
			t.Fatalf("%q: stream %v", line, req.stream)
		}
	case wire.OpKernels:
		if v, _ := str("unless_version"); v != req.version {
			t.Fatalf("%q: unless_version %q", line, req.version)
		}
	case wire.OpShutdownAll, wire.OpHello:
	case wire.OpSubscribe:
		if ms, ok := num("batch_ms"); ok && (ms < 0 || ms > 1000) || req.batch < 0 || req.batch > time.Second {
			t.Fatalf("%q: batch %v", line, req.batch)
		}
		secs, ok := num("since")
		if ok && (secs < 0 || req.since != time.Duration(secs*float64(time.Second))) || !ok && req.since != 0 {
			t.Fatalf("%q: since %v", line, req.since)
		}
		if raw, ok := present("output"); req.output != (ok && string(raw) == "true") {
			t.Fatalf("%q: output %v", line, req.output)
		}
	case wire.OpCells:
		k, _ := str("kernel")
		if k == "" || k != req.kernel {
			t.Fatalf("%q: kernel %q, the line says %q", line, req.kernel, k)
		}
	case wire.OpLimits:
		if req.maxKernels == nil && req.idleExit == nil {
			t.Fatalf("%q: limits accepted with nothing to set", line)
		}
		n, ok := num("max_kernels")
		if ok != (req.maxKernels != nil) || ok && (float64(*req.maxKernels) != n || *req.maxKernels < 1) {
			t.Fatalf("%q: max_kernels %v (given %v) parsed as %s", line, n, ok, show(req.maxKernels))
		}
		secs, ok := num("idle_exit")
		if ok != (req.idleExit != nil) || ok && (secs < 1 || *req.idleExit < time.Second) {
			t.Fatalf("%q: idle_exit %g (given %v) parsed as %s", line, secs, ok, show(req.idleExit))
		}
	case wire.OpInterrupt, wire.OpKill:
		k, _ := str("kernel")
		if k == "" || k != req.kernel {
			t.Fatalf("%q: kernel %q, the line says %q", line, req.kernel, k)
		}
	case wire.OpShutdownOwner:
		o, ok := str("owner")
		if !ok || o != req.owner {
			t.Fatalf("%q: owner %q, the line says %q (present %v)", line, req.owner, o, ok)
		}
	case wire.OpApprove:
		r, _ := str("request")
		d, _ := str("decision")
		if r == "" || r != req.approval || string(req.decision) != d {
			t.Fatalf("%q: approve %q/%q, the line says %q/%q", line, req.approval, req.decision, r, d)
		}
		if d != "once" && d != "always" && d != "deny" {
			t.Fatalf("%q: accepted decision %q", line, d)
		}
	default:
		t.Fatalf("%q: accepted unknown op %q", line, op)
	}
}

func show[T any](p *T) string {
	if p == nil {
		return "nothing"
	}
	return fmt.Sprint(*p)
}

// FuzzServe feeds whole input streams to Serve over an engine on a fake host
// (no processes): however the lines look, every non-blank line gets exactly
// one answer, each answer is one JSON object with an op, an answer carries
// an id exactly when its line was an object with a string id (answers come
// in completion order, so ids are compared as multisets), and Serve returns
// nil at the end of the input.
func FuzzServe(f *testing.F) {
	f.Add([]byte(`{"id":"1","op":"execute","code":"x"}` + "\n" + `{"id":2}` + "\n" + `[1]`))
	f.Add([]byte(`{"id":"k","op":"kernels"}` + "\n" + `{"id":"l","op":"limits","max_kernels":1.5}` + "\n" + `{"op":"kernels"}` + "\n"))
	f.Add([]byte("\n\n  \r\n{\"id\":\"a\",\"op\":\"kernels\"}\r\n\t\n"))
	f.Add([]byte(`{"id":"1","op":"execute","code":"x"}` + "\n" + `{"id":"1","op":"execute","code":"y","reset":true}` + "\n" + `{"id":"k","op":"kill","kernel":"nope"}`))
	env, _ := fakeenv.Healthy()
	eng, err := engine.New(engine.Config{Backends: []backends.Env{env}, StateDir: f.TempDir(), CellTimeout: 5 * time.Second,
		InterruptGrace: 100 * time.Millisecond, WaitWindow: time.Second})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		eng.Close(ctx, false)
	})
	f.Fuzz(func(t *testing.T, input []byte) {
		var wantIDs []string // JSON text of each id to echo
		wantNull := 0
		for l := range bytes.SplitSeq(input, []byte("\n")) {
			if len(bytes.TrimSpace(l)) == 0 {
				continue
			}
			var obj map[string]json.RawMessage
			var id string
			var dup *jsonobj.DuplicateKeyError
			_, derr := jsonobj.Decode(l)
			switch {
			case errors.As(derr, &dup) && dup.Key == "id":
				wantNull++ // two ids: which one was meant is unknown
			case json.Unmarshal(l, &obj) != nil || obj == nil || len(obj["id"]) == 0:
				wantNull++
			case obj["id"][0] == '"' && json.Unmarshal(obj["id"], &id) == nil:
				wantIDs = append(wantIDs, string(quote(id)))
			case derr == nil && obj["id"][0] != '"' && obj["id"][0] != 'n' && obj["id"][0] != '[' && obj["id"][0] != '{' && len(obj["id"]) <= maxEchoedID:
				wantIDs = append(wantIDs, string(obj["id"]))
			default:
				wantNull++
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var out bytes.Buffer
		if err := Serve(ctx, eng, bytes.NewReader(input), &out, Options{}); err != nil {
			t.Fatalf("Serve: %v", err)
		}
		var gotIDs []string
		gotNull := 0
		for l := range bytes.SplitSeq(bytes.TrimSuffix(out.Bytes(), []byte("\n")), []byte("\n")) {
			if len(l) == 0 && out.Len() == 0 {
				break
			}
			var ans struct {
				ID    json.RawMessage `json:"id"`
				Op    string          `json:"op"`
				Error string          `json:"error"`
			}
			if err := json.Unmarshal(l, &ans); err != nil {
				t.Fatalf("answer %q is not one JSON object: %v", l, err)
			}
			if ans.Op == "" || ans.Op == "event" {
				t.Fatalf("answer %q has no op (or is an event without --events)", l)
			}
			if ans.Op == "error" && strings.TrimSpace(ans.Error) == "" {
				t.Fatalf("error answer %q says nothing", l)
			}
			if len(ans.ID) == 0 || string(ans.ID) == "null" {
				if ans.Op != "error" {
					t.Fatalf("answer %q without an id is not an error", l)
				}
				gotNull++
				continue
			}
			if ans.ID[0] != '"' && ans.Op != "error" {
				t.Fatalf("answer %q echoes a non-string id but is not an error", l)
			}
			var s string
			if ans.ID[0] == '"' && json.Unmarshal(ans.ID, &s) == nil {
				ans.ID = quote(s) // the same id, however it was escaped
			}
			gotIDs = append(gotIDs, string(ans.ID))
		}
		slices.Sort(wantIDs)
		slices.Sort(gotIDs)
		if gotNull != wantNull || !slices.Equal(gotIDs, wantIDs) {
			t.Fatalf("input %q:\nanswered ids %q and %d without an id;\nwant ids %q and %d without an id\noutput:\n%s",
				input, gotIDs, gotNull, wantIDs, wantNull, out.Bytes())
		}
	})
}
