package ui

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/uitest"
)

// sized returns a fixture at 100x30.
func sized(t *testing.T, o fixtureOpts) *fixture {
	t.Helper()
	f := newFixture(t, o)
	f.update(tea.WindowSizeMsg{Width: 100, Height: 30})
	return f
}

func isQuit(cmd tea.Cmd) bool {
	if cmd == nil {
		return false
	}
	_, ok := cmd().(tea.QuitMsg)
	return ok
}

// TestStartsInKernelsOnUserTarget: the first frame's keys are the list's
// (as k9s starts), the editor is one key (e) away and aimed at the user's
// default kernel; esc comes back.
func TestStartsInKernelsOnUserTarget(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	if f.focused() != Pane(f.m.kernels) {
		t.Errorf("focus = %d, want the kernels", f.m.focus)
	}
	f.keys(keyEdit)
	if f.focused() != Pane(f.m.editor) {
		t.Fatalf("e: focus = %d, want the editor", f.m.focus)
	}
	mustContain(t, f.m.View(), "esc leave")
	f.keys(keyEsc)
	if f.focused() != Pane(f.m.kernels) {
		t.Errorf("esc in the editor: focus = %d, want the kernels", f.m.focus)
	}
	want := Target{Owner: "me", Task: "default", Backend: "local"}
	if got := f.m.editor.Target(); got.String() != want.String() {
		t.Errorf("target = %s, want %s", got, want)
	}
}

func TestTabCyclesFocus(t *testing.T) {
	f := sized(t, fixtureOpts{})
	for _, want := range []Pane{f.m.editor, f.m.output, f.m.evPane, f.m.kernels} {
		f.keys(keyTab)
		if f.focused() != want {
			t.Fatalf("focus = %d, want %T", f.m.focus, want)
		}
	}
	f.keys(tea.KeyMsg{Type: tea.KeyShiftTab})
	if f.focused() != Pane(f.m.evPane) {
		t.Errorf("shift+tab: focus = %d, want the events", f.m.focus)
	}
}

// TestCapKeys: with the kernels pane focused "+" and "-" set the cap one
// up or down (never below 1); in the editor they are text.
func TestCapKeys(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cap     int
		keys    []string
		want    []int // the cap of each SetLimits call
		header  string
		editing bool
	}{
		{name: "plus", cap: 4, keys: []string{"+"}, want: []int{5}, header: "kernels 3/5"},
		{name: "equals is plus", cap: 4, keys: []string{"="}, want: []int{5}, header: "kernels 3/5"},
		{name: "minus", cap: 4, keys: []string{"-"}, want: []int{3}, header: "kernels 3/3 FULL"},
		{name: "minus to over cap", cap: 3, keys: []string{"-"}, want: []int{2}, header: "kernels 3/2"},
		{name: "up down down", cap: 4, keys: []string{"+", "-", "-"}, want: []int{3}, header: "kernels 3/3"},
		{name: "not below one", cap: 1, keys: []string{"-"}, want: nil, header: "the cap is at least 1"},
		{name: "typed in the editor", cap: 4, keys: []string{"+", "-"}, want: nil, header: "kernels 3/4", editing: true},
		// Keys read together arrive as one message (auto-repeat, tmux send-keys).
		{name: "three at once", cap: 4, keys: []string{"+++"}, want: []int{7}, header: "kernels 3/7"},
		{name: "three typed at once in the editor", cap: 4, keys: []string{"+-"}, want: nil, header: "kernels 3/4", editing: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := sized(t, fixtureOpts{kernels: twoOwnerKernels(), cap: tc.cap})
			if tc.editing {
				f.keys(keyEdit)
			}
			for _, k := range tc.keys {
				f.keys(runes(k))
			}
			// Nothing applies while keys come; the pause applies the
			// last value, once.
			if calls := f.eng.SetLimitsCalls(); len(calls) != 0 {
				t.Fatalf("SetLimits called before the pause: %+v", calls)
			}
			if tc.want != nil {
				mustContain(t, f.m.View(), fmt.Sprintf("→ %d pending", tc.want[0]))
			}
			f.update(applyLimitsMsg{seq: f.m.pendingSeq})
			var got []int
			for _, c := range f.eng.SetLimitsCalls() {
				if c.MaxKernels == nil || c.IdleExit != nil {
					t.Fatalf("SetLimits(%v, %v), want only the cap", c.MaxKernels, c.IdleExit)
				}
				got = append(got, *c.MaxKernels)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("SetLimits caps = %v, want %v", got, tc.want)
			}
			mustContain(t, f.m.View(), tc.header)
			if tc.editing {
				if v := f.m.editor.area.Value(); v != "+-" {
					t.Errorf("editor holds %q, want the typed keys", v)
				}
			}
		})
	}
}

// TestIdleExitKeys: "]" and "[" step idle_exit by a step that suits its
// size, never below 10s.
func TestIdleExitKeys(t *testing.T) {
	for _, tc := range []struct {
		from time.Duration
		key  string
		want time.Duration
	}{
		{30 * time.Minute, "]", 31 * time.Minute},
		{30 * time.Minute, "[", 29 * time.Minute},
		{90 * time.Second, "]", 100 * time.Second},
		{90 * time.Second, "[", 80 * time.Second},
		{2 * time.Hour, "]", 2*time.Hour + 10*time.Minute},
		{2 * time.Hour, "[", 2*time.Hour - 10*time.Minute},
		{10 * time.Second, "[", 10 * time.Second},
		// At a range's edge the step is that of the range entered, so the
		// two keys undo each other.
		{2 * time.Minute, "[", 110 * time.Second},
		{110 * time.Second, "]", 2 * time.Minute},
		{2 * time.Minute, "]", 3 * time.Minute},
		{time.Hour, "[", 59 * time.Minute},
		{59 * time.Minute, "]", time.Hour},
		{time.Hour, "]", time.Hour + 10*time.Minute},
	} {
		t.Run(tc.from.String()+tc.key, func(t *testing.T) {
			f := sized(t, fixtureOpts{kernels: twoOwnerKernels(), idleExit: tc.from})
			f.keys(runes(tc.key))
			f.update(applyLimitsMsg{seq: f.m.pendingSeq})
			calls := f.eng.SetLimitsCalls()
			if len(calls) != 1 || calls[0].IdleExit == nil || calls[0].MaxKernels != nil {
				t.Fatalf("SetLimits calls = %+v, want one with only idle_exit", calls)
			}
			if got := *calls[0].IdleExit; got != tc.want {
				t.Errorf("idle_exit %s %s = %s, want %s", tc.from, tc.key, got, tc.want)
			}
			// The header and the reap countdowns follow the new value.
			v := f.m.View()
			mustContain(t, v, "idle_exit "+short(tc.want))
			if reap := tc.want - 5*time.Minute; reap > 0 {
				mustContain(t, v, short(reap))
			}
		})
	}
}

// TestKillSelected: "x" kills the kernel under the cursor, which then shows
// as dead.
func TestKillSelected(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	// The cursor starts on alice's group row: "x" there does nothing.
	if cmd := f.update(runes("x")); cmd != nil {
		f.run(t, cmd)
	}
	if k := f.eng.Killed(); len(k) != 0 {
		t.Fatalf("x on an owner row killed %v", k)
	}
	f.keys(runes("j"), runes("j")) // alice/etl
	if k, _ := f.m.kernels.Selected(); k.ID != "k-a2" {
		t.Fatalf("selected %q, want k-a2", k.ID)
	}
	// x asks first, naming the kernel; n (or esc) kills nothing.
	if cmd := f.update(runes("x")); cmd != nil {
		t.Fatal("x ran a command before it was confirmed")
	}
	mustContain(t, f.m.View(), "Kill alice/etl@local (k-a2)? Its state is lost. y/n")
	f.update(runes("n"))
	if k := f.eng.Killed(); len(k) != 0 {
		t.Fatalf("x then n killed %v", k)
	}
	mustContain(t, f.m.View(), "cancelled: nothing was done")
	f.update(runes("x"))
	f.run(t, f.update(runes("y")))
	if got := f.eng.Killed(); !slices.Equal(got, []string{"k-a2"}) {
		t.Errorf("Kill calls = %v, want [k-a2]", got)
	}
	v := f.m.View()
	mustContain(t, v, "killed alice/etl@local", "kernels 2/8")
	if l := linesWith(v, " etl "); len(l) != 1 || !strings.Contains(l[0], "dead") {
		t.Errorf("etl row = %q, want it dead", l)
	}
}

// TestOtherKernelActions: "i" interrupts the selected kernel, "X" shuts
// down the owner, "r" resets (an Execute with Reset).
func TestOtherKernelActions(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.keys(runes("j")) // alice/default
	f.run(t, f.update(runes("i")))
	if got := f.eng.Interrupted(); !slices.Equal(got, []string{"k-a1"}) {
		t.Errorf("Interrupt calls = %v", got)
	}
	f.update(runes("r"))
	if ex := f.eng.Executed(); len(ex) != 0 {
		t.Fatalf("r reset before it was confirmed: %+v", ex)
	}
	mustContain(t, f.m.View(), "Reset alice/default@local[read_file] (k-a1)? Its state is lost. y/n")
	f.run(t, f.update(runes("y")))
	if ex := f.eng.Executed(); len(ex) != 1 || !ex[0].Reset || ex[0].Owner != "alice" || ex[0].Task != "default" {
		t.Errorf("reset: Execute calls = %+v", ex)
	}
	f.update(runes("X"))
	mustContain(t, f.m.View(), "Shut down owner alice (2 kernels)? Their state is lost. y/n")
	if got := f.eng.ShutdownOwners(); len(got) != 0 {
		t.Fatalf("X shut down %v before it was confirmed", got)
	}
	f.run(t, f.update(runes("y")))
	if got := f.eng.ShutdownOwners(); !slices.Equal(got, []string{"alice"}) {
		t.Errorf("ShutdownOwner calls = %v", got)
	}
	mustContain(t, f.m.View(), "kernels 1/8")
}

