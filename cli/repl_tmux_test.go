package cli

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kerneldeck/kerneldeck/internal/imagetest"
	"github.com/kerneldeck/kerneldeck/internal/tmuxtest"
)

// TestREPLLineEditingInATerminal: the REPL in a real terminal (tmux). Up
// recalls the last line, which runs again; a line typed and abandoned with
// ctrl+c leaves nothing behind; the history outlives the session, in a 0600
// file; ctrl+d exits.
func TestREPLLineEditingInATerminal(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	start := func() *tmuxtest.Session {
		s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "repl", "--state-dir", dirs.state}, Env: dirs.env(), Width: 100, Height: 30})
		s.WaitScreen("the prompt", tmuxWait, func(screen string) bool { return strings.Contains(screen, ">>>") })
		return s
	}
	s := start()
	s.Type("n = 20")
	s.Keys("Enter")
	s.Type("n += 1; print('n is', n)")
	s.Keys("Enter")
	s.WaitScreen("n is 21", tmuxWait, func(screen string) bool { return strings.Contains(screen, "n is 21") })
	s.Keys("Up", "Enter") // the line again, not ^[[A
	s.WaitScreen("n is 22", tmuxWait, func(screen string) bool { return strings.Contains(screen, "n is 22") })
	if strings.Contains(s.LastScreen(), "^[[A") {
		t.Fatalf("the arrow key reached the input:\n%s", s.LastScreen())
	}
	s.Type("x = (1,")
	s.Keys("C-c") // abandons the line: no open bracket waits for more
	s.Type("print('after', n)")
	s.Keys("Enter")
	s.WaitScreen("after 22", tmuxWait, func(screen string) bool { return strings.Contains(screen, "after 22") })
	s.Keys("C-d")
	if code := s.WaitExit(tmuxWait); code != 0 {
		t.Fatalf("exit %d after ctrl+d:\n%s", code, s.Stderr())
	}

	hist := filepath.Join(dirs.state, "repl_history")
	st, err := os.Stat(hist)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("history file: %v %v, want 0600", st, err)
	}
	b, _ := os.ReadFile(hist)
	if !strings.Contains(string(b), `"n += 1; print('n is', n)"`) || strings.Contains(string(b), "x = (1,") {
		t.Fatalf("history file:\n%s", b)
	}

	// A new session: Up finds the last session's lines.
	s = start()
	s.Type("n = 100")
	s.Keys("Enter")
	s.Keys("Up", "Up", "Enter") // past "n = 100" to "print('after', n)"
	s.WaitScreen("after 100", tmuxWait, func(screen string) bool { return strings.Contains(screen, "after 100") })
	s.Keys("C-d")
	s.WaitExit(tmuxWait)
}

// TestREPLCompletesInspectsAndExits: in a real terminal, tab completes a
// name, an attribute and a dict key from the kernel's namespace, and
// indents an empty line; obj? shows the signature and docstring; help()
// prints; exit() ends the REPL, saying the kernel is killed.
func TestREPLCompletesInspectsAndExits(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "repl", "--state-dir", dirs.state}, Env: dirs.env(), Width: 100, Height: 40})
	s.WaitScreen("the prompt", tmuxWait, func(screen string) bool { return strings.Contains(screen, ">>>") })
	s.Type("measurements = {'alpha': 41}")
	s.Keys("Enter")
	s.WaitScreen("the next prompt", tmuxWait, func(screen string) bool { return strings.Count(screen, ">>>") == 2 })

	// The line being typed is the last one with a prompt.
	typing := func(screen string) string {
		lines := strings.Split(strings.TrimRight(screen, " \n"), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if strings.HasPrefix(lines[i], ">>> ") || strings.HasPrefix(lines[i], "... ") {
				return strings.TrimRight(lines[i], " ")
			}
		}
		return ""
	}
	s.Type("measu")
	s.Keys("Tab")
	s.WaitScreen("the name completed", tmuxWait, func(screen string) bool { return typing(screen) == ">>> measurements" })
	s.Type("['al")
	s.Keys("Tab")
	s.WaitScreen("the key completed", tmuxWait, func(screen string) bool { return strings.HasPrefix(typing(screen), ">>> measurements['alpha'") })
	s.Type("] + 1")
	s.Keys("Enter")
	s.WaitScreen("the completed line run", tmuxWait, func(screen string) bool { return strings.Contains(screen, "\n42") })

	s.Type("def twice(x):")
	s.Keys("Enter", "Tab")
	s.Type("return 2 * x")
	s.Keys("Enter", "Enter")
	s.Type("twice?")
	s.Keys("Enter")
	s.WaitScreen("the signature", tmuxWait, func(screen string) bool { return strings.Contains(screen, "Signature:   twice(x)") })
	s.Type("help(twice)")
	s.Keys("Enter")
	s.WaitScreen("help printed, no pager waiting", tmuxWait, func(screen string) bool {
		return strings.Contains(screen, "Help on function twice") && strings.HasSuffix(strings.TrimRight(screen, " \n"), ">>>")
	})
	s.Type("exit()")
	s.Keys("Enter")
	if code := s.WaitExit(tmuxWait); code != 0 {
		t.Fatalf("exit %d after exit():\n%s", code, s.Stderr())
	}
	if !strings.Contains(s.LastScreen()+s.Stderr(), "the kernel was killed") {
		t.Errorf("exit() did not say what became of the kernel:\n%s\n%s", s.LastScreen(), s.Stderr())
	}
}

