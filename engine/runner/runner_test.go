package runner

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startRunner starts runner.py from source in a fresh kernel dir, with no
// tool stubs and stdin as its config line, and returns the first line it
// writes to the ready pipe.
func startRunner(t *testing.T, stdin string) (string, *exec.Cmd) {
	t.Helper()
	line, cmd, _ := startShipped(t, shipment{script: Source}, stdin)
	return line, cmd
}

// shipment is what a spawn ships on the runner's stdin after Bootstrap:
// runner.py, the compiled code (with the loader) and kerneldeck_tools.py.
type shipment struct {
	script, code, tools []byte
	// sizes, when set, is KERNELDECK_STDIN as the runner sees it after
	// Bootstrap took runner.py's (else the true sizes); scriptSize, when
	// set, is runner.py's size as sent.
	sizes, scriptSize string
	// plant is called with the kernel dir's path before the runner starts
	// (the bootstrap makes the dir; with inDir it is there already).
	plant func(kd string)
	// inDir starts runner.py as "python3 <kd>/runner.py" in a kernel dir
	// made beforehand, without the bootstrap: what the runner checks
	// itself, were something planted in its dir in a race.
	inDir bool
	// python is the interpreter (python3 from PATH when empty).
	python string
}

// startShipped starts s's runner.py as the spawn script does, stdin
// following what it ships, and returns the ready pipe's first line, the
// command and the kernel dir.
func startShipped(t *testing.T, s shipment, stdin string) (string, *exec.Cmd, string) {
	t.Helper()
	line, cmd, kd, _ := startShippedPipe(t, s, stdin)
	return line, cmd, kd
}

// startShippedPipe is startShipped, also returning the ready pipe with its
// first line read.
func startShippedPipe(t *testing.T, s shipment, stdin string) (string, *exec.Cmd, string, *bufio.Reader) {
	t.Helper()
	root := t.TempDir()
	if err := os.Chmod(root, 0o700); err != nil { // as a kernel root is made
		t.Fatal(err)
	}
	kd := filepath.Join(root, "k")
	if s.inDir {
		if err := os.Mkdir(kd, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(kd, "runner.py"), s.script, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if s.plant != nil {
		s.plant(kd)
	}
	ready, w, err := os.Pipe() // as the spawn's watcher hands it over, as fd 3
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ready.Close() })
	sizes, scriptSize := s.sizes, s.scriptSize
	if sizes == "" {
		sizes = fmt.Sprintf("%d %d", len(s.code), len(s.tools))
	}
	if scriptSize == "" {
		scriptSize = strconv.Itoa(len(s.script))
	}
	python := s.python
	if python == "" {
		python = "python3"
	}
	// The bootstrap takes runner.py's size and bytes off the front.
	args, env := append(strings.Fields(StartFlags), "-c", StartProgram(), filepath.Join(kd, "runner.py")), scriptSize+" "+sizes
	front := []io.Reader{strings.NewReader(Bootstrap), bytes.NewReader(s.script)}
	if s.inDir {
		args, env, front = []string{filepath.Join(kd, "runner.py")}, sizes, nil
	}
	cmd := exec.Command(python, args...)
	cmd.Env = append(os.Environ(), "KERNELDECK_STDIN="+env)
	cmd.Stdin = io.MultiReader(append(front, bytes.NewReader(s.code), bytes.NewReader(s.tools), strings.NewReader(stdin))...)
	cmd.ExtraFiles = []*os.File{w}
	err = cmd.Start()
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(ready)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("nothing on the ready pipe: %v", err)
	}
	return strings.TrimSpace(line), cmd, kd, br
}

// A runner whose config line did not arrive whole (the engine ended in the
// middle of the spawn) cannot be driven by anyone: it says so to the spawn
// and exits, instead of living for the default idle_exit.
func TestRunnerWithoutConfigExits(t *testing.T) {
	for _, tc := range []struct{ name, stdin string }{
		{"no config line", ""},
		{"a config line cut short", `{"secret": "abab`},
		{"no secret", `{"idle_exit": 2}` + "\n"},
		{"a secret that is not hex", `{"secret": "not hex"}` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line, cmd := startRunner(t, tc.stdin)
			if line != "NOCONFIG" {
				t.Fatalf("ready pipe: %q, want NOCONFIG", line)
			}
			if err := cmd.Wait(); !isExit(err, 2) {
				t.Fatalf("the runner ended with %v, want exit status 2", err)
			}
		})
	}
	// The same start with a whole config line gets a working runner.
	line, _ := startRunner(t, `{"secret": "`+strings.Repeat("ab", 32)+`", "idle_exit": 60}`+"\n")
	if !strings.HasPrefix(line, "READY ") {
		t.Fatalf("ready pipe with a config line: %q, want READY ...", line)
	}
}