// TestQuitKeys: ctrl+c and "q" quit at once only when that kills nothing;
// with kernels they ask first (y quits, n or ctrl+c stays), and ctrl+c
// interrupts when the cell runs in the editor's target; "q" quits outside
// the editor only.
func TestQuitKeys(t *testing.T) {
	mine := engine.KernelInfo{ID: "k-me", Owner: "me", Task: "default", Backend: "local", PID: 1,
		State: "running", RunningSince: t0.Add(-time.Second)}
	idle := twoOwnerKernels()[1:]
	for _, tc := range []struct {
		name      string
		kernels   []engine.KernelInfo
		keys      []tea.KeyMsg
		quits     bool
		confirm   bool
		interrupt string
		editor    string
		ask       string // the question, when not the running-cells one
	}{
		{name: "ctrl+c idle asks", kernels: idle, keys: []tea.KeyMsg{keyCtrlC}, confirm: true, ask: "Quit and kill 2 kernels? y/n"},
		{name: "ctrl+c idle y", kernels: idle, keys: []tea.KeyMsg{keyCtrlC, runes("y")}, quits: true},
		{name: "ctrl+c idle ctrl+c", kernels: idle, keys: []tea.KeyMsg{keyCtrlC, keyCtrlC}},
		{name: "ctrl+c no kernels", keys: []tea.KeyMsg{keyCtrlC}, quits: true},
		{name: "ctrl+c running asks", kernels: twoOwnerKernels(), keys: []tea.KeyMsg{keyCtrlC}, confirm: true},
		{name: "ctrl+c running y", kernels: twoOwnerKernels(), keys: []tea.KeyMsg{keyCtrlC, runes("y")}, quits: true},
		{name: "ctrl+c running n", kernels: twoOwnerKernels(), keys: []tea.KeyMsg{keyCtrlC, runes("n")}},
		{name: "ctrl+c running ctrl+c", kernels: twoOwnerKernels(), keys: []tea.KeyMsg{keyCtrlC, keyCtrlC}},
		{name: "ctrl+c running other key", kernels: twoOwnerKernels(), keys: []tea.KeyMsg{keyCtrlC, runes("x")}, confirm: true},
		{name: "ctrl+c interrupts own cell", kernels: []engine.KernelInfo{mine}, keys: []tea.KeyMsg{keyCtrlC}, interrupt: "k-me"},
		{name: "q in editor types", kernels: idle, keys: []tea.KeyMsg{keyEdit, runes("q")}, editor: "q"},
		{name: "ctrl+c in editor clears the cell", kernels: idle, keys: []tea.KeyMsg{keyEdit, runes("x=1"), keyCtrlC}},
		{name: "ctrl+c in editor clears then quits", keys: []tea.KeyMsg{keyEdit, runes("x=1"), keyCtrlC, keyCtrlC}, quits: true},
		{name: "ctrl+c in editor clears then asks", kernels: idle, keys: []tea.KeyMsg{keyEdit, runes("x=1"), keyCtrlC, keyCtrlC}, confirm: true, ask: "Quit and kill 2 kernels? y/n"},
		{name: "ctrl+c in an empty editor quits", keys: []tea.KeyMsg{keyEdit, keyCtrlC}, quits: true},
		{name: "q in kernels no kernels quits", keys: []tea.KeyMsg{runes("q")}, quits: true},
		{name: "q in kernels idle asks", kernels: idle, keys: []tea.KeyMsg{runes("q")}, confirm: true, ask: "Quit and kill 2 kernels? y/n"},
		{name: "q in kernels idle y", kernels: idle, keys: []tea.KeyMsg{runes("q"), runes("y")}, quits: true},
		{name: "q in kernels idle n", kernels: idle, keys: []tea.KeyMsg{runes("q"), runes("n")}},
		{name: "q in kernels running asks", kernels: twoOwnerKernels(), keys: []tea.KeyMsg{runes("q")}, confirm: true},
		{name: "q in events quits", keys: []tea.KeyMsg{keyTab, keyTab, keyTab, runes("q")}, quits: true},
		{name: "q in events idle asks", kernels: idle, keys: []tea.KeyMsg{keyTab, keyTab, keyTab, runes("q")}, confirm: true, ask: "Quit and kill 2 kernels?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := sized(t, fixtureOpts{kernels: tc.kernels})
			var cmd tea.Cmd
			for _, k := range tc.keys {
				cmd = f.update(k)
			}
			if tc.interrupt != "" {
				f.run(t, cmd)
				if got := f.eng.Interrupted(); !slices.Equal(got, []string{tc.interrupt}) {
					t.Errorf("Interrupt calls = %v, want [%s]", got, tc.interrupt)
				}
				cmd = nil
			}
			if got := isQuit(cmd); got != tc.quits {
				t.Errorf("quits = %v, want %v", got, tc.quits)
			}
			if asking := f.asking(); !tc.quits && asking != tc.confirm {
				t.Errorf("asking = %v, want %v", asking, tc.confirm)
			}
			v := f.m.View()
			switch {
			case tc.quits:
				if v != "" {
					t.Errorf("view after quit = %q, want empty", v)
				}
			case tc.confirm && tc.ask != "":
				mustContain(t, v, tc.ask)
			case tc.confirm:
				mustContain(t, v, "Cells are running. Quit and kill every kernel? y/n")
			default:
				mustNotContain(t, v, "Quit and kill")
			}
			if got := f.m.editor.area.Value(); got != tc.editor {
				t.Errorf("editor = %q, want %q", got, tc.editor)
			}
		})
	}
}

// TestEditorDrawnAfterEveryChange: the editor is drawn when it changes,
// not in View, so each change must show: a key typed, a cell run, a recall
// from the history, focus leaving and coming back, a new target.
func TestEditorDrawnAfterEveryChange(t *testing.T) {
	f := sized(t, fixtureOpts{})
	editor := func() string { return f.m.editor.View() }
	f.keys(keyEdit, runes("print(7*6)"))
	mustContain(t, editor(), "print(7*6)")
	f.run(t, f.update(keyCtrlR))
	if strings.Contains(editor(), "print(7*6)") {
		t.Errorf("the run cell is still drawn in the editor:\n%s", editor())
	}
	mustContain(t, editor(), "Python code; ctrl+r runs it")
	f.keys(keyCtrlP)
	mustContain(t, editor(), "print(7*6)")
	focused := strings.SplitN(editor(), "\n", 2)[0]
	f.keys(tea.KeyMsg{Type: tea.KeyShiftTab})
	if f.focused() == Pane(f.m.editor) {
		t.Fatal("shift+tab left the editor focused")
	}
	if blurred := strings.SplitN(editor(), "\n", 2)[0]; blurred == focused {
		t.Errorf("the editor's frame is drawn focused after focus left it: %q", blurred)
	}
	f.keys(keyTab)
	if f.focused() != Pane(f.m.editor) {
		t.Fatal("tab did not come back to the editor")
	}
	if back := strings.SplitN(editor(), "\n", 2)[0]; back != focused {
		t.Errorf("the editor's frame is %q with focus back, want %q", back, focused)
	}
	f.m.retarget(Target{Owner: "zed", Task: "t2", Backend: "local"})
	mustContain(t, editor(), "zed/t2")
}

// TestRunCellAndHistory: ctrl+r runs the editor's code in the default
// target (owner=User, task=default, first backend), clears the editor and
// shows the result; ctrl+p recalls the cell, ctrl+n comes back.
func TestRunCellAndHistory(t *testing.T) {
	f := sized(t, fixtureOpts{})
	f.eng.SetExecResult(&engine.Result{Status: "success", Stdout: "hello 42\n", Duration: 1500 * time.Millisecond,
		Kernel: &engine.KernelResult{ID: "k-me", ExecutionCount: 1}}, nil, "hello 42\n")
	code := "x = 42\nprint('hello', x)"
	f.keys(keyEdit)
	for i, line := range strings.Split(code, "\n") {
		if i > 0 {
			f.keys(keyEnter)
		}
		f.keys(runes(line))
	}
	if got := f.m.editor.area.Value(); got != code {
		t.Fatalf("editor = %q", got)
	}
	f.run(t, f.update(keyCtrlR)) // runCellMsg: the cell starts
	if got := f.m.editor.area.Value(); got != "" {
		t.Errorf("editor after run = %q, want empty", got)
	}
	if !uitest.WaitFor(5*time.Second, func() bool { return len(f.eng.Executed()) == 1 }) {
		t.Fatal("Execute not called")
	}
	req := f.eng.Executed()[0]
	if req.Owner != "me" || req.Task != "default" || req.Backend != "local" || req.Child != "" || len(req.Tools) != 0 || req.Code != code || req.Reset {
		t.Errorf("Execute(%+v), want me/default@local with the code", req)
	}
	f.drainInbox(t)
	for !strings.Contains(f.m.View(), "[1] success") {
		f.drainInbox(t) // the streamed output and the result may come apart
	}
	mustContain(t, f.m.View(), "[1] success 1.50s · #1", "hello 42", "Output · me/default")

	// An empty editor does not run.
	if cmd := f.update(keyCtrlR); cmd != nil {
		t.Errorf("ctrl+r on an empty editor returned a command")
	}

	f.keys(runes("draft"))
	f.keys(keyCtrlP)
	if got := f.m.editor.area.Value(); got != code {
		t.Errorf("ctrl+p recalls %q, want %q", got, code)
	}
	f.keys(keyCtrlN)
	if got := f.m.editor.area.Value(); got != "draft" {
		t.Errorf("ctrl+n restores %q, want the draft", got)
	}
	if n := len(f.eng.Executed()); n != 1 {
		t.Errorf("Execute called %d times", n)
	}
}

// TestRunCellInSelectedKernel: enter on a kernel row targets it; ctrl+r then
// runs there.
func TestRunCellInSelectedKernel(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	for range 4 {
		f.keys(runes("j")) // bob/default
	}
	f.keys(keyEnter)
	if f.focused() != Pane(f.m.editor) {
		t.Fatalf("enter: focus = %d, want the editor", f.m.focus)
	}
	mustContain(t, f.m.View(), "target bob/default@ssh://gpu1[", "Output · bob/default")
	f.keys(runes("1+1"))
	f.run(t, f.update(keyCtrlR))
	f.drainInbox(t)
	req := f.eng.Executed()[0]
	if req.Owner != "bob" || req.Backend != "ssh://gpu1" || !slices.Equal(req.Tools, []string{"read_file", "terminal"}) {
		t.Errorf("Execute(%+v), want bob's kernel", req)
	}
}

