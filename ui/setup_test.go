package ui

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"
	"github.com/muesli/termenv"

	"github.com/kerneldeck/kerneldeck/client"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/uitest"
	"github.com/kerneldeck/kerneldeck/themes"
)

// TestMain pins the default lipgloss renderer to the ASCII profile and a
// dark background: themes built without an explicit renderer (and the
// bubbles components, which style with the default renderer) then emit no
// escape sequences and never query the terminal, so views are plain text
// and goldens are stable on any machine.
func TestMain(m *testing.M) {
	lipgloss.SetColorProfile(termenv.Ascii)
	lipgloss.SetHasDarkBackground(true)
	os.Exit(m.Run())
}

// Both the real engine and the fake have what the dashboard needs; an
// attached engine also says when its listing is unchanged.
var (
	_ Engine           = Embedded{}
	_ Engine           = (*uitest.Engine)(nil)
	_ Engine           = (*client.Client)(nil)
	_ kernelsVersioner = (*client.Client)(nil)
	_ spareCounter     = (*client.Client)(nil)
)

// t0 is the fake clock's "now" in every test.
var t0 = time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)

var testBackends = []string{"local", "ssh://gpu1"}

// Keys as Bubble Tea delivers them.
var (
	keyTab   = tea.KeyMsg{Type: tea.KeyTab}
	keyEdit  = tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("e")}
	keyPgUp  = tea.KeyMsg{Type: tea.KeyPgUp}
	keyEnter = tea.KeyMsg{Type: tea.KeyEnter}
	keyEsc   = tea.KeyMsg{Type: tea.KeyEsc}
	keyCtrlC = tea.KeyMsg{Type: tea.KeyCtrlC}
	keyCtrlR = tea.KeyMsg{Type: tea.KeyCtrlR}
	keyCtrlP = tea.KeyMsg{Type: tea.KeyCtrlP}
	keyCtrlN = tea.KeyMsg{Type: tea.KeyCtrlN}
)

func runes(s string) tea.KeyMsg { return tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(s)} }

// twoOwnerKernels: alice has a cell running for 42s and a kernel idle for
// 5m (idle_exit 30m: reaped in 25m00s); bob has one idle kernel on the
// remote backend.
func twoOwnerKernels() []engine.KernelInfo {
	return []engine.KernelInfo{
		{ID: "k-a1", Owner: "alice", Task: "default", Backend: "local", Tools: []string{"read_file"}, PID: 4101,
			State: "running", RunningCell: "c-17", RunningSince: t0.Add(-42 * time.Second), LastUsed: t0.Add(-42 * time.Second), ExecutionCount: 7},
		{ID: "k-a2", Owner: "alice", Task: "etl", Backend: "local", PID: 4102,
			State: "idle", LastUsed: t0.Add(-5 * time.Minute), ExecutionCount: 3},
		{ID: "k-b1", Owner: "bob", Task: "default", Backend: "ssh://gpu1", Tools: []string{"read_file", "terminal"}, PID: 5120,
			State: "idle", LastUsed: t0.Add(-12*time.Minute - 30*time.Second), ExecutionCount: 1},
	}
}

// fullCapKernels: four idle kernels under a cap of four; bob/default, used
// longest ago, is next in line for LRU eviction.
func fullCapKernels() []engine.KernelInfo {
	return []engine.KernelInfo{
		{ID: "k-a1", Owner: "alice", Task: "default", Backend: "local", PID: 4101, State: "idle", LastUsed: t0.Add(-2 * time.Minute), ExecutionCount: 4},
		{ID: "k-a2", Owner: "alice", Task: "etl", Backend: "local", PID: 4102, State: "idle", LastUsed: t0.Add(-3 * time.Minute), ExecutionCount: 2},
		{ID: "k-b1", Owner: "bob", Task: "default", Backend: "ssh://gpu1", PID: 5120, State: "idle", LastUsed: t0.Add(-5 * time.Minute), ExecutionCount: 9, NextEvict: true},
		{ID: "k-c1", Owner: "carol", Task: "notebook", Backend: "local", PID: 4300, State: "idle", LastUsed: t0.Add(-1 * time.Minute), ExecutionCount: 1},
	}
}

// overCapKernels: five kernels, all running, under a cap of four (the
// engine lets the registry go over the cap rather than kill a busy kernel).
func overCapKernels() []engine.KernelInfo {
	ks := fullCapKernels()
	for i := range ks {
		ks[i].State, ks[i].NextEvict = "running", false
		ks[i].RunningSince = t0.Add(-time.Duration(10*(i+1)) * time.Second)
	}
	ks = append(ks, engine.KernelInfo{ID: "k-c2", Owner: "carol", Task: "train", Backend: "ssh://gpu1", PID: 5200,
		State: "running", Queued: 2, RunningSince: t0.Add(-3 * time.Minute), ExecutionCount: 12})
	return ks
}

