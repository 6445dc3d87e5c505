// Package themes holds the dashboard's colour themes (dark, light,
// high-contrast): lipgloss styles built once by New and only read after, so
// the UI never builds styles in View. Without colour (NO_COLOR) states are
// told apart by attributes and border shapes alone.
package themes

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/charmbracelet/bubbles/help"
	"github.com/charmbracelet/lipgloss"
	"github.com/muesli/termenv"

	"github.com/kerneldeck/kerneldeck/engine"
)

// Theme names accepted by New, in the order returned by Names.
const (
	Dark         = "dark"
	Light        = "light"
	HighContrast = "high-contrast"
)

// Default is the theme used when no name is given.
const Default = Dark

// Names returns the valid theme names in a stable order: dark, light,
// high-contrast (the default first).
func Names() []string {
	return []string{Dark, Light, HighContrast}
}

// Options tune how a theme is built.
type Options struct {
	// NoColor strips every foreground and background colour from the
	// styles, keeping only text attributes and borders (NO_COLOR).
	NoColor bool
	// Renderer is the lipgloss renderer every style is bound to; it decides
	// the colour profile and whether the background is dark. Nil means
	// lipgloss.DefaultRenderer().
	Renderer *lipgloss.Renderer
}

// NoColorFromEnv reports whether the NO_COLOR environment variable is set to
// a non-empty value, which asks programs not to emit colour (no-color.org).
func NoColorFromEnv() bool {
	return os.Getenv("NO_COLOR") != ""
}

// Theme is a complete, immutable set of dashboard styles. All styles are
// bound to the renderer given in Options and must not be rebuilt per frame.
type Theme struct {
	// Name is the canonical theme name ("dark", "light" or "high-contrast").
	Name string
	// NoColor tells whether the theme was built without colours.
	NoColor bool
	// Renderer is the renderer all styles are bound to; use it for any
	// ad-hoc style or lipgloss.Place call so profiles stay consistent.
	Renderer *lipgloss.Renderer

	// App is the base style of the whole window; it sets no colour so the
	// terminal's own foreground and background show through.
	App lipgloss.Style
	// Title, Muted, Faint and Bold are general-purpose text styles.
	Title, Muted, Faint, Bold lipgloss.Style

	// Header is the header bar (a filled bar with horizontal padding; the UI
	// sets its width). Styles meant to sit inside it (HeaderItem, CapOK,
	// CapFull, CapOver) already carry its background, so segments rendered
	// with them do not punch holes in the bar.
	Header lipgloss.Style
	// HeaderItem is plain text inside the header bar: Header without its
	// padding.
	HeaderItem lipgloss.Style
	// CapOK, CapFull and CapOver style "kernels N/CAP" in the header: below
	// the cap, at the cap (highlighted), and over the cap because every
	// kernel is busy (marked more strongly).
	CapOK, CapFull, CapOver lipgloss.Style

	// PaneBorder and PaneBorderFocused are the border styles of an unfocused
	// and the focused pane. They use different border shapes, so focus shows
	// without colour, and have the same frame size, so focus never moves the
	// layout.
	PaneBorder, PaneBorderFocused lipgloss.Style
	// PaneTitle and PaneTitleFocused style a pane's title.
	PaneTitle, PaneTitleFocused lipgloss.Style

	// Selected is the selected row; it always uses reverse video so it is
	// visible without colour.
	Selected lipgloss.Style
	// Owner is an owner group row in the kernel list.
	Owner lipgloss.Style
	// StateIdle, StateRunning, StateQueued, StateStarting and StateDead style
	// a kernel's state; they render differently from each other even
	// without colour.
	StateIdle, StateRunning, StateQueued, StateStarting, StateDead lipgloss.Style
	// NextEvict marks the kernel next in line for LRU eviction.
	NextEvict lipgloss.Style
	// OK, Warn and Error style status messages.
	OK, Warn, Error lipgloss.Style

	// EventTypes styles engine events by type; use EventStyle to look one up.
	EventTypes map[engine.EventType]lipgloss.Style

	// Prompt is the approval prompt box (border and padding); PromptTitle
	// is its heading.
	Prompt, PromptTitle lipgloss.Style

	// HelpKey, HelpDesc and HelpSep style the key, its description and the
	// separators of the help line; HelpStyles bundles them for bubbles/help.
	HelpKey, HelpDesc, HelpSep lipgloss.Style

	// Editor is the text of the cell editor and EditorPrompt its line
	// prompt (bubbles/textarea).
	Editor, EditorPrompt lipgloss.Style

	help help.Styles
}

