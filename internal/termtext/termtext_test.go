package termtext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClean(t *testing.T) {
	for _, tc := range []struct {
		in, keep, strip string
	}{
		{"plain text\n\tindented", "plain text\n\tindented", "plain text\n\tindented"},
		{"\x1b]52;c;Y3VybCBldmlsfHNo\x07", "␛]52;c;Y3VybCBldmlsfHNo␇", "␛]52;c;Y3VybCBldmlsfHNo␇"},
		{"\x1b]2;pwned\x07title", "␛]2;pwned␇title", "␛]2;pwned␇title"},
		{"\x1b[2J\x1b[H", "␛[2J␛[H", "␛[2J␛[H"},
		{"\x1b[31mred\x1b[0m ok", "\x1b[31mred\x1b[0m ok", "␛[31mred␛[0m ok"},
		{"\x1b[1;32mgreen\nnext", "\x1b[1;32mgreen\x1b[0m\nnext", "␛[1;32mgreen\nnext"},
		{"\x1b[31mno reset", "\x1b[31mno reset\x1b[0m", "␛[31mno reset"},
		{"\x1bP1$r\x1b\\", "␛P1$r␛\\", "␛P1$r␛\\"},
		{"a\rb\r\nc", "a␍b\nc", "a␍b\nc"},
		{"bell\x07 del\x7f nul\x00", "bell␇ del␡ nul␀", "bell␇ del␡ nul␀"},
		{"csi\u009b2J", `csi\x9b2J`, `csi\x9b2J`},
		{"abc\u202edcba", `abc\u202edcba`, `abc\u202edcba`},
		{"bad \xff utf8", "bad \ufffd utf8", "bad \ufffd utf8"},
		{"é漢 ok", "é漢 ok", "é漢 ok"},
		{"\x1b[38;5;1" + strings.Repeat("1", 40) + "m", "␛[38;5;1" + strings.Repeat("1", 40) + "m", "␛[38;5;1" + strings.Repeat("1", 40) + "m"},
	} {
		if got := Clean(tc.in, true); got != tc.keep {
			t.Errorf("Clean(%q, keep) = %q, want %q", tc.in, got, tc.keep)
		}
		if got := Clean(tc.in, false); got != tc.strip {
			t.Errorf("Clean(%q, strip) = %q, want %q", tc.in, got, tc.strip)
		}
	}
}

// Line keeps an event's field on one line, whatever it holds.
func TestLine(t *testing.T) {
	for in, want := range map[string]string{
		"plain": "plain",
		"nope\n2026-12-05 19:00:00  owner_shutdown  kdalice  forged": "nope␊2026-12-05 19:00:00  owner_shutdown  kdalice  forged",
		"a\r\nb\tc\x1b[31m":    "a␍␊b␉c␛[31m",
		"abc\u202edcba \u0085": `abc\u202edcba \x85`,
	} {
		if got := Line(in); got != want {
			t.Errorf("Line(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzClean: whatever the input, the output is valid UTF-8 with no control
// character but newline and tab, no C1 control and no escape except kept
// SGR sequences (none at all when they are not kept), and cleaning it again
// changes nothing.
func FuzzClean(f *testing.F) {
	for _, s := range []string{"\x1b]52;c;eA==\x07", "\x1b[31mx\x1b[0m", "\x1b[2J", "\r\n\r", "\u009b", "\xc2\x9b", "\x1b[", "\x1b[1;2;3m\n"} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, in string, keep bool) {
		if line := Line(in); strings.ContainsAny(line, "\n\r\t\x1b") || Line(line) != line || !utf8.ValidString(line) {
			t.Fatalf("Line(%q) = %q is not one clean, stable line", in, line)
		}
		out := Clean(in, keep)
		if !utf8.ValidString(out) {
			t.Fatalf("Clean(%q) = %q is not valid UTF-8", in, out)
		}
		for i := 0; i < len(out); i++ {
			c := out[i]
			if c == 0x1b {
				n, _ := sgrAt(out[i:])
				if !keep || n == 0 {
					t.Fatalf("Clean(%q, %v) = %q passes an escape at %d", in, keep, out, i)
				}
				i += n - 1
				continue
			}
			if (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f {
				t.Fatalf("Clean(%q, %v) = %q passes control byte %#x", in, keep, out, c)
			}
		}
		for _, r := range out {
			if (r >= 0x80 && r <= 0x9f) || bidi(r) {
				t.Fatalf("Clean(%q, %v) = %q passes control %U", in, keep, out, r)
			}
		}
		if again := Clean(out, keep); again != out {
			t.Fatalf("Clean is not stable: %q -> %q -> %q", in, out, again)
		}
	})
}
