// Package termimage draws images in a terminal, as the kitty graphics
// protocol (Unicode placeholders) or sixel, from what the terminal tells
// its programs.
package termimage

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"image"
	"image/png"
	"slices"
	"strings"

	"github.com/mattn/go-sixel"
)

// Mode is how a cell's images are drawn: inline with the
// kitty graphics protocol or with sixel, or as a label line.
type Mode string

// The image modes; --images also takes auto (Detect).
const (
	Off   Mode = "off"
	Kitty Mode = "kitty"
	Sixel Mode = "sixel"
)

// Parse reads --images: auto, kitty, sixel or off. auto asks
// Detect of the environment getenv reads.
func Parse(s string, getenv func(string) string) (Mode, error) {
	switch m := Mode(s); m {
	case Off, Kitty, Sixel:
		return m, nil
	case "auto", "":
		return Detect(getenv), nil
	}
	return "", fmt.Errorf("%q is not an image mode: use auto, kitty, sixel or off", s)
}

// Detect says what the terminal draws, from what it tells its
// programs in the environment: kitty, Ghostty and WezTerm speak the kitty
// protocol; foot, mlterm and contour sixel. Inside tmux or screen, which
// pass neither on by default, and on anything else, off.
func Detect(getenv func(string) string) Mode {
	term := getenv("TERM")
	if getenv("TMUX") != "" || getenv("STY") != "" || strings.HasPrefix(term, "screen") || strings.HasPrefix(term, "tmux") {
		return Off
	}
	switch {
	case term == "xterm-kitty" || term == "xterm-ghostty" || getenv("KITTY_WINDOW_ID") != "" || getenv("GHOSTTY_RESOURCES_DIR") != "":
		return Kitty
	case getenv("TERM_PROGRAM") == "WezTerm" || getenv("TERM_PROGRAM") == "ghostty":
		return Kitty
	case term == "foot" || term == "foot-extra" || term == "mlterm" || term == "contour":
		return Sixel
	}
	return Off
}

// Bounds on an inline image: a cell is taken as 8×16 pixels (terminals
// differ; the image keeps its aspect within its box), the box is at most
// MaxRows high (kitty's placeholder rows are numbered by diacritics,
// of which the first 30 are used), and an image of more than maxImagePixels
// is not decoded (a small PNG can claim a huge bitmap).
const (
	cellPixelsW    = 8
	cellPixelsH    = 16
	MaxRows        = 20
	MaxCols        = 80
	maxImagePixels = 40 << 20
)

// kittyRowMarks are the combining marks that number the rows of kitty's
// Unicode placeholders (the start of its rowcolumn-diacritics table).
var kittyRowMarks = []rune{0x0305, 0x030D, 0x030E, 0x0310, 0x0312, 0x033D, 0x033E, 0x033F, 0x0346, 0x034A,
	0x034B, 0x034C, 0x0350, 0x0351, 0x0352, 0x0357, 0x035B, 0x0363, 0x0364, 0x0365,
	0x0366, 0x0367, 0x0368, 0x0369, 0x036A, 0x036B, 0x036C, 0x036D, 0x036E, 0x036F}

// KittyPlaceholder is the character kitty draws a placed image's cell in.
const KittyPlaceholder = '\U0010EEEE'

// ErrTooLarge is an image that claims more pixels than are decoded.
var ErrTooLarge = errors.New("too large to draw")

// ID names display i of cell run seq to the terminal: non-zero, and
// within 24 bits, as kitty reads it from a placeholder's colour.
func ID(seq, i int) uint32 { return 1<<23 | uint32(seq%(1<<16))<<7 | uint32(i%(1<<7)) }

// SixelStart and SixelEnd enclose the sixel drawing on an image's last line
// (cell output never holds an ESC: it is shown as ␛).
const SixelStart, SixelEnd = "\x1b7", "\x1b8"

// ClipSixels drops the drawing from the visible lines whose image's top is
// scrolled above the first of them: drawn, it would go over the border.
// It returns lines itself when nothing changes.
func ClipSixels(lines []string) []string {
	var out []string
	for i, l := range lines[:min(len(lines), MaxRows)] {
		start := strings.Index(l, SixelStart+"\x1b[")
		if start < 0 {
			continue
		}
		var up int
		fmt.Sscanf(l[start+len(SixelStart)+2:], "%dA", &up)
		if up <= i {
			continue
		}
		end := strings.Index(l[start:], SixelEnd)
		if end < 0 {
			continue
		}
		if out == nil {
			out = slices.Clone(lines)
		}
		out[i] = l[:start] + l[start+end+len(SixelEnd):]
	}
	if out == nil {
		return lines
	}
	return out
}