// EventStyle returns the style for an engine event type, or Muted for a type
// the theme does not know.
func (t *Theme) EventStyle(typ engine.EventType) lipgloss.Style {
	if s, ok := t.EventTypes[typ]; ok {
		return s
	}
	return t.Muted
}

// HelpStyles returns the bubbles/help styles built from HelpKey, HelpDesc and
// HelpSep (built once with the theme).
func (t *Theme) HelpStyles() help.Styles {
	return t.help
}

// New builds the named theme. An empty name means "dark"; names are matched
// case-insensitively. An unknown name returns an error listing the valid
// names.
//
// Unless opts.NoColor is set, New resolves the renderer's colour profile and
// background darkness right away (which may query the terminal), so call it
// before the Bubble Tea program takes over the terminal.
func New(name string, opts Options) (*Theme, error) {
	canon := strings.ToLower(strings.TrimSpace(name))
	if canon == "" {
		canon = Default
	}
	var p palette
	switch canon {
	case Dark:
		p = darkPalette()
	case Light:
		p = lightPalette()
	case HighContrast:
		p = highContrastPalette()
	default:
		return nil, fmt.Errorf("unknown theme %q; choose %s", name, choices())
	}
	r := opts.Renderer
	if r == nil {
		r = lipgloss.DefaultRenderer()
	}
	if !opts.NoColor {
		// Resolve AdaptiveColor and the profile now rather than during the
		// first View, while the terminal still answers queries.
		r.ColorProfile()
		r.HasDarkBackground()
	}
	b := builder{r: r, color: !opts.NoColor}
	t := build(canon, p, b)
	t.NoColor = opts.NoColor
	return t, nil
}

// choices renders Names as "dark, light or high-contrast".
func choices() string {
	n := Names()
	return strings.Join(n[:len(n)-1], ", ") + " or " + n[len(n)-1]
}

// palette is the colour and shape vocabulary of one theme.
type palette struct {
	text, subtle, faint      lipgloss.TerminalColor
	accent, accent2, accent3 lipgloss.TerminalColor
	headerFg, headerBg       lipgloss.TerminalColor
	ok, warn, err            lipgloss.TerminalColor
	border, borderFocus      lipgloss.TerminalColor
	capFullFg, capFullBg     lipgloss.TerminalColor
	capOverFg, capOverBg     lipgloss.TerminalColor

	paneBorder, paneBorderFocused, promptBorder lipgloss.Border
	// strong adds bold where other themes rely on colour alone.
	strong bool
}

// ac is a shorthand for an adaptive colour: dark-background value first.
func ac(dark, light string) lipgloss.AdaptiveColor {
	return lipgloss.AdaptiveColor{Dark: dark, Light: light}
}

// darkPalette is tuned for dark terminals (violet and cyan accents), with
// darker fallbacks for light backgrounds.
func darkPalette() palette {
	return palette{
		text:              ac("#E4E4E4", "#1C1C1C"),
		subtle:            ac("#A0A0B0", "#5C5C6C"),
		faint:             ac("#666676", "#A0A0AE"),
		accent:            ac("#B79CFF", "#5B32C8"),
		accent2:           ac("#7FD6E6", "#00697F"),
		accent3:           ac("#FF9FE5", "#A3168A"),
		headerFg:          ac("#F2F0FF", "#FFFFFF"),
		headerBg:          ac("#3B3361", "#5B45B0"),
		ok:                ac("#8BE39B", "#1F7A36"),
		warn:              ac("#F2C66D", "#8F5A00"),
		err:               ac("#FF7A85", "#C0182A"),
		border:            ac("#4E4E60", "#B8B8C8"),
		borderFocus:       ac("#B79CFF", "#5B32C8"),
		capFullFg:         ac("#1A1A1A", "#1A1A1A"),
		capFullBg:         ac("#F2C66D", "#F0B429"),
		capOverFg:         ac("#FFFFFF", "#FFFFFF"),
		capOverBg:         ac("#D7263D", "#C0182A"),
		paneBorder:        lipgloss.RoundedBorder(),
		paneBorderFocused: lipgloss.ThickBorder(),
		promptBorder:      lipgloss.RoundedBorder(),
	}
}

