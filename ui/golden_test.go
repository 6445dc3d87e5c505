package ui

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image"
	"image/png"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/exp/golden"
	"github.com/charmbracelet/x/exp/teatest"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/uitest"
)

// The golden tests run the dashboard as a real Bubble Tea program (teatest)
// at a fixed size, with the ASCII profile (TestMain) and a fake clock, send
// it messages, quit it, and compare the final model's View() with
// testdata/TestGolden/<name>.golden (go test ./ui -run TestGolden -update
// rewrites them).
//
// Why the final model's View() and not teatest's output stream: the stream
// holds the standard renderer's frames, whose number, line diffs and cursor
// moves depend on timing (60 fps ticker); View() of the final model is a pure
// function of the model's state. Everything asynchronous (events arriving
// through the Events channel, command results) is awaited before the quit,
// and every message a test sends goes through the program's one message
// channel, so the state at the quit is deterministic.

// goldenCase is one golden scenario.
type goldenCase struct {
	name  string
	w, h  int
	opts  fixtureOpts
	theme string
	// drive sends the scenario's messages; the program quits after it.
	drive func(t *testing.T, s *session)
	// want are substrings the final view must hold (a check that the golden
	// shows what the name says, independent of -update).
	want []string
	// want80, when set, replaces want at 80 columns, where long lines are
	// wrapped or cut (TestGoldenSizes).
	want80 []string
}

// session is a running program over a fixture.
type session struct {
	*fixture
	tm     *teatest.TestModel
	events chan engine.Event
}

// waitOutput waits until the program has drawn s.
func (s *session) waitOutput(t *testing.T, str string) {
	t.Helper()
	teatest.WaitFor(t, s.tm.Output(), func(b []byte) bool { return bytes.Contains(b, []byte(str)) },
		teatest.WithDuration(5*time.Second), teatest.WithCheckInterval(5*time.Millisecond))
}

// start runs the fixture's model as a program at w×h.
func start(t *testing.T, o fixtureOpts, w, h int) *session {
	t.Helper()
	evCh := make(chan engine.Event, 64)
	o.events = evCh
	f := newFixture(t, o)
	tm := teatest.NewTestModel(t, f.m, teatest.WithInitialTermSize(w, h))
	t.Cleanup(func() { close(evCh) })
	return &session{fixture: f, tm: tm, events: evCh}
}

// finish quits the program and returns the final model's view.
func (s *session) finish(t *testing.T) string {
	t.Helper()
	if err := s.tm.Quit(); err != nil {
		t.Fatal(err)
	}
	fm, ok := s.tm.FinalModel(t, teatest.WithFinalTimeout(5*time.Second)).(*Model)
	if !ok {
		t.Fatal("final model is not *ui.Model")
	}
	return fm.View()
}

func evictionEvents() []engine.Event {
	return []engine.Event{
		{Type: engine.EventEvictedCap, Time: t0.Add(-2 * time.Second), Owner: "bob", Kernel: "k-b1", Key: "bob/default@ssh://gpu1",
			Detail: "LRU position 1 of 4, cap 4, idle 5m00s"},
		{Type: engine.EventSpawned, Time: t0.Add(-1 * time.Second), Owner: "erin", Kernel: "k-e1", Key: "erin/default@local",
			Detail: "pid 4400"},
	}
}

// afterEviction is fullCapKernels once bob's kernel was evicted for erin's.
func afterEviction() []engine.KernelInfo {
	var ks []engine.KernelInfo
	for _, k := range fullCapKernels() {
		if k.ID != "k-b1" {
			k.NextEvict = k.ID == "k-a2"
			ks = append(ks, k)
		}
	}
	ks = append(ks, engine.KernelInfo{ID: "k-e1", Owner: "erin", Task: "default", Backend: "local", PID: 4400,
		State: "running", RunningSince: t0.Add(-1 * time.Second), LastUsed: t0.Add(-1 * time.Second)})
	sortByOwner(ks)
	return ks
}

