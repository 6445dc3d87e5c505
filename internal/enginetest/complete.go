package enginetest

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// Completion checks that a kernel completes names, attributes, dict keys
// and paths from its own namespace, while a cell runs too, without running
// a cell or changing its execution count.
func Completion(t *testing.T, env backends.Env) {
	h := New(t, env, nil)
	ctx := context.Background()
	res, err := h.Eng.Execute(ctx, engine.Request{Owner: "a",
		Code: "import os\nmeasurements = {'alpha': 1, 'beta': 2}\nclass Box:\n    def __init__(self):\n        self.payload_size = 3\nbox = Box()"})
	if err != nil || res.Status != engine.StatusSuccess {
		t.Fatalf("setup cell: %v %+v", err, res)
	}
	// A file to complete, in the kernel's own dir (it goes with the kernel).
	res, err = h.Eng.Execute(ctx, engine.Request{Owner: "a", Code: "os.chdir(" + strconv.Quote(res.Kernel.Dir) + ")\nopen('kd_probe_file.txt', 'w').close()"})
	if err != nil || res.Status != engine.StatusSuccess {
		t.Fatalf("setup cell: %v %+v", err, res)
	}
	id := res.Kernel.ID
	// Each case: the code, where the cursor is (its end when atCursorOf
	// is empty), and what the code up to the cursor holds once one of the
	// matches replaces it from Start: jedi and rlcompleter cut words apart
	// differently, and both are right.
	for _, tc := range []struct{ code, atCursorOf, want string }{
		{"measu", "", "measurements"},
		{"box.payl", "", "box.payload_size"},
		{"x = os.pa", "", "x = os.path"},
		{"measurements['al", "", "measurements['alpha"},
		{"open('./kd_pro", "", "open('./kd_probe_file.txt"},
		{"print(meas)", "print(meas", "print(measurements"},
	} {
		cursor := len([]rune(tc.code))
		if tc.atCursorOf != "" {
			cursor = len([]rune(tc.atCursorOf))
		}
		c, err := h.Eng.Complete(ctx, id, tc.code, cursor)
		if err != nil {
			t.Fatalf("complete %q: %v", tc.code, err)
		}
		head := string([]rune(tc.code)[:c.Start])
		if !slices.ContainsFunc(c.Matches, func(m string) bool { return strings.HasPrefix(head+m, tc.want) }) {
			t.Errorf("complete %q at %d: start %d, matches %q; none makes %q", tc.code, cursor, c.Start, c.Matches, tc.want)
		}
	}
	// The kernel is untrusted: a key that holds an escape sequence or a
	// bidirectional override never reaches a terminal line.
	if _, err := h.Eng.Execute(ctx, engine.Request{Owner: "a", Code: "hostile = {'ok_key': 1, 'bad\\x1b]52;c;eA==\\x07': 2, 'rlo\\u202e': 3}"}); err != nil {
		t.Fatal(err)
	}
	c, err := h.Eng.Complete(ctx, id, "hostile['", 9)
	if err != nil || !slices.ContainsFunc(c.Matches, func(m string) bool { return strings.Contains(m, "ok_key") }) {
		t.Fatalf("complete hostile keys: %v %q; want ok_key", err, c.Matches)
	}
	for _, m := range c.Matches {
		if strings.ContainsAny(m, "\x1b\x07\u202e") {
			t.Errorf("a match carries a control or bidi character: %q", m)
		}
	}
	// While a cell runs, completion still answers from the namespace.
	done := make(chan error, 1)
	go func() {
		_, err := h.Eng.Execute(ctx, engine.Request{Owner: "a", Code: "import time\nlate_name = 1\ntime.sleep(2)"})
		done <- err
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := h.Eng.Complete(ctx, id, "late_n", 6)
		if err == nil && slices.Contains(c.Matches, "late_name") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no completion of a name made by the running cell: %v %+v", err, c)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	after, err := h.Eng.Execute(ctx, engine.Request{Owner: "a", Code: "1"})
	if err != nil || after.Kernel.ExecutionCount != 5 {
		t.Errorf("after completions the execution count is %d (%v), want 5 (the cells run): completion runs no cell", after.Kernel.ExecutionCount, err)
	}
	if _, err := h.Eng.Complete(ctx, "k-none", "x", 1); !errors.Is(err, engine.ErrUnknownKernel) {
		t.Errorf("complete in an unknown kernel: %v, want ErrUnknownKernel", err)
	}
	if _, err := h.Eng.Complete(ctx, id, "x", 2); err == nil {
		t.Error("a cursor past the code's end was taken")
	}
}
