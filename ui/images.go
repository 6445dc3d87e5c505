package ui

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"image"
	"image/png"
	"slices"
	"strings"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/mattn/go-sixel"
)

// ImageMode is how the output pane draws a cell's images: inline with the
// kitty graphics protocol or with sixel, or as a label line.
type ImageMode string

// The image modes; --images also takes auto (DetectImageMode).
const (
	ImagesOff   ImageMode = "off"
	ImagesKitty ImageMode = "kitty"
	ImagesSixel ImageMode = "sixel"
)

// ParseImageMode reads --images: auto, kitty, sixel or off. auto asks
// DetectImageMode of the environment getenv reads.
func ParseImageMode(s string, getenv func(string) string) (ImageMode, error) {
	switch m := ImageMode(s); m {
	case ImagesOff, ImagesKitty, ImagesSixel:
		return m, nil
	case "auto", "":
		return DetectImageMode(getenv), nil
	}
	return "", fmt.Errorf("%q is not an image mode: use auto, kitty, sixel or off", s)
}

// DetectImageMode says what the terminal draws, from what it tells its
// programs in the environment: kitty, Ghostty and WezTerm speak the kitty
// protocol; foot, mlterm and contour sixel. Inside tmux or screen, which
// pass neither on by default, and on anything else, off.
func DetectImageMode(getenv func(string) string) ImageMode {
	term := getenv("TERM")
	if getenv("TMUX") != "" || getenv("STY") != "" || strings.HasPrefix(term, "screen") || strings.HasPrefix(term, "tmux") {
		return ImagesOff
	}
	switch {
	case term == "xterm-kitty" || term == "xterm-ghostty" || getenv("KITTY_WINDOW_ID") != "" || getenv("GHOSTTY_RESOURCES_DIR") != "":
		return ImagesKitty
	case getenv("TERM_PROGRAM") == "WezTerm" || getenv("TERM_PROGRAM") == "ghostty":
		return ImagesKitty
	case term == "foot" || term == "foot-extra" || term == "mlterm" || term == "contour":
		return ImagesSixel
	}
	return ImagesOff
}

// Bounds on an inline image: a cell is taken as 8×16 pixels (terminals
// differ; the image keeps its aspect within its box), the box is at most
// maxImageRows high (kitty's placeholder rows are numbered by diacritics,
// of which the first 30 are used), and an image of more than maxImagePixels
// is not decoded (a small PNG can claim a huge bitmap).
const (
	cellPixelsW    = 8
	cellPixelsH    = 16
	maxImageRows   = 20
	maxImageCols   = 80
	maxImagePixels = 40 << 20
)

// kittyRowMarks are the combining marks that number the rows of kitty's
// Unicode placeholders (the start of its rowcolumn-diacritics table).
var kittyRowMarks = []rune{0x0305, 0x030D, 0x030E, 0x0310, 0x0312, 0x033D, 0x033E, 0x033F, 0x0346, 0x034A,
	0x034B, 0x034C, 0x0350, 0x0351, 0x0352, 0x0357, 0x035B, 0x0363, 0x0364, 0x0365,
	0x0366, 0x0367, 0x0368, 0x0369, 0x036A, 0x036B, 0x036C, 0x036D, 0x036E, 0x036F}

// kittyPlaceholder is the character kitty draws a placed image's cell in.
const kittyPlaceholder = '\U0010EEEE'

var errImageTooLarge = errors.New("too large to draw")

// imageID names display i of cell run seq to the terminal: non-zero, and
// within 24 bits, as kitty reads it from a placeholder's colour.
func imageID(seq, i int) uint32 { return 1<<23 | uint32(seq%(1<<16))<<7 | uint32(i%(1<<7)) }

// sixelStart and sixelEnd enclose the sixel drawing on an image's last line
// (cell output never holds an ESC: it is shown as ␛).
const sixelStart, sixelEnd = "\x1b7", "\x1b8"

// clipSixels drops the drawing from the visible lines whose image's top is
// scrolled above the first of them: drawn, it would go over the border.
// It returns lines itself when nothing changes.
func clipSixels(lines []string) []string {
	var out []string
	for i, l := range lines[:min(len(lines), maxImageRows)] {
		start := strings.Index(l, sixelStart+"\x1b[")
		if start < 0 {
			continue
		}
		var up int
		fmt.Sscanf(l[start+len(sixelStart)+2:], "%dA", &up)
		if up <= i {
			continue
		}
		end := strings.Index(l[start:], sixelEnd)
		if end < 0 {
			continue
		}
		if out == nil {
			out = slices.Clone(lines)
		}
		out[i] = l[:start] + l[start+end+len(sixelEnd):]
	}
	if out == nil {
		return lines
	}
	return out
}

