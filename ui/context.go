package ui

import (
	"context"
	"io"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/kerneldeck/kerneldeck/internal/termimage"
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
	// act runs an engine action in the background; the root reports its
	// outcome on the status line.
	act func(what string, f func(ctx context.Context, eng Engine) error) tea.Cmd
	// ask puts a yes/no question to the operator; yes runs only on y.
	ask func(text string, yes tea.Cmd)
	// detail opens the detail view of the selected kernel.
	detail func() tea.Cmd
	// clipboard is the terminal that y sends OSC 52 to; nil: no copying.
	clipboard io.Writer
	// saveDir is where s saves a cell's images; "": no saving.
	saveDir string
	// images is how the output pane draws images; "" is termimage.Off.
	images termimage.Mode
	// drawer draws them, in commands.
	drawer *imageDrawer
	// open shows a saved image with the system's viewer; nil: o is off.
	open    func(path string) error
	openDir string
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
