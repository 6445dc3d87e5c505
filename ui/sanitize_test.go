package ui

import (
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

// hostile is what a cell can print to take over a terminal: set the
// clipboard (OSC 52), the window title (OSC 2), clear the screen, move the
// cursor, and a DCS.
const hostile = "\x1b]52;c;Y3VybCBldmlsfHNo\x07\x1b]2;pwned\x07\x1b[2J\x1b[H\x1bP1$r\x1b\\\x1b[31mred\x1b[0m"

// TestHostileOutputIsShownNotObeyed: what a kernel prints, its traceback,
// its notes and event details reach the screen with their escapes visible,
// never as escapes (plain colours aside).
func TestHostileOutputIsShownNotObeyed(t *testing.T) {
	f := sized(t, fixtureOpts{})
	f.eng.SetExecResult(&engine.Result{Status: engine.StatusError, Stdout: hostile + "\n", Stderr: hostile, Traceback: hostile,
		Duration: time.Second, Kernel: &engine.KernelResult{ID: "k-me", ExecutionCount: 1, Note: hostile}}, nil, hostile)
	f.keys(keyEdit, runes("print('x')"))
	f.run(t, f.update(keyCtrlR))
	f.keys(keyEsc) // back to the kernels
	f.drainInbox(t)
	for f.m.output.runs[0].res == nil {
		f.drainInbox(t) // the streamed output and the result may come apart
	}
	f.update(eventBatchMsg{{Type: engine.EventSpawnFailed, Time: t0, Owner: "eve\x1b]2;x\x07", Kernel: "k\x1b[2J", Detail: hostile}})
	v := f.m.View()
	for _, bad := range []string{"\x1b]", "\x1b[2J", "\x1b[H", "\x1bP", "\x07"} {
		if strings.Contains(v, bad) {
			t.Errorf("the view passes %q to the terminal", bad)
		}
	}
	mustContain(t, v, "␛]52;c;Y3VybCBldmlsfHNo␇", "␛[2J")
}

// TestEventIsOneLine: an event whose detail holds newlines (a path a
// kernel chose) starts no line that looks like another event's.
func TestEventIsOneLine(t *testing.T) {
	f := sized(t, fixtureOpts{})
	f.update(eventBatchMsg{{Type: engine.EventRPCCall, Time: t0, Owner: "bob", Kernel: "k1",
		Detail: "read_file: error: nope\n12:00:00 owner_shutdown     alice        forged"}})
	v := f.m.View()
	for _, l := range strings.Split(v, "\n") {
		if strings.Contains(l, "12:00:00") && !strings.Contains(l, "nope␊12:00:00") {
			t.Errorf("a line of its own from an event's detail: %q", l)
		}
	}
	mustContain(t, v, "nope␊12:00:00")
}

// TestUnconfinedHostInHeader: a host whose runners cannot use Landlock is
// marked in the header once the engine says so.
func TestUnconfinedHostInHeader(t *testing.T) {
	f := sized(t, fixtureOpts{})
	mustNotContain(t, f.m.View(), "(unconfined)")
	f.update(eventBatchMsg{{Type: engine.EventUnconfined, Time: t0, Owner: "me", Kernel: "k1", Key: "me/default@ssh://gpu1[]",
		Detail: "runners on ssh://gpu1 are not confined by Landlock"}})
	if h := strings.Split(f.m.View(), "\n")[0]; !strings.Contains(h, "ssh://gpu1 (unconfined)") || strings.Contains(h, "local (unconfined)") {
		t.Errorf("header %q, want ssh://gpu1 marked unconfined and local not", h)
	}
}
