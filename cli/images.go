package cli

import (
	"os"

	"github.com/charmbracelet/x/term"

	"github.com/kerneldeck/kerneldeck/internal/termimage"
)

// imagesFlag is --images, alike in the dashboard and the REPL: where says
// where images are drawn, more what else there is to know.
func imagesFlag(fs *flagSet, dst *string, where, more string) {
	fs.Func("images", "draw a cell's images (plots, PIL images) "+where+" with the kitty graphics protocol "+
		"(kitty, Ghostty, WezTerm) or sixel (foot, mlterm, xterm -ti vt340): `MODE` is auto (default: from TERM and "+
		"the terminal's variables; off inside tmux or screen), kitty, sixel or off (a line such as "+
		"[image/png 640×480, 23 KB]"+more+")",
		func(s string) error {
			if _, err := termimage.Parse(s, func(string) string { return "" }); err != nil {
				return err
			}
			*dst = s
			return nil
		})
}

// replImages is how the REPL draws images on out, and how wide: nothing
// unless out is a terminal (a pipe gets the lines only).
func replImages(flag string, out any) (termimage.Mode, int) {
	f, ok := out.(*os.File)
	if !ok || !term.IsTerminal(f.Fd()) {
		return termimage.Off, 0
	}
	mode, _ := termimage.Parse(flag, os.Getenv) // checked when the flag was read
	w, _, err := term.GetSize(f.Fd())
	if err != nil || w <= 0 {
		w = 80
	}
	return mode, w
}