// TestEventsFilter: "/" in the events pane filters by owner (and type).
func TestEventsFilter(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	evs := []engine.Event{
		{Type: engine.EventSpawned, Time: t0, Owner: "alice", Kernel: "k-a1", Detail: "alice-spawned"},
		{Type: engine.EventEvictedCap, Time: t0, Owner: "bob", Kernel: "k-b9", Detail: "bob-evicted"},
		{Type: engine.EventReapedIdle, Time: t0, Owner: "alice", Kernel: "k-a9", Detail: "alice-reaped"},
		{Type: engine.EventEvictedCap, Time: t0, Owner: "carol", Kernel: "k-c9", Detail: "carol-evicted"},
	}
	f.update(eventBatchMsg(evs))
	all := []string{"alice-spawned", "bob-evicted", "alice-reaped", "carol-evicted"}
	mustContain(t, f.m.View(), all...)

	f.keys(keyTab, keyTab, keyTab)
	if f.focused() != Pane(f.m.evPane) {
		t.Fatal("events pane not focused")
	}
	f.keys(runes("/"))
	for _, r := range "alice" {
		f.keys(runes(string(r)))
	}
	// While typing, keys go to the filter, not to the actions.
	if f.m.quitting {
		t.Fatal("typing in the filter quit")
	}
	v := f.m.View()
	mustContain(t, v, "alice-spawned", "alice-reaped")
	mustNotContain(t, v, "bob-evicted", "carol-evicted")
	f.keys(keyEnter)
	v = f.m.View()
	mustContain(t, v, "Events · alice", "alice-spawned", "alice-reaped")
	mustNotContain(t, v, "bob-evicted")

	// Words are ANDed over owner and type.
	f.keys(runes("/"), keyEsc) // esc clears
	mustContain(t, f.m.View(), all...)
	f.keys(runes("/"))
	for _, r := range "evicted" {
		f.keys(runes(string(r)))
	}
	f.keys(keyEnter)
	v = f.m.View()
	mustContain(t, v, "bob-evicted", "carol-evicted")
	mustNotContain(t, v, "alice-spawned", "alice-reaped")

	// New events pass through the filter too.
	f.update(eventBatchMsg{{Type: engine.EventSpawned, Time: t0, Owner: "dave", Detail: "dave-spawned"},
		{Type: engine.EventEvictedCap, Time: t0, Owner: "dave", Detail: "dave-evicted"}})
	v = f.m.View()
	mustContain(t, v, "dave-evicted")
	mustNotContain(t, v, "dave-spawned")
}

// TestApprovalPromptIsModal: while a prompt is up, other keys do nothing;
// prompts are answered oldest first.
func TestApprovalPromptIsModal(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.update(eventBatchMsg{approvalEvent("req-1", "alice", "k-a1"), approvalEvent("req-2", "bob", "k-b1")})
	mustContain(t, f.m.View(), "Approval needed (2 pending)", "owner alice")
	for _, k := range []tea.KeyMsg{keyTab, runes("q"), runes("x"), runes("+")} {
		if cmd := f.update(k); cmd != nil {
			t.Errorf("%s during a prompt returned a command", k)
		}
	}
	if f.focused() != Pane(f.m.kernels) || len(f.eng.SetLimitsCalls()) != 0 {
		t.Error("keys leaked through the prompt")
	}
	f.run(t, f.update(runes("o")))
	mustContain(t, f.m.View(), "Approval needed (1 pending)", "owner bob")
	f.run(t, f.update(runes("n"))) // n denies too
	want := []uitest.Approval{{Request: "req-1", Decision: engine.ApproveOnce}, {Request: "req-2", Decision: engine.ApproveDeny}}
	if got := f.eng.Approved(); !slices.Equal(got, want) {
		t.Errorf("Approve calls = %+v, want %+v", got, want)
	}
	mustNotContain(t, f.m.View(), "Approval needed")
}

// TestApprovalDecidedElsewhereEndsItsPrompt: a request answered by another
// client (or denied at its deadline) leaves the prompt; the others stay.
func TestApprovalDecidedElsewhereEndsItsPrompt(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.update(eventBatchMsg{approvalEvent("req-1", "alice", "k-a1"), approvalEvent("req-2", "bob", "k-b1")})
	mustContain(t, f.m.View(), "Approval needed (2 pending)", "owner alice")
	decided := func(req string) engine.Event {
		return engine.Event{Type: engine.EventApprovalDecided, Time: t0, Request: req, Tool: "terminal", Detail: "denied"}
	}
	f.update(eventBatchMsg{decided("req-1")})
	v := f.m.View()
	mustContain(t, v, "Approval needed (1 pending)", "owner bob")
	mustNotContain(t, v, "owner alice")
	f.update(eventBatchMsg{decided("req-2")})
	mustNotContain(t, f.m.View(), "Approval needed")
	if got := f.eng.Approved(); len(got) != 0 {
		t.Errorf("the dashboard answered requests decided elsewhere: %+v", got)
	}
}

// TestFullHelpHasEveryKeyOnce: the full help lists each key of the panes
// and of the dashboard once.
func TestFullHelpHasEveryKeyOnce(t *testing.T) {
	f := sized(t, fixtureOpts{})
	seen := map[string]int{}
	for _, col := range f.m.fullHelp() {
		for _, b := range col {
			seen[b.Help().Key]++
		}
	}
	for _, a := range f.m.globals {
		if a.key.Enabled() && seen[a.key.Help().Key] == 0 {
			t.Errorf("the dashboard's key %q (%s) is not in the full help", a.key.Help().Key, a.key.Help().Desc)
		}
	}
	for _, p := range f.m.panes {
		for _, col := range p.FullHelp() {
			for _, b := range col {
				if seen[b.Help().Key] == 0 {
					t.Errorf("the key %q (%s) of a pane is not in the full help", b.Help().Key, b.Help().Desc)
				}
			}
		}
	}
	for k, n := range seen {
		if n > 1 {
			t.Errorf("the full help lists %q %d times", k, n)
		}
	}
}

// TestApprovalPromptShowsTheEndOfLongArgs: arguments too long for the
// prompt keep their head and their tail, at 80x24 as at 100x30.
func TestApprovalPromptShowsTheEndOfLongArgs(t *testing.T) {
	for _, size := range []tea.WindowSizeMsg{{Width: 80, Height: 24}, {Width: 100, Height: 30}} {
		f := newFixture(t, fixtureOpts{kernels: twoOwnerKernels()})
		f.update(size)
		ev := approvalEvent("req-long", "alice", "k-a1")
		// Padding by spaces is counted, not drawn.
		ev.Args, _ = json.Marshal(map[string]string{"command": "echo hi" + strings.Repeat(" ", 3000) + "; rm -rf ~"})
		f.update(eventBatchMsg{ev})
		mustContain(t, f.m.View(), `{"command":"echo hi⟪3000 spaces⟫; rm -rf ~"}`)
		// Padding by anything else: the head and the tail are shown.
		ev.Request = "req-long-2"
		ev.Args, _ = json.Marshal(map[string]string{"command": "echo hi #" + strings.Repeat("x", 3000) + "\n rm -rf ~"})
		f.update(eventBatchMsg{ev})
		f.run(t, f.update(runes("d")))
		mustContain(t, f.m.View(), `{"command":"echo hi #xxx`, "rm -rf ~", "lines not shown; deny if unsure")
	}
}

// TestHelpToggle: "?" outside the editor shows the full help; in the
// editor it is text.
func TestHelpToggle(t *testing.T) {
	f := sized(t, fixtureOpts{})
	f.keys(keyEdit, runes("?"))
	if f.m.showHelp || f.m.editor.area.Value() != "?" {
		t.Fatal("? in the editor must be typed")
	}
	// tab would indent the text now; esc leaves the editor.
	f.keys(keyEsc, runes("?"))
	if !f.m.showHelp {
		t.Fatal("? in the kernels pane did not open the help")
	}
	v := f.m.View()
	mustContain(t, v, "ctrl+n", "kill owner", "idle_exit -")
	f.keys(runes("?"))
	if f.m.showHelp {
		t.Error("? again did not close the help")
	}
}

// TestTimersFollowTheClock: the timers are computed from the stored
// timestamps and the injected clock at each View.
func TestTimersFollowTheClock(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	row := func(text string) string {
		l := linesWith(f.m.View(), text)
		if len(l) != 1 {
			t.Fatalf("rows with %q: %q", text, l)
		}
		return l[0]
	}
	if r := row(" etl "); !strings.Contains(r, "5m00s") || !strings.Contains(r, "25m00s") {
		t.Errorf("etl at t0: %q", r)
	}
	f.clock.Advance(25*time.Minute + 30*time.Second)
	if r := row(" etl "); !strings.Contains(r, "30m30s") || !strings.Contains(r, " 0s ") {
		t.Errorf("etl past idle_exit: %q (the countdown stops at 0s)", r)
	}
	if r := row(" 4101 "); !strings.Contains(r, "26m12s") {
		t.Errorf("alice/default running for 42s+25m30s: %q", r)
	}
}

// TestEventsChannelClosed: a closed event stream ends the listener without
// re-arming it.
func TestEventsChannelClosed(t *testing.T) {
	ch := make(chan engine.Event, 2)
	ch <- engine.Event{Type: engine.EventSpawned, Time: t0, Owner: "zed", Detail: "first"}
	close(ch)
	f := newFixture(t, fixtureOpts{events: ch})
	f.update(tea.WindowSizeMsg{Width: 100, Height: 30})
	msg := waitEvents(ch)()
	batch, ok := msg.(eventBatchMsg)
	if !ok || len(batch) != 1 {
		t.Fatalf("first wait = %#v", msg)
	}
	if _, ok := waitEvents(ch)().(eventsDoneMsg); !ok {
		t.Fatal("closed channel did not give eventsDoneMsg")
	}
	if cmd := f.update(eventsDoneMsg{}); cmd != nil {
		t.Error("eventsDoneMsg re-armed a waiter")
	}
}

// TestDeadRowReason: a kernel that left the registry shows as dead with the
// reason the engine gave, whichever of the snapshot and the event comes
// first.
func TestDeadRowReason(t *testing.T) {
	for _, tc := range []struct {
		name         string
		refreshFirst bool
		killedEvent  bool
	}{
		{"event first", false, false},
		{"refresh first", true, false},
		// The engine reports a kill after every eviction: the reason stays the eviction.
		{"killed after evicted", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := sized(t, fixtureOpts{kernels: fullCapKernels(), cap: 4})
			f.eng.SetKernels(afterEviction())
			if tc.refreshFirst {
				f.update(refreshNowMsg{}) // a tick between the eviction and its event
			}
			f.update(eventBatchMsg(evictionEvents()))
			if tc.killedEvent {
				f.update(eventBatchMsg{{Type: engine.EventKilled, Time: t0, Owner: "bob", Kernel: "k-b1", Detail: "evicted by the cap (pid 5120, rc 0)"}})
			}
			rows := linesWith(f.m.View(), " dead ")
			if len(rows) != 1 || !strings.Contains(rows[0], "evicted_cap: LRU position 1 of 4, cap 4") { // the rest: in the detail view
				t.Errorf("dead rows = %q, want bob's with the eviction reason", rows)
			}
		})
	}
}

