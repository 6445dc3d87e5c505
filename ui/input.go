package ui

import (
	"context"
	"fmt"
	"slices"

	"github.com/charmbracelet/bubbles/key"
	"github.com/charmbracelet/bubbles/textinput"
	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/kerneldeck/kerneldeck/engine"
)

// inputAsk is a cell's input() or getpass() waiting for the operator: its
// cell's goroutine waits on reply.
type inputAsk struct {
	run   *cellRun
	ask   engine.InputRequest
	reply chan inputReply // room for one: Update never waits on it
}

type inputReply struct {
	value string
	eof   bool
}

// inputAskMsg brings an ask from its cell's goroutine to Update.
type inputAskMsg struct{ a *inputAsk }

// asker is the OnInput of run r: it asks through the inbox and waits for
// the operator's line, or for the cell's end.
func asker(box *inbox, r *cellRun) func(context.Context, engine.InputRequest) (string, error) {
	return func(ctx context.Context, ask engine.InputRequest) (string, error) {
		a := &inputAsk{run: r, ask: ask, reply: make(chan inputReply, 1)}
		box.post(inputAskMsg{a: a})
		select {
		case rep := <-a.reply:
			if rep.eof {
				return "", engine.ErrInputEOF
			}
			return rep.value, nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// inputPrompt is the status line that answers the cells' input(), oldest
// first; modal, as the cell waits on it. enter sends the line, ctrl+d ends
// input (EOFError in the cell), ctrl+c interrupts the cell.
type inputPrompt struct {
	queue []*inputAsk
	in    textinput.Model
}

func (p *inputPrompt) layer() layer { return layerInput }

// ask queues a and opens the prompt.
func (m *Model) ask(a *inputAsk) {
	p, ok := m.layers.at(layerInput).(*inputPrompt)
	if !ok {
		p = &inputPrompt{}
		m.layers.open(p)
	}
	p.queue = append(p.queue, a)
	if len(p.queue) == 1 {
		p.show()
	}
}

// show readies the line for the oldest ask: the kernel's prompt as text,
// and for a password nothing of what is typed.
func (p *inputPrompt) show() {
	a := p.queue[0]
	p.in = textinput.New()
	p.in.Prompt = plain(a.ask.Prompt)
	p.in.CharLimit = engine.MaxInputAnswer
	if a.ask.Password {
		p.in.EchoMode = textinput.EchoNone
	}
	p.in.Focus()
}

// answer sends rep to the oldest ask and moves on to the next.
func (p *inputPrompt) answer(m *Model, rep inputReply) {
	p.queue[0].reply <- rep
	p.next(m)
}

func (p *inputPrompt) next(m *Model) {
	p.queue = p.queue[1:]
	if len(p.queue) == 0 {
		m.layers.close(layerInput)
		return
	}
	p.show()
}

// dropInputs takes away the asks of run r, which has ended.
func (m *Model) dropInputs(r *cellRun) {
	p, ok := m.layers.at(layerInput).(*inputPrompt)
	if !ok {
		return
	}
	first := p.queue[0]
	p.queue = slices.DeleteFunc(p.queue, func(a *inputAsk) bool { return a.run == r })
	switch {
	case len(p.queue) == 0:
		m.layers.close(layerInput)
	case p.queue[0] != first:
		p.show()
	}
}

func (p *inputPrompt) onKey(m *Model, km tea.KeyMsg) (tea.Cmd, bool) {
	keys := m.ctx.Keys
	switch {
	case key.Matches(km, keys.SendLine):
		p.answer(m, inputReply{value: p.in.Value()})
		m.setStatus("sent the line to input()", nil)
		return nil, false
	case key.Matches(km, keys.EndInput):
		p.answer(m, inputReply{eof: true})
		m.setStatus("ended input(): the cell gets EOFError", nil)
		return nil, false
	case key.Matches(km, keys.Interrupt):
		cell := p.queue[0].ask.Cell
		p.answer(m, inputReply{eof: true})
		for _, k := range m.kernels.kernels {
			if k.RunningCell == cell {
				id := k.ID
				return m.action("interrupted "+id, func(ctx context.Context, eng Engine) error { return eng.Interrupt(ctx, id) }), false
			}
		}
		return nil, false
	}
	var cmd tea.Cmd
	p.in, cmd = p.in.Update(km)
	return cmd, false // modal
}

func (p *inputPrompt) view(m *Model, w, h int) string {
	a := p.queue[0]
	what := "input()"
	if a.ask.Password {
		what = "getpass()"
	}
	label := m.ctx.Theme.Warn.Render(plain(a.run.target.Owner+"/"+a.run.target.Task) + " " + what + " ")
	line := label + p.in.View()
	// The keys that answer, where the line has room for them.
	keys := m.ctx.Keys
	hint := "  " + keys.SendLine.Help().Key + " sends · " + keys.EndInput.Help().Key + " EOF · " + keys.Interrupt.Help().Key + " interrupts"
	if len(p.queue) > 1 {
		hint += fmt.Sprintf(" · %d more waiting", len(p.queue)-1)
	}
	if lipgloss.Width(line)+lipgloss.Width(hint) <= w {
		line += m.ctx.Theme.Faint.Render(hint)
	}
	return line
}

func (p *inputPrompt) helpKeys(m *Model) []key.Binding {
	keys := m.ctx.Keys
	return []key.Binding{keys.SendLine, keys.EndInput, keys.Interrupt}
}
