// Package tmuxtest runs a terminal program in a detached tmux session on a
// private tmux server, for end-to-end tests of terminal UIs: type keys, read
// the screen, and learn how the program exited. It never touches the user's
// own tmux server: every command names the private socket.
package tmuxtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/proctest"
)

// RequireEnv makes a missing tmux a test failure instead of a skip when set
// to 1, as CI does.
const RequireEnv = "KERNELDECK_REQUIRE_TMUX"

// Require returns the path of tmux, or skips the test when tmux is not
// installed (fails it when RequireEnv=1).
func Require(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("tmux")
	if err == nil {
		return path
	}
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("tmux not found (%v), and %s=1 makes that a failure: apt-get install tmux", err, RequireEnv)
	}
	t.Skipf("tmux not found: apt-get install tmux (set %s=1 to make this a failure)", RequireEnv)
	return ""
}

// Options says what to run and in which terminal.
type Options struct {
	// Args is the program and its arguments.
	Args []string
	// Env is the whole environment of the tmux server and so of the
	// program (default: this process's); TMUX and TMUX_PANE are dropped.
	Env []string
	// Dir is the program's working directory (default: the test's).
	Dir string
	// Width and Height are the terminal size (default 80x24).
	Width, Height int
	// StopTimeout is how long cleanup waits for the program to exit after
	// its terminal is gone (SIGHUP) before it kills it (default 40s).
	StopTimeout time.Duration
}

// Session is one program running in a tmux pane.
type Session struct {
	t          testing.TB
	tmux       string
	socket     string
	env        []string
	dir        string // holds the socket, the pid, stderr and exit status
	lastScreen string
}

// Start starts opts.Args in a new detached session of a fresh tmux server
// and registers cleanup: the server is killed, and the program gets
// opts.StopTimeout to exit (it sees SIGHUP) before it is killed.
func Start(t testing.TB, opts Options) *Session {
	t.Helper()
	tmux := Require(t)
	if len(opts.Args) == 0 {
		t.Fatal("tmuxtest: no program to run")
	}
	// Unix socket paths are short (108 bytes): keep the dir near the root
	// rather than under a long test-named t.TempDir().
	dir, err := os.MkdirTemp("", "tmuxtest-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Session{t: t, tmux: tmux, socket: filepath.Join(dir, "tmux.sock"), dir: dir}
	env := opts.Env
	if env == nil {
		env = os.Environ()
	}
	for _, kv := range env {
		if !strings.HasPrefix(kv, "TMUX=") && !strings.HasPrefix(kv, "TMUX_PANE=") {
			s.env = append(s.env, kv)
		}
	}
	stopTimeout := opts.StopTimeout
	if stopTimeout <= 0 {
		stopTimeout = 40 * time.Second
	}
	t.Cleanup(func() {
		s.tmuxCmd("kill-server").Run()
		s.waitStopped(stopTimeout)
		os.RemoveAll(dir)
	})
	w, h := opts.Width, opts.Height
	if w <= 0 || h <= 0 {
		w, h = 80, 24
	}
	args := []string{"new-session", "-d", "-s", "test", "-x", strconv.Itoa(w), "-y", strconv.Itoa(h)}
	if opts.Dir != "" {
		args = append(args, "-c", opts.Dir)
	}
	args = append(args, s.shellCommand(opts.Args))
	// -f /dev/null: no user or system tmux.conf changes the terminal.
	cmd := exec.Command(tmux, append([]string{"-f", "/dev/null"}, s.socketArgs(args...)...)...)
	cmd.Env = s.env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	return s
}

// shellCommand wraps args so that the pane records the program's pid (the
// inner sh execs it), its stderr and its exit status in s.dir.
func (s *Session) shellCommand(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = shellQuote(a)
	}
	return fmt.Sprintf(`sh -c 'echo $$ > "$0"; exec "$@"' %s %s 2>%s; echo $? >%s && mv %s %s`,
		shellQuote(s.path("pid")), strings.Join(quoted, " "), shellQuote(s.path("stderr")),
		shellQuote(s.path("status.tmp")), shellQuote(s.path("status.tmp")), shellQuote(s.path("status")))
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (s *Session) path(name string) string { return filepath.Join(s.dir, name) }

func (s *Session) socketArgs(args ...string) []string {
	return append([]string{"-u", "-S", s.socket}, args...)
}

func (s *Session) tmuxCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(s.tmux, s.socketArgs(args...)...)
	cmd.Env = s.env
	return cmd
}

// Type types text literally (no key names are looked up).
func (s *Session) Type(text string) {
	s.t.Helper()
	s.run("send-keys", "-t", "test", "-l", text)
}

// Paste pastes text as a terminal does: wrapped in bracketed-paste
// markers when the program turned bracketed paste on, else as typed.
func (s *Session) Paste(text string) {
	s.t.Helper()
	buf := s.path("paste")
	if err := os.WriteFile(buf, []byte(text), 0o600); err != nil {
		s.t.Fatal(err)
	}
	s.run("load-buffer", "-b", "kdpaste", buf)
	s.run("paste-buffer", "-p", "-d", "-b", "kdpaste", "-t", "test")
}