// TestSelectionFollowsTheKernel: a reset gives alice/etl a new id and
// moves it up the list; the cursor stays on alice/etl, so the next x asks
// about it and not about the kernel that took its row.
func TestSelectionFollowsTheKernel(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.keys(runes("j"), runes("j"))
	if k, _ := f.m.kernels.Selected(); k.ID != "k-a2" {
		t.Fatalf("selected %q, want k-a2 (alice/etl)", k.ID)
	}
	ks := twoOwnerKernels()
	fresh := ks[1]
	fresh.ID, fresh.PID, fresh.ExecutionCount, fresh.LastUsed = "k-a9", 4199, 1, t0
	f.eng.SetKernels([]engine.KernelInfo{fresh, ks[0], ks[2]}) // etl now first among alice's
	f.update(refreshNowMsg{})
	if k, ok := f.m.kernels.Selected(); !ok || k.ID != "k-a9" {
		t.Fatalf("after the reset the cursor is on %q (%v), want the new alice/etl kernel k-a9", k.ID, ok)
	}
	f.update(runes("x"))
	mustContain(t, f.m.View(), "Kill alice/etl@local (k-a9)?")
	f.update(runes("n"))
	// Killed and gone from the listing: the cursor stays on its dead row.
	f.eng.SetKernels([]engine.KernelInfo{ks[0], ks[2]})
	f.update(refreshNowMsg{})
	if r := f.m.kernels.selectedRow(); r == nil || r.gone == nil || r.gone.info.ID != "k-a9" {
		t.Fatalf("after k-a9 went, the cursor is on %+v, want its dead row", r)
	}
	if len(f.eng.Killed()) != 0 {
		t.Fatal("something was killed")
	}
}

// TestLimitsEditIsOneChange: three [ presses and the pause after them make
// one SetLimits call with the value of the last; the pause scheduled by an
// earlier press does nothing; esc drops a pending edit.
func TestLimitsEditIsOneChange(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels(), idleExit: 30 * time.Minute, limitsPause: 20 * time.Millisecond})
	first := f.update(runes("["))
	f.update(runes("["))
	last := f.update(runes("["))
	mustContain(t, f.m.View(), "idle_exit 30m00s → 27m00s pending")
	f.run(t, first) // the first press's pause: superseded
	if calls := f.eng.SetLimitsCalls(); len(calls) != 0 {
		t.Fatalf("an earlier pause applied the edit: %+v", calls)
	}
	f.run(t, last)
	calls := f.eng.SetLimitsCalls()
	if len(calls) != 1 || calls[0].IdleExit == nil || *calls[0].IdleExit != 27*time.Minute || calls[0].MaxKernels != nil {
		t.Fatalf("SetLimits calls = %+v, want one with idle_exit 27m", calls)
	}
	mustNotContain(t, f.m.View(), "pending")
	f.update(runes("+"))
	f.update(tea.KeyMsg{Type: tea.KeyEsc})
	f.update(applyLimitsMsg{seq: f.m.pendingSeq})
	if n := len(f.eng.SetLimitsCalls()); n != 1 {
		t.Fatalf("esc did not drop the pending cap: %d calls", n)
	}
	mustContain(t, f.m.View(), "limits unchanged")
}