// TestREPLAnswersInput: in a real terminal, a cell's input() asks with its
// prompt and takes the typed line; getpass() takes one that never shows;
// ctrl+c at the prompt interrupts the cell, and the kernel keeps its state.
func TestREPLAnswersInput(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "repl", "--state-dir", dirs.state}, Env: dirs.env(), Width: 100, Height: 30})
	s.WaitScreen("the prompt", tmuxWait, func(screen string) bool { return strings.Contains(screen, ">>>") })
	s.Type("print('asking'); name = input('who are you? ')")
	s.Keys("Enter")
	s.WaitScreen("input's prompt", tmuxWait, func(screen string) bool { return strings.Contains(screen, "asking\nwho are you?") })
	s.Type("Ada")
	s.Keys("Enter")
	s.WaitScreen("the next prompt", tmuxWait, func(screen string) bool { return strings.Count(screen, ">>>") == 2 })
	s.Type("import getpass; pin = getpass.getpass()")
	s.Keys("Enter")
	s.WaitScreen("getpass's prompt", tmuxWait, func(screen string) bool { return strings.Contains(screen, "Password:") })
	s.Type("hunter2")
	s.Keys("Enter")
	s.WaitScreen("the prompt after getpass", tmuxWait, func(screen string) bool { return strings.Count(screen, ">>>") == 3 })
	s.Type("input('never? ')")
	s.Keys("Enter")
	s.WaitScreen("the third prompt", tmuxWait, func(screen string) bool { return strings.Contains(screen, "never?") })
	s.Keys("C-c")
	s.WaitScreen("the prompt after the interrupt", tmuxWait, func(screen string) bool { return strings.Count(screen, ">>>") == 4 })
	if !strings.Contains(s.Stderr(), "input('never? ')\nKeyboardInterrupt") {
		t.Errorf("ctrl+c at input() did not interrupt the cell:\n%s", s.Stderr())
	}
	s.Type("print(name, len(pin))")
	s.Keys("Enter")
	screen := s.WaitScreen("the answers kept", tmuxWait, func(screen string) bool { return strings.Contains(screen, "\nAda 7") })
	if strings.Contains(screen, "hunter2") {
		t.Errorf("the password shows on the screen:\n%s", screen)
	}
	s.Keys("C-d")
	s.WaitExit(tmuxWait)
	if hist, err := os.ReadFile(filepath.Join(dirs.state, "repl_history")); err != nil || strings.Contains(string(hist), "Ada") || strings.Contains(string(hist), "hunter2") {
		t.Errorf("the history (%v) keeps an answer:\n%s", err, hist)
	}
}

// TestREPLRunsAPastedBlock: in a real terminal, a function pasted with a
// blank line inside runs as one block (bracketed paste), as typed lines
// would not; a one-line paste is text to edit.
func TestREPLRunsAPastedBlock(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "repl", "--state-dir", dirs.state}, Env: dirs.env(), Width: 100, Height: 30})
	s.WaitScreen("the prompt", tmuxWait, func(screen string) bool { return strings.Contains(screen, ">>>") })
	s.Paste("def area(w, h):\n    base = w * h\n\n    return base + 0\nprint('pasted', area(6, 7))\n")
	s.WaitScreen("the pasted block run as one", tmuxWait, func(screen string) bool {
		return strings.Contains(screen, "pasted 42") && strings.Contains(screen, "...     return base + 0")
	})
	if strings.Contains(s.Stderr(), "Error") {
		t.Fatalf("the paste did not run as one block:\n%s\n%s", s.LastScreen(), s.Stderr())
	}
	s.Paste("area(2, 3)")
	s.WaitScreen("the one-line paste waiting to be edited", tmuxWait, func(screen string) bool {
		return strings.HasSuffix(strings.TrimRight(screen, " \n"), ">>> area(2, 3)")
	})
	s.Type(" * 2")
	s.Keys("Enter")
	s.WaitScreen("the edited line run", tmuxWait, func(screen string) bool { return strings.Contains(screen, "\n12") })
	s.Keys("C-d")
	s.WaitExit(tmuxWait)
}

// TestREPLDrawsImages: with --images=kitty the REPL in a real terminal
// draws a cell's image under its line (what it writes, recorded: tmux
// itself passes no graphics on).
func TestREPLDrawsImages(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "repl", "--state-dir", dirs.state, "--images=kitty"}, Env: dirs.env(), Width: 100, Height: 30})
	written := s.Record()
	s.WaitScreen("the prompt", tmuxWait, func(screen string) bool { return strings.Contains(screen, ">>>") })
	png := base64.StdEncoding.EncodeToString(imagetest.Halves(t, 64, 32))
	s.Type("import base64; P = type('P', (), {'_repr_png_': lambda self: base64.b64decode('" + png + "')}); display(P())")
	s.Keys("Enter")
	s.WaitScreen("the image's line", tmuxWait, func(screen string) bool { return strings.Contains(screen, "[image/png 64×32") })
	waitUntil(t, "the image drawn", func() bool {
		_, img, ok := imagetest.Kitty(written())
		return ok && imagetest.IsRed(img.At(1, 1))
	})
	s.Keys("C-d")
	s.WaitExit(tmuxWait)
}
