package ui

import (
	"strings"

	"github.com/charmbracelet/bubbles/key"
	"github.com/charmbracelet/bubbles/textinput"
	"github.com/charmbracelet/bubbles/viewport"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/termtext"
)

// maxEvents bounds the events the pane keeps.
const maxEvents = 2000

// eventDetailLines is how many lines one event's detail may wrap onto, so
// the reason for an eviction is never cut.
const eventDetailLines = 3

// EventsPane is the live event stream, newest at the bottom, with a filter
// on owner and type ("/").
type EventsPane struct {
	pane

	events []engine.Event
	// chunks are the events drawn at width (nil: not drawn yet); shown
	// indexes the events that pass the filter.
	chunks   [][]string
	drawnAt  int
	shown    []int
	filter   textinput.Model
	editing  bool
	filterBy string
	lines    []string // the shown events, drawn
	scroll   scroller
	follow   bool
	keys     actions
	editKeys actions
}

func newEventsPane(ctx *Context) *EventsPane {
	f := textinput.New()
	f.Prompt = "/"
	f.Placeholder = "owner or type, e.g. alice evicted"
	p := &EventsPane{pane: pane{ctx: ctx}, filter: f, follow: true, scroll: scroller{vp: viewport.New(0, 0)}}
	k := ctx.Keys
	vp := &p.scroll.vp
	p.keys = actions{
		{k.Filter, run(func() tea.Cmd { p.editing = true; p.resizeView(); return p.filter.Focus() })},
		{k.Up, run(func() tea.Cmd { vp.LineUp(1); return p.scrolled() })},
		{k.Down, run(func() tea.Cmd { vp.LineDown(1); return p.scrolled() })},
		{k.PageUp, run(func() tea.Cmd { vp.PageUp(); return p.scrolled() })},
		{k.PageDown, run(func() tea.Cmd { vp.PageDown(); return p.scrolled() })},
		{k.Follow, run(func() tea.Cmd { vp.GotoBottom(); p.follow = true; return nil })},
	}
	endEdit := func(clear bool) tea.Cmd {
		p.editing = false
		p.filter.Blur()
		if clear {
			p.filter.SetValue("")
		}
		p.setFilter(p.filter.Value())
		return nil
	}
	p.editKeys = actions{
		{k.Submit, run(func() tea.Cmd { return endEdit(false) })},
		{k.Cancel, run(func() tea.Cmd { return endEdit(true) })},
	}
	return p
}

func (p *EventsPane) scrolled() tea.Cmd {
	p.follow = p.scroll.atEnd()
	return nil
}

// Title implements Pane.
func (p *EventsPane) Title() string {
	t := "Events"
	if p.filterBy != "" {
		t += " · " + plain(p.filterBy)
	}
	if !p.follow {
		t += " · scrolled, G follows"
	}
	return t
}

// ShortHelp implements help.KeyMap.
func (p *EventsPane) ShortHelp() []key.Binding {
	k := p.ctx.Keys
	if p.editing {
		return []key.Binding{k.Submit, k.Cancel}
	}
	return []key.Binding{k.Filter, k.Up, k.Down, k.Follow, k.Focus, k.Help, k.Quit}
}

// FullHelp implements help.KeyMap.
func (p *EventsPane) FullHelp() [][]key.Binding { return [][]key.Binding{p.keys.bindings()} }

// Typing implements Pane: the filter line takes the keys while it is open.
func (p *EventsPane) Typing() bool { return p.editing }

// Modal implements Pane: so does it take tab.
func (p *EventsPane) Modal() bool { return p.editing }

// SetSize implements Pane.
func (p *EventsPane) SetSize(w, h int) {
	p.width, p.height = w, h
	p.filter.Width = max(1, w-4)
	p.resizeView()
}

func (p *EventsPane) resizeView() {
	p.scroll.setHeight(p.rowsShown())
	p.redraw()
}

// add appends events and drops the oldest beyond maxEvents.
func (p *EventsPane) add(evs ...engine.Event) {
	p.events = append(p.events, evs...)
	p.chunks = append(p.chunks, make([][]string, len(evs))...)
	if over := len(p.events) - maxEvents; over > 0 {
		p.events = append(p.events[:0], p.events[over:]...)
		p.chunks = append(p.chunks[:0], p.chunks[over:]...)
	}
	p.refilter()
}