// TestKernelFilter: / filters by owner, task, id, backend, state and tools
// (a regexp, a literal if it does not compile), ! inverts, esc clears; the
// actions act on what the cursor shows.
func TestKernelFilter(t *testing.T) {
	for _, tc := range []struct {
		filter string
		want   []string // kernel ids listed
	}{
		{"alice", []string{"k-a1", "k-a2"}},
		{"ETL", []string{"k-a2"}},
		{"!alice", []string{"k-b1"}},
		{"gpu1", []string{"k-b1"}},
		{"^bob default", []string{"k-b1"}},
		{"running", []string{"k-a1"}},
		{"terminal", []string{"k-b1"}},
		{"k-a[12]", []string{"k-a1", "k-a2"}},
		{"(", nil}, // not a regexp: taken literally, matches nothing
		{"zzz", nil},
	} {
		t.Run(tc.filter, func(t *testing.T) {
			f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
			f.keys(runes("/"))
			for _, r := range tc.filter {
				f.keys(runes(string(r)))
			}
			f.keys(keyEnter)
			var got []string
			for _, r := range f.m.kernels.rows {
				if r.kernel != nil {
					got = append(got, r.kernel.ID)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("/%s lists %v, want %v", tc.filter, got, tc.want)
			}
			if tc.want == nil {
				mustContain(t, f.m.View(), "no match for /"+tc.filter)
			}
			f.keys(keyEsc)
			if n := len(f.m.kernels.rows); n != 5 {
				t.Errorf("after esc %d rows, want all 5", n)
			}
		})
	}
}

// TestDetailView: d opens the selected kernel's detail (and asks for its
// cells), keys other than scrolling do nothing there, esc closes it.
func TestDetailView(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.keys(runes("j"), runes("j")) // alice/etl
	f.run(t, f.update(runes("d")))
	if f.m.detail() == nil || f.m.detail().id != "k-a2" {
		t.Fatalf("d opened %+v, want the detail of k-a2", f.m.detail())
	}
	if got := f.eng.CellsAsked(); !slices.Contains(got, "k-a2") {
		t.Errorf("the detail did not ask for k-a2's cells: %v", got)
	}
	mustContain(t, f.m.View(), "Kernel k-a2", "alice/etl@local", "2 of 2 idle kernels")
	for _, k := range []string{"x", "r", "X", "+"} {
		f.update(runes(k))
	}
	if f.asking() || len(f.eng.Killed()) != 0 || f.m.pendingCap != nil {
		t.Fatal("keys leaked through the detail view")
	}
	f.update(keyEsc)
	if f.m.detail() != nil {
		t.Fatal("esc did not close the detail")
	}
	mustNotContain(t, f.m.View(), "Kernel k-a2")
}

// TestOverlaysStack: an approval that arrives over a kernel's detail takes
// the keys and the rows under the kernels; answered, it leaves the detail
// as it was. A question over the prompt takes the keys before it.
func TestOverlaysStack(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.keys(runes("j"), runes("j")) // alice/etl
	f.run(t, f.update(runes("d")))
	f.update(eventBatchMsg{approvalEvent("req-1", "alice", "k-a1")})
	v := f.m.View()
	mustContain(t, v, "Approval needed (1 pending)")
	mustNotContain(t, v, "Kernel k-a2")
	f.update(runes("j"))
	if d := f.m.detail(); d == nil || d.offset != 0 {
		t.Fatalf("a key reached the detail under the prompt: %+v", d)
	}
	f.update(keyCtrlC) // no cell of ours runs: it asks to quit, over the prompt
	mustContain(t, f.m.View(), "Quit and kill")
	f.update(runes("o")) // the question takes it: not an approval
	if len(f.eng.Approved()) != 0 || !f.asking() {
		t.Fatalf("o under a question: approved %v, question open %v", f.eng.Approved(), f.asking())
	}
	f.update(runes("n"))
	mustContain(t, f.m.View(), "Approval needed (1 pending)")
	f.run(t, f.update(runes("o")))
	if got := f.eng.Approved(); len(got) != 1 || got[0].Request != "req-1" {
		t.Fatalf("approvals %+v, want req-1 once", got)
	}
	v = f.m.View()
	mustNotContain(t, v, "Approval needed")
	mustContain(t, v, "Kernel k-a2")
}

// TestReplayKeys: outside the editor p pauses and resumes the replay, n
// steps it only while paused; in the editor both are text.
func TestReplayKeys(t *testing.T) {
	r := &fakeReplay{total: 5, speed: 1, says: []string{"", "alice starts a long job"}}
	f := sized(t, fixtureOpts{replay: r})
	// The first frame's keys work: the focus is on the list.
	f.keys(runes("n"))
	if r.steps != 0 {
		t.Fatal("n stepped a running replay")
	}
	mustContain(t, f.m.View(), "the replay runs: p pauses it, then n steps")
	f.keys(runes("p"))
	mustContain(t, f.m.View(), "REPLAY 0/5 PAUSED (p resumes, n steps)")
	f.update(runes("n"))
	f.update(runes("n"))
	if r.steps != 2 {
		t.Fatalf("two n while paused made %d steps", r.steps)
	}
	mustContain(t, f.m.View(), "REPLAY 2/5 PAUSED")
	f.update(refreshNowMsg{})
	f.update(refreshNowMsg{})
	if v := f.m.evPane.View(); strings.Count(v, "alice starts a long job") != 1 || !strings.Contains(v, "replay says") {
		t.Errorf("the second request's say is not in the events pane once:\n%s", v)
	}
	// In the editor they are text, and the header says how to reach them.
	f.keys(keyEdit, runes("p"), runes("n"))
	if !r.paused || r.steps != 2 || f.m.editor.area.Value() != "pn" {
		t.Fatalf("in the editor p and n steered the replay: %+v", r)
	}
	mustContain(t, f.m.View(), "REPLAY 2/5 PAUSED (esc, then p resumes, n steps)")
	f.keys(keyEsc, runes("p"))
	if r.paused {
		t.Fatal("p did not resume")
	}
	mustContain(t, f.m.View(), "REPLAY 2/5 (p pauses)")
}

// TestEventsFollowIndicator: scrolling up stops following and the title
// says so; new events do not move the view; G follows the end again.
func TestEventsFollowIndicator(t *testing.T) {
	f := sized(t, fixtureOpts{})
	var evs []engine.Event
	for i := range 60 {
		evs = append(evs, engine.Event{Type: engine.EventSpawned, Time: t0, Owner: fmt.Sprintf("owner-%02d", i), Kernel: "k1"})
	}
	f.update(eventBatchMsg(evs))
	f.keys(keyTab, keyTab, keyTab) // the events pane
	mustContain(t, f.m.View(), "owner-59")
	mustNotContain(t, f.m.View(), "scrolled, G follows")
	f.keys(runes("k"), runes("k"), runes("k"))
	mustContain(t, f.m.View(), "Events · scrolled, G follows")
	f.update(eventBatchMsg{{Type: engine.EventSpawned, Time: t0, Owner: "newcomer", Kernel: "k2"}})
	mustNotContain(t, f.m.View(), "newcomer")
	f.keys(runes("G"))
	v := f.m.View()
	mustContain(t, v, "newcomer")
	mustNotContain(t, v, "scrolled, G follows")
}

// TestStatusClears: a status goes from the help line after a while; an
// error stays.
func TestStatusClears(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.update(actionDoneMsg{what: "interrupted alice/default@local"})
	mustContain(t, f.m.View(), "interrupted alice/default@local")
	f.clock.Advance(statusShown + time.Second)
	mustNotContain(t, f.m.View(), "interrupted alice/default@local")
	f.update(actionDoneMsg{what: "kill", err: errors.New("host unreachable")})
	f.clock.Advance(time.Hour)
	mustContain(t, f.m.View(), "kill: host unreachable")
}

// TestEditorIndents: tab indents once there is text (an empty editor's
// tab moves on); enter keeps the indent, and adds one after a ':'.
func TestEditorIndents(t *testing.T) {
	f := sized(t, fixtureOpts{})
	f.keys(keyEdit)
	for _, r := range "def f(x):" {
		f.keys(runes(string(r)))
	}
	f.keys(keyEnter)
	for _, r := range "if x:  # a comment" {
		f.keys(runes(string(r)))
	}
	f.keys(keyEnter)
	for _, r := range "return 1" {
		f.keys(runes(string(r)))
	}
	f.keys(keyEnter, keyTab)
	for _, r := range "pass" {
		f.keys(runes(string(r)))
	}
	want := "def f(x):\n    if x:  # a comment\n        return 1\n            pass"
	if got := f.m.editor.area.Value(); got != want {
		t.Errorf("editor holds %q, want %q", got, want)
	}
	if f.focused() != Pane(f.m.editor) {
		t.Error("tab with text left the editor")
	}
	f.m.editor.area.SetValue("")
	f.keys(keyTab)
	if f.focused() != Pane(f.m.output) {
		t.Error("tab in an empty editor did not move on")
	}
}

func TestShortBackend(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"local", "local"},
		{"ssh://gpu1", "ssh://gpu1"},
		{"ssh://root@10.0.0.12", "root@1…0.0.12"},
		{"ssh://root@10.0.0.1", "root@10.0.0.1"},
		{"ssh://operator@build-server-eu-west-1", "operat…west-1"},
		{"docker://web", "docker://web"},
		{"docker://python-box", "dk:python-box"},
		{"docker://a-very-long-container", "dk:a-v…tainer"},
		{"docker-image://sandbox?memory=256m", "img:sandbox"},
		{"docker-image://sandbox:3.12?memory=1g&cpus=2", "img:sa…x:3.12"},
	} {
		if got := shortBackend(tc.in, 13); got != tc.want || len([]rune(got)) > 14 {
			t.Errorf("shortBackend(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestReasonsReadOnce: a reset kernel's row says reset, and a kill's
// reason does not repeat its type.
func TestReasonsReadOnce(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.update(eventBatchMsg{
		{Type: engine.EventReset, Time: t0, Owner: "alice", Kernel: "k-a2", Detail: "reset requested"},
		{Type: engine.EventKilled, Time: t0, Owner: "alice", Kernel: "k-a2", Detail: "killed by the operator (pid 4102, rc 0)"},
		{Type: engine.EventKilled, Time: t0, Owner: "bob", Kernel: "k-b1", Detail: "killed by the operator (pid 5120, rc 0)"},
	})
	f.eng.SetKernels(twoOwnerKernels()[:1])
	f.update(refreshNowMsg{})
	if r := f.m.kernels.gone["k-a2"]; r == nil || r.reason != "reset requested" {
		t.Errorf("k-a2's reason %+v, want the reset", r)
	}
	if r := f.m.kernels.gone["k-b1"]; r == nil || r.reason != "killed by the operator (pid 5120, rc 0)" {
		t.Errorf("k-b1's reason %+v, want the kill's words once", r)
	}
}

// TestCommandMode: : opens the command line outside the editor; tab
// completes; a bad command keeps the line open with its error; good ones
// run (kill still asks).
func TestCommandMode(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels(), cap: 8})
	typeIn := func(s string) {
		for _, r := range s {
			f.keys(runes(string(r)))
		}
	}
	f.keys(runes(":"))
	typeIn("ca")
	f.keys(keyTab)
	if got := f.commandLine().in.Value(); got != "cap " {
		t.Fatalf("tab after 'ca' gave %q", got)
	}
	typeIn("x")
	f.keys(keyEnter)
	mustContain(t, f.m.View(), `:cap needs a whole number of kernels, at least 1 (got "x")`)
	if f.commandLine() == nil || len(f.eng.SetLimitsCalls()) != 0 {
		t.Fatal("a bad :cap closed the line or changed the cap")
	}
	f.commandLine().in.SetValue("cap 3")
	f.keys(keyEnter)
	if calls := f.eng.SetLimitsCalls(); len(calls) != 1 || *calls[0].MaxKernels != 3 || f.commandLine() != nil {
		t.Fatalf(":cap 3: %+v", calls)
	}
	f.keys(runes(":"))
	typeIn("kill k-a")
	f.keys(keyTab)
	if got := f.commandLine().in.Value(); got != "kill k-a" {
		t.Errorf("tab with two k-a kernels gave %q, want the common prefix", got)
	}
	typeIn("2")
	f.keys(keyEnter)
	mustContain(t, f.m.View(), "Kill alice/etl@local (k-a2)? Its state is lost. y/n")
	if len(f.eng.Killed()) != 0 {
		t.Fatal(":kill killed before it was confirmed")
	}
	f.run(t, f.update(runes("y")))
	if got := f.eng.Killed(); !slices.Equal(got, []string{"k-a2"}) {
		t.Fatalf("killed %v", got)
	}
	f.keys(runes(":"))
	typeIn("nope")
	f.keys(keyEnter)
	mustContain(t, f.m.View(), `unknown command "nope"; commands: cap N, idle DURATION`)
	f.keys(keyEsc)
	if f.commandLine() != nil {
		t.Fatal("esc did not close the command line")
	}
	f.keys(runes(":"))
	typeIn("filter bob")
	f.keys(keyEnter)
	mustContain(t, f.m.View(), "Kernels (1 of 2) · /bob")

	// Up and down walk the commands that ran (not the failed ones), back
	// to the line being typed.
	up, down := tea.KeyMsg{Type: tea.KeyUp}, tea.KeyMsg{Type: tea.KeyDown}
	f.keys(runes(":"))
	typeIn("ca")
	for _, want := range []string{"filter bob", "kill k-a2", "cap 3", "cap 3"} {
		f.keys(up)
		if got := f.commandLine().in.Value(); got != want {
			t.Errorf("up: %q, want %q", got, want)
		}
	}
	for _, want := range []string{"kill k-a2", "filter bob", "ca", "ca"} {
		f.keys(down)
		if got := f.commandLine().in.Value(); got != want {
			t.Errorf("down: %q, want %q", got, want)
		}
	}
}

// TestExternalEditor: ctrl+e hands the cell to $EDITOR in a private file
// and takes it back; a failed editor leaves the cell as it was.
func TestExternalEditor(t *testing.T) {
	f := sized(t, fixtureOpts{})
	f.keys(keyEdit)
	f.m.editor.area.SetValue("x = 1")
	if cmd := f.update(tea.KeyMsg{Type: tea.KeyCtrlE}); cmd == nil {
		t.Fatal("ctrl+e gave no command to run the editor")
	}
	path := filepath.Join(t.TempDir(), "cell.py")
	os.WriteFile(path, []byte("x = 2\nprint(x)\n"), 0o600)
	f.update(editedMsg{path: path})
	if got := f.m.editor.area.Value(); got != "x = 2\nprint(x)" {
		t.Fatalf("after the editor the cell is %q", got)
	}
	mustContain(t, f.m.editor.View(), "print(x)") // drawn on its return, not only held
	if _, err := os.Stat(path); err == nil {
		t.Error("the cell's file was left behind")
	}
	os.WriteFile(path, []byte("lost"), 0o600)
	f.update(editedMsg{path: path, err: errors.New("exit status 1")})
	if got := f.m.editor.area.Value(); got != "x = 2\nprint(x)" {
		t.Fatalf("a failed editor changed the cell to %q", got)
	}
	mustContain(t, f.m.View(), "the editor failed, the cell is unchanged")
}

// TestMouse: a click on a kernel row selects it (and focuses the list);
// the wheel scrolls the focused pane; a click elsewhere does nothing.
func TestMouse(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	// Line 0 is the header, 1 the pane's border, 2 its column header; the
	// rows start at 3: alice, alice/default, alice/etl.
	f.update(tea.MouseMsg{X: 10, Y: 5, Button: tea.MouseButtonLeft, Action: tea.MouseActionPress})
	if k, ok := f.m.kernels.Selected(); !ok || k.ID != "k-a2" || f.focused() != Pane(f.m.kernels) {
		t.Fatalf("a click on alice/etl's row selected %+v (focus %d)", k, f.m.focus)
	}
	f.update(tea.MouseMsg{X: 10, Y: 5, Button: tea.MouseButtonWheelDown, Action: tea.MouseActionPress})
	if r := f.m.kernels.selectedRow(); r == nil || r.owner != "bob" {
		t.Fatalf("the wheel moved the cursor to %+v, want bob's row", r)
	}
	f.update(tea.MouseMsg{X: 10, Y: 25, Button: tea.MouseButtonLeft, Action: tea.MouseActionPress})
	if r := f.m.kernels.selectedRow(); r == nil || r.owner != "bob" {
		t.Fatal("a click below the list moved the cursor")
	}
}

func TestOutputWrapsBetweenWords(t *testing.T) {
	if got := wrapLine("the quick brown fox jumps", 10); !slices.Equal(got, []string{"the quick", "brown fox", "jumps"}) {
		t.Errorf("wrapLine = %q", got)
	}
	if got := wrapLine("abcdefghijklmnop", 10); !slices.Equal(got, []string{"abcdefghij", "klmnop"}) {
		t.Errorf("a long word: %q", got)
	}
	// The arguments of a tool call to approve keep every space.
	if got := hardWrapLines(`{"a":  "b c"}`, 8); !slices.Equal(got, []string{`{"a":  "`, `b c"}`}) {
		t.Errorf("hardWrapLines = %q", got)
	}
}

// TestKernelReplacedMarker: where the target's kernel changed between two
// cells, the output pane draws a rule; the kernel's note is shown whole.
func TestKernelReplacedMarker(t *testing.T) {
	f := sized(t, fixtureOpts{})
	runCell := func(res *engine.Result, want string) {
		t.Helper()
		f.eng.SetExecResult(res, nil, "")
		f.keys(keyEdit)
		f.m.editor.area.SetValue("print(1)")
		f.run(t, f.update(keyCtrlR))
		f.keys(keyEsc) // back to the kernels
		for !strings.Contains(f.m.View(), want) {
			f.drainInbox(t)
		}
	}
	runCell(&engine.Result{Status: engine.StatusSuccess, Stdout: "first\n", Kernel: &engine.KernelResult{ID: "k-one", ExecutionCount: 1}}, "first")
	mustNotContain(t, f.m.View(), "a new kernel")
	note := "state from earlier calls was lost: the kernel was evicted by the cap while idle (LRU), so variables defined before are gone"
	runCell(&engine.Result{Status: engine.StatusSuccess, Stdout: "second\n", Kernel: &engine.KernelResult{ID: "k-two", ExecutionCount: 1, StateLost: true, Note: note}}, "second")
	f.keys(keyTab, keyTab, runes("z")) // the output pane, zoomed: all of it in view
	v := f.m.View()
	mustContain(t, v, "a new kernel k-two from here: the state above is gone", "variables defined before are gone")

	// A kernel that got its parked state back: the state above is there.
	f.keys(runes("z"), keyTab) // unzoomed, back to the kernels
	runCell(&engine.Result{Status: engine.StatusSuccess, Stdout: "third\n", Kernel: &engine.KernelResult{ID: "k-three", ExecutionCount: 3, StateRestored: true,
		Note: "restored 2 names parked from kernel k-two"}}, "third")
	f.keys(keyTab, keyTab, runes("z"))
	v = f.m.View()
	mustContain(t, v, "a new kernel k-three from here, with the state above restored")
	mustNotContain(t, v, "a new kernel k-three from here: the state above is gone")
}

// TestSortKeys: s cycles task, state, idle and LRU order within each
// owner; the title says which; the cursor stays on its kernel.
func TestSortKeys(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.keys(runes("j")) // alice/default
	order := func() []string {
		var ids []string
		for _, r := range f.m.kernels.rows {
			if r.kernel != nil {
				ids = append(ids, r.kernel.ID)
			}
		}
		return ids
	}
	for _, tc := range []struct {
		title string
		want  []string
	}{
		{"by state", []string{"k-a1", "k-a2", "k-b1"}},
		{"by idle", []string{"k-a2", "k-a1", "k-b1"}}, // etl idle 5m, default used 42s ago
		{"by LRU", []string{"k-a2", "k-a1", "k-b1"}},  // the idle one first, the busy after
		{"", []string{"k-a1", "k-a2", "k-b1"}},        // back to task order
	} {
		f.keys(runes("s"))
		if got := order(); !slices.Equal(got, tc.want) {
			t.Errorf("%q: order %v, want %v", tc.title, got, tc.want)
		}
		v := f.m.View()
		if tc.title != "" {
			mustContain(t, v, "Kernels (3) · "+tc.title)
		} else {
			mustNotContain(t, v, "Kernels (3) · by")
		}
		if k, _ := f.m.kernels.Selected(); k.ID != "k-a1" {
			t.Errorf("%q: the cursor is on %s, want it to follow k-a1", tc.title, k.ID)
		}
	}
}

// TestApprovalTimeLeft: the prompt says when the call is denied unless
// answered.
func TestApprovalTimeLeft(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	ev := approvalEvent("req-1", "alice", "k-a1")
	ev.Until = t0.Add(45 * time.Second)
	f.update(eventBatchMsg{ev})
	mustContain(t, f.m.View(), "denied in 45s unless answered")
	f.clock.Advance(30 * time.Second)
	mustContain(t, f.m.View(), "denied in 15s unless answered")
}

// TestQueuedCellIsLabelledQueued: a cell waiting for its kernel says
// queued, then running once it has it.
func TestQueuedCellIsLabelledQueued(t *testing.T) {
	f := sized(t, fixtureOpts{})
	release := f.eng.QueueExecute()
	defer release()
	unblock := f.eng.BlockExecute()
	defer unblock()
	f.keys(keyEdit)
	f.m.editor.area.SetValue("print(1)")
	f.run(t, f.update(keyCtrlR))
	f.keys(keyEsc) // back to the kernels
	mustContain(t, f.m.View(), "[1] queued")
	release()
	for !strings.Contains(f.m.View(), "[1] running") {
		f.drainInbox(t)
	}
}

// TestCopyOutput: y in the output pane sends the cell's output to the
// terminal as one OSC 52 sequence, control characters dropped; scrolled
// up, it copies the cell at the top of the window; with no terminal it
// says so.
func TestCopyOutput(t *testing.T) {
	var clip bytes.Buffer
	f := sized(t, fixtureOpts{clipboard: &clip})
	runCell := func(seq int, stdout string) {
		t.Helper()
		f.eng.SetExecResult(&engine.Result{Status: engine.StatusSuccess, Stdout: stdout, Kernel: &engine.KernelResult{ID: "k-me", ExecutionCount: 1}}, nil, "")
		f.keys(keyEdit)
		f.m.editor.area.SetValue("print(1)")
		f.run(t, f.update(keyCtrlR))
		f.keys(keyEsc) // back to the kernels
		for len(f.m.output.shown) < seq || f.m.output.shown[seq-1].res == nil {
			f.drainInbox(t)
		}
	}
	decode := func() string {
		t.Helper()
		s := clip.String()
		clip.Reset()
		b64, ok := strings.CutPrefix(s, "\x1b]52;c;")
		if b64, ok = strings.CutSuffix(b64, "\x07"); !ok {
			t.Fatalf("clipboard write %q is not one OSC 52 sequence", s)
		}
		text, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			t.Fatalf("OSC 52 payload %q: %v", b64, err)
		}
		return string(text)
	}
	var first strings.Builder
	for i := range 30 {
		fmt.Fprintf(&first, "line %d\n", i)
	}
	runCell(1, first.String())
	runCell(2, "second \x1b]2;pwned\x07cell\nrm -rf /tmp/\u202ex\u200bfiles\ufeff\n")
	f.keys(keyTab, keyTab) // the output pane
	f.run(t, f.update(runes("y")))
	if got := decode(); got != "second ]2;pwnedcell\nrm -rf /tmp/xfiles\n" {
		t.Errorf("copied %q, want the last cell's output without its control, bidirectional and zero-width characters", got)
	}
	mustContain(t, f.m.View(), "copied the output of [2]")

	f.keys(keyPgUp, keyPgUp, keyPgUp, keyPgUp, keyPgUp)
	f.run(t, f.update(runes("y")))
	if got := decode(); got != first.String() {
		t.Errorf("scrolled to the top, copied %q, want the first cell's output", got)
	}

	g := sized(t, fixtureOpts{})
	g.keys(keyTab, keyTab)
	g.run(t, g.update(runes("y")))
	mustContain(t, g.m.View(), "nothing to copy")
}

