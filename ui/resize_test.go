package ui

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/ansi"

	"github.com/kerneldeck/kerneldeck/engine"
)

var testSizes = []struct{ w, h int }{
	{80, 24}, {60, 20}, {120, 40}, {200, 60}, {40, 12}, {20, 8}, {100, 30}, {10, 4}, {1, 1},
}

// crowded is a dashboard with many kernels, long owner, task, backend and
// tool names, long event details and a cell with long output.
func crowded(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t, fixtureOpts{kernels: manyKernels(300, 30, true), cap: 250})
	f.update(eventBatchMsg(manyEvents(120, true)))
	long := strings.Repeat("x", 500)
	f.eng.SetExecResult(&engine.Result{Status: "error", Stdout: strings.Repeat("a fairly long line of output "+long+"\n", 50),
		Stderr: "warning: " + long, Traceback: "Traceback (most recent call last):\n  " + long + "\nValueError: " + long,
		StdoutClipped: true, SpillPath: "/tmp/kerneldeck/spill/" + long,
		Kernel: &engine.KernelResult{ExecutionCount: 3, Note: "state lost: " + long}}, nil, "")
	f.keys(keyEdit, runes("print('"+long+"')"))
	f.run(t, f.update(keyCtrlR))
	f.keys(keyEsc) // back to the kernels
	f.drainInbox(t)
	return f
}

func bigApproval() engine.Event {
	args := map[string]any{"command": strings.Repeat("echo hello world; ", 200), "env": map[string]string{"A": strings.Repeat("é漢", 300)}}
	raw, _ := json.MarshalIndent(args, "", "  ")
	ev := approvalEvent("req-big", strings.Repeat("owner-with-a-long-name-", 6), "k00001")
	ev.Args = raw
	return ev
}

// TestViewFitsWindow: after a WindowSizeMsg the view has at most Height
// lines of at most Width cells, whatever is on screen.
func TestViewFitsWindow(t *testing.T) {
	variants := []struct {
		name  string
		setup func(f *fixture)
	}{
		{"crowded", func(f *fixture) {}},
		{"approval_pending", func(f *fixture) { f.update(eventBatchMsg{bigApproval(), bigApproval()}) }},
		{"help_expanded", func(f *fixture) { f.keys(keyTab, runes("?")) }},
		{"events_filter", func(f *fixture) { f.keys(keyTab, keyTab, keyTab, runes("/"), runes("owner-001")) }},
		{"target_form", func(f *fixture) { f.keys(tea.KeyMsg{Type: tea.KeyCtrlT}) }},
		{"confirm_quit", func(f *fixture) { f.keys(keyTab, runes("q")) }},
		{"kernels_scrolled", func(f *fixture) {
			f.keys(keyTab)
			for range 150 {
				f.keys(runes("j"))
			}
		}},
	}
	for _, v := range variants {
		for _, sz := range testSizes {
			t.Run(fmt.Sprintf("%s/%dx%d", v.name, sz.w, sz.h), func(t *testing.T) {
				f := crowded(t)
				v.setup(f)
				f.update(tea.WindowSizeMsg{Width: sz.w, Height: sz.h})
				view := f.m.View()
				checkFits(t, view, sz.w, sz.h)
				// From 40x12 up the panes fill the window. The full help
				// reserves 6 lines; when it is too narrow for the column
				// of 6 keys it has 5, and the view is a line short.
				if sz.w >= 40 && sz.h >= 12 {
					n, want := len(strings.Split(view, "\n")), sz.h
					if v.name == "help_expanded" && n == want-1 {
						n = want
					}
					if n != want {
						t.Errorf("view has %d lines, want the window's %d", n, want)
					}
				}
			})
		}
	}
}

// TestViewFitsAfterResize: shrinking (and growing again) relayouts every
// pane; nothing from the bigger layout is drawn past the smaller window.
func TestViewFitsAfterResize(t *testing.T) {
	for _, seq := range [][]tea.WindowSizeMsg{
		{{Width: 200, Height: 60}, {Width: 20, Height: 8}},
		{{Width: 200, Height: 60}, {Width: 80, Height: 24}},
		{{Width: 20, Height: 8}, {Width: 200, Height: 60}, {Width: 40, Height: 12}},
		{{Width: 120, Height: 40}, {Width: 60, Height: 20}, {Width: 120, Height: 40}},
	} {
		var names []string
		for _, s := range seq {
			names = append(names, fmt.Sprintf("%dx%d", s.Width, s.Height))
		}
		t.Run(strings.Join(names, "-"), func(t *testing.T) {
			f := crowded(t)
			f.update(eventBatchMsg{bigApproval()})
			f.keys(keyTab) // the prompt is modal: tab is swallowed
			for _, s := range seq {
				f.update(s)
				checkFits(t, f.m.View(), s.Width, s.Height)
			}
			// Answer the prompt, open the help and check again.
			f.run(t, f.update(runes("d")))
			f.keys(keyTab, runes("?"))
			last := seq[len(seq)-1]
			checkFits(t, f.m.View(), last.Width, last.Height)
			f.update(seq[0])
			checkFits(t, f.m.View(), seq[0].Width, seq[0].Height)
		})
	}
}

// TestViewBeforeSize: before the first WindowSizeMsg there is nothing to
// draw into.
func TestViewBeforeSize(t *testing.T) {
	f := newFixture(t, fixtureOpts{kernels: twoOwnerKernels()})
	if v := f.m.View(); v != "" {
		t.Errorf("view before any size = %q", v)
	}
}

// TestFooterKeepsHelp: at every width the key-hint line fits, and outside
// the editor (where ? is typed) it ends with "? help": entries that do not
// fit are cut before it, with an ellipsis.
func TestFooterKeepsHelp(t *testing.T) {
	for _, w := range []int{60, 80, 100, 120, 200} {
		f := newFixture(t, fixtureOpts{kernels: twoOwnerKernels()})
		f.update(tea.WindowSizeMsg{Width: w, Height: 30})
		for pane := range 4 {
			lines := strings.Split(f.m.View(), "\n")
			foot := strings.TrimRight(lines[len(lines)-1], " ")
			if sw := ansi.StringWidth(foot); sw > w {
				t.Errorf("width %d, pane %d: footer is %d cells: %q", w, pane, sw, foot)
			}
			if f.focused() != Pane(f.m.editor) && !strings.HasSuffix(foot, "? help") {
				t.Errorf("width %d, pane %d: footer %q does not end with ? help", w, pane, foot)
			}
			if strings.Contains(foot, "…") && !strings.Contains(foot, " … ") && !strings.HasSuffix(foot, " …") {
				t.Errorf("width %d, pane %d: footer %q cut mid-entry", w, pane, foot)
			}
			f.update(keyTab)
		}
	}
}