// Lines decodes raw (a PNG, JPEG or GIF) and draws it for mode in
// rows lines of at most w cells, as image id (kitty names the image by it).
// For sixel the last line draws the image, going up: drawn by the first, it
// would be painted over by the blank lines after it.
func Lines(mode Mode, id uint32, raw []byte, w int) ([]string, error) {
	cfg, _, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if cfg.Width <= 0 || cfg.Height <= 0 || cfg.Width*cfg.Height > maxImagePixels {
		return nil, ErrTooLarge
	}
	img, _, err := image.Decode(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	cols, rows := Box(cfg.Width, cfg.Height, w)
	scaled := scale(img, cols*cellPixelsW, rows*cellPixelsH)
	blank := strings.Repeat(" ", cols)
	switch mode {
	case Kitty:
		var buf bytes.Buffer
		if err := png.Encode(&buf, scaled); err != nil {
			return nil, err
		}
		var lines []string
		// The image id is the placeholders' foreground colour.
		colour := fmt.Sprintf("\x1b[38;2;%d;%d;%dm", id>>16&0xff, id>>8&0xff, id&0xff)
		for r := range rows {
			line := colour + string(KittyPlaceholder) + string(kittyRowMarks[r]) + string(kittyRowMarks[0]) +
				strings.Repeat(string(KittyPlaceholder), cols-1) + "\x1b[39m"
			if r == 0 {
				line = kittyTransmit(id, cols, rows, buf.Bytes()) + line
			}
			lines = append(lines, line)
		}
		return lines, nil
	case Sixel:
		var buf bytes.Buffer
		enc := sixel.NewEncoder(&buf)
		if err := enc.Encode(scaled); err != nil {
			return nil, err
		}
		six := strings.NewReplacer("\n", "", "\r", "").Replace(buf.String())
		var lines []string
		for range rows - 1 {
			lines = append(lines, blank)
		}
		up := ""
		if rows > 1 {
			up = fmt.Sprintf("\x1b[%dA", rows-1)
		}
		// Save the cursor, go up to the image's top, draw, come back.
		return append(lines, SixelStart+up+six+SixelEnd+blank), nil
	}
	return nil, fmt.Errorf("image mode %q draws nothing", mode)
}

// Box is the cells an image of pw×ph pixels takes in at most w
// columns, keeping its aspect.
func Box(pw, ph, w int) (cols, rows int) {
	cols = min(max(1, w), MaxCols, (pw+cellPixelsW-1)/cellPixelsW)
	rows = (ph*cols*cellPixelsW/pw + cellPixelsH - 1) / cellPixelsH
	if rows > MaxRows {
		rows = MaxRows
		cols = max(1, min(cols, pw*rows*cellPixelsH/ph/cellPixelsW))
	}
	return cols, max(1, rows)
}

// scale fits img into w×h pixels, keeping its aspect, nearest pixel.
func scale(img image.Image, w, h int) image.Image {
	b := img.Bounds()
	sw, sh := b.Dx(), b.Dy()
	if sw*h > sh*w {
		h = max(1, sh*w/sw)
	} else {
		w = max(1, sw*h/sh)
	}
	if w >= sw && h >= sh {
		return img
	}
	out := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			out.Set(x, y, img.At(b.Min.X+x*sw/w, b.Min.Y+y*sh/h))
		}
	}
	return out
}

// kittyTransmit sends a PNG as image id with a virtual placement of
// cols×rows cells (U=1), drawn where its placeholders are; quiet (q=2), so
// the terminal answers nothing into the input.
func kittyTransmit(id uint32, cols, rows int, pngData []byte) string {
	data := base64.StdEncoding.EncodeToString(pngData)
	var b strings.Builder
	const chunk = 4096
	for i := 0; i < len(data); i += chunk {
		part := data[i:min(len(data), i+chunk)]
		more := 1
		if i+chunk >= len(data) {
			more = 0
		}
		if i == 0 {
			fmt.Fprintf(&b, "\x1b_Ga=T,U=1,f=100,t=d,q=2,i=%d,c=%d,r=%d,m=%d;%s\x1b\\", id, cols, rows, more, part)
		} else {
			fmt.Fprintf(&b, "\x1b_Gm=%d;%s\x1b\\", more, part)
		}
	}
	return b.String()
}