// TestSaveImages: s in the output pane writes the cell's images to new
// 0600 files in the save dir, never over one that exists, and says where;
// a cell without images says so.
func TestSaveImages(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, fixtureOpts{})
	f.m.ctx.saveDir = dir
	f.update(tea.WindowSizeMsg{Width: 100, Height: 30})
	png := testPNG(t, 8, 4)
	f.showDisplays(t, engine.Display{Data: map[string]string{"text/plain": "x"}},
		engine.Display{Data: map[string]string{"image/png": png, "text/plain": "img"}})
	f.keys(keyTab, keyTab)
	for _, name := range []string{"kerneldeck-cell1-2.png", "kerneldeck-cell1-2-2.png"} {
		f.run(t, f.update(runes("s")))
		mustContain(t, f.m.View(), "saved "+filepath.Join(dir, name)[:30])
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", name, fi, err)
		}
	}
	raw, _ := base64.StdEncoding.DecodeString(png)
	if got, _ := os.ReadFile(filepath.Join(dir, "kerneldeck-cell1-2.png")); !bytes.Equal(got, raw) {
		t.Error("the saved file is not the image")
	}
}

// TestNoTwoActionsShareAKey: in each pane, and between a pane that does
// not type and the dashboard's own keys, a key does one thing (the second
// action of a key would never run).
func TestNoTwoActionsShareAKey(t *testing.T) {
	f := sized(t, fixtureOpts{})
	global := map[string]string{}
	for _, a := range f.m.globals {
		for _, k := range a.key.Keys() {
			if d, dup := global[k]; dup {
				t.Errorf("dashboard key %q does both %q and %q", k, d, a.key.Help().Desc)
			}
			global[k] = a.key.Help().Desc
		}
	}
	for name, tc := range map[string]struct {
		keys   actions
		typing bool
	}{
		"kernels": {f.m.kernels.keys, false}, "output": {f.m.output.keys, false},
		"events": {f.m.evPane.keys, false}, "editor": {f.m.editor.keys, true},
	} {
		seen := map[string]string{}
		for _, a := range tc.keys {
			for _, k := range a.key.Keys() {
				if d, dup := seen[k]; dup {
					t.Errorf("%s: key %q does both %q and %q", name, k, d, a.key.Help().Desc)
				}
				seen[k] = a.key.Help().Desc
				if d, dup := global[k]; dup && !tc.typing {
					t.Errorf("%s: key %q (%s) is the dashboard's %q too", name, k, a.key.Help().Desc, d)
				}
			}
		}
	}
}

// TestEveryActionIsInItsPanesHelp: a pane's help is made from its key
// table, so no key it acts on is missing from it.
func TestEveryActionIsInItsPanesHelp(t *testing.T) {
	f := sized(t, fixtureOpts{})
	for name, p := range map[string]struct {
		pane Pane
		keys actions
	}{
		"kernels": {f.m.kernels, f.m.kernels.keys}, "output": {f.m.output, f.m.output.keys},
		"events": {f.m.evPane, f.m.evPane.keys}, "editor": {f.m.editor, f.m.editor.keys},
	} {
		help := map[string]bool{}
		for _, col := range p.pane.FullHelp() {
			for _, b := range col {
				help[b.Help().Key] = true
			}
		}
		for _, a := range p.keys {
			if !help[a.key.Help().Key] {
				t.Errorf("%s: key %q (%s) is not in its help", name, a.key.Help().Key, a.key.Help().Desc)
			}
		}
	}
}

// TestDestructiveKeysAskFirst: every key the key map calls destructive
// asks first, in its own words, and n leaves the engine untouched; no
// other key of the kernels pane asks anything.
func TestDestructiveKeysAskFirst(t *testing.T) {
	untouched := func(t *testing.T, f *fixture) {
		t.Helper()
		if ex, k, s := f.eng.Executed(), f.eng.Killed(), f.eng.ShutdownOwners(); len(ex)+len(k)+len(s) != 0 {
			t.Errorf("engine acted: executed %v, killed %v, owners shut down %v", ex, k, s)
		}
	}
	destructive := map[string]bool{}
	km := reflect.ValueOf(DefaultKeyMap())
	for i := range km.NumField() {
		d, ok := km.Field(i).Interface().(Destructive)
		if !ok {
			continue
		}
		name := km.Type().Field(i).Name
		destructive[d.Help().Key] = true
		t.Run(name, func(t *testing.T) {
			f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
			f.keys(runes("j")) // alice/default
			if name == "DropParked" {
				f.eng.SetParked(parkedStates())
				f.m.refresh()
				for range 10 {
					if _, ok := f.m.kernels.SelectedParked(); ok {
						break
					}
					f.keys(runes("j"))
				}
			}
			if cmd := f.update(keyOf(d.Keys()[0])); cmd != nil {
				t.Fatalf("%s ran a command before it was confirmed", name)
			}
			prefix, _, _ := strings.Cut(d.Ask, "%s")
			if !f.asking() {
				t.Fatalf("%s did not ask first", name)
			}
			mustContain(t, f.m.View(), prefix, " y/n")
			f.update(runes("n"))
			untouched(t, f)
			if _, dropped := f.eng.ParkCalls(); len(dropped) != 0 {
				t.Errorf("dropped %v after n", dropped)
			}
		})
	}
	if len(destructive) < 3 {
		t.Fatalf("key map has %d destructive keys, want reset, kill and kill owner", len(destructive))
	}
	f0 := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	for _, a := range f0.m.kernels.keys {
		if destructive[a.key.Help().Key] {
			continue
		}
		f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
		f.keys(runes("j"))
		f.update(keyOf(a.key.Keys()[0]))
		if f.asking() {
			t.Errorf("%q (%s) asks, but the key map does not call it destructive", a.key.Keys()[0], a.key.Help().Desc)
		}
		untouched(t, f)
	}
}