// lightPalette is tuned for light terminals (blue and teal accents, a pale
// header), with lighter fallbacks for dark backgrounds.
func lightPalette() palette {
	return palette{
		text:              ac("#E8EAED", "#202124"),
		subtle:            ac("#A0A4AA", "#5F6368"),
		faint:             ac("#5F6368", "#A0A4AA"),
		accent:            ac("#8AB4F8", "#1A56C4"),
		accent2:           ac("#6FD3C4", "#00796B"),
		accent3:           ac("#E1A6F0", "#8E24AA"),
		headerFg:          ac("#E8F0FE", "#0B2A5B"),
		headerBg:          ac("#22385E", "#D6E4FA"),
		ok:                ac("#81C995", "#137333"),
		warn:              ac("#FDD663", "#8A5300"),
		err:               ac("#F28B82", "#B3261E"),
		border:            ac("#4A4F57", "#C4C7CC"),
		borderFocus:       ac("#8AB4F8", "#1A56C4"),
		capFullFg:         ac("#1A1A1A", "#1A1A1A"),
		capFullBg:         ac("#FDD663", "#FBC02D"),
		capOverFg:         ac("#FFFFFF", "#FFFFFF"),
		capOverBg:         ac("#C5221F", "#B3261E"),
		paneBorder:        lipgloss.RoundedBorder(),
		paneBorderFocused: lipgloss.ThickBorder(),
		promptBorder:      lipgloss.RoundedBorder(),
	}
}

// highContrastPalette uses only the 16 basic ANSI colours ("0".."15"),
// black/white against the terminal background, plus bold and double borders.
func highContrastPalette() palette {
	return palette{
		text:              ac("15", "0"),
		subtle:            ac("7", "0"),
		faint:             ac("7", "8"),
		accent:            ac("14", "4"),
		accent2:           ac("14", "4"),
		accent3:           ac("13", "5"),
		headerFg:          ac("0", "15"),
		headerBg:          ac("15", "0"),
		ok:                ac("10", "2"),
		warn:              ac("11", "3"),
		err:               ac("9", "1"),
		border:            ac("15", "0"),
		borderFocus:       ac("14", "4"),
		capFullFg:         ac("0", "0"),
		capFullBg:         ac("11", "11"),
		capOverFg:         ac("15", "15"),
		capOverBg:         ac("1", "1"),
		paneBorder:        lipgloss.NormalBorder(),
		paneBorderFocused: lipgloss.DoubleBorder(),
		promptBorder:      lipgloss.DoubleBorder(),
		strong:            true,
	}
}

// builder creates styles on one renderer and drops colours when color is
// false, so NO_COLOR is enforced in one place.
type builder struct {
	r     *lipgloss.Renderer
	color bool
}

func (b builder) style() lipgloss.Style { return b.r.NewStyle() }

func (b builder) fg(s lipgloss.Style, c lipgloss.TerminalColor) lipgloss.Style {
	if !b.color {
		return s
	}
	return s.Foreground(b.native(c))
}

func (b builder) bg(s lipgloss.Style, c lipgloss.TerminalColor) lipgloss.Style {
	if !b.color {
		return s
	}
	return s.Background(b.native(c))
}

func (b builder) borderFg(s lipgloss.Style, c lipgloss.TerminalColor) lipgloss.Style {
	if !b.color {
		return s
	}
	return s.BorderForeground(b.native(c))
}

