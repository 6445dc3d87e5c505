package termimage

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/png"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"

	"github.com/kerneldeck/kerneldeck/internal/imagetest"
)

func TestImageModeFromEnvironment(t *testing.T) {
	for _, tc := range []struct {
		flag string
		env  map[string]string
		want Mode
	}{
		{"auto", map[string]string{"TERM": "xterm-kitty"}, Kitty},
		{"auto", map[string]string{"TERM": "xterm-256color", "KITTY_WINDOW_ID": "3"}, Kitty},
		{"auto", map[string]string{"TERM": "xterm-256color", "TERM_PROGRAM": "WezTerm"}, Kitty},
		{"auto", map[string]string{"TERM": "foot"}, Sixel},
		{"auto", map[string]string{"TERM": "xterm-256color"}, Off},
		{"auto", map[string]string{"TERM": "xterm-kitty", "TMUX": "/tmp/tmux-0/default,1,0"}, Off},
		{"auto", map[string]string{"TERM": "screen-256color", "KITTY_WINDOW_ID": "3"}, Off},
		{"", map[string]string{"TERM": "foot"}, Sixel},
		{"kitty", map[string]string{"TMUX": "x"}, Kitty},
		{"sixel", nil, Sixel},
		{"off", map[string]string{"TERM": "xterm-kitty"}, Off},
	} {
		got, err := Parse(tc.flag, func(k string) string { return tc.env[k] })
		if err != nil || got != tc.want {
			t.Errorf("--images=%q with %v: %q, %v; want %q", tc.flag, tc.env, got, err, tc.want)
		}
	}
	if _, err := Parse("iterm", func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "auto, kitty, sixel or off") {
		t.Errorf("--images=iterm: %v, want an error naming the modes", err)
	}
}

func TestKittyImageLines(t *testing.T) {
	raw := imagetest.Halves(t, 320, 160)
	lines, err := Lines(Kitty, ID(3, 1), raw, 60)
	if err != nil {
		t.Fatal(err)
	}
	cols, rows := Box(320, 160, 60)
	if cols != 40 || rows != 10 || len(lines) != rows {
		t.Fatalf("box %d×%d, %d lines; want 40×10 (320×160 px in 8×16 cells)", cols, rows, len(lines))
	}
	keys, img, ok := imagetest.Kitty(lines[0])
	if !ok {
		t.Fatal("the first line transmits no whole PNG")
	}
	for _, k := range []string{"a=T", "U=1", "f=100", "q=2", "c=40", "r=10", "i=8388993"} {
		if !strings.Contains(","+keys+",", ","+k+",") {
			t.Errorf("transmission keys %q lack %s", keys, k)
		}
	}
	if b := img.Bounds(); b.Dx() != 320 || b.Dy() != 160 {
		t.Errorf("transmitted %v, want the 320×160 image", b)
	}
	// id 8388993 = 0x800181 (1<<23 | cell run 3<<7 | display 1): the
	// placeholders' colour.
	for r, l := range lines {
		if w := ansi.StringWidth(l); w != 40 {
			t.Errorf("line %d is %d cells wide, want 40", r, w)
		}
		if !strings.Contains(l, "\x1b[38;2;128;1;129m"+string(KittyPlaceholder)+string(kittyRowMarks[r])+string(kittyRowMarks[0])) {
			t.Errorf("line %d does not start row %d of image 0x800181: %q", r, r, ansi.Strip(l)[:20])
		}
		if r > 0 && strings.Contains(l, "\x1b_G") {
			t.Errorf("line %d transmits again", r)
		}
	}
}

func TestSixelImageLines(t *testing.T) {
	raw := imagetest.Halves(t, 640, 320)
	lines, err := Lines(Sixel, 1, raw, 60)
	if err != nil {
		t.Fatal(err)
	}
	cols, rows := Box(640, 320, 60)
	if cols != 60 || rows != 15 || len(lines) != rows {
		t.Fatalf("box %d×%d, %d lines; want 60×15", cols, rows, len(lines))
	}
	last := lines[rows-1]
	start := strings.Index(last, "\x1bP")
	if !strings.HasPrefix(last, "\x1b7\x1b[14A") || start < 0 || !strings.Contains(last, "\x1b8") {
		t.Fatalf("the last line does not draw the image from 14 lines up: %q", last[:min(len(last), 30)])
	}
	img, ok := imagetest.Sixel(last[start:])
	if !ok {
		t.Fatal("the last line's sixel does not decode")
	}
	// Scaled to 480 px wide (60 cells of 8), its left half red.
	if b := img.Bounds(); b.Dx() != 480 || b.Dy() != 240 {
		t.Errorf("sixel image %v, want 480×240", b)
	}
	if !imagetest.IsRed(img.At(10, 10)) {
		t.Errorf("pixel (10,10) is %v, want red", img.At(10, 10))
	}
	for i, l := range lines {
		if w := ansi.StringWidth(l); w != 60 || strings.ContainsAny(l, "\n\r") {
			t.Errorf("line %d: %d cells, newline %v", i, w, strings.ContainsAny(l, "\n\r"))
		}
	}
	// Scrolled so that its top is gone, the drawing is dropped (it would
	// go over the border); fully visible, it stays.
	if got := ClipSixels(lines); got[rows-1] != last {
		t.Error("a fully visible image lost its drawing")
	}
	if got := ClipSixels(lines[2:]); strings.Contains(got[rows-3], "\x1bP") || ansi.StringWidth(got[rows-3]) != 60 {
		t.Errorf("an image scrolled up by two kept its drawing: %q", got[rows-3][:min(30, len(got[rows-3]))])
	}
}

func TestInlineImageRefusesBombs(t *testing.T) {
	// A PNG header that claims 30000×30000 pixels.
	var buf bytes.Buffer
	png.Encode(&buf, image.NewGray(image.Rect(0, 0, 1, 1)))
	claim := buf.Bytes()
	copy(claim[16:24], []byte{0, 0, 0x75, 0x30, 0, 0, 0x75, 0x30})
	binary.BigEndian.PutUint32(claim[29:33], crc32.ChecksumIEEE(claim[12:29]))
	if _, err := Lines(Kitty, 1, claim, 80); err != ErrTooLarge {
		t.Errorf("a 30000×30000 claim: %v, want %v", err, ErrTooLarge)
	}
	if _, err := Lines(Sixel, 1, []byte("not an image"), 80); err == nil {
		t.Error("garbage was drawn")
	}
}
