package ui

import (
	"github.com/charmbracelet/bubbles/help"
	"github.com/charmbracelet/bubbles/key"
	tea "github.com/charmbracelet/bubbletea"
)

// Pane is one pane of the dashboard. It carries its own keys and their
// help, so the root only asks the focused pane what it offers.
type Pane interface {
	help.KeyMap
	// Update handles a message meant for this pane.
	Update(msg tea.Msg) tea.Cmd
	// View draws the pane at its size; it changes no state.
	View() string
	// SetSize sets the pane's outer size, border included.
	SetSize(width, height int)
	// Title is the pane's name, shown in its border.
	Title() string
	// Focus gives the pane the keyboard; Blur takes it away.
	Focus() tea.Cmd
	Blur()
	// Typing reports whether keys are text for the pane now (an editor, a
	// filter line), so the root's single-key commands stay out of its way.
	Typing() bool
	// Modal reports whether the pane holds the whole keyboard now, tab
	// included (a form, a filter line being typed).
	Modal() bool
}

// action is one key: its binding (with the help text) and its handler, in
// one record. A handler returns handled=false to let the key fall through.
type action struct {
	key key.Binding
	do  func(km tea.KeyMsg) (cmd tea.Cmd, handled bool)
}

// actions is a key table, matched in order.
type actions []action

// handle runs the first action whose key matches km.
func (as actions) handle(km tea.KeyMsg) (tea.Cmd, bool) {
	for _, a := range as {
		if key.Matches(km, a.key) {
			if cmd, ok := a.do(km); ok {
				return cmd, true
			}
		}
	}
	return nil, false
}

// bindings lists the table's keys, for help.
func (as actions) bindings() []key.Binding {
	out := make([]key.Binding, len(as))
	for i, a := range as {
		out[i] = a.key
	}
	return out
}

// destroy is the action of a destructive key: pick names what it would act
// on now and the act (ok=false: nothing to act on); the operator is asked
// first, in the key's own words, and the act runs only on y.
func destroy(ctx *Context, d Destructive, pick func() (what string, act tea.Cmd, ok bool)) action {
	return action{key: d.Binding, do: func(tea.KeyMsg) (tea.Cmd, bool) {
		what, act, ok := pick()
		if !ok {
			return nil, false
		}
		ctx.ask(d.question(what), act)
		return nil, true
	}}
}

// run wraps a handler that always handles its key.
func run(f func() tea.Cmd) func(tea.KeyMsg) (tea.Cmd, bool) {
	return func(tea.KeyMsg) (tea.Cmd, bool) { return f(), true }
}

// pane holds what every pane has: its context, size and focus.
type pane struct {
	ctx           *Context
	width, height int
	focused       bool
}

func (p *pane) SetSize(w, h int) { p.width, p.height = w, h }
func (p *pane) Focus() tea.Cmd   { p.focused = true; return nil }
func (p *pane) Blur()            { p.focused = false }
func (p *pane) Typing() bool     { return false }
func (p *pane) Modal() bool      { return false }