// Record starts copying everything the program writes to its terminal,
// escape sequences that tmux itself drops (kitty graphics) included, to a
// file, and returns a function that reads what it has so far.
func (s *Session) Record() func() string {
	s.t.Helper()
	path := s.path("recording")
	s.run("pipe-pane", "-O", "-t", "test", "cat >> "+shellQuote(path))
	return func() string {
		data, _ := os.ReadFile(path)
		return string(data)
	}
}

// Keys presses keys by tmux name, such as C-r, Tab, Enter or q.
func (s *Session) Keys(keys ...string) {
	s.t.Helper()
	s.run(append([]string{"send-keys", "-t", "test"}, keys...)...)
}

func (s *Session) run(args ...string) {
	s.t.Helper()
	if out, err := s.tmuxCmd(args...).CombinedOutput(); err != nil {
		s.t.Fatalf("tmux %s: %v\n%s%s", strings.Join(args, " "), err, out, s.lastScreenReport())
	}
}

// Screen captures the pane as plain text, one line per row.
func (s *Session) Screen() (string, error) {
	out, err := s.tmuxCmd("capture-pane", "-p", "-t", "test").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("tmux capture-pane: %v: %s", err, strings.TrimSpace(string(out)))
	}
	s.lastScreen = string(out)
	return s.lastScreen, nil
}

// LastScreen is the last screen captured, for failure messages.
func (s *Session) LastScreen() string { return s.lastScreen }

func (s *Session) lastScreenReport() string {
	return "\nlast screen:\n" + s.lastScreen
}

// WaitScreen polls the screen until ok accepts it and returns that screen.
// Once the screen cannot be captured (the program has exited and its pane
// is gone), ok sees the last screen captured. After timeout it fails the
// test, saying what it waited for and showing the last screen.
func (s *Session) WaitScreen(what string, timeout time.Duration, ok func(screen string) bool) string {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		screen, err := s.Screen()
		if err != nil {
			screen = s.lastScreen
		}
		if ok(screen) {
			return screen
		}
		lastErr = err
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, exited := s.ExitStatus(); exited {
		s.t.Fatalf("waited %v for %s, but the program exited with status %d; stderr:\n%s%s", timeout, what, code, s.Stderr(), s.lastScreenReport())
	}
	if lastErr != nil {
		s.t.Fatalf("waited %v for %s: %v%s", timeout, what, lastErr, s.lastScreenReport())
	}
	s.t.Fatalf("waited %v for %s%s", timeout, what, s.lastScreenReport())
	return ""
}

// ExitStatus is the program's exit status once it has exited.
func (s *Session) ExitStatus() (code int, exited bool) {
	b, err := os.ReadFile(s.path("status"))
	if err != nil {
		return 0, false
	}
	code, err = strconv.Atoi(strings.TrimSpace(string(b)))
	return code, err == nil
}

// WaitExit waits for the program to exit and returns its exit status.
func (s *Session) WaitExit(timeout time.Duration) int {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if code, exited := s.ExitStatus(); exited {
			return code
		}
		if time.Now().After(deadline) {
			s.Screen() // best effort, for the report
			s.t.Fatalf("the program did not exit within %v; stderr:\n%s%s", timeout, s.Stderr(), s.lastScreenReport())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stderr is what the program wrote to stderr so far.
func (s *Session) Stderr() string {
	b, _ := os.ReadFile(s.path("stderr"))
	return string(b)
}

// PID is the program's process id (0 before it started).
func (s *Session) PID() int {
	b, _ := os.ReadFile(s.path("pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// waitStopped waits for the program to end, then kills it if it has not.
func (s *Session) waitStopped(timeout time.Duration) {
	pid := s.PID()
	if _, exited := s.ExitStatus(); exited || pid <= 0 {
		return
	}
	deadline := time.Now().Add(timeout)
	for Alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Alive reports whether pid is a live process (zombies count as dead).
func Alive(pid int) bool { return proctest.Alive(pid) }

// SetOption sets a global tmux option, e.g. set-clipboard on.
func (s *Session) SetOption(name, value string) {
	s.t.Helper()
	s.run("set-option", "-g", name, value)
}

// Buffers lists the samples of tmux's paste buffers (what OSC 52 from the
// program would set, with set-clipboard on).
func (s *Session) Buffers() string {
	s.t.Helper()
	out, err := s.tmuxCmd("list-buffers", "-F", "#{buffer_sample}").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "no buffers") {
		s.t.Fatalf("tmux list-buffers: %v: %s", err, out)
	}
	if strings.Contains(string(out), "no buffers") {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// Buffer is the newest tmux paste buffer in full, "" when there is none.
func (s *Session) Buffer() string {
	s.t.Helper()
	out, err := s.tmuxCmd("show-buffer").Output()
	if err != nil {
		return ""
	}
	return string(out)
}

// PaneTitle is the pane's title (what OSC 2 from the program sets).
func (s *Session) PaneTitle() string {
	s.t.Helper()
	out, err := s.tmuxCmd("display-message", "-p", "-t", "test", "#{pane_title}").CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux display-message: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}
