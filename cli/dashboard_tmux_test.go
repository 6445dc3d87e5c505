package cli

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kerneldeck/kerneldeck/internal/imagetest"
	"github.com/kerneldeck/kerneldeck/internal/tmuxtest"
)

// tmuxWait bounds every wait for the screen or the process: generous, since
// CI machines are small and the race detector is slow.
const tmuxWait = 30 * time.Second

// dashboardUser is $USER in the dashboard's environment: the default owner.
const dashboardUser = "kdtmux"

// TestDashboardTmux runs the real binary in a 100x30 tmux terminal, types
// cells, reads the screen with capture-pane, quits, and checks what is left
// running. CI sets KERNELDECK_REQUIRE_TMUX=1 so that a missing tmux fails.
func TestDashboardTmux(t *testing.T) {
	tmuxtest.Require(t)
	bin := buildBinary(t)

	t.Run("RunCellRaiseCapQuit", func(t *testing.T) {
		s, kernels := startDashboard(t, bin)
		writeCell(s, `import os; print("hello", 6*7, os.getpid())`)
		screen := s.WaitScreen(`output "hello 42 <pid>"`, tmuxWait, helloOutput.MatchString)
		pid, _ := strconv.Atoi(helloOutput.FindStringSubmatch(screen)[1])

		screen = s.WaitScreen("the kernel row idle after one cell", tmuxWait, func(screen string) bool {
			row := kernelRowOfOwner(screen, dashboardUser)
			return row["STATE"] == "idle" && row["#"] == "1"
		})
		if row := kernelRowOfOwner(screen, dashboardUser); row["PID"] != strconv.Itoa(pid) || row["BACKEND"] != "local" {
			t.Errorf("kernel row of %s/default %q, want PID %d on local\n%s", dashboardUser, row, pid, screen)
		}
		if h := headerLine(screen); !strings.Contains(h, "kernels 1/4") || !strings.Contains(h, "running 0") {
			t.Errorf("header %q, want kernels 1/4 and running 0", h)
		}

		focusKernels(s)
		s.Keys("+")
		s.WaitScreen("the cap raised to 5 in the header", tmuxWait, func(screen string) bool {
			return strings.Contains(headerLine(screen), "kernels 1/5")
		})

		quitKillingKernels(s) // no cell runs, yet quitting kills the kernel: it asks
		wantExitKilled(t, s, "killed 1 kernel")
		waitProcessDead(t, pid)
		wantNoProcessesUnder(t, kernels)
	})

	// Every key the first frame offers works: the dashboard starts in the
	// kernels list; typed code is never lost to ctrl+c, nor to a failure.
	t.Run("FirstKeysAndTypedCode", func(t *testing.T) {
		s, kernels := startDashboard(t, bin)
		s.Keys("?")
		s.WaitScreen("the full help from the first key", tmuxWait, func(screen string) bool {
			return strings.Contains(screen, "write a cell") && strings.Contains(screen, "idle_exit -")
		})
		s.Keys("?", "e")
		s.WaitScreen("the editor focused", tmuxWait, func(screen string) bool { return strings.Contains(helpLine(screen), "esc leave") })
		s.Type("x = (1,")
		s.Keys("C-c")
		s.WaitScreen("the cell cleared, the dashboard still up", tmuxWait, func(screen string) bool {
			return strings.Contains(screen, "cleared the cell (ctrl+p brings it back)") && !strings.Contains(screen, "x = (1,")
		})
		s.Keys("C-p")
		s.WaitScreen("the cleared cell back", tmuxWait, func(screen string) bool { return strings.Contains(screen, "│ x = (1,") })
		s.Keys("C-r")
		screen := s.WaitScreen("the SyntaxError, and the code kept to be fixed", tmuxWait, func(screen string) bool {
			return strings.Contains(screen, "SyntaxError") && strings.Contains(screen, "│ x = (1,")
		})
		if _, exited := s.ExitStatus(); exited {
			t.Fatalf("ctrl+c with typed code quit the dashboard:\n%s", screen)
		}
		// Tab after a word completes it from the kernel's namespace.
		s.Keys("C-c")
		writeCell(s, "measurements = 41")
		s.WaitScreen("the cell run", tmuxWait, func(screen string) bool { return strings.Contains(screen, "[2] success") })
		s.Type("print(measu")
		s.Keys("Tab")
		s.WaitScreen("the name completed in the editor", tmuxWait, func(screen string) bool { return strings.Contains(screen, "│ print(measurements") })
		s.Keys("C-c")
		focusKernels(s)
		quitKillingKernels(s)
		wantExitKilled(t, s, "killed 1 kernel")
		wantNoProcessesUnder(t, kernels)
	})

	// A cell's input() asks on the status line; getpass() takes a line
	// that never shows; ctrl+d ends input.
	t.Run("InputAsksTheOperator", func(t *testing.T) {
		s, kernels := startDashboard(t, bin)
		writeCell(s, "name = input('who are you? '); print('hi', name)")
		s.WaitScreen("input's prompt on the status line", tmuxWait, func(screen string) bool {
			return strings.Contains(helpLine(screen), "input() who are you?")
		})
		s.Type("Ada")
		s.Keys("Enter")
		s.WaitScreen("the answer in the output", tmuxWait, func(screen string) bool { return strings.Contains(screen, "hi Ada") })
		writeCell(s, "import getpass; pin = getpass.getpass(); print('pin of', len(pin))")
		s.WaitScreen("getpass's prompt", tmuxWait, func(screen string) bool { return strings.Contains(helpLine(screen), "getpass() Password:") })
		s.Type("hunter2")
		screen := s.WaitScreen("the password typed", tmuxWait, func(screen string) bool { return true })
		s.Keys("Enter")
		screen += s.WaitScreen("the password's length in the output", tmuxWait, func(screen string) bool { return strings.Contains(screen, "pin of 7") })
		if strings.Contains(screen, "hunter2") {
			t.Errorf("the password shows on the screen:\n%s", screen)
		}
		writeCell(s, `exec("try: input('more? ')\nexcept EOFError: print('no more input')")`)
		s.WaitScreen("the third prompt", tmuxWait, func(screen string) bool { return strings.Contains(helpLine(screen), "input() more?") })
		s.Keys("C-d")
		s.WaitScreen("EOFError in the cell", tmuxWait, func(screen string) bool { return strings.Contains(screen, "no more input") })
		focusKernels(s)
		quitKillingKernels(s)
		wantExitKilled(t, s, "killed 1 kernel")
		wantNoProcessesUnder(t, kernels)
	})

	t.Run("InterruptThenConfirmQuit", func(t *testing.T) {
		s, kernels := startDashboard(t, bin)
		pid := runLongCell(s)
		s.Keys("C-c") // a cell runs: interrupts it
		s.WaitScreen("the cell interrupted", 15*time.Second, func(screen string) bool {
			return strings.Contains(screen, "KeyboardInterrupt") && strings.Contains(headerLine(screen), "running 0") &&
				kernelRowByTask(screen, "default")["STATE"] == "idle"
		})
		if code, exited := s.ExitStatus(); exited {
			t.Fatalf("ctrl+c during a cell quit the dashboard (status %d) instead of interrupting the cell", code)
		}

		if again := runLongCell(s); again != pid {
			t.Fatalf("the second cell ran in pid %d, not in the first cell's kernel %d", again, pid)
		}
		focusKernels(s)
		s.Keys("q")
		s.WaitScreen("the quit confirmation", tmuxWait, func(screen string) bool {
			return strings.Contains(screen, "Quit and kill")
		})
		s.Keys("y")
		wantExitKilled(t, s, "killed 1 kernel")
		waitProcessDead(t, pid)
		wantNoProcessesUnder(t, kernels)
	})

	t.Run("KeepKernels", func(t *testing.T) {
		s, _ := startDashboard(t, bin, "--keep-kernels")
		writeCell(s, `import os; print("hello", 6*7, os.getpid())`)
		screen := s.WaitScreen(`output "hello 42 <pid>"`, tmuxWait, helloOutput.MatchString)
		pid, _ := strconv.Atoi(helloOutput.FindStringSubmatch(screen)[1])
		t.Cleanup(func() { killKeptKernel(t, pid) }) // before its dir is removed

		s.Keys("C-c")
		wantExitKilled(t, s, "left 1 kernel running (--keep-kernels)")
		if !tmuxtest.Alive(pid) {
			t.Errorf("kernel pid %d is gone after quitting with --keep-kernels", pid)
		}
	})

	t.Run("HostileOutputIsShownNotObeyed", func(t *testing.T) {
		s, _ := startDashboard(t, bin)
		// With these, OSC 52 from the program sets a tmux buffer and OSC 2
		// the pane title: what the attack would change.
		s.SetOption("set-clipboard", "on")
		s.SetOption("allow-rename", "on")
		title := s.PaneTitle()
		writeCell(s, `print("\x1b]52;c;Y3VybCBldmlsfHNo\x07\x1b]2;pwned\x07\x1b[2J\x1b[Hfake screen")`)
		screen := s.WaitScreen("the hostile output, shown or obeyed", tmuxWait, func(screen string) bool {
			return (strings.Contains(screen, "␛]52;c;Y3VybCBldmlsfHNo␇") && strings.Contains(screen, "␛[2J")) ||
				s.Buffers() != "" || s.PaneTitle() != title
		})
		if b := s.Buffers(); b != "" {
			t.Errorf("the cell's OSC 52 set a tmux buffer: %q", b)
		}
		if got := s.PaneTitle(); got != title || strings.Contains(got, "pwned") {
			t.Errorf("the cell's OSC 2 changed the pane title from %q to %q", title, got)
		}
		if !strings.HasPrefix(headerLine(screen), "kerneldeck") {
			t.Errorf("the screen was cleared or repainted:\n%s", screen)
		}

		// y in the output pane copies the output through OSC 52 (tmux
		// takes it into a buffer), the escapes dropped.
		s.Keys("Tab") // the empty editor moves on: the output pane
		s.WaitScreen("the output pane focused", tmuxWait, func(screen string) bool { return strings.Contains(helpLine(screen), "y copy") })
		s.Keys("y")
		s.WaitScreen("the copy reported", tmuxWait, func(screen string) bool { return strings.Contains(screen, "copied the output of [1]") })
		if got, want := s.Buffer(), "]52;c;Y3VybCBldmlsfHNo]2;pwned[2J[Hfake screen\n"; got != want {
			t.Errorf("y put %q in the clipboard, want %q", got, want)
		}
		quitKillingKernels(s)
		wantExitKilled(t, s, "killed 1 kernel")
	})

	// A large output shows its end (the lines that matter) while the pane
	// follows, and v hands all of it to $PAGER.
	t.Run("LargeOutputTailAndPager", func(t *testing.T) {
		dirs := newDashboardDirs(t)
		paged := filepath.Join(t.TempDir(), "paged")
		pager := filepath.Join(t.TempDir(), "pager")
		// The copy is renamed into place: the test reads it once it is there
		// whole (it once read a copy cp was still writing).
		os.WriteFile(pager, []byte("#!/bin/sh\ncp \"$1\" "+paged+".tmp && mv "+paged+".tmp "+paged+"\n"), 0o700)
		s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "--max-kernels", "4", "--state-dir", dirs.state},
			Env: append(dirs.env(), "PAGER="+pager), Width: 80, Height: 24})
		s.WaitScreen("the dashboard", tmuxWait, func(screen string) bool { return strings.Contains(screen, "ctrl+r") })
		writeCell(s, `for i in range(200000): print(i)`)
		s.WaitScreen("the output's last line and the clip line", tmuxWait, func(screen string) bool {
			return strings.Contains(screen, "199999") && strings.Contains(screen, "clipped (v pages all of it)")
		})
		s.Keys("Tab") // the empty editor moves on: the output pane
		s.WaitScreen("the output pane focused", tmuxWait, func(screen string) bool { return strings.Contains(helpLine(screen), "v page") })
		s.Keys("v")
		waitUntil(t, "the pager ran", func() bool { _, err := os.Stat(paged); return err == nil })
		data, _ := os.ReadFile(paged)
		lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
		if len(lines) != 200002 || lines[2] != "0" || lines[len(lines)-1] != "199999" {
			t.Errorf("the pager got %d lines (%.30q ... %q), want the cell's line, a blank and all 200,000", len(lines), lines[0], lines[len(lines)-1])
		}
		s.WaitScreen("the dashboard back after the pager", tmuxWait, func(screen string) bool {
			return strings.HasPrefix(headerLine(screen), "kerneldeck") && strings.Contains(screen, "199999")
		})
		quitKillingKernels(s)
		wantExitKilled(t, s, "killed 1 kernel")
	})

	t.Run("SaveImage", func(t *testing.T) {
		dirs := newDashboardDirs(t)
		work := t.TempDir()
		s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "--max-kernels", "4", "--state-dir", dirs.state},
			Env: dirs.env(), Width: 100, Height: 30, Dir: work})
		s.WaitScreen("the dashboard", tmuxWait, func(screen string) bool { return strings.Contains(screen, "ctrl+r") })
		writeCell(s, `import base64; P = type("P", (), {"_repr_png_": lambda self: base64.b64decode("`+onePixelPNG+`")}); display(P())`)
		s.WaitScreen("the image line", tmuxWait, func(screen string) bool { return strings.Contains(screen, "[image/png 1×1, ") })
		s.Keys("Tab") // the empty editor moves on: the output pane
		s.WaitScreen("the output pane focused", tmuxWait, func(screen string) bool { return strings.Contains(helpLine(screen), "s save images") })
		s.Keys("s")
		s.WaitScreen("the save reported", tmuxWait, func(screen string) bool { return strings.Contains(screen, "saved ") })
		path := filepath.Join(work, "kerneldeck-cell1-1.png")
		data, err := os.ReadFile(path)
		want, _ := base64.StdEncoding.DecodeString(onePixelPNG)
		if err != nil || !bytes.Equal(data, want) {
			t.Fatalf("saved file %s: %d bytes, %v; want the cell's PNG", path, len(data), err)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
			t.Errorf("saved image has mode %v, want 0600", fi.Mode().Perm())
		}
		quitKillingKernels(s)
		s.WaitExit(tmuxWait)
	})

	// --images draws a cell's image inline: what the binary writes to its
	// terminal (recorded through tmux, which itself drops kitty graphics)
	// holds the image, and o hands a private copy to the system's viewer.
	t.Run("InlineImages", func(t *testing.T) {
		picture := imagetest.Halves(t, 64, 32)
		for _, mode := range []string{"kitty", "sixel"} {
			t.Run(mode, func(t *testing.T) {
				dirs := newDashboardDirs(t)
				viewed := filepath.Join(t.TempDir(), "viewed")
				bindir := t.TempDir()
				os.WriteFile(filepath.Join(bindir, "xdg-open"), []byte("#!/bin/sh\ncp \"$1\" "+viewed+"\necho \"$1\" >"+viewed+".path\n"), 0o700)
				env := envWithOverrides(dirs.env(), map[string]string{"PATH": bindir + ":" + os.Getenv("PATH")})
				s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "--max-kernels", "4", "--state-dir", dirs.state, "--images", mode},
					Env: env, Width: 100, Height: 30})
				recorded := s.Record()
				s.WaitScreen("the dashboard", tmuxWait, func(screen string) bool { return strings.Contains(screen, "ctrl+r") })
				writeCell(s, `import base64; P = type("P", (), {"_repr_png_": lambda self: base64.b64decode("`+
					base64.StdEncoding.EncodeToString(picture)+`")}); display(P())`)
				s.WaitScreen("the image's label", tmuxWait, func(screen string) bool { return strings.Contains(screen, "[image/png 64×32, ") })
				var drawn image.Image
				waitUntil(t, "the image drawn", func() bool {
					var ok bool
					if mode == "kitty" {
						_, drawn, ok = imagetest.Kitty(recorded())
					} else {
						drawn, ok = imagetest.Sixel(recorded())
					}
					return ok
				})
				if b := drawn.Bounds(); b.Dx() != 64 || b.Dy() != 32 {
					t.Fatalf("drew a %v image, want the cell's 64×32", b)
				}
				if !imagetest.IsRed(drawn.At(5, 5)) {
					t.Errorf("the drawn image's left half is %v, want red", drawn.At(5, 5))
				}
				if mode == "kitty" && !strings.Contains(recorded(), "\U0010EEEE") {
					t.Error("no kitty placeholder cells were written")
				}

				s.Keys("Tab") // the empty editor moves on: the output pane
				s.WaitScreen("the output pane focused", tmuxWait, func(screen string) bool { return strings.Contains(helpLine(screen), "s save images") })
				s.Keys("o")
				s.WaitScreen("the open reported", tmuxWait, func(screen string) bool { return strings.Contains(screen, "opened ") })
				waitUntil(t, "the viewer started", func() bool { _, err := os.Stat(viewed + ".path"); return err == nil })
				got, _ := os.ReadFile(viewed)
				path, _ := os.ReadFile(viewed + ".path")
				if !bytes.Equal(got, picture) || !strings.HasPrefix(string(path), filepath.Join(dirs.state, "images")+"/") {
					t.Fatalf("the viewer got %s (%d bytes), want the cell's PNG from <state>/images", path, len(got))
				}
				fi, _ := os.Stat(strings.TrimSpace(string(path)))
				di, _ := os.Stat(filepath.Dir(strings.TrimSpace(string(path))))
				if fi.Mode().Perm() != 0o600 || di.Mode().Perm() != 0o700 {
					t.Errorf("opened file mode %v in dir mode %v, want 0600 in 0700", fi.Mode().Perm(), di.Mode().Perm())
				}
				quitKillingKernels(s)
				s.WaitExit(tmuxWait)
			})
		}
	})

	t.Run("FilterDetailConfirmKill", func(t *testing.T) {
		s, kernels := startDashboard(t, bin)
		writeCell(s, `import os; print("pid", os.getpid())`)
		screen := s.WaitScreen("the kernel idle after its cell", tmuxWait, func(screen string) bool {
			return kernelRowOfOwner(screen, dashboardUser)["STATE"] == "idle"
		})
		id := kernelRowOfOwner(screen, dashboardUser)["ID"]
		pid, _ := strconv.Atoi(kernelRowOfOwner(screen, dashboardUser)["PID"])
		focusKernels(s)
		s.Type("/nobody-here")
		s.WaitScreen("no match", tmuxWait, func(screen string) bool { return strings.Contains(screen, "no match for /nobody-here") })
		// Each Escape is waited for: an Escape followed at once by a key
		// reaches the program as alt+key.
		s.Keys("Escape")
		s.WaitScreen("the filter closed", tmuxWait, func(screen string) bool { return !strings.Contains(screen, "no match for /nobody-here") })
		s.Type("/" + dashboardUser)
		s.Keys("Enter", "j") // onto the kernel row
		s.WaitScreen("the filtered list", tmuxWait, func(screen string) bool {
			return strings.Contains(screen, "Kernels (1 of 1) · /"+dashboardUser)
		})
		s.Keys("d")
		s.WaitScreen("the kernel's detail", tmuxWait, func(screen string) bool {
			return strings.Contains(screen, "Kernel "+id) && strings.Contains(screen, "print(\"pid\", os.getpid())")
		})
		s.Keys("Escape")
		s.WaitScreen("the detail closed", tmuxWait, func(screen string) bool { return !strings.Contains(screen, "esc closes, j/k scroll") })
		s.Keys("x")
		s.WaitScreen("the kill question", tmuxWait, func(screen string) bool {
			return strings.Contains(screen, "Kill "+dashboardUser+"/default@local ("+id)
		})
		s.Keys("n")
		s.WaitScreen("nothing killed", tmuxWait, func(screen string) bool { return strings.Contains(screen, "cancelled: nothing was done") })
		if !tmuxtest.Alive(pid) {
			t.Fatalf("the kernel (pid %d) died although the kill was answered n", pid)
		}
		s.Keys("x", "y")
		s.WaitScreen("the kernel dead", tmuxWait, func(screen string) bool {
			return kernelRowOfOwner(screen, dashboardUser)["STATE"] == "dead"
		})
		waitProcessDead(t, pid)
		s.Keys("q")
		if code := s.WaitExit(tmuxWait); code != 0 {
			t.Fatalf("exit %d", code)
		}
		wantNoProcessesUnder(t, kernels)
	})

	t.Run("ReplayStepped", func(t *testing.T) {
		example, err := filepath.Abs(filepath.Join("..", "examples", "eviction.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		s, _ := startDashboardSized(t, bin, 100, 50, "--replay", example, "--replay-paused", "--max-kernels", "3")
		s.WaitScreen("the paused replay's badge", tmuxWait, func(screen string) bool {
			return strings.Contains(headerLine(screen), "REPLAY 0/8 PAUSED")
		})
		s.Keys("n") // the first key: the limits request
		s.WaitScreen("one request sent", tmuxWait, func(screen string) bool {
			return strings.Contains(headerLine(screen), "REPLAY 1/8 PAUSED")
		})
		s.Keys("n") // alice's long cell
		screen := s.WaitScreen("alice's kernel and only hers", tmuxWait, func(screen string) bool {
			return strings.Contains(headerLine(screen), "REPLAY 2/8") && kernelRowOfOwner(screen, "alice")["STATE"] != ""
		})
		if row := kernelRowOfOwner(screen, "bob"); row["STATE"] != "" {
			t.Fatalf("bob's kernel exists while the replay is paused before him: %v\n%s", row, screen)
		}
		s.Keys("p")
		s.WaitScreen("the rest of the replay", tmuxWait, func(screen string) bool {
			return strings.Contains(headerLine(screen), "REPLAY 8/8 done") && kernelRowOfOwner(screen, "frank")["STATE"] != ""
		})
		s.Keys("C-c")
		s.WaitScreen("the quit question or the exit", tmuxWait, func(screen string) bool {
			_, exited := s.ExitStatus()
			return exited || strings.Contains(screen, "Quit and kill")
		})
		if _, exited := s.ExitStatus(); !exited {
			s.Keys("y")
		}
		s.WaitExit(tmuxWait)
	})

	t.Run("ReplayEviction", func(t *testing.T) {
		example, err := filepath.Abs(filepath.Join("..", "examples", "eviction.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		// 50 rows show every owner of the example in the kernels pane.
		s, kernels := startDashboardSized(t, bin, 100, 50, "--replay", example, "--max-kernels", "3")
		// The example says what it shows, in the events pane, whatever the
		// kernels pane selects.
		s.WaitScreen("the replay's first line in the events pane", tmuxWait, func(screen string) bool {
			return strings.Contains(screen, "replay says") && strings.Contains(screen, "the cap is 3 kernels")
		})
		// Evicted kernels park their state (the default): their rows say so.
		s.WaitScreen("three kernels evicted while alice's cell runs", tmuxWait, func(screen string) bool {
			parked := 0
			for _, owner := range []string{"bob", "carol", "dave", "erin", "frank"} {
				if kernelRowOfOwner(screen, owner)["STATE"] == "parked" {
					parked++
				}
			}
			return parked == 3 && strings.Contains(headerLine(screen), "kernels 3/3") &&
				strings.HasPrefix(kernelRowOfOwner(screen, "alice")["STATE"], "run")
		})
		focusKernels(s)
		// alice's cell runs for 20 s: unless this machine is very slow,
		// quitting asks first.
		s.Keys("q")
		screen := s.WaitScreen("the quit confirmation or the exit", tmuxWait, func(screen string) bool {
			_, exited := s.ExitStatus()
			return exited || strings.Contains(screen, "Quit and kill")
		})
		if _, exited := s.ExitStatus(); !exited && strings.Contains(screen, "Quit and kill") {
			s.Keys("y")
		}
		wantExitKilled(t, s, "killed 3 kernels")
		wantNoProcessesUnder(t, kernels)
	})
}

// helloOutput is the output line of the cell the tests type.
var helloOutput = regexp.MustCompile(`hello 42 (\d+)`)

// startDashboard starts the binary in a 100x30 tmux terminal with its own
// HOME, config, state and kernel dirs, and waits for the first screen. It
// returns the dir the kernels live under.
func startDashboard(t *testing.T, bin string, args ...string) (s *tmuxtest.Session, kernels string) {
	t.Helper()
	return startDashboardSized(t, bin, 100, 30, args...)
}

// startDashboardSized is startDashboard in a width x height terminal.
func startDashboardSized(t *testing.T, bin string, width, height int, args ...string) (s *tmuxtest.Session, kernels string) {
	t.Helper()
	dirs := newDashboardDirs(t)
	return startDashboardIn(t, bin, dirs, width, height, args...), dirs.kernels
}

// dashboardDirs are the dirs a dashboard's environment points at: the
// kernels' TMPDIR, HOME (config) and the state dir.
type dashboardDirs struct {
	kernels, home, state string
}

func newDashboardDirs(t *testing.T) dashboardDirs {
	t.Helper()
	short, err := os.MkdirTemp("", "kdtmux-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(short) })
	return dashboardDirs{kernels: t.TempDir(), home: t.TempDir(), state: filepath.Join(short, "state")}
}

// env is the environment of a kerneldeck process using dirs.
func (d dashboardDirs) env() []string {
	return envWithOverrides(os.Environ(), map[string]string{
		"HOME":            d.home,
		"USER":            dashboardUser,
		"XDG_CONFIG_HOME": filepath.Join(d.home, ".config"),
		"XDG_STATE_HOME":  filepath.Join(d.home, ".local", "state"),
		"TMPDIR":          d.kernels,
		"SHELL":           "/bin/sh",
		// The default socket is <state dir>/engine.sock, the test's own: a
		// dashboard never finds (and attaches to) an engine of the machine's.
		"XDG_RUNTIME_DIR": "",
	}, "COLUMNS", "LINES", "NO_COLOR", "TMUX", "TMUX_PANE")
}

// startDashboardIn starts the binary on dirs in a width x height terminal
// and waits for the first screen.
func startDashboardIn(t *testing.T, bin string, dirs dashboardDirs, width, height int, args ...string) *tmuxtest.Session {
	t.Helper()
	// --max-kernels 4 fixes the cap the header shows; a later flag wins.
	argv := append([]string{bin, "--max-kernels", "4", "--state-dir", dirs.state}, args...)
	s := tmuxtest.Start(t, tmuxtest.Options{Args: argv, Env: dirs.env(), Width: width, Height: height})
	s.WaitScreen("the dashboard", tmuxWait, func(screen string) bool {
		return strings.HasPrefix(headerLine(screen), "kerneldeck") && strings.Contains(screen, "ctrl+r")
	})
	return s
}

// envWithOverrides returns base with set applied and the drop variables removed.
func envWithOverrides(base []string, set map[string]string, drop ...string) []string {
	var env []string
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if _, ok := set[name]; ok || slices.Contains(drop, name) {
			continue
		}
		env = append(env, kv)
	}
	for name, v := range set {
		env = append(env, name+"="+v)
	}
	return env
}

// runLongCell types and runs a 30 s cell in the default target, waits until
// the kernel row says it runs, and returns the kernel's pid.
func runLongCell(s *tmuxtest.Session) int {
	writeCell(s, `import time; time.sleep(30)`)
	screen := s.WaitScreen("the long cell running", tmuxWait, func(screen string) bool {
		return strings.Contains(headerLine(screen), "running 1") && kernelRowByTask(screen, "default")["STATE"] == "running"
	})
	pid, _ := strconv.Atoi(kernelRowByTask(screen, "default")["PID"])
	return pid
}

// focusKernels leaves the editor with esc, if it has the focus, and waits
// until the kernels pane has it, which its keys in the help line tell.
func focusKernels(s *tmuxtest.Session) {
	if screen, _ := s.Screen(); strings.Contains(helpLine(screen), "d detail") {
		return
	}
	s.Keys("Escape")
	s.WaitScreen("the kernels pane focused (its keys in the help line)", tmuxWait, func(screen string) bool {
		return strings.Contains(helpLine(screen), "d detail")
	})
}

// writeCell gives the editor the focus (e, from the list the dashboard
// starts in), types code and runs it with ctrl+r.
func writeCell(s *tmuxtest.Session, code string) {
	// The focused pane has the heavy border (the help line may show a
	// status instead of the pane's keys).
	if screen, _ := s.Screen(); !strings.Contains(screen, "┏━ Cell") {
		s.Keys("e")
		s.WaitScreen("the editor focused (its heavy border)", tmuxWait, func(screen string) bool {
			return strings.Contains(screen, "┏━ Cell")
		})
	}
	s.Type(code)
	s.Keys("C-r")
}

// quitKillingKernels presses ctrl+c, waits for the question that quitting
// with kernels asks, and answers y.
func quitKillingKernels(s *tmuxtest.Session) {
	s.Keys("C-c")
	s.WaitScreen("the quit question", tmuxWait, func(screen string) bool { return strings.Contains(screen, "Quit and kill") })
	s.Keys("y")
}

// wantExitKilled waits for the binary to exit and checks status 0 and the
// kernel count on stderr.

func wantExitKilled(t *testing.T, s *tmuxtest.Session, stderr string) {
	t.Helper()
	if code := s.WaitExit(tmuxWait); code != 0 {
		t.Fatalf("exit status %d, want 0; stderr:\n%s\nlast screen:\n%s", code, s.Stderr(), s.LastScreen())
	}
	if !strings.Contains(s.Stderr(), stderr) {
		t.Errorf("stderr %q, want %q", s.Stderr(), stderr)
	}
}

// killKeptKernel kills -9 a kernel left running, and waits for it and for
// its watcher (its parent, which then writes the exit status beside the
// kernel dir) to be gone, so that the test's dirs can be removed.
func killKeptKernel(t *testing.T, pid int) {
	t.Helper()
	ppid := 0
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if i := strings.LastIndexByte(string(stat), ')'); i >= 0 {
			if f := strings.Fields(string(stat)[i+1:]); len(f) > 1 {
				ppid, _ = strconv.Atoi(f[1])
			}
		}
	}
	syscall.Kill(pid, syscall.SIGKILL)
	waitProcessDead(t, pid)
	if ppid > 1 {
		waitProcessDead(t, ppid)
	}
}

// waitProcessDead waits a few seconds for pid to be gone (or a zombie).
func waitProcessDead(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for tmuxtest.Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("kernel pid %d still alive after 10s", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// headerLine is the screen's first line: the dashboard's header.
func headerLine(screen string) string {
	first, _, _ := strings.Cut(screen, "\n")
	return first
}

// helpLine is the screen's last non-empty line: the help line.
func helpLine(screen string) string {
	lines := strings.Split(strings.TrimRight(screen, "\n "), "\n")
	return lines[len(lines)-1]
}

// kernelColumns are the titles of the kernels pane's header line.
var kernelColumns = []string{"TASK", "ID", "STATE", "TIME", "REAP IN", "#", "LRU", "PID", "BACKEND", "TOOLS"}

// kernelRowByTask returns the cells of the first kernel row whose TASK is
// task, keyed by column title, cut at the columns of the pane's header line;
// nil if there is none.
func kernelRowByTask(screen, task string) map[string]string {
	return findKernelRow(screen, "", task)
}

// kernelRowOfOwner is kernelRowByTask for the "default" task of owner.
func kernelRowOfOwner(screen, owner string) map[string]string {
	return findKernelRow(screen, owner, "default")
}

// findKernelRow finds the row of task, under the owner line of owner when
// owner is set.
func findKernelRow(screen, owner, task string) map[string]string {
	lines := strings.Split(screen, "\n")
	var starts []int
	inOwner := owner == ""
	ownerLine := regexp.MustCompile(`^\W*` + regexp.QuoteMeta(owner) + `\s+\d+ kernels?\b`)
	for _, l := range lines {
		if starts == nil {
			starts = columnStarts(l)
			continue
		}
		cells := cutColumns(l, starts)
		if owner != "" && cells["TASK"] != task {
			inOwner = ownerLine.MatchString(strings.TrimLeft(l, "│┃ >"))
			continue
		}
		if inOwner && cells["TASK"] == task {
			return cells
		}
	}
	return nil
}

// columnStarts returns the rune offsets of kernelColumns in line, or nil
// unless line is the header with every title in order.
func columnStarts(line string) []int {
	var starts []int
	from := 0
	for _, title := range kernelColumns {
		i := strings.Index(line[from:], title)
		if i < 0 {
			return nil
		}
		starts = append(starts, utf8.RuneCountInString(line[:from+i]))
		from += i + len(title)
	}
	return starts
}

// cutColumns cuts line at starts into trimmed cells keyed by column title.
func cutColumns(line string, starts []int) map[string]string {
	runes := []rune(line)
	cells := make(map[string]string, len(starts))
	for i, title := range kernelColumns {
		from, to := starts[i], len(runes)
		if i+1 < len(starts) {
			to = starts[i+1]
		}
		if from >= len(runes) {
			break
		}
		cells[title] = strings.Trim(string(runes[from:min(to, len(runes))]), " │┃")
	}
	return cells
}

// onePixelPNG is a 1×1 PNG, base64.
const onePixelPNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="

// A replay runs on a state dir of its own: it does not list (nor restore)
// what an earlier run parked in the user's state dir, and leaves nothing
// there.
func TestReplayRunsOnAStateDirOfItsOwn(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	t.Cleanup(func() { killProcessesUnder(t, dirs.kernels) })
	state := filepath.Join(dirs.home, ".local", "state", "kerneldeck")
	// An earlier run parks ghost's kernel (the cap evicts it) and stops,
	// keeping its kernels (a clean stop that keeps nothing drops its parks).
	cmd := exec.Command(bin, "headless", "--max-kernels", "1", "--spare-kernels", "0", "--keep-kernels")
	cmd.Env = dirs.env()
	cmd.Stdin = strings.NewReader(`{"id":"1","op":"execute","owner":"ghost","code":"x = 1"}` + "\n" + `{"id":"2","op":"execute","owner":"other","code":"y = 2"}` + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the earlier run: %v\n%s", err, out)
	}
	parked, _ := filepath.Glob(filepath.Join(state, "parked", "*.park"))
	if len(parked) != 1 {
		t.Fatalf("the earlier run left %v parked; want ghost's", parked)
	}
	before := treeOf(state)
	replayFile := filepath.Join(t.TempDir(), "replay.jsonl")
	os.WriteFile(replayFile, []byte(`{"id":"1","op":"execute","owner":"shown","code":"1"}`+"\n"), 0o600)
	s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "--replay", replayFile, "--listen", "none"}, Env: dirs.env(), Width: 100, Height: 30})
	s.WaitScreen("the replay's kernel", tmuxWait, func(screen string) bool { return strings.Contains(screen, "shown") })
	time.Sleep(2 * time.Second) // parked states are listed within a second
	screen, _ := s.Screen()
	if strings.Contains(screen, "ghost") {
		t.Errorf("the replay lists an earlier run's parked kernel:\n%s", screen)
	}
	s.Keys("q")
	s.WaitScreen("the quit question", tmuxWait, func(screen string) bool { return strings.Contains(screen, "Quit and kill") })
	s.Keys("y")
	s.WaitExit(tmuxWait)
	if after := treeOf(state); !slices.Equal(before, after) {
		t.Errorf("the replay changed the user's state dir: %v, then %v", before, after)
	}
}

// treeOf lists every path under dir, with each file's size.
func treeOf(dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			info, _ := d.Info()
			if info != nil && !d.IsDir() {
				p += fmt.Sprintf(" %d", info.Size())
			}
			out = append(out, p)
		}
		return nil
	})
	return out
}
