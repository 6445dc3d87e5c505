package ui

import (
	"fmt"
	"strings"
	"time"

	"github.com/charmbracelet/bubbles/key"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
)

// cellRun is one cell started from the dashboard and what came of it.
type cellRun struct {
	seq            int
	target         Target
	code           string
	started        time.Time
	finished       time.Time
	running        bool
	stdout, stderr strings.Builder
	res            *engine.Result
	err            error
}

// maxRuns bounds the cells the dashboard remembers.
const maxRuns = 200

// OutputPane shows the cells run in the current target: status, output,
// traceback, duration and spill paths; it follows a running cell's output.
type OutputPane struct {
	ctx           *Context
	width, height int
	focused       bool

	target Target
	runs   []*cellRun // of every target, oldest first
	lines  []string   // rendered for the current target and width
	offset int
	follow bool
}

func newOutputPane(ctx *Context) *OutputPane { return &OutputPane{ctx: ctx, follow: true} }

// SetSize sets the pane's outer size.
func (p *OutputPane) SetSize(w, h int) {
	if w != p.width {
		p.width, p.height = w, h
		p.render()
		return
	}
	p.width, p.height = w, h
}

// setTarget shows the cells of t.
func (p *OutputPane) setTarget(t Target) {
	if t.String() != p.target.String() {
		p.target, p.follow = t, true
		p.render()
	}
}

func (p *OutputPane) add(r *cellRun) {
	p.runs = append(p.runs, r)
	if len(p.runs) > maxRuns {
		p.runs = p.runs[len(p.runs)-maxRuns:]
	}
	p.follow = true
	p.render()
}

// changed re-renders after a run of the current target got output or ended.
func (p *OutputPane) changed(r *cellRun) {
	if r.target.String() == p.target.String() {
		p.render()
	}
}

func (p *OutputPane) render() {
	w := p.width - 2
	t := p.ctx.Theme
	var lines []string
	key := p.target.String()
	for _, r := range p.runs {
		if r.target.String() != key {
			continue
		}
		head := fmt.Sprintf("[%d] ", r.seq)
		first, _, _ := strings.Cut(strings.TrimSpace(r.code), "\n")
		switch {
		case r.running:
			lines = append(lines, t.StateRunning.Render(head+"running")+" "+t.Muted.Render(first))
		case r.err != nil:
			lines = append(lines, t.Error.Render(head+"failed")+" "+t.Muted.Render(first))
		default:
			st := t.OK
			if r.res.Status != "success" {
				st = t.Error
			}
			lines = append(lines, st.Render(head+r.res.Status)+t.Muted.Render(fmt.Sprintf(" %s · #%d", r.res.Duration.Round(time.Millisecond), execCount(r.res)))+" "+t.Muted.Render(first))
		}
		out, errOut := r.stdout.String(), r.stderr.String()
		if r.res != nil {
			out, errOut = r.res.Stdout, r.res.Stderr
		}
		lines = append(lines, wrapLines(out, w)...)
		for _, l := range wrapLines(errOut, w) {
			lines = append(lines, t.Warn.Render(l))
		}
		if r.res != nil {
			for _, l := range wrapLines(r.res.Traceback, w) {
				lines = append(lines, t.Error.Render(l))
			}
			if r.res.StdoutClipped || r.res.StderrClipped {
				lines = append(lines, t.Muted.Render("clipped; full output: "+strings.TrimSpace(r.res.SpillPath+" "+r.res.StderrSpillPath)))
			}
			if k := r.res.Kernel; k != nil && k.Note != "" {
				lines = append(lines, t.Warn.Render("note: "+k.Note))
			}
			if r.res.Fallback != "" {
				lines = append(lines, t.Warn.Render("ran without a persistent kernel ("+r.res.Fallback+")"))
			}
		}
		if r.err != nil {
			lines = append(lines, wrapLines(t.Error.Render(r.err.Error()), w)...)
		}
	}
	p.lines = lines
}

func execCount(res *engine.Result) int {
	if res.Kernel == nil {
		return 0
	}
	return res.Kernel.ExecutionCount
}

// Update scrolls.
func (p *OutputPane) Update(msg tea.Msg) (Component, tea.Cmd) {
	km, ok := msg.(tea.KeyMsg)
	if !ok {
		return p, nil
	}
	keys := p.ctx.Keys
	page := max(1, p.height-2)
	switch {
	case key.Matches(km, keys.Up):
		p.offset--
	case key.Matches(km, keys.Down):
		p.offset++
	case key.Matches(km, keys.PageUp):
		p.offset -= page
	case key.Matches(km, keys.PageDown):
		p.offset += page
	default:
		return p, nil
	}
	inner := max(0, p.height-2)
	p.offset = min(max(p.offset, 0), max(0, len(p.lines)-inner))
	p.follow = p.offset >= len(p.lines)-inner
	return p, nil
}

// View renders the visible lines.
func (p *OutputPane) View() string {
	inner := max(0, p.height-2)
	if p.follow {
		p.offset = max(0, len(p.lines)-inner)
	}
	end := min(len(p.lines), p.offset+inner)
	var lines []string
	if p.offset < end {
		lines = p.lines[p.offset:end]
	}
	if len(p.lines) == 0 {
		lines = []string{p.ctx.Theme.Muted.Render("no cells run in this target yet")}
	}
	return p.ctx.box("Output · "+p.target.Owner+"/"+p.target.Task, lines, p.width, p.height, p.focused)
}