func approvalEvent(req, owner, kernel string) engine.Event {
	return engine.Event{Type: engine.EventApprovalRequest, Time: t0, Owner: owner, Kernel: kernel,
		Key: owner + "/default@local[terminal]", Request: req, Tool: "terminal",
		Args: json.RawMessage(`{"command": "rm -rf /tmp/scratch", "cwd": "/home/` + owner + `"}`)}
}

// fixture is a model over a fake engine and a settable clock.
type fixture struct {
	eng   *uitest.Engine
	clock *uitest.Clock
	m     *Model
}

type fixtureOpts struct {
	kernels  []engine.KernelInfo
	cap      int
	idleExit time.Duration
	theme    *themes.Theme
	events   <-chan engine.Event
	// limitsPause is how long a cap edit waits (default an hour: tests
	// deliver the pause themselves, and goldens never see it pass).
	limitsPause time.Duration
	replay      ReplayControl
	clipboard   io.Writer
	lost        func() error
}

// fakeReplay is a replay's state as the dashboard sees it.
type fakeReplay struct {
	sent, total int
	paused      bool
	speed       float64
	steps       int
	says        []string
}

func (f *fakeReplay) State() (int, int, bool, float64) { return f.sent, f.total, f.paused, f.speed }
func (f *fakeReplay) SetPaused(p bool)                 { f.paused = p }
func (f *fakeReplay) Step()                            { f.steps++; f.sent++ }
func (f *fakeReplay) Say(i int) string {
	if i < len(f.says) {
		return f.says[i]
	}
	return ""
}

func newFixture(t testing.TB, o fixtureOpts) *fixture {
	t.Helper()
	if o.cap == 0 {
		o.cap = 8
	}
	if o.idleExit == 0 {
		o.idleExit = 30 * time.Minute
	}
	if o.theme == nil {
		o.theme = mustTheme(t, "dark")
	}
	eng := uitest.New(testBackends, o.cap, o.idleExit)
	eng.SetKernels(o.kernels)
	clock := uitest.NewClock(t0)
	if o.limitsPause == 0 {
		o.limitsPause = time.Hour
	}
	m := New(Options{Engine: eng, Events: o.events, Theme: o.theme, Now: clock.Now, User: "me", TickEvery: -1, LimitsPause: o.limitsPause, Replay: o.replay, Clipboard: o.clipboard, Lost: o.lost})
	t.Cleanup(m.Close)
	return &fixture{eng: eng, clock: clock, m: m}
}

