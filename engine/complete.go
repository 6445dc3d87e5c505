package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/termtext"
)

// Completion is what a kernel offers at a cursor: each of Matches replaces
// the code from Start to the cursor. Offsets count characters (Unicode
// code points), as Python and Jupyter count them.
type Completion struct {
	Start   int      `json:"start"`
	Matches []string `json:"matches"`
}

// MaxCompleteCode bounds the code sent for a completion.
const MaxCompleteCode = 1 << 20

// Bounds on what a completion gives back: the kernel's namespace is
// untrusted, and its matches go into an operator's terminal line.
const (
	maxMatches    = 200
	maxMatchBytes = 256
)

// completeWait bounds a completion: the first one may import jedi.
const completeWait = 10 * time.Second

// ErrNoCompletion is a kernel whose runner cannot complete now: it is not
// reachable over a stream (a backend without one, a kernel still
// starting).
var ErrNoCompletion = errors.New("completion needs the kernel's stream")

// Complete asks kernel id for the completions of code at cursor (in
// characters), computed in its namespace: names, attributes, dict keys and
// paths (jedi where the kernel's interpreter has it). It runs no cell: the
// execution count and the kernel's idle time stay as they were.
func (e *Engine) Complete(ctx context.Context, id, code string, cursor int) (Completion, error) {
	if !utf8.ValidString(code) || len(code) > MaxCompleteCode {
		return Completion{}, fmt.Errorf("complete: the code must be UTF-8 text of at most %d bytes", MaxCompleteCode)
	}
	if n := utf8.RuneCountInString(code); cursor < 0 || cursor > n {
		return Completion{}, fmt.Errorf("complete: cursor %d is outside the code's %d characters", cursor, n)
	}
	e.mu.Lock()
	k := e.byID[id]
	var dir, token string
	ready := k != nil && k.state == phaseReady
	if k != nil {
		dir, token = k.dir, k.token
	}
	e.mu.Unlock()
	if k == nil {
		return Completion{}, fmt.Errorf("%w %q", ErrUnknownKernel, id)
	}
	d := backends.StreamsOf(k.env)
	if !ready || d == nil || len(dir+"/sock") >= sockPathMax {
		return Completion{}, fmt.Errorf("kernel %s: %w", id, ErrNoCompletion)
	}
	// A connection of its own: the kernel's stream may be carrying a
	// cell, whose reader would take the answer.
	dctx, cancel := context.WithTimeout(ctx, completeWait)
	defer cancel()
	nc, err := d.DialUnix(dctx, dir+"/sock")
	if err != nil {
		return Completion{}, fmt.Errorf("kernel %s: %w: %v", id, ErrNoCompletion, err)
	}
	conn, err := dialRunner(dctx, nc, token, nil)
	if err != nil {
		return Completion{}, fmt.Errorf("kernel %s: %w: %v", id, ErrNoCompletion, err)
	}
	defer conn.close()
	defer conn.begin(ctx, time.Now().Add(completeWait))()
	ask := "complete-" + randomHex(8)
	if err := conn.send(map[string]any{"op": "complete", "id": ask, "code": code, "cursor": cursor}); err != nil {
		return Completion{}, fmt.Errorf("complete in kernel %s: %w", id, err)
	}
	for {
		f, err := conn.next(ask)
		if err != nil {
			return Completion{}, fmt.Errorf("complete in kernel %s: %w", id, err)
		}
		switch f.Op {
		case "completions":
			if f.Start < 0 || f.Start > cursor {
				return Completion{}, fmt.Errorf("complete in kernel %s: the runner's start %d is outside 0..%d", id, f.Start, cursor)
			}
			return Completion{Start: f.Start, Matches: safeMatches(f.Matches)}, nil
		case "error":
			return Completion{}, fmt.Errorf("complete in kernel %s: %s", id, f.Error)
		}
	}
}

// safeMatches keeps the matches a terminal line can take as typed text:
// valid UTF-8, short, without control, bidirectional or zero-width
// characters (a dict key can hold an escape sequence), at most maxMatches.
func safeMatches(in []string) []string {
	out := []string{}
	for _, m := range in {
		if len(out) == maxMatches {
			break
		}
		if m == "" || len(m) > maxMatchBytes || !utf8.ValidString(m) || strings.ContainsFunc(m, func(r rune) bool {
			return r < 0x20 || (r >= 0x7f && r <= 0x9f) || termtext.Hidden(r)
		}) {
			continue
		}
		out = append(out, m)
	}
	return out
}
