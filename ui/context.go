package ui

import (
	"sync"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/kerneldeck/kerneldeck/themes"
)

// Context is shared by every component: the window size, the theme, the
// keys, the clock and the styles derived from the theme (built once).
type Context struct {
	Width, Height int
	Theme         *themes.Theme
	Keys          KeyMap
	// Now is the clock the timers read; tests inject a fixed one.
	Now func() time.Time
	// User is the default owner of new targets.
	User string

	borders boxStyle
}

// boxStyle holds what a pane border needs, derived from the theme once.
type boxStyle struct {
	normal, focused             lipgloss.Border
	normalStyle, focusedStyle   lipgloss.Style
	titleStyle, titleFocusStyle lipgloss.Style
}

func newBoxStyle(t *themes.Theme) boxStyle {
	return boxStyle{
		normal:          t.PaneBorder.GetBorderStyle(),
		focused:         t.PaneBorderFocused.GetBorderStyle(),
		normalStyle:     lipgloss.NewStyle().Inherit(t.PaneBorder).UnsetBorderStyle().Foreground(t.PaneBorder.GetBorderTopForeground()),
		focusedStyle:    lipgloss.NewStyle().Inherit(t.PaneBorderFocused).UnsetBorderStyle().Foreground(t.PaneBorderFocused.GetBorderTopForeground()),
		titleStyle:      t.PaneTitle,
		titleFocusStyle: t.PaneTitleFocused,
	}
}

// Component is one pane of the dashboard.
type Component interface {
	Update(msg tea.Msg) (Component, tea.Cmd)
	View() string
	SetSize(width, height int)
}

// inbox carries messages from background work (running cells and their
// output) to the UI without ever blocking the sender: posts queue up and one
// waiting command collects them all.
type inbox struct {
	mu     sync.Mutex
	queue  []tea.Msg
	notify chan struct{}
	closed bool
}

func newInbox() *inbox { return &inbox{notify: make(chan struct{}, 1)} }

func (b *inbox) post(msg tea.Msg) {
	b.mu.Lock()
	if !b.closed {
		b.queue = append(b.queue, msg)
	}
	b.mu.Unlock()
	select {
	case b.notify <- struct{}{}:
	default:
	}
}

func (b *inbox) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	select {
	case b.notify <- struct{}{}:
	default:
	}
}

// inboxMsg is a batch of posted messages.
type inboxMsg []tea.Msg

// wait is the command that delivers the next batch; Update re-arms it.
func (b *inbox) wait() tea.Cmd {
	return func() tea.Msg {
		for {
			<-b.notify
			b.mu.Lock()
			msgs, closed := b.queue, b.closed
			b.queue = nil
			b.mu.Unlock()
			if len(msgs) > 0 {
				return inboxMsg(msgs)
			}
			if closed {
				return nil
			}
		}
	}
}