// The loader runs the code CompileProgram made with the same interpreter,
// and refuses code whose magic number is another interpreter's: it says
// NOCODE to the spawn and exits 2, before running anything of it.
func TestLoaderRunsOnlyItsInterpretersCode(t *testing.T) {
	compile := exec.Command("python3", "-I", "-S", "-c", CompileProgram, strconv.Itoa(len(Source)))
	compile.Stdin = bytes.NewReader(Source)
	out, err := compile.Output()
	first, exe, _ := strings.Cut(string(out), "\n")
	line, ok := strings.CutPrefix(first, "KD:CODE ")
	if err != nil || !ok {
		t.Fatalf("compile: %v: %.200q", err, out)
	}
	if want, err := exec.Command("python3", "-I", "-S", "-c", "import sys; print(sys.executable)").Output(); err != nil || exe != "KD:EXE "+string(want) {
		t.Errorf("compile's second line %q, want KD:EXE and the interpreter's path %q (%v)", exe, want, err)
	}
	code, err := base64.StdEncoding.DecodeString(line)
	if err != nil {
		t.Fatal(err)
	}
	config := `{"secret": "` + strings.Repeat("ab", 32) + `", "idle_exit": 60}` + "\n"
	if line, _, _ := startShipped(t, shipment{script: Loader, code: code}, config); !strings.HasPrefix(line, "READY ") {
		t.Fatalf("ready pipe with the loader and its code: %q, want READY ...", line)
	}
	other := bytes.Clone(code)
	other[1] ^= 0x5a
	line, cmd, _ := startShipped(t, shipment{script: Loader, code: other}, config)
	if line != "NOCODE" {
		t.Fatalf("ready pipe with another interpreter's code: %q, want NOCODE", line)
	}
	if err := cmd.Wait(); !isExit(err, 2) {
		t.Fatalf("the loader of refused code ended with %v, want exit status 2", err)
	}
	// Code cut short (the engine ended mid-spawn) is not run either.
	line, cmd, _ = startShipped(t, shipment{script: Loader, code: code[:len(code)/2], sizes: fmt.Sprintf("%d 0", len(code))}, "")
	if line != "FAILED the compiled runner was cut short" {
		t.Fatalf("ready pipe with half the code: %q, want FAILED ...", line)
	}
	if err := cmd.Wait(); !isExit(err, 2) {
		t.Fatalf("the loader of cut code ended with %v, want exit status 2", err)
	}
	// Without the code's size the loader says so (a traceback in runner.log
	// would leave the spawn to say only that the runner exited).
	line, cmd, _ = startShipped(t, shipment{script: Loader, code: code, sizes: "nonsense"}, config)
	if line != "FAILED no size for the compiled runner in KERNELDECK_STDIN" {
		t.Fatalf("ready pipe with no size for the code: %q, want FAILED ...", line)
	}
	if err := cmd.Wait(); !isExit(err, 2) {
		t.Fatalf("the loader without a size ended with %v, want exit status 2", err)
	}
}

// The runner writes the tool stubs that follow the code on its stdin into
// its dir, 0600, and fails the spawn with the cause when it cannot: stubs
// cut short, a size missing, or a file already there (planted: never
// written through).
func TestRunnerWritesTheShippedToolStubs(t *testing.T) {
	config := `{"secret": "` + strings.Repeat("ab", 32) + `", "idle_exit": 60}` + "\n"
	stubs := []byte("TOOLS = ('noop',)\n")
	line, _, kd := startShipped(t, shipment{script: Source, tools: stubs}, config)
	if !strings.HasPrefix(line, "READY ") {
		t.Fatalf("ready pipe: %q, want READY ...", line)
	}
	p := filepath.Join(kd, "kerneldeck_tools.py")
	got, err := os.ReadFile(p)
	st, _ := os.Lstat(p)
	if err != nil || !bytes.Equal(got, stubs) || st.Mode() != 0o600 {
		t.Fatalf("kerneldeck_tools.py: %q %v, mode %v; want %q, 0600", got, err, st.Mode(), stubs)
	}
	elsewhere := filepath.Join(t.TempDir(), "target")
	for _, tc := range []struct {
		name  string
		s     shipment
		stdin string
		want  string
	}{
		{"stubs cut short", shipment{script: Source, sizes: "0 100"}, "short", "FAILED kerneldeck_tools.py was cut short: 5 of 100 bytes"},
		{"no sizes", shipment{script: Source, sizes: "nonsense"}, config, "FAILED no size for kerneldeck_tools.py in KERNELDECK_STDIN"},
		{"a planted link", shipment{script: Source, tools: stubs, inDir: true, plant: func(kd string) {
			if err := os.Symlink(elsewhere, filepath.Join(kd, "kerneldeck_tools.py")); err != nil {
				t.Fatal(err)
			}
		}}, config, "FAILED cannot write kerneldeck_tools.py into "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line, cmd, _ := startShipped(t, tc.s, tc.stdin)
			if !strings.HasPrefix(line, tc.want) {
				t.Fatalf("ready pipe: %q, want %q...", line, tc.want)
			}
			if err := cmd.Wait(); !isExit(err, 2) {
				t.Fatalf("the runner ended with %v, want exit status 2", err)
			}
		})
	}
	if _, err := os.Lstat(elsewhere); err == nil {
		t.Fatal("the runner wrote through the planted link")
	}
}

func isExit(err error, status int) bool {
	ee, ok := err.(*exec.ExitError)
	return ok && ee.ExitCode() == status
}
