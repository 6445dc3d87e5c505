package ui

import (
	"fmt"
	"strings"
	"time"

	"github.com/charmbracelet/bubbles/viewport"
	"github.com/charmbracelet/x/ansi"

	"github.com/kerneldeck/kerneldeck/internal/termtext"
)

// output is text from a kernel (cell output, tracebacks, notes) made safe
// for the terminal: escape sequences shown, not obeyed; plain colours kept.
func output(s string) string { return termtext.Clean(s, true) }

// plain is a name or message from outside (owners, tasks, event details,
// errors) made safe for the terminal, with no escape kept at all.
func plain(s string) string { return termtext.Clean(s, false) }

// fit pads or cuts s (which may hold ANSI styles) to exactly w cells.
func fit(s string, w int) string {
	if w <= 0 {
		return ""
	}
	sw := cells(s)
	if sw > w {
		s = ansi.Truncate(s, w, "…")
		sw = cells(s)
	}
	return s + strings.Repeat(" ", max(0, w-sw))
}

// box draws lines inside a border of exactly w×h cells, with the title set
// into the top edge. Lines beyond the box are cut, missing ones are blank.
func (c *Context) box(title string, lines []string, w, h int, focused bool) string {
	if h <= 0 {
		return ""
	}
	if w < 2 || h < 2 {
		return strings.Repeat("\n", h-1)
	}
	b, st, tst := c.borders.normal, c.borders.normalStyle, c.borders.titleStyle
	if focused {
		b, st, tst = c.borders.focused, c.borders.focusedStyle, c.borders.titleFocusStyle
	}
	inner := w - 2
	var sb strings.Builder
	top := b.Top
	if title != "" && inner > 4 {
		t := fit(" "+title+" ", min(inner-2, cells(title)+2))
		rest := inner - 1 - cells(t)
		sb.WriteString(st.Render(b.TopLeft+top) + tst.Render(t) + st.Render(strings.Repeat(top, max(0, rest))+b.TopRight))
	} else {
		sb.WriteString(st.Render(b.TopLeft + strings.Repeat(top, inner) + b.TopRight))
	}
	left, right := st.Render(b.Left), st.Render(b.Right)
	for i := 0; i < h-2; i++ {
		line := ""
		if i < len(lines) {
			line = lines[i]
		}
		sb.WriteString("\n" + left + fit(line, inner) + right)
	}
	sb.WriteString("\n" + st.Render(b.BottomLeft+strings.Repeat(b.Bottom, inner)+b.BottomRight))
	return sb.String()
}

// joinColumns puts blocks of equal height side by side.
func joinColumns(blocks ...string) string {
	cols := make([][]string, len(blocks))
	n := 0
	for i, b := range blocks {
		cols[i] = strings.Split(b, "\n")
		n = max(n, len(cols[i]))
	}
	out := make([]string, n)
	for i := range n {
		var sb strings.Builder
		for _, c := range cols {
			if i < len(c) {
				sb.WriteString(c[i])
			}
		}
		out[i] = sb.String()
	}
	return strings.Join(out, "\n")
}

// short renders a duration the way the dashboard's timers show it: 42s,
// 3m05s, 2h10m.
func short(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	d = d.Truncate(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
}

// wrapLines splits text into display lines of at most w cells.
func wrapLines(text string, w int) []string {
	if w <= 0 {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(strings.TrimRight(text, "\n"), "\n") {
		out = append(out, wrapLine(line, w)...)
	}
	return out
}

// wrapLine splits one line of output into display lines of at most w
// cells, between words where it can (a word longer than w is cut).
func wrapLine(line string, w int) []string {
	if w <= 0 {
		return nil
	}
	line = strings.ReplaceAll(line, "\t", "    ")
	return strings.Split(ansi.Wrap(line, w, ""), "\n")
}

// hardWrapLines is wrapLines cutting at exactly w cells, spaces kept: for
// text whose every byte matters (a tool call's arguments to approve).
func hardWrapLines(text string, w int) []string {
	if w <= 0 {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(strings.TrimRight(text, "\n"), "\n") {
		out = append(out, strings.Split(ansi.Hardwrap(strings.ReplaceAll(line, "\t", "    "), w, true), "\n")...)
	}
	return out
}

// wordWrapLines splits prose (event details, prompts) into lines of at most
// w cells, breaking between words where it can.
func wordWrapLines(text string, w int) []string {
	if w <= 0 {
		return nil
	}
	return strings.Split(ansi.Wrap(strings.TrimRight(text, "\n"), w, ""), "\n")
}

// scroller is a pane's scroll position over lines it draws itself, kept by
// bubbles/viewport. The viewport is given only the line count: handed the
// lines, it measures the width of every one on each update, which costs
// more than drawing them (12 ms per streamed chunk at 13k lines).
type scroller struct {
	vp viewport.Model
	n  int
}

// setLines sets how many lines there are; at the end is where following
// keeps the position.
func (s *scroller) setLines(n int, follow bool) {
	if n != s.n || s.vp.TotalLineCount() == 0 {
		s.n = n
		s.vp.SetContent(strings.Repeat("\n", max(0, n-1)))
	}
	if follow {
		s.vp.GotoBottom()
	} else {
		s.vp.SetYOffset(s.vp.YOffset)
	}
}

// setHeight sets how many lines fit.
func (s *scroller) setHeight(h int) {
	s.vp.Height = max(0, h)
	s.vp.SetYOffset(s.vp.YOffset)
}

// window is the range of lines in view.
func (s *scroller) window() (from, to int) {
	from = min(max(0, s.vp.YOffset), s.n)
	return from, min(s.n, from+s.vp.Height)
}

// atEnd reports whether the last line is in view.
func (s *scroller) atEnd() bool { return s.vp.AtBottom() }