// native resolves c for the renderer once: the adaptive colour's choice for
// the background, and a hex colour's nearest in a 256- or 16-colour
// profile. Left to lipgloss, both happen again in every Render: a colour
// distance search per styled segment, an eighth of a frame's cost on a
// 256-colour terminal.
func (b builder) native(c lipgloss.TerminalColor) lipgloss.TerminalColor {
	var spec string
	switch v := c.(type) {
	case lipgloss.AdaptiveColor:
		spec = v.Light
		if b.r.HasDarkBackground() {
			spec = v.Dark
		}
	case lipgloss.Color:
		spec = string(v)
	default:
		return c
	}
	switch v := b.r.ColorProfile().Color(spec).(type) {
	case termenv.ANSIColor:
		return lipgloss.Color(strconv.Itoa(int(v)))
	case termenv.ANSI256Color:
		return lipgloss.Color(strconv.Itoa(int(v)))
	case termenv.RGBColor:
		return lipgloss.Color(string(v))
	}
	return lipgloss.NoColor{}
}

// plain applies f only when colours are off, to replace a colour cue by an
// attribute.
func (b builder) plain(s lipgloss.Style, f func(lipgloss.Style) lipgloss.Style) lipgloss.Style {
	if b.color {
		return s
	}
	return f(s)
}

