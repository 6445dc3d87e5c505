package ui

import "github.com/charmbracelet/x/ansi"

// cells is the width of s on the terminal, as ansi.StringWidth counts it.
// The dashboard's lines are mostly ASCII with SGR styles: those are counted
// here byte by byte, without the grapheme segmentation that made width
// counting half of a frame's cost. Anything else (a byte outside ASCII, a
// control, an escape other than a well-formed CSI) goes to ansi.StringWidth.
func cells(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 0x20 && c < 0x7f:
			n++
		case c == 0x1b && i+1 < len(s) && s[i+1] == '[':
			end, ok := csiEnd(s, i+2)
			if !ok {
				return ansi.StringWidth(s)
			}
			i = end
		default:
			return ansi.StringWidth(s)
		}
	}
	return n
}

// csiEnd finds the final byte of a control sequence whose parameters start
// at s[i]: parameter bytes (0x30–0x3F), then intermediate bytes
// (0x20–0x2F), then one final byte (0x40–0x7E). ok is false for anything
// else, the sequence cut short included.
func csiEnd(s string, i int) (end int, ok bool) {
	for i < len(s) && s[i] >= 0x30 && s[i] <= 0x3f {
		i++
	}
	for i < len(s) && s[i] >= 0x20 && s[i] <= 0x2f {
		i++
	}
	if i < len(s) && s[i] >= 0x40 && s[i] <= 0x7e {
		return i, true
	}
	return 0, false
}
