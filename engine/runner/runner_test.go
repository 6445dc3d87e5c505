package runner

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startRunner starts runner.py in a fresh kernel dir with stdin as its
// config line, and returns the first line it writes to the ready FIFO.
func startRunner(t *testing.T, stdin string) (string, *exec.Cmd) {
	t.Helper()
	return startShipped(t, map[string][]byte{"runner.py": Source}, stdin)
}

// startShipped is startRunner with the given files in the kernel dir.
func startShipped(t *testing.T, files map[string][]byte, stdin string) (string, *exec.Cmd) {
	t.Helper()
	kd := t.TempDir()
	for _, d := range []string{"cells", "rpc"} {
		if err := os.Mkdir(filepath.Join(kd, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"wake", "done", "ready"} {
		if err := syscall.Mkfifo(filepath.Join(kd, f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(kd, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ready, err := os.OpenFile(filepath.Join(kd, "ready"), os.O_RDWR, 0) // as the spawn script holds it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ready.Close() })
	cmd := exec.Command("python3", filepath.Join(kd, "runner.py"))
	cmd.Stdin = strings.NewReader(stdin)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(ready).ReadString('\n')
	if err != nil {
		t.Fatalf("nothing on the ready FIFO: %v", err)
	}
	return strings.TrimSpace(line), cmd
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
				t.Fatalf("ready FIFO: %q, want NOCONFIG", line)
			}
			if err := cmd.Wait(); !isExit(err, 2) {
				t.Fatalf("the runner ended with %v, want exit status 2", err)
			}
		})
	}
	// The same start with a whole config line gets a working runner.
	line, _ := startRunner(t, `{"secret": "`+strings.Repeat("ab", 32)+`", "idle_exit": 60}`+"\n")
	if !strings.HasPrefix(line, "READY ") {
		t.Fatalf("ready FIFO with a config line: %q, want READY ...", line)
	}
}

// The loader runs the code CompileProgram made with the same interpreter,
// and refuses code whose magic number is another interpreter's: it says
// NOCODE to the spawn and exits 2, before running anything of it.
func TestLoaderRunsOnlyItsInterpretersCode(t *testing.T) {
	compile := exec.Command("python3", "-I", "-S", "-c", CompileProgram, strconv.Itoa(len(Source)))
	compile.Stdin = bytes.NewReader(Source)
	out, err := compile.Output()
	line, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "KD:CODE ")
	if err != nil || !ok {
		t.Fatalf("compile: %v: %.200q", err, out)
	}
	code, err := base64.StdEncoding.DecodeString(line)
	if err != nil {
		t.Fatal(err)
	}
	config := `{"secret": "` + strings.Repeat("ab", 32) + `", "idle_exit": 60}` + "\n"
	if line, _ := startShipped(t, map[string][]byte{"runner.py": Loader, "runner.code": code}, config); !strings.HasPrefix(line, "READY ") {
		t.Fatalf("ready FIFO with the loader and its code: %q, want READY ...", line)
	}
	other := bytes.Clone(code)
	other[1] ^= 0x5a
	line, cmd := startShipped(t, map[string][]byte{"runner.py": Loader, "runner.code": other}, config)
	if line != "NOCODE" {
		t.Fatalf("ready FIFO with another interpreter's code: %q, want NOCODE", line)
	}
	if err := cmd.Wait(); !isExit(err, 2) {
		t.Fatalf("the loader of refused code ended with %v, want exit status 2", err)
	}
}

func isExit(err error, status int) bool {
	ee, ok := err.(*exec.ExitError)
	return ok && ee.ExitCode() == status
}
