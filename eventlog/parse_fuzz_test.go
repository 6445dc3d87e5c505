package eventlog_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/eventlog"
)

// The event log is a file anyone with our uid could have edited: ParseLine
// takes arbitrary bytes, accepts only events of known types with a time,
// and what it accepts survives a round trip unchanged.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{
		`{"type":"spawned","time":"2030-03-01T12:00:00Z","kernel":"k1","owner":"a","detail":"pid 1"}`,
		`{"type":"cell_output","time":"2030-03-01T12:00:00Z","cell":"c1","stream":"stdout","text":"\u001b[2J"}`,
		`{"type":"missed","time":"2030-03-01T12:00:00Z","missed":3}`,
		`{"type":"spawned","time":"2030-03-01T12:00:00Z","bogus":1}`,
		`{"type":"spawned","time":"2030-03-01T12:00:00Z","type":"killed"}`,
		`[]`, `null`, `{"type":5}`, `{"type":"spawned","time":"not a time"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, err := eventlog.ParseLine(line)
		if err != nil {
			return
		}
		if !slices.Contains(engine.EventTypes(), ev.Type) || ev.Time.IsZero() {
			t.Fatalf("accepted %q as %+v", line, ev)
		}
		again, err := json.Marshal(ev)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", line, err)
		}
		back, err := eventlog.ParseLine(again)
		if err != nil || !reflect.DeepEqual(back.Time.UTC(), ev.Time.UTC()) {
			t.Fatalf("round trip of %q: %v", line, err)
		}
		back.Time, ev.Time = back.Time.UTC(), ev.Time.UTC()
		if !reflect.DeepEqual(back, ev) {
			t.Fatalf("round trip of %q changed it: %+v -> %+v", line, ev, back)
		}
	})
}
