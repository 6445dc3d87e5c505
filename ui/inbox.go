package ui

import (
	"sync"

	tea "github.com/charmbracelet/bubbletea"
)

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
