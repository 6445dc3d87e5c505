package ui

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aymanbagabas/go-osc52/v2"
	"github.com/charmbracelet/bubbles/key"
	"github.com/charmbracelet/bubbles/viewport"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/internal/imagefile"
	"github.com/kerneldeck/kerneldeck/internal/termimage"
	"github.com/kerneldeck/kerneldeck/internal/termtext"
)

// cellRun is one cell and what came of it: started here, or (foreign) by
// another client of the engine.
type cellRun struct {
	seq            int
	target         Target
	cell           string // the engine's id of it, once known
	foreign        bool
	code           string
	started        time.Time
	finished       time.Time
	running        bool
	stdout, stderr strings.Builder
	res            *engine.Result
	err            error

	// The run as display lines at width: a finished run is wrapped once;
	// while it runs, only output after the last complete line is wrapped
	// again when a chunk arrives.
	width        int
	lines        []string // the whole run, once finished
	out, errOut  wrapCache
	renderedDone bool
}

// wrapCache holds the wrapped complete lines of a growing stream.
type wrapCache struct {
	done  int // bytes of the stream wrapped into lines
	lines []string
}

// wrap returns text as display lines of width w, as wrapLines does,
// wrapping only what follows the complete lines it wrapped before.
func (c *wrapCache) wrap(text string, w int) []string {
	if c.done > len(text) {
		*c = wrapCache{} // the stream lost its head: wrap it afresh
	}
	if i := strings.LastIndexByte(text[c.done:], '\n'); i >= 0 {
		end := c.done + i
		for line := range strings.SplitSeq(text[c.done:end], "\n") {
			c.lines = append(c.lines, wrapLine(output(line), w)...)
		}
		c.done = end + 1
	}
	lines := c.lines[:len(c.lines):len(c.lines)]
	if tail := text[c.done:]; tail != "" {
		return append(lines, wrapLine(output(tail), w)...)
	}
	// Like wrapLines: trailing newlines make no lines, and nothing is one
	// empty line.
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) == 0 {
		return []string{""}
	}
	return lines
}

// maxRuns bounds the cells the dashboard remembers.
const maxRuns = 200

// OutputPane shows the cells run in the current target: status, output,
// traceback, duration and spill paths; it follows a running cell's output.
type OutputPane struct {
	pane

	target Target
	runs   []*cellRun // of every target, oldest first
	lines  []string   // of the current target, at the current width
	shown  []*cellRun // the current target's runs, as rendered
	starts []int      // the first line of each of shown
	scroll scroller
	follow bool
	keys   actions
}

func newOutputPane(ctx *Context) *OutputPane {
	p := &OutputPane{pane: pane{ctx: ctx}, follow: true, scroll: scroller{vp: viewport.New(0, 0)}}
	k := ctx.Keys
	vp := &p.scroll.vp
	p.keys = actions{
		{k.Up, run(func() tea.Cmd { vp.LineUp(1); return p.scrolled() })},
		{k.Down, run(func() tea.Cmd { vp.LineDown(1); return p.scrolled() })},
		{k.PageUp, run(func() tea.Cmd { vp.PageUp(); return p.scrolled() })},
		{k.PageDown, run(func() tea.Cmd { vp.PageDown(); return p.scrolled() })},
		{k.Follow, run(func() tea.Cmd { vp.GotoBottom(); p.follow = true; return nil })},
		{k.Copy, run(p.copySelected)},
		{k.SaveImage, run(p.saveImages)},
		{k.OpenImage, run(p.openImages)},
		{k.Page, run(p.pageSelected)},
	}
	return p
}

// maxCopy bounds what y sends: terminals drop longer OSC 52 payloads.
const maxCopy = 64 << 10

// selected is the cell y copies: the last one while following, else the
// one at the top of the scrolled window.
func (p *OutputPane) selected() *cellRun {
	if len(p.shown) == 0 {
		return nil
	}
	if p.follow {
		return p.shown[len(p.shown)-1]
	}
	top, _ := p.scroll.window()
	i, found := slices.BinarySearch(p.starts, top)
	if !found {
		i--
	}
	return p.shown[max(i, 0)]
}

