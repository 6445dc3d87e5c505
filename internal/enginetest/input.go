package enginetest

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// Input checks that a cell's input() and getpass() ask the cell's caller:
// the prompt arrives after what the cell printed before it, as one line of
// plain text, and the answer is the call's value (never in an event). An
// end of input, a caller that cannot answer and a cell that times out
// waiting each end input() as Python would, and the kernel lives on.
func Input(t *testing.T, env backends.Env) {
	h := New(t, env, nil)
	ctx := context.Background()
	var mu sync.Mutex
	var out strings.Builder
	var asked []engine.InputRequest
	var printedBefore string
	res, err := h.Eng.Execute(ctx, engine.Request{Owner: "a",
		Code: "print('before')\nname = input('name\\x1b]52;c;eA==\\x07? ')\nfrom getpass import getpass\nsecret = getpass()\nprint(len(name), len(secret))",
		OnOutput: func(_, text string) {
			mu.Lock()
			out.WriteString(text)
			mu.Unlock()
		},
		OnInput: func(_ context.Context, ask engine.InputRequest) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, ask)
			if ask.Password {
				return "hunter2", nil
			}
			printedBefore = out.String()
			return "Ada Lovelace", nil
		}})
	if err != nil || res.Status != engine.StatusSuccess || res.Stdout != "before\n12 7\n" {
		t.Fatalf("input() and getpass() answered: %v %+v; want before, then 12 7", err, res)
	}
	mu.Lock()
	if len(asked) != 2 || strings.ContainsAny(asked[0].Prompt, "\x1b\x07") || !strings.HasPrefix(asked[0].Prompt, "name") ||
		!strings.HasSuffix(asked[0].Prompt, "? ") || asked[0].Password || asked[1].Prompt != "Password: " || !asked[1].Password || asked[0].Cell != res.Cell {
		t.Errorf("the requests: %+v; want name? (the escape shown, not sent) of cell %s, then a password", asked, res.Cell)
	}
	// Where output streams (not over the Execute door), the prompt comes
	// after it.
	if out.Len() > 0 && printedBefore != "before\n" {
		t.Errorf("the caller had %q of the output when asked; want what the cell printed before input()", printedBefore)
	}
	mu.Unlock()
	for _, ev := range h.AllEvents() {
		if strings.Contains(ev.Detail, "hunter2") || strings.Contains(ev.Detail, "Ada") {
			t.Errorf("an event carries an answer: %s %s", ev.Type, ev.Detail)
		}
	}
	if !strings.Contains(h.EventText(), "getpass(): answered in") {
		t.Errorf("no event says getpass() was answered:\n%s", h.EventText())
	}

	// A cell's threads cannot queue up questions: one waits at a time.
	var calls atomic.Int32
	res, err = h.Eng.Execute(ctx, engine.Request{Owner: "a",
		Code: "import threading\nerrs = []\ndef ask():\n    try:\n        input('t? ')\n    except EOFError as e:\n        errs.append(str(e))\n" +
			"ts = [threading.Thread(target=ask) for _ in range(5)]\n[t.start() for t in ts]\n[t.join() for t in ts]\nprint(len(errs), sorted(set(errs)))",
		OnInput: func(context.Context, engine.InputRequest) (string, error) {
			calls.Add(1)
			time.Sleep(300 * time.Millisecond) // the other threads ask meanwhile
			return "", engine.ErrInputEOF
		}})
	if err != nil || !strings.HasPrefix(res.Stdout, "5 ") || !strings.Contains(res.Stdout, "another input() of this cell waits") || calls.Load() >= 5 {
		t.Errorf("five threads asking at once: %v %+v, the caller asked %d times; want the others refused while one waits", err, res, calls.Load())
	}

	eof := func(context.Context, engine.InputRequest) (string, error) { return "", engine.ErrInputEOF }
	res, err = h.Eng.Execute(ctx, engine.Request{Owner: "a", OnInput: eof,
		Code: "try:\n    input()\nexcept EOFError as e:\n    print('eof:', e)"})
	if err != nil || res.Stdout != "eof: EOF when reading a line\n" {
		t.Errorf("an end of input: %v %+v; want EOFError", err, res)
	}
	res, err = h.Eng.Execute(ctx, engine.Request{Owner: "a", Code: "input('x? ')"})
	if err != nil || res.Status != engine.StatusError || !strings.Contains(res.Traceback, "EOFError: input() has no one to answer it here") {
		t.Errorf("input() with no one to answer: %v %+v; want an EOFError that says why", err, res)
	}
	wait := func(ctx context.Context, _ engine.InputRequest) (string, error) {
		<-ctx.Done()
		return "", ctx.Err()
	}
	res, err = h.Eng.Execute(ctx, engine.Request{Owner: "a", OnInput: wait, Timeout: 2 * time.Second, Code: "input('never answered ')"})
	if err != nil || res.Status != engine.StatusTimeout {
		t.Errorf("input() past the cell's timeout: %v %+v; want a timeout", err, res)
	}
	res, err = h.Eng.Execute(ctx, engine.Request{Owner: "a", Code: "print(name)"})
	if err != nil || res.Stdout != "Ada Lovelace\n" || res.Kernel.StateLost {
		t.Errorf("after the timeout: %v %+v; want the kernel and its name", err, res)
	}
}
