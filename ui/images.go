package ui

import (
	"encoding/base64"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/internal/termimage"
)

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
	mode    termimage.Mode
	done    map[imageKey]drawing
	order   []imageKey // of done, oldest first
	drawing map[imageKey]bool
	queue   []imageJob
}

type imageJob struct {
	key  imageKey
	data string // base64, as the result carries it
}

func newImageDrawer(mode termimage.Mode) *imageDrawer {
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
			lines, err := termimage.Lines(mode, j.key.id, raw, j.key.w)
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
