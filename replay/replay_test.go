package replay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/syncbuf"
)

// syncBuffer is a buffer Run writes while the test reads it.
type syncBuffer struct{ syncbuf.Buffer }

func (s *syncBuffer) lines() []string {
	return strings.Split(strings.TrimSuffix(s.String(), "\n"), "\n")
}

func waitLines(t *testing.T, out *syncBuffer, n int) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if l := out.lines(); len(l) == n && l[0] != "" {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d lines sent, want %d: %q", len(out.lines()), n, out.lines())
		}
	}
}

const file = `# a comment
{"id":"1","op":"execute","code":"1"}

{"id":"2","op":"execute","code":"2","after_ms":30,"say":"two comes"}
{"id":"3","op":"kernels"}
`

func TestLoad(t *testing.T) {
	f, err := Load(strings.NewReader(file), 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, total, paused, _ := f.State(); total != 3 || paused {
		t.Fatalf("total %d paused %v", total, paused)
	}
	if got := string(f.lines[1]); strings.Contains(got, "after_ms") || strings.Contains(got, "say") || !strings.Contains(got, `"code":"2"`) {
		t.Errorf("line 2 sent as %q: after_ms and say must go, the request stay", got)
	}
	if f.Say(0) != "" || f.Say(1) != "two comes" || f.Say(3) != "" {
		t.Errorf("says %q %q %q, want only the second's", f.Say(0), f.Say(1), f.Say(3))
	}
	if f.delays[1] != 30*time.Millisecond {
		t.Errorf("delay %v", f.delays[1])
	}
	for _, tc := range []struct{ in, err string }{
		{`not json`, "replay line 1"},
		{`{"id":"1","op":"kernels"}` + "\n" + `{"a":1,"a":2}`, "replay line 2: key \"a\" appears twice"},
		{`{"id":"1","op":"exec","code":"1"}`, `replay line 1: unknown op "exec"`},
		{`{"id":"1","op":"execute","cod":"1"}`, `replay line 1: unknown field "cod" in execute; its fields are: id, op, code,`},
		{`{"id":"1","code":"1"}`, `replay line 1: it has no "op"`},
		{`{"after_ms":-1}`, "after_ms must be milliseconds"},
		{`{"after_ms":"soon"}`, "after_ms must be milliseconds"},
		{`{"say":3}`, "say must be a string"},
		{`[1]`, "not a JSON object"},
	} {
		if _, err := Load(strings.NewReader(tc.in), 1, false); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("Load(%q) = %v, want %q", tc.in, err, tc.err)
		}
	}
	if _, err := Load(strings.NewReader(file), 0, false); err == nil || !strings.Contains(err.Error(), "speed") {
		t.Errorf("speed 0: %v", err)
	}
}

// Paused, nothing goes; n sends exactly one request; p runs the rest.
func TestPauseStepResume(t *testing.T) {
	f, err := Load(strings.NewReader(file), 10, true)
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- f.Run(context.Background(), &out) }()
	time.Sleep(50 * time.Millisecond)
	if sent, _, _, _ := f.State(); sent != 0 || out.lines()[0] != "" {
		t.Fatalf("paused, yet sent %d: %q", sent, out.lines())
	}
	f.Step()
	waitLines(t, &out, 1)
	time.Sleep(50 * time.Millisecond)
	if l := out.lines(); len(l) != 1 || !strings.Contains(l[0], `"id":"1"`) {
		t.Fatalf("one step sent %q", l)
	}
	f.Step()
	waitLines(t, &out, 2)
	f.SetPaused(false)
	waitLines(t, &out, 3)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if sent, total, _, _ := f.State(); sent != 3 || total != 3 {
		t.Fatalf("state %d/%d", sent, total)
	}
}

// A cancelled context stops a paused replay.
func TestRunStopsWithItsContext(t *testing.T) {
	f, _ := Load(strings.NewReader(file), 1, true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx, &syncBuffer{}) }()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Run ended without the context's error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run went on after its context ended")
	}
}
