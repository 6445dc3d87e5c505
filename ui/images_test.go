package ui

import (
	"encoding/base64"
	"strings"
	"testing"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/imagetest"
	"github.com/kerneldeck/kerneldeck/internal/termimage"
)

// TestImagesDrawnOffTheLoop: with an image mode on, the output pane never
// decodes an image in Update. It shows a placeholder and returns a command
// that draws it; the drawing comes back as a message and replaces the
// placeholder. A new width is a new drawing.
func TestImagesDrawnOffTheLoop(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.m.ctx.images, f.m.ctx.drawer = termimage.Kitty, newImageDrawer(termimage.Kitty)
	f.update(tea.WindowSizeMsg{Width: 100, Height: 40})
	png := base64.StdEncoding.EncodeToString(imagetest.Halves(t, 320, 160))
	f.showDisplays(t, engine.Display{Data: map[string]string{"image/png": png, "text/plain": "img"}})
	for _, width := range []int{120, 90} {
		_, cmd := f.m.Update(tea.WindowSizeMsg{Width: width, Height: 40})
		if view := f.m.View(); !strings.Contains(view, "drawing…") || strings.Contains(view, "\x1b_G") {
			t.Fatalf("at %d columns before the drawing came: want the placeholder and no image:\n%s", width, view)
		}
		if cmd == nil {
			t.Fatalf("at %d columns: no command to draw the image", width)
		}
		msg, ok := cmd().(imageDrawnMsg)
		if !ok || msg.err != nil {
			t.Fatalf("at %d columns: the command gave %#v", width, msg)
		}
		f.update(msg)
		view := f.m.View()
		if strings.Contains(view, "drawing…") || !strings.Contains(view, "\x1b_G") || !strings.Contains(view, string(termimage.KittyPlaceholder)) {
			t.Fatalf("at %d columns after the drawing came: want the image in place of the placeholder:\n%q", width, view)
		}
	}
}