// keyOf is the key message a binding's key name stands for.
func keyOf(name string) tea.KeyMsg {
	for _, k := range []tea.KeyMsg{keyTab, keyEnter, keyEsc, {Type: tea.KeyUp}, {Type: tea.KeyDown},
		{Type: tea.KeyPgUp}, {Type: tea.KeyPgDown}, {Type: tea.KeySpace, Runes: []rune{' '}}} {
		if k.String() == name {
			return k
		}
	}
	return runes(name)
}

// TestEngineGoneIsShown: when an attached dashboard's engine goes away,
// the header says so instead of the last cap and counts, the kernels and
// their timers leave the screen, and a cell run then says why it was not
// sent.
func TestEngineGoneIsShown(t *testing.T) {
	why := errors.New("connection reset by peer")
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels(), lost: func() error { return why }})
	f.m.where = "attached to /run/kd.sock"
	mustContain(t, f.m.View(), "kernels 3/8", "alice")
	f.update(eventsDoneMsg{})
	v := f.m.View()
	mustContain(t, v, "ENGINE GONE", "attached to /run/kd.sock", "the engine is gone (connection reset by peer)")
	for _, stale := range []string{"kernels 3/8", "alice", "reaped in", "idle_exit"} {
		if strings.Contains(v, stale) {
			t.Errorf("the screen still shows %q from the engine that is gone:\n%s", stale, v)
		}
	}
	f.clock.Advance(time.Minute)
	f.m.refresh() // a tick: nothing is asked of a gone engine
	if strings.Contains(f.m.View(), "alice") {
		t.Error("a refresh brought the gone engine's kernels back")
	}
	f.keys(keyEdit, runes("print(1)"))
	f.run(t, f.update(keyCtrlR)) // fails at once: nothing goes to the engine
	mustContain(t, f.m.View(), "failed print(1)", "not run: the engine is gone (connection reset by")
	if ex := f.eng.Executed(); len(ex) != 0 {
		t.Errorf("a cell was sent to the gone engine: %+v", ex)
	}
}

// TestReattachedShowsTheNewEngine: a dashboard whose engine came back shows
// the new engine's kernels, and cells go to it.
func TestReattachedShowsTheNewEngine(t *testing.T) {
	why := errors.New("EOF")
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels(), lost: func() error { return why }})
	f.m.reconnects = true
	f.update(eventsDoneMsg{})
	mustContain(t, f.m.View(), "ENGINE GONE, reconnecting")
	back := uitest.New(testBackends, 5, time.Hour)
	back.SetKernels([]engine.KernelInfo{{ID: "k-n1", Owner: "newcomer", Task: "default", Backend: "local", PID: 9,
		State: engine.StateIdle, LastUsed: t0}})
	events := make(chan engine.Event)
	if cmd := f.update(Reattached{Engine: back, Events: events, Lost: func() error { return nil }, Where: "attached to /run/kd.sock"}); cmd == nil {
		t.Fatal("no waiter for the new engine's events")
	}
	v := f.m.View()
	mustContain(t, v, "kernels 1/5", "newcomer", "attached to /run/kd.sock")
	for _, stale := range []string{"ENGINE GONE", "alice", "the engine is gone"} {
		if strings.Contains(v, stale) {
			t.Errorf("after the engine came back the screen still shows %q:\n%s", stale, v)
		}
	}
	f.keys(keyEdit, runes("print(2)"))
	f.run(t, f.update(keyCtrlR))
	f.drainInbox(t)
	if ex := back.Executed(); len(ex) != 1 || ex[0].Code != "print(2)" {
		t.Errorf("the cell did not go to the engine that came back: %+v", ex)
	}
	if ex := f.eng.Executed(); len(ex) != 0 {
		t.Errorf("a cell went to the old engine: %+v", ex)
	}
}

// TestBackendLabel: the output pane's title names the target's backend
// without its options.
func TestBackendLabel(t *testing.T) {
	for uri, want := range map[string]string{
		"local":                                  "@local",
		"ssh://gpu-box":                          "@ssh:gpu-box",
		"ssh://me@gpu-box:2222/":                 "@ssh:me@gpu-box:2222",
		"docker-image://python:3.12?memory=512m": "@docker-image:python:3.12",
		"":                                       "",
	} {
		if got := backendLabel(uri); got != want {
			t.Errorf("backendLabel(%q) = %q, want %q", uri, got, want)
		}
	}
}

// TestFailedCellKeepsItsCode: a cell that fails comes back to the editor
// to be fixed; one that succeeds or was interrupted does not, and a cell
// being written is never overwritten. ctrl+c clears a typed cell into the
// history, where ctrl+p finds it.
func TestFailedCellKeepsItsCode(t *testing.T) {
	f := sized(t, fixtureOpts{})
	runCell := func(status engine.CellStatus, code string, typeAfter string) {
		t.Helper()
		f.eng.SetExecResult(&engine.Result{Status: status, Kernel: &engine.KernelResult{ID: "k-me", ExecutionCount: 1}}, nil, "")
		f.keys(runes(code))
		f.run(t, f.update(keyCtrlR))
		if typeAfter != "" {
			f.keys(runes(typeAfter))
		}
		for len(f.m.runs) > 0 || len(f.m.output.shown) == 0 {
			f.drainInbox(t)
		}
	}
	f.keys(keyEdit)
	runCell(engine.StatusError, "print(1", "")
	if got := f.m.editor.area.Value(); got != "print(1" {
		t.Fatalf("after a SyntaxError the editor holds %q, want the cell's code", got)
	}
	mustContain(t, f.m.editor.View(), "print(1")
	// Back in the kernels pane, e for a new cell says the failed one waits
	// in the editor (typing would go into it).
	f.keys(keyEsc, keyEdit)
	mustContain(t, f.m.View(), "the cell that failed is back in the editor")
	f.m.editor.area.Reset()
	runCell(engine.StatusSuccess, "x = 1", "")
	if got := f.m.editor.area.Value(); got != "" {
		t.Errorf("after a success the editor holds %q", got)
	}
	runCell(engine.StatusInterrupted, "sleep()", "")
	if got := f.m.editor.area.Value(); got != "" {
		t.Errorf("after an interrupt the editor holds %q", got)
	}
	runCell(engine.StatusError, "1/0", "next")
	if got := f.m.editor.area.Value(); got != "next" {
		t.Errorf("a failed cell overwrote the cell being written: %q", got)
	}
	f.keys(keyCtrlC)
	if got := f.m.editor.area.Value(); got != "" || f.focused() != Pane(f.m.editor) {
		t.Fatalf("ctrl+c with typed code: editor %q, focus %d; want it cleared, in the editor", got, f.m.focus)
	}
	mustContain(t, f.m.View(), "cleared the cell (ctrl+p brings it back)")
	f.keys(keyCtrlP)
	if got := f.m.editor.area.Value(); got != "next" {
		t.Errorf("ctrl+p after ctrl+c brings back %q, want the cleared cell", got)
	}
}

// TestPageWholeOutput: v in the output pane writes the selected cell's
// whole output (its spill file, not the clipped result) to a private file
// for $PAGER, the kernel's escapes made visible; the result shows where
// the whole output is, wrapped, not cut.
func TestPageWholeOutput(t *testing.T) {
	spill := filepath.Join(t.TempDir(), "c1.out")
	whole := "line 0\n" + strings.Repeat("middle\n", 1000) + "evil \x1b]2;pwned\x07 last line\n"
	if err := os.WriteFile(spill, []byte(whole), 0o600); err != nil {
		t.Fatal(err)
	}
	f := sized(t, fixtureOpts{})
	f.eng.SetExecResult(&engine.Result{Status: engine.StatusSuccess, Stdout: "line 0\n[... 7000 bytes not shown ...]\nlast line\n",
		StdoutClipped: true, SpillPath: spill, Kernel: &engine.KernelResult{ID: "k-me", ExecutionCount: 1}}, nil, "")
	f.keys(keyEdit, runes("big()"))
	f.run(t, f.update(keyCtrlR))
	for len(f.m.output.shown) == 0 || f.m.output.shown[0].res == nil {
		f.drainInbox(t)
	}
	mustContain(t, f.m.View(), "clipped (v pages all of it); full output:", "c1.out")
	f.keys(keyTab) // the empty editor moves on: the output pane
	mustContain(t, f.m.View(), "v page output")
	msg, ok := f.run(t, f.update(runes("v"))).(pageReadyMsg)
	if !ok || msg.err != nil {
		t.Fatalf("v gave %#v, want the paged file", msg)
	}
	defer os.Remove(msg.path)
	fi, err := os.Stat(msg.path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("paged file %s: %v %v, want 0600", msg.path, fi, err)
	}
	data, _ := os.ReadFile(msg.path)
	got := string(data)
	if !strings.HasPrefix(got, "[1] big()\n") || strings.Count(got, "middle\n") != 1000 || !strings.Contains(got, "last line") {
		t.Errorf("paged file holds %d bytes, starts %.40q; want the whole spill after the cell's line", len(got), got)
	}
	if strings.ContainsRune(got, '\x1b') || !strings.Contains(got, "␛]2;pwned") {
		t.Errorf("the paged file keeps the kernel's raw escapes: %q", got[len(got)-40:])
	}
}