// copySelected sends the selected cell's output to the terminal's
// clipboard (OSC 52), stripped of control characters: it is the kernel's
// text, and pasting it must not replay its escape sequences.
func (p *OutputPane) copySelected() tea.Cmd {
	r := p.selected()
	clip := p.ctx.clipboard
	switch {
	case r == nil:
		return func() tea.Msg { return actionDoneMsg{what: "nothing to copy: no cell ran in this target yet"} }
	case clip == nil:
		return func() tea.Msg { return actionDoneMsg{what: "copy", err: errNoClipboard} }
	}
	text := copyText(r)
	clipped := len(text) > maxCopy
	if clipped {
		text = strings.ToValidUTF8(text[:maxCopy], "")
	}
	what := fmt.Sprintf("copied the output of [%d] (%s) to the clipboard, where the terminal allows OSC 52", r.seq, english.Count(len(text), "byte"))
	if clipped {
		what = fmt.Sprintf("copied the first %d KiB of [%d]'s output to the clipboard, where the terminal allows OSC 52", maxCopy>>10, r.seq)
	}
	return func() tea.Msg {
		_, err := osc52.New(text).WriteTo(clip)
		return actionDoneMsg{what: what, err: err}
	}
}

// errNoClipboard is why y copies nothing without a terminal.
var errNoClipboard = errors.New("no terminal to copy to")

// copyText is a run's output as copied: stdout, stderr and traceback,
// with control characters other than newline and tab dropped, and the
// bidirectional and zero-width ones, which would make the pasted text
// read otherwise than it showed.
func copyText(r *cellRun) string {
	var text string
	if r.res == nil {
		text = r.stdout.String() + r.stderr.String()
	} else {
		text = r.res.Stdout + r.res.Stderr + r.res.Traceback
	}
	return strings.Map(func(c rune) rune {
		if c == '\n' || c == '\t' || (c >= 0x20 && c != 0x7f && (c < 0x80 || c > 0x9f) && !termtext.Hidden(c)) {
			return c
		}
		return -1
	}, text)
}

// scrolled follows the output again once scrolled to its end.
func (p *OutputPane) scrolled() tea.Cmd {
	p.follow = p.scroll.atEnd()
	return nil
}

// Title implements Pane.
func (p *OutputPane) Title() string {
	t := "Output · " + plain(p.target.Owner+"/"+p.target.Task+backendLabel(p.target.Backend))
	if !p.follow {
		t += " · scrolled, G follows"
	}
	return t
}

// backendLabel names a backend in a title: "@local", "@ssh:gpu-box",
// "@docker-image:python:3.12"; its options stay in the detail view.
func backendLabel(uri string) string {
	if uri == "" {
		return ""
	}
	if scheme, rest, ok := strings.Cut(uri, "://"); ok {
		rest, _, _ = strings.Cut(rest, "?")
		uri = scheme + ":" + strings.TrimSuffix(rest, "/")
	}
	return "@" + uri
}

// ShortHelp implements help.KeyMap.
func (p *OutputPane) ShortHelp() []key.Binding {
	k := p.ctx.Keys
	return []key.Binding{k.Up, k.Down, k.Follow, k.Page, k.Copy, k.SaveImage, k.Focus, k.Help, k.Quit}
}

// FullHelp implements help.KeyMap.
func (p *OutputPane) FullHelp() [][]key.Binding { return [][]key.Binding{p.keys.bindings()} }

