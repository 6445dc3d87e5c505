package cli

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// The paste reader passes keys on, takes pastes of several lines out
// (ending the line with a CR) and lets one-line pastes through as typed,
// with markers split across reads anywhere.
func TestPasteReader(t *testing.T) {
	for _, tc := range []struct {
		name, in, keys, pasted string
	}{
		{"keys", "abc\x1b[Dd\r", "abc\x1b[Dd\r", ""},
		{"a block", "x\x1b[200~def f():\r\n\r\n    return 1\r\n\x1b[201~", "x\r", "def f():\n\n    return 1"},
		{"one line", "\x1b[200~print(1)\n\x1b[201~\r", "print(1)\r", ""},
		{"an escape that starts no marker", "\x1b[2Jz", "\x1b[2Jz", ""},
	} {
		for _, reads := range []string{"whole", "a byte at a time"} {
			t.Run(tc.name+", "+reads, func(t *testing.T) {
				var in io.Reader = strings.NewReader(tc.in)
				if reads != "whole" {
					in = iotest.OneByteReader(in)
				}
				p := newPasteReader(in)
				keys, err := io.ReadAll(p)
				if err != nil || string(keys) != tc.keys {
					t.Errorf("keys %q (%v), want %q", keys, err, tc.keys)
				}
				if pasted, tooLong := p.taken(); pasted != tc.pasted || tooLong != 0 {
					t.Errorf("pasted %q (too long %d), want %q", pasted, tooLong, tc.pasted)
				}
			})
		}
	}
	p := newPasteReader(strings.NewReader("\x1b[200~" + strings.Repeat("x\n", maxPaste) + "\x1b[201~"))
	keys, _ := io.ReadAll(p)
	if pasted, tooLong := p.taken(); string(keys) != "\r" || pasted != "" || tooLong <= maxPaste {
		t.Errorf("a paste over the bound: keys %q, %d bytes pasted, too long %d; want it dropped and said", keys, len(pasted), tooLong)
	}
}