// mustTheme builds a theme on the default renderer (ASCII in these tests).
func mustTheme(t testing.TB, name string) *themes.Theme {
	t.Helper()
	th, err := themes.New(name, themes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return th
}

// update sends msg to the model and returns the command it gave back.
func (f *fixture) update(msg tea.Msg) tea.Cmd {
	_, cmd := f.m.Update(msg)
	return cmd
}

// keys sends each key in turn; commands are dropped.
func (f *fixture) keys(ks ...tea.KeyMsg) {
	for _, k := range ks {
		f.update(k)
	}
}

// run runs cmd (which must not block for long) and feeds its message back
// to the model; it returns the message.
func (f *fixture) run(t testing.TB, cmd tea.Cmd) tea.Msg {
	t.Helper()
	if cmd == nil {
		t.Fatal("no command")
	}
	ch := make(chan tea.Msg, 1)
	go func() { ch <- cmd() }()
	select {
	case msg := <-ch:
		f.update(msg)
		return msg
	case <-time.After(5 * time.Second):
		t.Fatal("command did not return")
		return nil
	}
}

// showDisplays runs a cell from the editor whose result holds displays,
// and waits until the output pane has it.
func (f *fixture) showDisplays(t testing.TB, displays ...engine.Display) {
	t.Helper()
	f.eng.SetExecResult(&engine.Result{Status: engine.StatusSuccess, Displays: displays,
		Kernel: &engine.KernelResult{ID: "k-me", ExecutionCount: 1}}, nil, "")
	f.keys(keyEdit)
	f.m.editor.area.SetValue("show()")
	f.run(t, f.update(keyCtrlR))
	f.keys(keyEsc) // back to the kernels
	for len(f.m.output.shown) < 1 || f.m.output.shown[0].res == nil {
		f.drainInbox(t)
	}
}

// drainInbox waits for the results posted by background cells and feeds
// them to the model.
func (f *fixture) drainInbox(t testing.TB) {
	t.Helper()
	f.run(t, f.m.inbox.wait())
}

// checkFits fails unless view has at most h lines of at most w cells.
func checkFits(t testing.TB, view string, w, h int) {
	t.Helper()
	lines := strings.Split(view, "\n")
	if len(lines) > h {
		t.Errorf("%dx%d: view has %d lines", w, h, len(lines))
	}
	for i, l := range lines {
		if sw := ansi.StringWidth(l); sw > w {
			t.Errorf("%dx%d: line %d is %d cells wide: %q", w, h, i, sw, l)
		}
	}
}

// linesWith returns the lines of view that contain s.
func linesWith(view, s string) []string {
	var out []string
	for l := range strings.SplitSeq(view, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

func mustContain(t testing.TB, view string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(view, w) {
			t.Errorf("view lacks %q:\n%s", w, view)
		}
	}
}

func mustNotContain(t testing.TB, view string, unwanted ...string) {
	t.Helper()
	for _, w := range unwanted {
		if strings.Contains(view, w) {
			t.Errorf("view has %q:\n%s", w, view)
		}
	}
}

// manyKernels builds n kernels over owners owners, with long names when
// long is set; every tenth is running and the first is next to evict.
func manyKernels(n, owners int, long bool) []engine.KernelInfo {
	ks := make([]engine.KernelInfo, 0, n)
	for i := range n {
		o := i % owners
		owner := fmt.Sprintf("owner%03d", o)
		task := fmt.Sprintf("task%05d", i)
		backend := testBackends[i%2]
		tools := []string{"read_file"}
		if long {
			owner = fmt.Sprintf("owner-%03d-with-a-rather-long-name-from-an-identity-provider@example.com", o)
			task = fmt.Sprintf("a-very-long-task-name-%05d-that-never-fits", i)
			backend = "ssh://build-host-with-a-long-name.example.internal:2222"
			tools = []string{"read_file", "write_file", "terminal", "web_search", "browser", "http_request"}
		}
		k := engine.KernelInfo{ID: fmt.Sprintf("k%05d", i), Owner: owner, Task: task, Backend: backend, Tools: tools,
			PID: 10000 + i, State: "idle", LastUsed: t0.Add(-time.Duration(i%3600) * time.Second), ExecutionCount: i % 50}
		if i%10 == 0 {
			k.State, k.RunningSince, k.RunningCell = "running", t0.Add(-time.Duration(i%90)*time.Second), "c"
		}
		if i == 1 {
			k.NextEvict = true
		}
		ks = append(ks, k)
	}
	// The engine lists kernels sorted by owner.
	sortByOwner(ks)
	return ks
}

func sortByOwner(ks []engine.KernelInfo) {
	slices.SortStableFunc(ks, func(a, b engine.KernelInfo) int { return strings.Compare(a.Owner, b.Owner) })
}

func manyEvents(n int, long bool) []engine.Event {
	types := []engine.EventType{engine.EventSpawned, engine.EventCellStarted, engine.EventCellFinished,
		engine.EventEvictedCap, engine.EventReapedIdle, engine.EventEvictSkippedBusy}
	evs := make([]engine.Event, 0, n)
	for i := range n {
		owner := fmt.Sprintf("owner%03d", i%100)
		detail := fmt.Sprintf("LRU position %d of 100, cap 100, idle %s", i%100+1, short(time.Duration(i)*time.Second))
		if long {
			owner = fmt.Sprintf("owner-%03d-with-a-rather-long-name-from-an-identity-provider@example.com", i%30)
			detail = strings.Repeat("a long detail that keeps going and going ", 8)
		}
		evs = append(evs, engine.Event{Type: types[i%len(types)], Time: t0.Add(-time.Duration(n-i) * time.Second),
			Owner: owner, Kernel: fmt.Sprintf("k%05d", i), Key: owner + "/default@local", Detail: detail})
	}
	return evs
}

// asking reports whether a yes/no question is open.
func (f *fixture) asking() bool { return f.m.layers.at(layerQuestion) != nil }

// commandLine is the open : line, or nil.
func (f *fixture) commandLine() *commandLine {
	c, _ := f.m.layers.at(layerCommand).(*commandLine)
	return c
}

// focused is the pane that has the keyboard.
func (f *fixture) focused() Pane { return f.m.panes[f.m.focus] }

// parkedStates are two parked states of alice's and carol's (carol has no
// kernel).
func parkedStates() []engine.ParkedKernel {
	return []engine.ParkedKernel{
		{Owner: "alice", Task: "etl2", Backend: "local", Key: "alice/etl2@local[]", Kernel: "k-a0", Parked: t0.Add(-3 * time.Minute),
			Reason: "evicted by the cap", Bytes: 12 << 20, Names: []string{"df", "model", "np"}, ExecutionCount: 7,
			NotSaved: []engine.NotSaved{{Name: "f", Type: "TextIOWrapper", Why: "open file"}, {Name: "t", Type: "Thread", Why: "thread"}}},
		{Owner: "carol", Task: "default", Backend: "local", Key: "carol/default@local[]", Kernel: "k-c0", Parked: t0.Add(-time.Hour),
			Reason: "reaped after idle 30m00s", Bytes: 2048, Names: []string{"x"}, ExecutionCount: 2},
	}
}
