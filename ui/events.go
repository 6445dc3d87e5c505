package ui

import (
	"strings"

	"github.com/charmbracelet/bubbles/key"
	"github.com/charmbracelet/bubbles/textinput"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
)

// maxEvents bounds the events the pane keeps.
const maxEvents = 2000

// EventsPane is the live event stream, newest at the bottom, with a filter
// on owner and type ("/").
type EventsPane struct {
	ctx           *Context
	width, height int
	focused       bool

	events   []engine.Event
	shown    []int // indexes into events that pass the filter
	filter   textinput.Model
	editing  bool
	offset   int
	follow   bool
	filterBy string
}

func newEventsPane(ctx *Context) *EventsPane {
	f := textinput.New()
	f.Prompt = "/"
	f.Placeholder = "owner or type, e.g. alice evicted"
	return &EventsPane{ctx: ctx, filter: f, follow: true}
}

// SetSize sets the pane's outer size.
func (p *EventsPane) SetSize(w, h int) { p.width, p.height = w, h; p.filter.Width = max(1, w-4) }

// add appends events and drops the oldest beyond maxEvents.
func (p *EventsPane) add(evs ...engine.Event) {
	p.events = append(p.events, evs...)
	if over := len(p.events) - maxEvents; over > 0 {
		p.events = append(p.events[:0], p.events[over:]...)
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

func (p *EventsPane) refilter() {
	p.shown = p.shown[:0]
	for i, ev := range p.events {
		if p.matches(ev) {
			p.shown = append(p.shown, i)
		}
	}
}

// Editing reports whether the filter line has the keyboard.
func (p *EventsPane) Editing() bool { return p.editing }

// Update edits the filter and scrolls.
func (p *EventsPane) Update(msg tea.Msg) (Component, tea.Cmd) {
	km, ok := msg.(tea.KeyMsg)
	if !ok {
		return p, nil
	}
	keys := p.ctx.Keys
	if p.editing {
		switch {
		case key.Matches(km, keys.Submit), key.Matches(km, keys.Cancel):
			p.editing = false
			p.filter.Blur()
			if key.Matches(km, keys.Cancel) {
				p.filter.SetValue("")
			}
			p.filterBy = p.filter.Value()
			p.refilter()
			return p, nil
		}
		var cmd tea.Cmd
		p.filter, cmd = p.filter.Update(msg)
		p.filterBy = p.filter.Value()
		p.refilter()
		return p, cmd
	}
	page := max(1, p.height-3)
	switch {
	case key.Matches(km, keys.Filter):
		p.editing = true
		return p, p.filter.Focus()
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
	inner := p.rowsShown()
	p.offset = min(max(p.offset, 0), max(0, len(p.shown)-inner))
	p.follow = p.offset >= len(p.shown)-inner
	return p, nil
}

func (p *EventsPane) rowsShown() int {
	n := p.height - 2
	if p.editing || p.filterBy != "" {
		n--
	}
	return max(0, n)
}

// View renders the newest events that fit, and only those: it walks back
// from the newest shown event, wrapping each detail onto at most three lines
// so the reason for an eviction is never cut.
func (p *EventsPane) View() string {
	t := p.ctx.Theme
	inner := p.rowsShown()
	if p.follow {
		p.offset = max(0, len(p.shown)-inner)
	}
	var head []string
	if p.editing || p.filterBy != "" {
		head = append(head, p.filter.View())
	}
	w := p.width - 2
	const lead = 9 + 19 + 13 // time, type, owner columns
	var body []string
	end := min(len(p.shown), p.offset+inner)
	for i := end - 1; i >= 0 && len(body) < inner; i-- {
		ev := p.events[p.shown[i]]
		detail := ev.Detail
		if ev.Kernel != "" {
			detail = ev.Kernel + ": " + detail
		}
		first := t.Muted.Render(ev.Time.Format("15:04:05")) + " " + t.EventStyle(string(ev.Type)).Render(fit(string(ev.Type), 18)) + " " + fit(ev.Owner, 12) + " "
		var chunk []string
		if w-lead >= 20 {
			wrapped := wordWrapLines(detail, w-lead)
			if len(wrapped) > 3 {
				wrapped = wrapped[:3]
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
		if len(body)+len(chunk) > inner && len(body) > 0 {
			chunk = chunk[:inner-len(body)]
		}
		body = append(chunk, body...)
	}
	title := "Events"
	if p.filterBy != "" {
		title += " · " + p.filterBy
	}
	return p.ctx.box(title, append(head, body...), p.width, p.height, p.focused)
}