// evict replaces the fake's kernels by afterEviction and sends the events.
func evict(t *testing.T, s *session) {
	s.eng.SetKernels(afterEviction())
	for _, ev := range evictionEvents() {
		s.events <- ev
	}
	s.waitOutput(t, "k-e1")
}

func goldenCases() []goldenCase {
	return []goldenCase{
		{
			name: "empty", w: 100, h: 30,
			want: []string{"kernels 0/8", "no kernels yet", "target me/default@local", "no cells run in this target yet", "ctrl+r"},
		},
		{
			name: "empty_80x24", w: 80, h: 24,
			want: []string{"kernels 0/8", "no kernels yet", "target me/default@local"},
		},
		{
			name: "two_owners_running_and_timers", w: 100, h: 30,
			opts: fixtureOpts{kernels: twoOwnerKernels()},
			// alice/default runs for 42s; alice/etl is idle 5m00s, reaped
			// in 25m00s; bob/default idle 12m30s, reaped in 17m30s.
			want: []string{"kernels 3/8", "running 1", "▾ alice  2 kernels", "▾ bob  1 kernel ", "42s", "5m00s", "25m00s", "12m30s", "17m30s"},
		},
		{
			name: "two_owners_timers_after_65s", w: 100, h: 30,
			opts: fixtureOpts{kernels: twoOwnerKernels()},
			drive: func(t *testing.T, s *session) {
				s.clock.Advance(65 * time.Second)
				s.tm.Send(refreshNowMsg{})
			},
			// 42s+65s = 1m47s running; 5m00s+65s = 6m05s idle, reap 23m55s.
			want: []string{"1m47s", "6m05s", "23m55s", "13m35s", "16m25s"},
		},
		{
			name: "cap_full_next_lru", w: 100, h: 30,
			opts: fixtureOpts{kernels: fullCapKernels(), cap: 4},
			drive: func(t *testing.T, s *session) {
				// The kernels pane has the focus from the start: its help line.
			},
			want: []string{"kernels 4/4 FULL", "next"},
		},
		{
			name: "filter_alice", w: 100, h: 30,
			opts: fixtureOpts{kernels: twoOwnerKernels()},
			drive: func(t *testing.T, s *session) {
				s.tm.Type("/alice")
				s.tm.Send(keyEnter)
			},
			want: []string{"Kernels (2 of 3) · /alice", "/alice", "▾ alice  2 kernels"},
		},
		{
			name: "filter_no_match", w: 100, h: 30,
			opts: fixtureOpts{kernels: twoOwnerKernels()},
			drive: func(t *testing.T, s *session) {
				s.tm.Type("/k424601")
			},
			want: []string{"no match for /k424601 among 3 kernels (esc clears the filter)", "Kernels (0 of 3)"},
		},
		{
			name: "confirm_kill", w: 100, h: 30,
			opts: fixtureOpts{kernels: twoOwnerKernels()},
			drive: func(t *testing.T, s *session) {
				s.tm.Type("jjx")
			},
			want: []string{"Kill alice/etl@local (k-a2)? Its state is lost. y/n"},
		},
		{
			name: "confirm_kill_80x24", w: 80, h: 24,
			opts: fixtureOpts{kernels: twoOwnerKernels()},
			drive: func(t *testing.T, s *session) {
				s.tm.Type("jjx")
			},
			want: []string{"Kill alice/etl@local (k-a2)? Its state is lost. y/n"},
		},
		{
			name: "pending_cap", w: 100, h: 30,
			opts: fixtureOpts{kernels: twoOwnerKernels(), cap: 4},
			drive: func(t *testing.T, s *session) {
				s.tm.Type("---")
			},
			want: []string{"kernels 3/4 cap → 1 pending", "max_kernels 4 → 1 pending"},
		},
		{
			name: "detail_live", w: 100, h: 30,
			opts: fixtureOpts{kernels: fullCapKernels(), cap: 4},
			drive: func(t *testing.T, s *session) {
				s.eng.SetCells("k-b1", []engine.CellRecord{{ID: "c-1", Kernel: "k-b1", Owner: "bob", Code: "import pandas as pd\ndf = pd.read_csv('x.csv')",
					Status: engine.StatusSuccess, Started: t0.Add(-6 * time.Minute), Duration: 1994 * time.Millisecond,
					Stdout: engine.Excerpt{Head: "read 120 rows\n", Bytes: 14}}})
				s.tm.Type("jjjjd") // bob/default, next in line
				// The record's line as the detail draws it: the output pane
				// shows the cell's output ("read 120 rows") already when the
				// cursor passes the kernel, before the detail has its records.
				s.waitOutput(t, "11:54:00  bob")
			},
			want: []string{"Kernel k-b1", "bob/default@ssh://gpu1", "LRU", "1 of 4 idle kernels", "next to be evicted", "reaped in 25m00s", "1.99s", "read 120 rows"},
		},
		{
			name: "detail_evicted", w: 100, h: 30,
			opts: fixtureOpts{kernels: fullCapKernels(), cap: 4},
			drive: func(t *testing.T, s *session) {
				s.tm.Type("jjjj") // bob/default
				evict(t, s)
				s.tm.Type("d")
				s.waitOutput(t, "Kernel k-b1")
			},
			want: []string{"Kernel k-b1", "dead", "evicted_cap: LRU position 1 of 4, cap 4, idle 5m00s"},
		},
		{
			// Every column of the full help shows at the smallest size.
			name: "full_help_80x24", w: 80, h: 24,
			opts: fixtureOpts{kernels: twoOwnerKernels()},
			drive: func(t *testing.T, s *session) {
				s.tm.Type("?")
			},
			want: []string{"idle_exit -", "write a cell", "quit", "open images"},
		},
		{
			name: "replay_paused_80x24", w: 80, h: 24,
			opts: fixtureOpts{kernels: twoOwnerKernels(), replay: &fakeReplay{sent: 2, total: 9, paused: true, speed: 1}},
			want: []string{"REPLAY 2/9 PAUSED (p resumes, n steps)"},
		},
		{
			name: "display_placeholder", w: 100, h: 30,
			drive: func(t *testing.T, s *session) {
				s.eng.SetExecResult(&engine.Result{Status: engine.StatusSuccess, Stdout: "plotted\n",
					Displays: []engine.Display{
						{Data: map[string]string{"image/png": testPNG(t, 64, 48), "text/plain": "<Figure size 64x48 with 1 Axes>"}},
						{Data: map[string]string{"text/html": "<table>…</table>", "text/plain": "   sales\n0      3\n1      5"}},
					},
					Kernel: &engine.KernelResult{ID: "k-me", Backend: "local", ExecutionCount: 1}}, nil, "")
				s.tm.Send(keyEdit)
				s.tm.Type("plot()")
				s.tm.Send(keyCtrlR)
				s.waitOutput(t, "sales")
			},
			want: []string{"plotted", "[image/png 64×48, ", "sales", "0      3"},
		},
		{
			name: "zoomed_output", w: 100, h: 30,
			drive: func(t *testing.T, s *session) {
				var out strings.Builder
				for i := range 30 {
					fmt.Fprintf(&out, "line %02d of a long output\n", i)
				}
				s.eng.SetExecResult(&engine.Result{Status: engine.StatusSuccess, Stdout: out.String(),
					Kernel: &engine.KernelResult{ID: "k-me", Backend: "local", ExecutionCount: 1}}, nil, "")
				s.tm.Send(keyEdit)
				s.tm.Type("print(...)")
				s.tm.Send(keyCtrlR)
				s.waitOutput(t, "line 29")
				s.tm.Send(keyTab) // the output pane (the run cell left the editor empty)
				s.tm.Type("z")
				s.waitOutput(t, "line 10") // (line 06 too, at 100x30 and more)
			},
			want:   []string{"Output · me/default", "line 29 of a long output", "line 06"},
			want80: []string{"Output · me/default", "line 29 of a long output", "line 10"},
		},
		{
			name: "detail_evicted_80x24", w: 80, h: 24,
			opts: fixtureOpts{kernels: fullCapKernels(), cap: 4},
			drive: func(t *testing.T, s *session) {
				s.tm.Type("jjjj")
				evict(t, s)
				s.tm.Type("d")
				s.waitOutput(t, "Kernel k-b1")
			},
			want: []string{"Kernel k-b1", "dead", "evicted_cap: LRU position 1 of 4"},
		},
		{
			name: "fleet_200x60", w: 200, h: 60,
			opts: fixtureOpts{kernels: manyKernels(40, 6, false), cap: 30},
			drive: func(t *testing.T, s *session) {
				s.tm.Type("s") // by state
			},
			want: []string{"Kernels (40) · by state", "kernels 40/30 OVER CAP by 10 (evicting)"},
		},
		{
			name: "filter_no_match_80x24", w: 80, h: 24,
			opts: fixtureOpts{kernels: twoOwnerKernels()},
			drive: func(t *testing.T, s *session) {
				s.tm.Type("/k424601")
			},
			want: []string{"no match for /k424601"},
		},
		{
			name: "over_cap_all_busy", w: 100, h: 30,
			opts: fixtureOpts{kernels: overCapKernels(), cap: 4},
			// (At 100 columns the header cuts "queued 2": see the report.)
			want:   []string{"kernels 5/4 OVER CAP by 1 (all busy)", "running 5", "run+2"},
			want80: []string{"kernels 5/4 OVER CAP by 1 (all busy)", "running 5", "rows 1–5 of 8"},
		},
		{
			name: "eviction_event", w: 100, h: 30,
			opts:  fixtureOpts{kernels: fullCapKernels(), cap: 4},
			drive: evict,
			want: []string{"evicted_cap", "bob", "k-b1: LRU position 1 of 4, cap 4, idle 5m00s",
				"dead", "evicted_cap: LRU position 1 of 4", "spawned", "erin"},
		},
		{
			name: "eviction_event_80x24", w: 80, h: 24,
			opts:  fixtureOpts{kernels: fullCapKernels(), cap: 4},
			drive: evict,
			want:  []string{"evicted_cap", "LRU position 1 of 4"},
		},
		{
			name: "approval_prompt", w: 100, h: 30,
			opts: fixtureOpts{kernels: twoOwnerKernels()},
			drive: func(t *testing.T, s *session) {
				s.events <- approvalEvent("req-1", "alice", "k-a1")
				s.waitOutput(t, "Approval needed")
			},
			want: []string{"Approve tool call", "Approval needed (1 pending)", "owner alice (kernel k-a1) wants to call terminal",
				`"command": "rm -rf /tmp/scratch"`, "o approve once", "a always for this owner", "d deny"},
		},
		{
			// A cell's input() asks on the status line, with the keys that
			// answer it in place of the help.
			name: "input_prompt", w: 100, h: 30,
			opts: fixtureOpts{kernels: twoOwnerKernels()},
			drive: func(t *testing.T, s *session) {
				r := &cellRun{target: Target{Owner: "alice", Task: "etl"}, running: true}
				s.tm.Send(inboxMsg{inputAskMsg{a: &inputAsk{run: r, ask: engine.InputRequest{Cell: "c1", Prompt: "Continue with the load? [y/N] "},
					reply: make(chan inputReply, 1)}}})
				s.waitOutput(t, "Continue with")
			},
			want: []string{"alice/etl input() Continue with the load? [y/N]"},
		},
	}
}

