package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
