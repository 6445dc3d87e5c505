package ui

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"
)

// cellsPieces are what dashboard lines and hostile text are made of: ASCII,
// styles, cut and malformed sequences, controls, wide and combining
// runes, emoji sequences whose first rune is ASCII (a keycap).
var cellsPieces = []string{
	"a", "Z", " ", "~", "0", "#", "\x1b[0m", "\x1b[1;38;5;141m", "\x1b[48;2;1;2;3m", "\x1b[", "\x1b[38;5", "\x1b",
	"\x1b]8;;http://x\x07", "\x1bP", "\x1b[?25l", "\x1b[ q", "\x1b[ 1m", "\x1b[1 ;2m", "\x1b[1;\x80m", "\t", "\n", "\r", "\x7f", "\x00",
	"…", "▾", "●", "界", "é", "e\u0301", "\u0301", "\u200d", "👍", "👍🏽", "1\ufe0f\u20e3", "\u0600", "\xff", "\xe2\x80",
}

// TestCellsCountsAsStringWidth: cells agrees with ansi.StringWidth on the
// table, and on 50,000 strings put together from cellsPieces.
func TestCellsCountsAsStringWidth(t *testing.T) {
	for _, s := range []string{"", "plain", "\x1b[1mbold\x1b[0m", "│ ▾ bob  1 kernel", "k-a1     running   42s", "x\x1b[", "x\x1b[1"} {
		if got, want := cells(s), ansi.StringWidth(s); got != want {
			t.Errorf("cells(%q) = %d, ansi.StringWidth %d", s, got, want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 50000 {
		var b strings.Builder
		for range r.IntN(12) {
			b.WriteString(cellsPieces[r.IntN(len(cellsPieces))])
		}
		s := b.String()
		if got, want := cells(s), ansi.StringWidth(s); got != want {
			t.Fatalf("cells(%q) = %d, ansi.StringWidth %d", s, got, want)
		}
	}
}

// FuzzCells: cells never disagrees with ansi.StringWidth.
func FuzzCells(f *testing.F) {
	for _, p := range cellsPieces {
		f.Add("ab" + p + "cd")
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := cells(s), ansi.StringWidth(s); got != want {
			t.Fatalf("cells(%q) = %d, ansi.StringWidth %d", s, got, want)
		}
	})
}