// imageLines decodes raw (a PNG, JPEG or GIF) and draws it for mode in
// rows lines of at most w cells, as image id (kitty names the image by it).
// For sixel the last line draws the image, going up: drawn by the first, it
// would be painted over by the blank lines after it.
func imageLines(mode ImageMode, id uint32, raw []byte, w int) ([]string, error) {
	cfg, _, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if cfg.Width <= 0 || cfg.Height <= 0 || cfg.Width*cfg.Height > maxImagePixels {
		return nil, errImageTooLarge
	}
	img, _, err := image.Decode(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	cols, rows := imageBox(cfg.Width, cfg.Height, w)
	scaled := scaleImage(img, cols*cellPixelsW, rows*cellPixelsH)
	blank := strings.Repeat(" ", cols)
	switch mode {
	case ImagesKitty:
		var buf bytes.Buffer
		if err := png.Encode(&buf, scaled); err != nil {
			return nil, err
		}
		var lines []string
		// The image id is the placeholders' foreground colour.
		colour := fmt.Sprintf("\x1b[38;2;%d;%d;%dm", id>>16&0xff, id>>8&0xff, id&0xff)
		for r := range rows {
			line := colour + string(kittyPlaceholder) + string(kittyRowMarks[r]) + string(kittyRowMarks[0]) +
				strings.Repeat(string(kittyPlaceholder), cols-1) + "\x1b[39m"
			if r == 0 {
				line = kittyTransmit(id, cols, rows, buf.Bytes()) + line
			}
			lines = append(lines, line)
		}
		return lines, nil
	case ImagesSixel:
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
		return append(lines, sixelStart+up+six+sixelEnd+blank), nil
	}
	return nil, fmt.Errorf("image mode %q draws nothing", mode)
}

// imageBox is the cells an image of pw×ph pixels takes in at most w
// columns, keeping its aspect.
func imageBox(pw, ph, w int) (cols, rows int) {
	cols = min(max(1, w), maxImageCols, (pw+cellPixelsW-1)/cellPixelsW)
	rows = (ph*cols*cellPixelsW/pw + cellPixelsH - 1) / cellPixelsH
	if rows > maxImageRows {
		rows = maxImageRows
		cols = max(1, min(cols, pw*rows*cellPixelsH/ph/cellPixelsW))
	}
	return cols, max(1, rows)
}

// scaleImage fits img into w×h pixels, keeping its aspect, nearest pixel.
func scaleImage(img image.Image, w, h int) image.Image {
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

// maxDrawings bounds the drawings an imageDrawer keeps (a kitty drawing
// carries its PNG): one dropped is drawn again when it is next shown.
const maxDrawings = 32

// imageKey names one drawing: an image (its id) at a width.
type imageKey struct {
	id uint32
	w  int
}

// drawing is an image drawn for the terminal, or why it is not.
type drawing struct {
	lines []string
	err   error
}

// imageDrawnMsg brings a drawing made off the Update loop.
type imageDrawnMsg struct {
	key imageKey
	drawing
}

// imageDrawer draws images in commands, never in Update: decoding,
// scaling and encoding a large PNG takes tens of ms. The output pane asks
// for a drawing while it renders and shows a placeholder until the drawing
// comes back (imageDrawnMsg).
type imageDrawer struct {
	mode    ImageMode
	done    map[imageKey]drawing
	order   []imageKey // of done, oldest first
	drawing map[imageKey]bool
	queue   []imageJob
}

type imageJob struct {
	key  imageKey
	data string // base64, as the result carries it
}

func newImageDrawer(mode ImageMode) *imageDrawer {
	return &imageDrawer{mode: mode, done: map[imageKey]drawing{}, drawing: map[imageKey]bool{}}
}

// get returns image id drawn at width w, or false after queueing it for
// the next start.
func (d *imageDrawer) get(id uint32, data string, w int) (drawing, bool) {
	k := imageKey{id, w}
	if dr, ok := d.done[k]; ok {
		return dr, true
	}
	if !d.drawing[k] {
		d.drawing[k] = true
		d.queue = append(d.queue, imageJob{k, data})
	}
	return drawing{}, false
}

// start returns a command per queued drawing, or nil.
func (d *imageDrawer) start() tea.Cmd {
	if len(d.queue) == 0 {
		return nil
	}
	cmds := make([]tea.Cmd, 0, len(d.queue))
	for _, j := range d.queue {
		mode := d.mode
		cmds = append(cmds, func() tea.Msg {
			raw, err := base64.StdEncoding.DecodeString(j.data)
			if err != nil {
				return imageDrawnMsg{j.key, drawing{err: err}}
			}
			lines, err := imageLines(mode, j.key.id, raw, j.key.w)
			return imageDrawnMsg{j.key, drawing{lines, err}}
		})
	}
	d.queue = nil
	return tea.Batch(cmds...)
}

// store keeps a drawing that came back, dropping the oldest past the bound.
func (d *imageDrawer) store(msg imageDrawnMsg) {
	delete(d.drawing, msg.key)
	if _, ok := d.done[msg.key]; !ok {
		d.order = append(d.order, msg.key)
	}
	d.done[msg.key] = msg.drawing
	for len(d.order) > maxDrawings {
		delete(d.done, d.order[0])
		d.order = d.order[1:]
	}
}