// matches: every word of the filter must appear in the owner or the type.
func (p *EventsPane) matches(ev engine.Event) bool {
	for w := range strings.FieldsSeq(strings.ToLower(p.filterBy)) {
		if !strings.Contains(strings.ToLower(ev.Owner), w) && !strings.Contains(string(ev.Type), w) {
			return false
		}
	}
	return true
}

func (p *EventsPane) setFilter(s string) {
	p.filterBy = s
	p.refilter()
}

func (p *EventsPane) refilter() {
	p.shown = p.shown[:0]
	for i, ev := range p.events {
		if p.matches(ev) {
			p.shown = append(p.shown, i)
		}
	}
	p.redraw()
}

// redraw puts the shown events into the view, drawing each event once per
// width.
func (p *EventsPane) redraw() {
	w := p.width - 2
	if w != p.drawnAt {
		p.drawnAt = w
		clear(p.chunks)
	}
	var lines []string
	history := false // the line before was history
	for _, i := range p.shown {
		if p.chunks[i] == nil {
			p.chunks[i] = p.draw(p.events[i], w)
		}
		if history && !p.events[i].History {
			lines = append(lines, p.liveRule(w))
		}
		history = p.events[i].History
		lines = append(lines, p.chunks[i]...)
	}
	if history {
		lines = append(lines, p.liveRule(w))
	}
	p.lines = lines
	p.scroll.setLines(len(lines), p.follow)
}

// draw renders one event: time, type and owner, then its detail wrapped
// onto at most eventDetailLines lines.
func (p *EventsPane) draw(ev engine.Event, w int) []string {
	t := p.ctx.Theme
	const lead = 9 + 19 + 13 // time, type, owner columns
	detail := termtext.Line(ev.Detail)
	switch k := termtext.Line(ev.Kernel); {
	case k != "" && detail != "":
		detail = k + ": " + detail
	case k != "":
		detail = k
	}
	typeStyle := t.EventStyle(ev.Type)
	if ev.History {
		// From before this dashboard looked (the engine's memory or its
		// event log): shown, muted, above the live ones.
		typeStyle = t.Muted
		detail = "(history) " + detail
	}
	first := t.Muted.Render(ev.Time.Format("15:04:05")) + " " + typeStyle.Render(fit(termtext.Line(string(ev.Type)), 18)) + " " + fit(termtext.Line(ev.Owner), 12) + " "
	var chunk []string
	if w-lead >= 20 {
		wrapped := wordWrapLines(detail, w-lead)
		if len(wrapped) > eventDetailLines {
			wrapped = wrapped[:eventDetailLines]
		}
		for j, l := range wrapped {
			if j == 0 {
				chunk = append(chunk, first+l)
			} else {
				chunk = append(chunk, strings.Repeat(" ", lead)+l)
			}
		}
	}
	if len(chunk) == 0 {
		chunk = []string{first + detail}
	}
	return chunk
}

// liveRule separates the history from the live events.
func (p *EventsPane) liveRule(w int) string {
	label := " history above · live below "
	side := max(0, (w-len(label))/2)
	return p.ctx.Theme.Muted.Render(fit(strings.Repeat("─", side)+label+strings.Repeat("─", side), w))
}

// Editing reports whether the filter line has the keyboard.
func (p *EventsPane) Editing() bool { return p.editing }

// Update edits the filter and scrolls.
func (p *EventsPane) Update(msg tea.Msg) tea.Cmd {
	km, ok := msg.(tea.KeyMsg)
	if !ok {
		return nil
	}
	if p.editing {
		if cmd, ok := p.editKeys.handle(km); ok {
			p.resizeView()
			return cmd
		}
		var cmd tea.Cmd
		p.filter, cmd = p.filter.Update(msg)
		p.setFilter(p.filter.Value())
		return cmd
	}
	cmd, _ := p.keys.handle(km)
	return cmd
}

func (p *EventsPane) rowsShown() int {
	n := p.height - 2
	if p.editing || p.filterBy != "" {
		n--
	}
	return max(0, n)
}

// View renders the events in view, under the filter line when one is set.
func (p *EventsPane) View() string {
	var lines []string
	if p.editing || p.filterBy != "" {
		lines = append(lines, p.filter.View())
	}
	from, to := p.scroll.window()
	lines = append(lines, p.lines[from:to]...)
	return p.ctx.box(p.Title(), lines, p.width, p.height, p.focused)
}
