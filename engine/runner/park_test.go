package runner

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// slowPickle is a namespace whose one name takes 1.5 s to pickle.
const slowPickle = `import time
class Slow:
    def __reduce__(self):
        time.sleep(1.5)
        return (int, (7,))
slow = Slow()`

// readOp reads frames from br until one of op, and returns it with the ops
// read before it (a park_data's bytes skipped).
func readOp(t *testing.T, br *bufio.Reader, op string) (map[string]any, []string) {
	t.Helper()
	var before []string
	for {
		l, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatalf("waiting for %s (after %v): %v", op, before, err)
		}
		var f map[string]any
		if err := json.Unmarshal(l, &f); err != nil {
			t.Fatalf("frame %.200q: %v", l, err)
		}
		if f["op"] == op {
			return f, before
		}
		if n, ok := f["n"].(float64); ok && f["op"] == "park_data" {
			if _, err := br.Discard(int(n)); err != nil { // the raw bytes after the line
				t.Fatal(err)
			}
		}
		before = append(before, f["op"].(string))
	}
}

// Pickling runs the user's code for as long as it takes: meanwhile the
// runner still answers on its doors (a ping on another connection), and
// the park's answer comes once it is done.
func TestParkingDoesNotHoldTheRunnersReading(t *testing.T) {
	e := startEngineSide(t)
	e.write(cellFrame("setup", slowPickle))
	if f, _ := e.result(); f.Status != "ok" {
		t.Fatalf("setup: %s %q", f.Status, f.Traceback)
	}
	e.write(frame(map[string]any{"op": "park", "id": "park-1", "max_bytes": 1 << 20}))
	asked := time.Now()
	other, br := dialAuthed(t, e.kd, e.secret)
	other.Write(frame(map[string]any{"op": "ping"}))
	readOp(t, br, "pong")
	if waited := time.Since(asked); waited > time.Second {
		t.Fatalf("a ping during a park was answered after %v: the park held the reading", waited)
	}
	parked, before := readOp(t, e.br, "parked")
	if names, _ := parked["names"].([]any); len(names) != 2 || strings.Join(before, ",") != "park_data,park_data" {
		t.Fatalf("the park's answer: %v after %v", parked, before)
	}
}

// A whole park (to hibernate) sends nothing when a name does not pickle,
// and says so.
func TestAWholeParkSendsNothingOfAnIncompleteNamespace(t *testing.T) {
	e := startEngineSide(t)
	e.write(cellFrame("setup", "f = open('/dev/null')\nx = 1"))
	if f, _ := e.result(); f.Status != "ok" {
		t.Fatalf("setup: %s %q", f.Status, f.Traceback)
	}
	e.write(frame(map[string]any{"op": "park", "id": "park-1", "max_bytes": 1 << 20, "whole": true}))
	f, before := readOp(t, e.br, "error")
	if f["incomplete"] != true || !strings.Contains(f["error"].(string), "f (open file)") || len(before) != 0 {
		t.Fatalf("a whole park of a namespace with an open file: %v after %v", f, before)
	}
}