// TestEditorTabCompletes: after a word, tab asks the target's kernel and
// puts in the one match, or what several share (listing them); at a
// line's start it indents; a stale answer is dropped; without a kernel it
// says why.
func TestEditorTabCompletes(t *testing.T) {
	mine := engine.KernelInfo{ID: "k-me", Owner: "me", Task: "default", Backend: "local", PID: 1, State: engine.StateIdle}
	f := sized(t, fixtureOpts{kernels: []engine.KernelInfo{mine}})
	// tab: the editor's ask, the root's call of the engine, its answer.
	tab := func() {
		t.Helper()
		ask := f.update(keyTab)
		if ask == nil {
			t.Fatal("tab after a word asked nothing")
		}
		f.run(t, f.update(ask()))
	}
	f.keys(keyEdit, runes("x = measu"))
	f.eng.SetCompletion(engine.Completion{Start: 4, Matches: []string{"measurements"}})
	tab()
	if got := f.m.editor.area.Value(); got != "x = measurements" {
		t.Fatalf("after tab the cell is %q, want the name completed", got)
	}
	if calls := f.eng.Completed(); len(calls) != 1 || calls[0] != (uitest.CompleteCall{Kernel: "k-me", Code: "x = measu", Cursor: 9}) {
		t.Errorf("Complete calls %+v, want one in k-me at 9", calls)
	}
	f.keys(runes(".ke"))
	f.eng.SetCompletion(engine.Completion{Start: 17, Matches: []string{"keys", "kernel_size", "other"}})
	tab()
	if got := f.m.editor.area.Value(); got != "x = measurements.ke" {
		t.Errorf("two matches sharing only the typed part changed the cell to %q", got)
	}
	mustContain(t, f.m.View(), "tab: keys  kernel_size")
	// At a line's start tab indents, and asks nothing.
	f.keys(keyEnter)
	f.update(keyTab)
	if got := f.m.editor.area.Value(); got != "x = measurements.ke\n    " || len(f.eng.Completed()) != 2 {
		t.Errorf("tab at a line's start: cell %q, %d completions asked; want an indent, none", got, len(f.eng.Completed()))
	}
	// A stale answer (the cell changed since) is dropped.
	f.keys(runes("ab"))
	call := f.update(f.update(keyTab)())
	f.keys(runes("c"))
	f.eng.SetCompletion(engine.Completion{Start: 24, Matches: []string{"abs"}})
	f.run(t, call)
	if got := f.m.editor.area.Value(); got != "x = measurements.ke\n    abc" {
		t.Errorf("a stale completion changed the cell to %q", got)
	}
	// No kernel for the target: said.
	g := sized(t, fixtureOpts{})
	g.keys(keyEdit, runes("pri"))
	g.run(t, g.update(keyTab))
	mustContain(t, g.m.View(), "tab completes from the target's kernel, which has not started")
}

// TestInputPrompt: a cell's input() opens a modal line on the status line
// with the kernel's prompt as text; enter sends what was typed, ctrl+d an
// end of input; a password shows nothing; a cell that ends takes its
// question away unanswered.
func TestInputPrompt(t *testing.T) {
	f := sized(t, fixtureOpts{})
	r := &cellRun{target: Target{Owner: "me", Task: "etl"}, running: true}
	ask := func(prompt string, password bool) *inputAsk {
		a := &inputAsk{run: r, ask: engine.InputRequest{Cell: "c1", Prompt: prompt, Password: password}, reply: make(chan inputReply, 1)}
		f.update(inboxMsg{inputAskMsg{a: a}})
		return a
	}
	a := ask("name\x1b[2J? ", false)
	f.keys(runes("Ada"))
	view := f.m.View()
	mustContain(t, helpLine(view), "me/etl input() name", "? Ada")
	if strings.Contains(view, "\x1b[2J") {
		t.Error("the kernel's prompt reached the terminal as an escape sequence")
	}
	f.keys(runes("q")) // modal: a letter is typed, not a key of the dashboard
	f.keys(keyEnter)
	if got := <-a.reply; got != (inputReply{value: "Adaq"}) {
		t.Errorf("enter sent %+v, want the typed line", got)
	}
	if f.m.layers.at(layerInput) != nil {
		t.Error("the prompt is still open after its answer")
	}
	p := ask("Password: ", true)
	f.keys(runes("hunter2"))
	if view := f.m.View(); strings.Contains(view, "hunter2") || !strings.Contains(helpLine(view), "getpass() Password:") {
		t.Errorf("a password prompt shows %q", helpLine(view))
	}
	f.keys(tea.KeyMsg{Type: tea.KeyCtrlD})
	if got := <-p.reply; !got.eof {
		t.Errorf("ctrl+d sent %+v, want an end of input", got)
	}
	late := ask("never? ", false)
	f.update(inboxMsg{cellResultMsg{run: r, res: &engine.Result{Status: engine.StatusTimeout}}})
	if f.m.layers.at(layerInput) != nil || strings.Contains(helpLine(f.m.View()), "never?") {
		t.Error("the question of a cell that ended is still asked")
	}
	select {
	case got := <-late.reply:
		t.Errorf("a question of an ended cell was answered: %+v", got)
	default:
	}
}

// helpLine is the view's last line: the help line, or the status line's
// overlay.
func helpLine(view string) string {
	lines := strings.Split(strings.TrimRight(view, "\n"), "\n")
	return lines[len(lines)-1]
}

// TestPodKernels: a kernel in a pod of its own shows the pod in the
// BACKEND column, beside local and ssh kernels, and its detail says where
// the pod runs.
func TestPodKernels(t *testing.T) {
	ks := twoOwnerKernels()
	ks = append(ks, engine.KernelInfo{ID: "k-c1", Owner: "carol", Task: "default", Backend: "k8s-image://python-sandbox?namespace=agents", PID: 23,
		State: "idle", LastUsed: t0.Add(-time.Minute), ExecutionCount: 2,
		Host: backends.Place{Kind: "pod", Name: "agents/kd-carol-default-5bc92f", Node: "node-7"}})
	f := sized(t, fixtureOpts{kernels: ks})
	mustContain(t, f.m.View(), "pod:ca…5bc92f", "ssh://gpu1")
	for range 6 {
		f.keys(runes("j"))
	}
	f.run(t, f.update(runes("d")))
	if f.m.detail() == nil || f.m.detail().id != "k-c1" {
		t.Fatalf("d opened %+v, want the detail of k-c1", f.m.detail())
	}
	mustContain(t, f.m.View(), "pod agents/kd-carol-default-5bc92f on node node-7")
}

// A hibernated kernel is a greyed row of its own kind: "hibernated", how
// long it has been idle, and its detail says its next cell wakes it.
func TestHibernatedKernels(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	asleep := parkedStates()
	asleep[1].Hibernated, asleep[1].LastUsed, asleep[1].Reason = true, t0.Add(-12*time.Minute), "hibernated after idle 10m02s"
	f.eng.SetParked(asleep)
	f.m.refresh()
	v := f.m.View()
	if row := linesWith(v, "k-c0"); len(row) != 1 || !strings.Contains(row[0], "hibernated idle 12m00s") {
		t.Fatalf("carol's hibernated row: %q", row)
	}
	if row := linesWith(v, "k-a0"); len(row) != 1 || !strings.Contains(row[0], "parked     3m00s ago") {
		t.Fatalf("alice's parked row beside it: %q", row)
	}
	f.keys(runes("G"))
	for range 12 {
		f.keys(runes("j"))
	}
	if pk, ok := f.m.kernels.SelectedParked(); !ok || pk.Kernel != "k-c0" {
		t.Fatalf("the cursor is not on carol's hibernated row: %+v", pk)
	}
	if cmd := f.update(runes("d")); cmd != nil {
		f.run(t, cmd)
	}
	mustContain(t, f.m.View(), "hibernated 1h00m ago (hibernated after idle 10m02s); its key's next cell wakes it")
}

// TestParkedKernels: parked states are greyed rows under their owner (one
// with no kernel too), with their size, age and what was not saved; d
// shows what was parked; P parks the selected kernel, D drops a parked
// state once confirmed, enter writes a cell for its key; :park, :unpark
// and :drop do the same by name.
func TestParkedKernels(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.eng.SetParked(parkedStates())
	f.m.refresh()
	v := f.m.View()
	mustContain(t, v, "alice  2 kernels, 1 parked", "carol  0 kernels, 1 parked")
	row := linesWith(v, "k-a0")
	if len(row) != 1 || !strings.Contains(row[0], "parked     3m00s ago") || !strings.Contains(row[0], "12.0 MB, 3 names (2 not saved)") {
		t.Fatalf("alice's parked row: %q", row)
	}
	for range 3 {
		f.keys(runes("j"))
	}
	pk, ok := f.m.kernels.SelectedParked()
	if !ok || pk.Kernel != "k-a0" {
		t.Fatalf("the cursor is not on alice's parked row: %+v", pk)
	}
	if cmd := f.update(runes("d")); cmd != nil {
		f.run(t, cmd)
	}
	mustContain(t, f.m.View(), "parked 3m00s ago (evicted by the cap)", "df, model, np", "f (TextIOWrapper): open file", "t (Thread): thread")
	f.update(runes("d"))

	// enter writes a cell for the parked key.
	f.update(keyOf("enter"))
	if got := f.m.editor.Target(); got.Owner != "alice" || got.Task != "etl2" || got.Backend != "local" {
		t.Fatalf("enter on a parked row targets %+v", got)
	}
	f.update(keyOf("esc"))

	// D asks, then drops.
	f.update(keyOf("tab"))
	for f.focused() != Pane(f.m.kernels) {
		f.update(keyOf("tab"))
	}
	f.update(runes("D"))
	mustContain(t, f.m.View(), "Drop the parked state of alice/etl2 (parked from k-a0)? It is lost. y/n")
	f.run(t, f.update(runes("y")))
	if _, dropped := f.eng.ParkCalls(); !slices.Equal(dropped, []string{"alice/etl2"}) {
		t.Fatalf("dropped %v", dropped)
	}
	// P parks the selected kernel.
	f.m.refresh()
	for range 10 {
		f.keys(runes("k"))
	}
	f.keys(runes("j"), runes("j")) // alice/etl
	sel, ok := f.m.kernels.Selected()
	if !ok {
		t.Fatal("no kernel selected")
	}
	f.run(t, f.update(runes("P")))
	if parked, _ := f.eng.ParkCalls(); !slices.Equal(parked, []string{sel.ID}) {
		t.Fatalf("P parked %v, want [%s]", parked, sel.ID)
	}
	f.m.refresh()
	mustContain(t, f.m.View(), "alice  1 kernel, 1 parked")

	// The commands: :unpark runs the key's next cell; :drop asks; :park
	// names a kernel.
	f.update(runes(":"))
	for _, r := range "unpark carol/default" {
		f.update(runes(string(r)))
	}
	f.run(t, f.update(keyOf("enter")))
	ex := f.eng.Executed()
	if len(ex) != 1 || ex[0].Owner != "carol" || ex[0].Task != "default" || ex[0].Code != "pass" {
		t.Fatalf(":unpark executed %+v", ex)
	}
	f.update(runes(":"))
	for _, r := range "drop nobody/x" {
		f.update(runes(string(r)))
	}
	f.update(keyOf("enter"))
	mustContain(t, f.m.View(), `no parked state "nobody/x"`)
}
