package ui

import (
	"fmt"
	"slices"

	"github.com/charmbracelet/bubbles/key"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
)

// overlay is a layer over the panes that takes the keys first: a yes/no
// question, the approval prompt, the : command line, a kernel's detail.
// The root keeps them in a stack (Model.layers), each with its keys, its
// view and its help; the panes get what no layer takes.
type overlay interface {
	// layer is its place in the stack, and says where it draws.
	layer() layer
	// onKey handles km; pass hands it to the layer below (the next
	// overlay, then the dashboard's keys and the focused pane).
	onKey(m *Model, km tea.KeyMsg) (cmd tea.Cmd, pass bool)
	// view draws it in w×h cells (h is 1 on the status line).
	view(m *Model, w, h int) string
	// helpKeys are its keys for the help line; nil leaves the pane's.
	helpKeys(m *Model) []key.Binding
}

// layer orders the overlays, lowest first; each is open once at most.
type layer int

// The layers, lowest first.
const (
	layerDetail   layer = iota // every row under the header
	layerCommand               // the status line
	layerApproval              // the rows under the kernels; modal
	layerInput                 // the status line: a cell's input(); modal
	layerQuestion              // the status line; modal
)

// area is where a layer draws.
type area int

// The areas.
const (
	areaStatus       area = iota // the help line
	areaBody                     // every row under the header
	areaBelowKernels             // the rows under the kernels pane
)

func (l layer) area() area {
	switch l {
	case layerCommand, layerInput, layerQuestion:
		return areaStatus
	case layerApproval:
		return areaBelowKernels
	}
	return areaBody
}

// overlays is the stack, lowest layer first.
type overlays []overlay

// open puts o in its place, instead of one of its layer already open.
func (s *overlays) open(o overlay) {
	s.close(o.layer())
	i := slices.IndexFunc(*s, func(x overlay) bool { return x.layer() > o.layer() })
	if i < 0 {
		i = len(*s)
	}
	*s = slices.Insert(*s, i, o)
}

// close takes the overlay of layer l away, if it is open.
func (s *overlays) close(l layer) {
	*s = slices.DeleteFunc(*s, func(x overlay) bool { return x.layer() == l })
}

// at returns the open overlay of layer l, or nil.
func (s overlays) at(l layer) overlay {
	for _, o := range s {
		if o.layer() == l {
			return o
		}
	}
	return nil
}

// top returns the highest open overlay that draws in one of the areas.
func (s overlays) top(areas ...area) overlay {
	for i := len(s) - 1; i >= 0; i-- {
		if slices.Contains(areas, s[i].layer().area()) {
			return s[i]
		}
	}
	return nil
}

// onKey offers km to the layers, top first; pass says none took it.
func (s overlays) onKey(m *Model, km tea.KeyMsg) (cmd tea.Cmd, pass bool) {
	for i := len(s) - 1; i >= 0; i-- {
		if cmd, pass := s[i].onKey(m, km); !pass {
			return cmd, false
		}
	}
	return nil, true
}

// helpKeys are the keys of the highest layer that has its own.
func (s overlays) helpKeys(m *Model) []key.Binding {
	for i := len(s) - 1; i >= 0; i-- {
		if k := s[i].helpKeys(m); k != nil {
			return k
		}
	}
	return nil
}

// question is a yes/no prompt on the status line; the action it guards
// runs only on y.
type question struct {
	text string
	yes  tea.Cmd
	quit bool // y quits
}

func (q *question) layer() layer { return layerQuestion }

func (q *question) onKey(m *Model, km tea.KeyMsg) (tea.Cmd, bool) {
	keys := m.ctx.Keys
	switch {
	case key.Matches(km, keys.Yes):
		m.layers.close(layerQuestion)
		if q.quit {
			return m.quit(), false
		}
		return q.yes, false
	case key.Matches(km, keys.No), key.Matches(km, keys.Interrupt):
		m.layers.close(layerQuestion)
		if q.quit {
			m.setStatus("quit cancelled", nil)
		} else {
			m.setStatus("cancelled: nothing was done", nil)
		}
	}
	return nil, false // modal
}

func (q *question) view(m *Model, w, h int) string { return m.ctx.Theme.Warn.Render(plain(q.text)) }

func (q *question) helpKeys(*Model) []key.Binding { return nil }

// approvalPrompt asks the operator about the tool calls waiting for an
// answer, oldest first.
type approvalPrompt struct {
	queue []engine.Event
}

func (a *approvalPrompt) layer() layer { return layerApproval }

func (a *approvalPrompt) onKey(m *Model, km tea.KeyMsg) (tea.Cmd, bool) {
	keys := m.ctx.Keys
	var d engine.Decision
	switch {
	case key.Matches(km, keys.ApproveOnce):
		d = engine.ApproveOnce
	case key.Matches(km, keys.ApproveAlways):
		d = engine.ApproveAlways
	case key.Matches(km, keys.Deny):
		d = engine.ApproveDeny
	case key.Matches(km, keys.Interrupt):
		return nil, true
	default:
		return nil, false // modal
	}
	req := a.queue[0]
	a.drop(m, req.Request)
	eng := m.eng
	return func() tea.Msg {
		return actionDoneMsg{what: fmt.Sprintf("%s %s for %s", d, req.Tool, req.Owner), err: eng.Approve(req.Request, d)}
	}, false
}

// drop takes request id out of the queue (answered here or elsewhere),
// and the prompt away with its last request.
func (a *approvalPrompt) drop(m *Model, id string) {
	a.queue = slices.DeleteFunc(a.queue, func(ev engine.Event) bool { return ev.Request == id })
	if len(a.queue) == 0 {
		m.layers.close(layerApproval)
	}
}

func (a *approvalPrompt) view(m *Model, w, h int) string { return m.approvalView(a, w, h) }

func (a *approvalPrompt) helpKeys(*Model) []key.Binding { return nil }

// approvals returns the approval prompt, opening it when open is set.
func (m *Model) approvals(open bool) *approvalPrompt {
	if a, ok := m.layers.at(layerApproval).(*approvalPrompt); ok {
		return a
	}
	if !open {
		return nil
	}
	a := &approvalPrompt{}
	m.layers.open(a)
	return a
}

func (c *commandLine) layer() layer { return layerCommand }

func (c *commandLine) onKey(m *Model, km tea.KeyMsg) (tea.Cmd, bool) {
	if key.Matches(km, m.ctx.Keys.Interrupt) {
		return nil, true
	}
	return m.onCommandKey(c, km), false
}

func (c *commandLine) view(m *Model, w, h int) string { return m.commandView(c) }

func (c *commandLine) helpKeys(*Model) []key.Binding { return nil }

func (d *kernelDetail) layer() layer { return layerDetail }

func (d *kernelDetail) onKey(m *Model, km tea.KeyMsg) (tea.Cmd, bool) {
	if key.Matches(km, m.ctx.Keys.Interrupt) {
		return nil, true
	}
	m.onDetailKey(d, km)
	return nil, false
}

func (d *kernelDetail) view(m *Model, w, h int) string { return m.detailView(d, w, h) }

func (d *kernelDetail) helpKeys(m *Model) []key.Binding {
	k := m.ctx.Keys
	return []key.Binding{helpOnly("esc/d", "close"), k.Up, k.Down, k.PageUp, k.PageDown}
}

// detail returns the open kernel detail, or nil.
func (m *Model) detail() *kernelDetail {
	d, _ := m.layers.at(layerDetail).(*kernelDetail)
	return d
}
