// Package replay feeds a file of headless requests to an engine at a pace
// the operator controls: paused, stepped one request at a time, or running
// with each request's own delay scaled by a speed factor.
package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/jsonobj"
	"github.com/kerneldeck/kerneldeck/wire"
)

// DelayField is a field a replay line may carry beyond a headless request:
// milliseconds to wait before sending it (scaled by the speed).
const DelayField = "after_ms"

// SayField is the other: a line of text the dashboard shows when the
// request is sent, to say what it shows (a replay that teaches).
const SayField = "say"

// maxSay bounds a say line.
const maxSay = 500

// maxLines bounds a replay file.
const maxLines = 100_000

// Feed holds a replay file's requests and hands them out (Run) as the
// controls allow. Safe for concurrent use.
type Feed struct {
	lines  [][]byte
	delays []time.Duration
	says   []string
	speed  float64

	mu     sync.Mutex
	sent   int
	paused bool
	steps  int
	wake   chan struct{}
}

// Load reads a replay file: one JSON object per line (blank lines and
// lines starting with # skipped), each a headless request with an optional
// after_ms. speed scales the delays (2 is twice as fast); paused starts it
// paused.
func Load(r io.Reader, speed float64, paused bool) (*Feed, error) {
	if speed <= 0 || speed > 1000 {
		return nil, fmt.Errorf("replay speed %g is out of range: give a factor above 0, up to 1000 (1 is as written)", speed)
	}
	f := &Feed{speed: speed, paused: paused, wake: make(chan struct{}, 1)}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 16<<20)
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		if len(f.lines) >= maxLines {
			return nil, fmt.Errorf("replay line %d: more than %d requests in one file", n, maxLines)
		}
		obj, err := jsonobj.Decode(line)
		if err != nil {
			return nil, fmt.Errorf("replay line %d: %v; each line is one JSON request, e.g. {\"id\":\"1\",\"op\":\"execute\",\"code\":\"1\"}", n, err)
		}
		var delay time.Duration
		if raw, ok := obj[DelayField]; ok {
			var ms float64
			if err := json.Unmarshal(raw, &ms); err != nil || ms < 0 || ms > 3_600_000 {
				return nil, fmt.Errorf("replay line %d: %s must be milliseconds from 0 to 3600000, not %s", n, DelayField, raw)
			}
			delay = time.Duration(ms * float64(time.Millisecond))
			delete(obj, DelayField)
			if line, err = json.Marshal(obj); err != nil {
				return nil, fmt.Errorf("replay line %d: %w", n, err)
			}
		}
		var say string
		if raw, ok := obj[SayField]; ok {
			if err := json.Unmarshal(raw, &say); err != nil || len(say) > maxSay {
				return nil, fmt.Errorf("replay line %d: %s must be a string of at most %d bytes, not %.80s", n, SayField, maxSay, raw)
			}
			delete(obj, SayField)
			if line, err = json.Marshal(obj); err != nil {
				return nil, fmt.Errorf("replay line %d: %w", n, err)
			}
		}
		if err := checkRequest(obj); err != nil {
			return nil, fmt.Errorf("replay line %d: %w", n, err)
		}
		f.lines = append(f.lines, append(bytes.Clone(line), '\n'))
		f.delays = append(f.delays, delay)
		f.says = append(f.says, say)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("replay line %d: %w", n+1, err)
	}
	return f, nil
}

// Run writes the requests to w as the controls allow, until the last is
// sent or ctx ends.
func (f *Feed) Run(ctx context.Context, w io.Writer) error {
	for i, line := range f.lines {
		if d := time.Duration(float64(f.delays[i]) / f.speed); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		for !f.take() {
			select {
			case <-f.wake:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if _, err := w.Write(line); err != nil {
			return fmt.Errorf("replay request %d: %w", i+1, err)
		}
	}
	return nil
}

// take says whether the next request may go now, and counts it sent.
func (f *Feed) take() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case !f.paused:
	case f.steps > 0:
		f.steps--
	default:
		return false
	}
	f.sent++
	return true
}

func (f *Feed) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// SetPaused pauses or resumes the replay.
func (f *Feed) SetPaused(p bool) {
	f.mu.Lock()
	f.paused, f.steps = p, 0
	f.mu.Unlock()
	f.poke()
}

// Step lets one more request go while paused.
func (f *Feed) Step() {
	f.mu.Lock()
	if f.paused {
		f.steps++
	}
	f.mu.Unlock()
	f.poke()
}

// State is the replay's progress: requests sent, in all, and whether it is
// paused; speed is the factor.
func (f *Feed) State() (sent, total int, paused bool, speed float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent, len(f.lines), f.paused, f.speed
}

// Say is what request i (from 0, in the order sent) says, or "".
func (f *Feed) Say(i int) string {
	if i < 0 || i >= len(f.says) {
		return ""
	}
	return f.says[i]
}

// checkRequest refuses a line that is no request of the protocol (its op
// unknown, or a field its op does not take) when the file is loaded, not
// when the engine meets it mid-replay; the engine checks the values.
func checkRequest(obj map[string]json.RawMessage) error {
	var op wire.Op
	if json.Unmarshal(obj["op"], &op) != nil || op == "" {
		return errors.New(`it has no "op" string; each line is one headless request, e.g. {"id":"1","op":"execute","code":"1"}`)
	}
	req := wire.NewRequest(op)
	if req == nil {
		return fmt.Errorf("unknown op %q; a replay sends headless requests (execute, kernels, limits, ...)", op)
	}
	known := wire.Fields(req)
	for k := range obj {
		if !slices.Contains(known, k) {
			return fmt.Errorf("unknown field %.80q in %s; its fields are: %s, and %s and %s", k, op, strings.Join(known, ", "), DelayField, SayField)
		}
	}
	return nil
}
