// Package termtext makes untrusted text safe to show on a terminal. Cell
// output, tracebacks and event details come from kernel code; written as
// they are, an escape sequence in them could set the clipboard (OSC 52),
// the window title (OSC 2), clear or repaint the screen, or move the cursor
// over the dashboard's own text. Clean shows every control character
// visibly instead, and can keep plain SGR colours.
package termtext

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// maxSGR bounds the parameters of an SGR sequence that is kept.
const maxSGR = 32

// Clean returns s with every control character and escape sequence made
// visible: C0 controls as their Unicode pictures ("␛", "␇"), DEL as "␡", C1
// controls and bidirectional overrides as "\x9b" or "\u202e", invalid UTF-8
// as U+FFFD. Newlines and tabs stay; "\r\n" becomes "\n". With keepSGR,
// well-formed SGR sequences (ESC [ digits and ; m) are kept, and a line that
// ends with one in force gets a reset, so colour never leaks past it.
func Clean(s string, keepSGR bool) string { return clean(s, keepSGR, false) }

// Line is Clean without styles for text that must stay one line, such as
// an event's fields: newlines, carriage returns and tabs are shown as
// their pictures ("␊", "␍", "␉") too, so text a kernel chose cannot start
// what looks like another line.
func Line(s string) string { return clean(s, false, true) }

func clean(s string, keepSGR, oneLine bool) string {
	if isPlain(s, oneLine) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	styled := false // a kept SGR is in force
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case oneLine && c < 0x20:
			b.WriteRune(0x2400 + rune(c))
			i++
		case c == '\n':
			if styled {
				b.WriteString("\x1b[0m")
				styled = false
			}
			b.WriteByte('\n')
			i++
		case c == '\r' && i+1 < len(s) && s[i+1] == '\n':
			i++ // the \n writes itself
		case c == '\t':
			b.WriteByte('\t')
			i++
		case c == 0x1b && keepSGR:
			if n, reset := sgrAt(s[i:]); n > 0 {
				b.WriteString(s[i : i+n])
				styled = !reset
				i += n
				continue
			}
			b.WriteRune(0x2400 + 0x1b)
			i++
		case c < 0x20:
			b.WriteRune(0x2400 + rune(c))
			i++
		case c == 0x7f:
			b.WriteRune('␡')
			i++
		case c < utf8.RuneSelf:
			b.WriteByte(c)
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			switch {
			case r == utf8.RuneError && size == 1:
				b.WriteRune(utf8.RuneError)
			case r >= 0x80 && r <= 0x9f:
				fmt.Fprintf(&b, `\x%02x`, r)
			case bidi(r):
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				b.WriteString(s[i : i+size])
			}
			i += size
		}
	}
	if styled {
		b.WriteString("\x1b[0m")
	}
	return b.String()
}

// isPlain reports whether s is printable ASCII, and newlines and tabs
// unless oneLine: the common case, returned as it is.
func isPlain(s string, oneLine bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 0x20 && (oneLine || (c != '\n' && c != '\t'))) || c >= 0x7f {
			return false
		}
	}
	return true
}

// sgrAt returns the length of the SGR sequence s starts with (0 if none)
// and whether it resets all attributes.
func sgrAt(s string) (n int, reset bool) {
	if len(s) < 3 || s[1] != '[' {
		return 0, false
	}
	for j := 2; j < len(s) && j < 2+maxSGR+1; j++ {
		switch c := s[j]; {
		case c == 'm':
			params := s[2:j]
			return j + 1, params == "" || params == "0"
		case c >= '0' && c <= '9', c == ';':
		default:
			return 0, false
		}
	}
	return 0, false
}

// bidi reports the Unicode controls that reorder what follows them, which
// could make shown text read differently from what it is.
func bidi(r rune) bool {
	return (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200e || r == 0x200f || r == 0x061c
}

// Hidden reports the characters a screen does not show as themselves but
// that change what text means where it is pasted: the bidirectional
// controls (shown escaped here) and the zero-width ones, which show as
// nothing.
func Hidden(r rune) bool {
	switch r {
	case 0x200b, 0x200c, 0x200d, 0x2060, 0xfeff, 0x180e:
		return true
	}
	return bidi(r)
}