func TestGolden(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			s := start(t, tc.opts, tc.w, tc.h)
			if tc.drive != nil {
				tc.drive(t, s)
			}
			view := s.finish(t)
			checkGolden(t, view, tc.w, tc.h)
			mustContain(t, view, tc.want...)
		})
	}
}

// TestGoldenSizes renders every scenario drawn at 100x30 also at the
// smallest supported window (80x24) and a large one (200x60): nothing may
// be cut that the scenario is about, and nothing may spill.
func TestGoldenSizes(t *testing.T) {
	sizes := []struct{ w, h int }{{80, 24}, {200, 60}}
	for _, tc := range goldenCases() {
		if tc.w != 100 || tc.h != 30 || slices.ContainsFunc(goldenCases(), func(c goldenCase) bool { return c.name == tc.name+"_80x24" }) {
			continue // drawn at 80x24 by a case of its own
		}
		for _, sz := range sizes {
			t.Run(fmt.Sprintf("%s_%dx%d", tc.name, sz.w, sz.h), func(t *testing.T) {
				s := start(t, tc.opts, sz.w, sz.h)
				if tc.drive != nil {
					tc.drive(t, s)
				}
				view := s.finish(t)
				checkGolden(t, view, sz.w, sz.h)
				want := tc.want
				if sz.w < 100 && tc.want80 != nil {
					want = tc.want80
				}
				mustContain(t, view, want...)
			})
		}
	}
}