// SetSize implements Pane.
func (p *OutputPane) SetSize(w, h int) {
	resized := w != p.width
	p.width, p.height = w, h
	p.scroll.setHeight(h - 2)
	if resized {
		p.render()
		return
	}
	p.scroll.setLines(len(p.lines), p.follow)
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

// redraw renders every run again: an image it shows was drawn.
func (p *OutputPane) redraw() {
	for _, r := range p.runs {
		if r.res != nil && len(r.res.Displays) > 0 {
			r.width = 0
		}
	}
	p.render()
}

// changed re-renders after a run of the current target got output or ended.
func (p *OutputPane) changed(r *cellRun) {
	if r.target.String() == p.target.String() {
		p.render()
	}
}

// render collects the current target's lines: finished runs from their
// cache, the running one with its new tail.
func (p *OutputPane) render() {
	w := p.width - 2
	key := p.target.String()
	var lines []string
	p.shown, p.starts = p.shown[:0], p.starts[:0]
	lastKernel := ""
	for _, r := range p.runs {
		if r.target.String() != key {
			continue
		}
		p.shown, p.starts = append(p.shown, r), append(p.starts, len(lines))
		if r.res != nil && r.res.Kernel != nil {
			// Where the target's kernel was replaced, a rule says so: the
			// cells above ran in a kernel whose state is gone, unless the
			// new one got it back (its parked state, restored).
			if id := r.res.Kernel.ID; lastKernel != "" && id != lastKernel {
				rule, style := "── a new kernel %s from here: the state above is gone ", p.ctx.Theme.Warn
				if r.res.Kernel.StateRestored {
					rule, style = "── a new kernel %s from here, with the state above restored ", p.ctx.Theme.Muted
				}
				lines = append(lines, style.Render(fit(fmt.Sprintf(rule, plain(id))+strings.Repeat("─", max(0, w)), w)))
			}
			lastKernel = r.res.Kernel.ID
		}
		lines = append(lines, p.runLines(r, w)...)
	}
	p.lines = lines
	p.scroll.setLines(len(lines), p.follow)
}

func (p *OutputPane) runLines(r *cellRun, w int) []string {
	if r.width != w {
		r.width, r.lines, r.renderedDone = w, nil, false
		r.out, r.errOut = wrapCache{}, wrapCache{}
	}
	if r.renderedDone {
		return r.lines
	}
	t := p.ctx.Theme
	head := fmt.Sprintf("[%d] ", r.seq)
	first, _, _ := strings.Cut(strings.TrimSpace(plain(r.code)), "\n")
	if r.foreign {
		first = strings.TrimSpace("(another client) " + first)
	}
	var lines []string
	switch {
	case r.running && r.cell == "" && !r.foreign:
		// Its kernel runs another cell first.
		lines = append(lines, t.StateQueued.Render(head+"queued")+" "+t.Muted.Render(first))
	case r.running:
		lines = append(lines, t.StateRunning.Render(head+"running")+" "+t.Muted.Render(first))
	case r.err != nil:
		lines = append(lines, t.Error.Render(head+"failed")+" "+t.Muted.Render(first))
	default:
		st := t.OK
		if r.res.Status != engine.StatusSuccess {
			st = t.Error
		}
		meta := " " + english.Duration(r.res.Duration)
		if n := execCount(r.res); n > 0 {
			// Another client's cell has no count here: no "#0".
			meta += fmt.Sprintf(" · #%d", n)
		}
		lines = append(lines, st.Render(head+string(r.res.Status))+t.Muted.Render(meta)+" "+t.Muted.Render(first))
	}
	if r.res == nil {
		// An empty stream is no line here either.
		if r.stdout.Len() > 0 {
			lines = append(lines, r.out.wrap(r.stdout.String(), w)...)
		}
		if r.stderr.Len() > 0 {
			for _, l := range r.errOut.wrap(r.stderr.String(), w) {
				lines = append(lines, t.Warn.Render(l))
			}
		}
	} else {
		// An empty stream is no line (wrapLines makes one empty line of it).
		if r.res.Stdout != "" {
			lines = append(lines, wrapLines(output(r.res.Stdout), w)...)
		}
		if r.res.Stderr != "" {
			for _, l := range wrapLines(output(r.res.Stderr), w) {
				lines = append(lines, t.Warn.Render(l))
			}
		}
		if r.res.Traceback != "" {
			for _, l := range wrapLines(output(r.res.Traceback), w) {
				lines = append(lines, t.Error.Render(l))
			}
		}
		for i, d := range r.res.Displays {
			lines = append(lines, displayLines(d, r.seq, i, w, p.ctx)...)
		}
		if r.res.DisplayNote != "" {
			lines = append(lines, wordWrapLines(t.Warn.Render("displays: "+plain(r.res.DisplayNote)), w)...)
		}
		if r.res.StdoutClipped || r.res.StderrClipped {
			for _, l := range wordWrapLines("clipped (v pages all of it); full output: "+plain(strings.TrimSpace(r.res.SpillPath+" "+r.res.StderrSpillPath)), w) {
				lines = append(lines, t.Muted.Render(l))
			}
		}
		if k := r.res.Kernel; k != nil && k.Note != "" {
			for _, l := range wordWrapLines("note: "+plain(k.Note), w) {
				lines = append(lines, t.Warn.Render(l))
			}
		}
		if r.res.Fallback != "" {
			lines = append(lines, t.Warn.Render("ran without a persistent kernel ("+plain(r.res.Fallback)+")"))
		}
	}
	if r.err != nil {
		lines = append(lines, wrapLines(t.Error.Render(plain(r.err.Error())), w)...)
	}
	if !r.running {
		r.lines, r.renderedDone = lines, true
		r.out, r.errOut = wrapCache{}, wrapCache{}
	}
	return lines
}

func execCount(res *engine.Result) int {
	if res.Kernel == nil {
		return 0
	}
	return res.Kernel.ExecutionCount
}

// Update scrolls.
func (p *OutputPane) Update(msg tea.Msg) tea.Cmd {
	km, ok := msg.(tea.KeyMsg)
	if !ok {
		return nil
	}
	cmd, _ := p.keys.handle(km)
	return cmd
}

// View renders the visible lines.
func (p *OutputPane) View() string {
	var lines []string
	if len(p.lines) == 0 {
		lines = []string{p.ctx.Theme.Muted.Render("no cells run in this target yet")}
	} else {
		from, to := p.scroll.window()
		lines = p.lines[from:to]
		if p.ctx.images == termimage.Sixel {
			lines = termimage.ClipSixels(lines)
		}
	}
	return p.ctx.box(p.Title(), lines, p.width, p.height, p.focused)
}

// displayLines shows display i of cell run seq: an image inline where the
// terminal draws images (ctx.images), else as a line naming its type, size
// and bytes; anything else as its text/plain (HTML included).
func displayLines(d engine.Display, seq, i, w int, ctx *Context) []string {
	t := ctx.Theme
	for _, m := range engine.ImageTypes() {
		if v, ok := d.Data[m]; ok {
			label := []string{t.Muted.Render(fit(engine.ImageLabel(m, v), w))}
			if ctx.images == termimage.Off || ctx.images == "" {
				return label
			}
			drawn, ok := ctx.drawer.get(termimage.ID(seq, i), v, w)
			switch {
			case !ok:
				return append(label, t.Muted.Render(fit("drawing…", w)))
			case drawn.err != nil:
				return append(label, t.Warn.Render(fit("not drawn: "+drawn.err.Error(), w)))
			}
			return append(label, drawn.lines...)
		}
		if path, ok := d.Spill[m]; ok {
			return []string{t.Muted.Render(fit(fmt.Sprintf("[%s, too large to keep: %s]", m, plain(path)), w))}
		}
	}
	lines := wrapLines(output(d.Data["text/plain"]), w)
	if d.Note != "" {
		lines = append(lines, t.Warn.Render(fit("display: "+plain(d.Note), w)))
	}
	return lines
}

// saveImages writes the selected cell's images into the save dir, each to
// a new 0600 file (never over an existing one), and says where.
func (p *OutputPane) saveImages() tea.Cmd {
	r, dir := p.selected(), p.ctx.saveDir
	switch {
	case r == nil || r.res == nil:
		return func() tea.Msg { return actionDoneMsg{what: "no finished cell to save images from"} }
	case dir == "":
		return func() tea.Msg { return actionDoneMsg{what: "save", err: errors.New("saving is off")} }
	}
	displays, seq := r.res.Displays, r.seq
	return func() tea.Msg {
		saved, err := imagefile.Save(dir, displays, fmt.Sprintf("kerneldeck-cell%d", seq))
		switch {
		case err != nil:
			return actionDoneMsg{what: "save image", err: err}
		case len(saved) == 0:
			return actionDoneMsg{what: fmt.Sprintf("[%d] has no image to save", seq)}
		}
		return actionDoneMsg{what: "saved " + strings.Join(saved, ", ")}
	}
}

// maxOpened bounds how many viewers o starts at once.
const maxOpened = 8

// openImages saves the selected cell's images into the private open dir
// and shows each with the system's viewer.
func (p *OutputPane) openImages() tea.Cmd {
	r, dir, open := p.selected(), p.ctx.openDir, p.ctx.open
	switch {
	case r == nil || r.res == nil:
		return func() tea.Msg { return actionDoneMsg{what: "no finished cell to open images of"} }
	case open == nil || dir == "":
		return func() tea.Msg {
			return actionDoneMsg{what: "open", err: errors.New("no image viewer here (o needs xdg-open, or open on macOS): s saves them")}
		}
	}
	displays, seq := r.res.Displays, r.seq
	return func() tea.Msg {
		if err := engine.EnsurePrivateDir(dir); err != nil {
			return actionDoneMsg{what: "open images", err: err}
		}
		saved, err := imagefile.Save(dir, displays, fmt.Sprintf("kerneldeck-cell%d", seq))
		if err != nil {
			return actionDoneMsg{what: "open images", err: err}
		}
		if len(saved) == 0 {
			return actionDoneMsg{what: fmt.Sprintf("[%d] has no image to open", seq)}
		}
		for _, path := range saved[:min(len(saved), maxOpened)] {
			if err := open(path); err != nil {
				return actionDoneMsg{what: "open " + path, err: err}
			}
		}
		return actionDoneMsg{what: "opened " + strings.Join(saved[:min(len(saved), maxOpened)], ", ")}
	}
}
