package server

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestParseHandover(t *testing.T) {
	for _, tc := range []struct {
		frame  string
		fds    int
		ok     bool
		events bool
		rest   string
	}{
		{`{"op":"stdio","events":true}` + "\n", 2, true, true, ""},
		{`{"op":"stdio"}` + "\n" + `{"id":"1","op":"kernels"}` + "\n", 2, true, false, `{"id":"1","op":"kernels"}` + "\n"},
		{`{"op":"stdio","events":false}` + "\n", 2, true, false, ""},
		{`{"op":"stdio","events":true}` + "\n", 0, false, false, ""},  // no descriptors came with it
		{`{"op":"stdio","events":true}` + "\n", 1, false, false, ""},  // one is not a pair
		{`{"op":"stdio","events":true}`, 2, false, false, ""},         // no whole line
		{`{"OP":"stdio"}` + "\n", 2, false, false, ""},                // keys match exactly
		{`{"op":"stdio","op":"kernels"}` + "\n", 2, false, false, ""}, // once
		{`{"op":"stdio","events":"yes"}` + "\n", 2, false, false, ""}, // events is a boolean
		{`{"op":"stdio","events":null}` + "\n", 2, false, false, ""},  // and not null
		{`{"op":"stdio","owner":"root"}` + "\n", 2, false, false, ""}, // nothing else
		{`{"op":"stdio"} {"op":"stdio"}` + "\n", 2, false, false, ""}, // one object
		{`{"id":"1","op":"hello"}` + "\n", 2, false, false, ""},       // a request
	} {
		events, rest, ok := parseHandover([]byte(tc.frame), tc.fds)
		if ok != tc.ok || events != tc.events || (ok && string(rest) != tc.rest) {
			t.Errorf("parseHandover(%q, %d) = %v, %q, %v; want %v, %q, %v", tc.frame, tc.fds, events, rest, ok, tc.events, tc.rest, tc.ok)
		}
	}
}

// FuzzParseHandover: the first frame of a connection is hostile input. A
// frame taken as a handover is exactly one line that encoding/json reads as
// op "stdio" with the same events, followed by the rest of the frame.
func FuzzParseHandover(f *testing.F) {
	f.Add([]byte(`{"op":"stdio","events":true}`+"\n"+`{"id":"1","op":"kernels"}`+"\n"), 2)
	f.Add([]byte(`{"op":"stdio"}`+"\n"), 2)
	f.Add([]byte(`{"Op":"stdio","events":true}`+"\n"), 2)
	f.Add([]byte(`{"op":"stdio","op":"x"}`+"\n"), 2)
	f.Add([]byte(`{"id":"1","op":"hello"}`+"\n"), 0)
	f.Fuzz(func(t *testing.T, frame []byte, fds int) {
		events, rest, ok := parseHandover(frame, fds)
		if !ok {
			return
		}
		if fds != 2 {
			t.Fatalf("a handover with %d descriptors", fds)
		}
		i := bytes.IndexByte(frame, '\n')
		if i < 0 || !bytes.Equal(rest, frame[i+1:]) {
			t.Fatalf("rest %q is not what follows the first line of %q", rest, frame)
		}
		var m map[string]any
		if err := json.Unmarshal(frame[:i], &m); err != nil {
			t.Fatalf("taken as a handover but not JSON: %q: %v", frame[:i], err)
		}
		if m["op"] != "stdio" || len(m) > 2 {
			t.Fatalf("taken as a handover: %q", frame[:i])
		}
		if e, present := m["events"]; (present && e != events) || (!present && events) {
			t.Fatalf("events %v from %q", events, frame[:i])
		}
	})
}