// build assembles a Theme from a palette.
func build(name string, p palette, b builder) *Theme {
	s := b.style
	t := &Theme{Name: name, Renderer: b.r}

	t.App = s()
	t.Title = b.fg(s().Bold(true), p.accent)
	t.Muted = b.plain(b.fg(s(), p.subtle), func(x lipgloss.Style) lipgloss.Style { return x.Faint(true) })
	t.Faint = b.fg(s().Faint(!p.strong || !b.color), p.faint)
	t.Bold = s().Bold(true)

	// Header bar: coloured fill, or reverse video without colour.
	t.Header = b.bg(b.fg(s().Bold(true).Padding(0, 1), p.headerFg), p.headerBg)
	t.Header = b.plain(t.Header, func(x lipgloss.Style) lipgloss.Style { return x.Reverse(true) })
	t.HeaderItem = s().Inherit(t.Header)
	t.CapOK = b.fg(s(), p.headerFg).Inherit(t.Header)
	t.CapFull = b.bg(b.fg(s().Bold(true), p.capFullFg), p.capFullBg)
	t.CapFull = b.plain(t.CapFull, func(x lipgloss.Style) lipgloss.Style { return x.Underline(true) }).Inherit(t.Header)
	t.CapOver = b.bg(b.fg(s().Bold(true).Underline(true), p.capOverFg), p.capOverBg)
	// Without colour, "over" breaks out of the reversed bar as well.
	t.CapOver = b.plain(t.CapOver, func(x lipgloss.Style) lipgloss.Style { return x.Reverse(false) }).Inherit(t.Header)

	t.PaneBorder = b.borderFg(s().Border(p.paneBorder), p.border)
	t.PaneBorderFocused = b.borderFg(s().Border(p.paneBorderFocused), p.borderFocus)
	t.PaneTitle = b.fg(s().Bold(p.strong), p.subtle)
	t.PaneTitleFocused = b.fg(s().Bold(true), p.accent)
	t.PaneTitleFocused = b.plain(t.PaneTitleFocused, func(x lipgloss.Style) lipgloss.Style { return x.Underline(true) })
	if p.strong {
		t.PaneTitleFocused = t.PaneTitleFocused.Underline(true)
	}

	// Reverse video with the accent as foreground gives an accent bar in
	// colour and a plain reverse bar without it (high-contrast keeps the
	// terminal's own colours reversed: the strongest contrast available).
	t.Selected = s().Reverse(true).Bold(true)
	if !p.strong {
		t.Selected = b.fg(t.Selected, p.accent)
	}
	t.Owner = b.fg(s().Bold(true), p.accent2)
	t.Owner = b.plain(t.Owner, func(x lipgloss.Style) lipgloss.Style { return x.Underline(true) })

	t.StateIdle = b.fg(s().Bold(p.strong && b.color), p.text)
	t.StateRunning = b.fg(s().Bold(true), p.ok)
	t.StateQueued = b.fg(s().Bold(p.strong), p.warn)
	t.StateQueued = b.plain(t.StateQueued, func(x lipgloss.Style) lipgloss.Style { return x.Underline(true) })
	t.StateStarting = b.fg(s(), p.accent2)
	t.StateStarting = b.plain(t.StateStarting, func(x lipgloss.Style) lipgloss.Style { return x.Faint(true) })
	t.StateDead = b.fg(s().Bold(p.strong), p.err)
	t.StateDead = b.plain(t.StateDead, func(x lipgloss.Style) lipgloss.Style { return x.Faint(true).Strikethrough(true) })
	t.NextEvict = b.fg(s().Bold(true), p.warn)
	t.NextEvict = b.plain(t.NextEvict, func(x lipgloss.Style) lipgloss.Style { return x.Underline(true) })
	if p.strong {
		t.NextEvict = t.NextEvict.Underline(true)
	}

	t.OK = b.fg(s().Bold(p.strong && b.color), p.ok)
	t.Warn = b.fg(s().Bold(true), p.warn)
	t.Error = b.fg(s().Bold(true), p.err)
	t.Error = b.plain(t.Error, func(x lipgloss.Style) lipgloss.Style { return x.Underline(true) })

	info := b.fg(s(), p.accent2)
	attention := b.fg(s().Bold(true), p.accent3)
	attention = b.plain(attention, func(x lipgloss.Style) lipgloss.Style { return x.Underline(true) })
	eviction := t.Warn.Underline(true)
	t.EventTypes = map[engine.EventType]lipgloss.Style{
		engine.EventSpawned:          t.OK,
		engine.EventSpawnFailed:      t.Error,
		engine.EventReused:           t.Muted,
		engine.EventReset:            info,
		engine.EventStateLost:        t.Error,
		engine.EventCellStarted:      info,
		engine.EventCellFinished:     t.OK,
		engine.EventCellTimeout:      t.Error,
		engine.EventInterrupted:      t.Warn,
		engine.EventKilled:           t.Error,
		engine.EventReapedIdle:       t.Warn,
		engine.EventEvictedCap:       eviction,
		engine.EventEvictSkippedBusy: info,
		engine.EventOwnerShutdown:    t.Warn,
		engine.EventRPCCall:          t.Muted,
		engine.EventRPCRejected:      t.Error,
		engine.EventFallbackPerCall:  t.Warn,
		engine.EventTransportError:   t.Error,
		engine.EventReconnected:      t.OK,
		engine.EventLimits:           info,
		engine.EventApprovalRequest:  attention,
		engine.EventApprovalDecided:  info,
		engine.EventAdopted:          info,
		engine.EventUnconfined:       t.Warn,
		engine.EventRunnerFlood:      t.Error,
		engine.EventCellOutput:       t.Muted,
		engine.EventNotice:           t.Warn,
		engine.EventMissed:           t.Warn,
		engine.EventParked:           info,
		engine.EventParkFailed:       t.Error,
		engine.EventRestored:         t.OK,
		engine.EventRestoreRefused:   t.Error,
		engine.EventParkDropped:      t.Warn,
		engine.EventHibernated:       info,
	}

	t.Prompt = b.borderFg(s().Border(p.promptBorder).Padding(0, 1), p.accent3)
	t.PromptTitle = attention

	t.HelpKey = b.fg(s().Bold(true), p.accent2)
	t.HelpDesc = b.fg(s(), p.subtle)
	t.HelpSep = b.fg(s().Faint(!p.strong || !b.color), p.faint)
	t.help = help.Styles{
		Ellipsis:       t.HelpSep,
		ShortKey:       t.HelpKey,
		ShortDesc:      t.HelpDesc,
		ShortSeparator: t.HelpSep,
		FullKey:        t.HelpKey,
		FullDesc:       t.HelpDesc,
		FullSeparator:  t.HelpSep,
	}

	t.Editor = b.fg(s(), p.text)
	t.EditorPrompt = b.fg(s().Bold(true), p.accent)
	return t
}