// TestGoldenThemes renders the same busy dashboard (kernels focused, an
// eviction in the events) in each theme. With the ASCII profile the
// colours are gone: dark and light look alike, high-contrast has its own
// border shapes. TestThemesDifferInColour checks the colours.
func TestGoldenThemes(t *testing.T) {
	for _, name := range []string{"dark", "light", "high-contrast"} {
		t.Run(name, func(t *testing.T) {
			s := start(t, fixtureOpts{kernels: fullCapKernels(), cap: 4, theme: mustTheme(t, name)}, 100, 30)
			evict(t, s)
			view := s.finish(t)
			checkGolden(t, view, 100, 30)
			mustContain(t, view, "kernels 4/4 FULL", "evicted_cap")
		})
	}
}

// checkGolden checks the frame (plain text, within the window) and compares
// it with the golden file.
func checkGolden(t *testing.T, view string, w, h int) {
	t.Helper()
	if strings.Contains(view, "\x1b") {
		t.Errorf("view has escape sequences under the ASCII profile: %q", view)
	}
	checkFits(t, view, w, h)
	if n := len(strings.Split(view, "\n")); n != h {
		t.Errorf("view has %d lines, want the window's %d", n, h)
	}
	golden.RequireEqual(t, []byte(view))
}

// TestApprovalKeysCallApprove answers the prompt in a running program: "o"
// approves once, "a" always, "d" denies; the prompt closes and the status
// line says what was decided.
func TestApprovalKeysCallApprove(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want engine.Decision
	}{
		{"o", engine.ApproveOnce},
		{"a", engine.ApproveAlways},
		{"d", engine.ApproveDeny},
	} {
		t.Run(tc.key, func(t *testing.T) {
			s := start(t, fixtureOpts{kernels: twoOwnerKernels()}, 100, 30)
			s.events <- approvalEvent("req-7", "alice", "k-a1")
			s.waitOutput(t, "Approval needed")
			s.tm.Type(tc.key)
			if !uitest.WaitFor(5*time.Second, func() bool { return len(s.eng.Approved()) > 0 }) {
				t.Fatal("Approve was not called")
			}
			s.waitOutput(t, string(tc.want)+" terminal for alice")
			view := s.finish(t)
			want := []uitest.Approval{{Request: "req-7", Decision: tc.want}}
			if got := s.eng.Approved(); len(got) != 1 || got[0] != want[0] {
				t.Errorf("Approve calls = %+v, want %+v", got, want)
			}
			mustNotContain(t, view, "Approval needed")
			mustContain(t, view, string(tc.want)+" terminal for alice", "target me/default@local")
		})
	}
}

// testPNG is a w×h grey PNG, base64-encoded as a display carries it.
func testPNG(t *testing.T, w, h int) string {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}
