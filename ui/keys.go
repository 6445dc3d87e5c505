package ui

import (
	"fmt"

	"github.com/charmbracelet/bubbles/key"
)

// KeyMap is every key the dashboard answers to, with its help text.
type KeyMap struct {
	Run, HistPrev, HistNext, NewTarget         key.Binding
	Focus, FocusBack, Help, Quit, Interrupt    key.Binding
	Up, Down, PageUp, PageDown, Toggle, Select key.Binding
	Reset, Kill, ShutdownOwner, DropParked     Destructive
	Park                                       key.Binding
	InterruptSel                               key.Binding
	CapUp, CapDown, IdleUp, IdleDown           key.Binding
	Filter, ApproveOnce, ApproveAlways, Deny   key.Binding
	Yes, No, Cancel, Submit, Detail            key.Binding
	ReplayPause, ReplayStep, Follow, Zoom      key.Binding
	Newline, Command, External, Sort, Copy     key.Binding
	SaveImage, OpenImage, Edit, Leave, Page    key.Binding
	Complete, SendLine, EndInput               key.Binding
}

// DefaultKeyMap is the standard key map.
func DefaultKeyMap() KeyMap {
	b := func(help, desc string, keys ...string) key.Binding {
		return key.NewBinding(key.WithKeys(keys...), key.WithHelp(help, desc))
	}
	return KeyMap{
		Run:           b("ctrl+r", "run cell", "ctrl+r"),
		HistPrev:      b("ctrl+p", "prev cell", "ctrl+p"),
		HistNext:      b("ctrl+n", "next cell", "ctrl+n"),
		NewTarget:     b("ctrl+t", "new target", "ctrl+t"),
		Focus:         b("tab", "next pane", "tab"),
		FocusBack:     b("shift+tab", "prev pane", "shift+tab"),
		Help:          b("?", "help", "?"),
		Quit:          b("q", "quit", "q"),
		Interrupt:     b("ctrl+c", "interrupt/quit", "ctrl+c"),
		Up:            b("↑/k", "up", "up", "k"),
		Down:          b("↓/j", "down", "down", "j"),
		PageUp:        b("pgup", "page up", "pgup"),
		PageDown:      b("pgdn", "page down", "pgdown"),
		Toggle:        b("space", "fold owner", " ", "space"),
		Select:        b("enter", "edit", "enter"),
		Reset:         Destructive{b("r", "reset", "r"), "Reset %s? Its state is lost."},
		InterruptSel:  b("i", "interrupt", "i"),
		Kill:          Destructive{b("x", "kill", "x"), "Kill %s? Its state is lost."},
		ShutdownOwner: Destructive{b("X", "kill owner", "X"), "Shut down owner %s? Their state is lost."},
		Park:          b("P", "park", "P"),
		DropParked:    Destructive{b("D", "drop parked", "D"), "Drop the parked state of %s? It is lost."},
		CapUp:         b("+", "cap +1", "+", "="),
		CapDown:       b("-", "cap -1", "-"),
		IdleUp:        b("]", "idle_exit +", "]"),
		IdleDown:      b("[", "idle_exit -", "["),
		Filter:        b("/", "filter", "/"),
		ApproveOnce:   b("o", "approve once", "o", "y"),
		ApproveAlways: b("a", "always", "a"),
		Deny:          b("d", "deny", "d", "n"),
		Yes:           b("y", "yes", "y"),
		No:            b("n", "no", "n", "esc"),
		Cancel:        b("esc", "cancel", "esc"),
		Submit:        b("enter", "ok", "enter"),
		Detail:        b("d", "detail", "d"),
		ReplayPause:   b("p", "pause/resume replay", "p"),
		ReplayStep:    b("n", "replay one request", "n"),
		Follow:        b("G/F", "follow the end", "G", "F", "end"),
		Zoom:          b("z", "zoom pane", "z"),
		Newline:       b("enter", "new line (indented)", "enter"),
		Command:       b(":", "command", ":"),
		External:      b("ctrl+e", "$EDITOR", "ctrl+e"),
		Sort:          b("s", "sort", "s"),
		Copy:          b("y", "copy output", "y"),
		SaveImage:     b("s", "save images", "s"),
		OpenImage:     b("o", "open images", "o"),
		Edit:          b("e", "write a cell", "e"),
		Page:          b("v", "page output", "v"),
		Complete:      b("tab in a cell", "complete/indent", "tab"),
		Leave:         b("esc", "leave the editor", "esc"),
		SendLine:      b("enter", "send to input()", "enter"),
		EndInput:      b("ctrl+d", "end input (EOFError)", "ctrl+d"),
	}
}

// Destructive is a key whose act cannot be undone. Its record carries the
// question asked before it acts, so every way to that act asks alike.
type Destructive struct {
	key.Binding
	// Ask is the question, with %s for what the act falls on.
	Ask string
}

// question is the prompt for acting on what.
func (d Destructive) question(what string) string { return fmt.Sprintf(d.Ask, what) + " y/n" }
