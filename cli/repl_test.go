package cli

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/proctest"
)

func runnerAlive(pid int) bool { return proctest.Alive(pid) }

func waitRunnerDead(t *testing.T, pid int) { proctest.WaitDead(t, pid, 10*time.Second) }

// firstPID is the number on the first line of a REPL's stdout.
func firstPID(t *testing.T, stdout string) int {
	t.Helper()
	first, _, _ := strings.Cut(stdout, "\n")
	pid, err := strconv.Atoi(first)
	if err != nil || pid <= 0 {
		t.Fatalf("no runner pid on the first line of stdout %q", stdout)
	}
	return pid
}

func TestREPLPipe(t *testing.T) {
	kernels := isolate(t)
	in := "import os; print(os.getpid())\nx = 41\ndef f(v):\n    return v + 1\n\nf(x)\n1/0\nprint('still here')\n"
	code, stdout, stderr := runCLI(t, in, "repl", "--owner", "tester", "--task", "t1")
	// A script whose cell raised exits 1, as python3 does, saying which
	// cell; the rest of it still ran.
	if code != exitFail {
		t.Fatalf("exit %d, want 1 for the failed cell; stderr:\n%s", code, stderr)
	}
	pid := firstPID(t, stdout)
	if want := strconv.Itoa(pid) + "\n42\nstill here\n"; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}
	// Through a pipe: no prompts, no banner; the traceback and the verdict.
	if !strings.HasPrefix(stderr, "Traceback") || !strings.Contains(stderr, "ZeroDivisionError: division by zero\n") ||
		!strings.HasSuffix(stderr, "kerneldeck repl: 1 of 6 cells failed; the first was cell 5 (from input line 7): error\n") {
		t.Errorf("stderr:\n%s", stderr)
	}
	// At the end of input the kernel is killed.
	waitRunnerDead(t, pid)
	wantNoProcessesUnder(t, kernels)
}

func TestREPLKeepKernels(t *testing.T) {
	isolate(t)
	code, stdout, stderr := runCLI(t, "import os; print(os.getpid())\n", "repl", "--keep-kernels", "--idle-exit", "1m")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	pid := firstPID(t, stdout)
	t.Cleanup(func() { killKeptKernel(t, pid) })
	if !runnerAlive(pid) {
		t.Fatalf("runner %d was killed despite --keep-kernels", pid)
	}
	if !strings.Contains(stderr, "(pid "+strconv.Itoa(pid)+") keeps running on local") || !strings.Contains(stderr, "after 1m0s idle") {
		t.Errorf("stderr does not say which kernel was kept:\n%s", stderr)
	}
}

// A restart after --keep-kernels finds the kept kernel again, with its
// state, in the same process: adopted, not leaked and not duplicated. The
// run that adopts it with --adopt (not --keep-kernels) kills it at exit.
func TestREPLKeptKernelIsAdoptedOnRestart(t *testing.T) {
	kernels := isolate(t)
	code, stdout, stderr := runCLI(t, "import os; x = 41; print(os.getpid())\n", "repl", "--keep-kernels")
	if code != exitOK {
		t.Fatalf("first run: exit %d, stderr:\n%s", code, stderr)
	}
	pid := firstPID(t, stdout)
	t.Cleanup(func() { killKeptKernel(t, pid) })
	code, stdout, stderr = runCLI(t, "import os; print(x + 1, os.getpid())\n", "repl", "--adopt")
	if code != exitOK {
		t.Fatalf("second run: exit %d, stderr:\n%s", code, stderr)
	}
	if want := fmt.Sprintf("42 %d\n", pid); stdout != want {
		t.Fatalf("second run printed %q, want %q (the kept kernel with its state); stderr:\n%s", stdout, want, stderr)
	}
	if !strings.Contains(stderr, "adopted 1 kernel left running by an earlier kerneldeck") {
		t.Errorf("stderr does not say the kernel was adopted:\n%s", stderr)
	}
	waitRunnerDead(t, pid)
	wantNoProcessesUnder(t, kernels)
	// Nothing is left to adopt a third time.
	if _, err := os.Stat(engine.KeptStoreIn(filepath.Join(os.Getenv("XDG_STATE_HOME"), "kerneldeck")).Path); err == nil {
		t.Error("the kept-kernels file outlived the adoption")
	}
}

func TestREPLCommandLine(t *testing.T) {
	isolate(t)
	for _, tc := range []struct {
		args   []string
		code   int
		stdout []string
		stderr []string
	}{
		{[]string{"--help"}, 0, []string{"kerneldeck repl [flags]", "kerneldeck headless [flags]"}, nil},
		{[]string{"repl", "--help"}, 0, []string{
			"Usage: kerneldeck repl [flags]", ">>>", "...", "blank line", "ctrl+c", "ctrl+d", "--keep-kernels",
			"--backend URI", "--owner O", "--task T", "--idle-exit DURATION", "--cell-timeout DURATION",
			"--config FILE", "--state-dir DIR", "--ssh-config FILE", "--identity FILE", "--known-hosts FILE",
			"--accept-new-host-key", "| kerneldeck repl",
		}, nil},
		{[]string{"help", "repl"}, 0, []string{"Usage: kerneldeck repl [flags]"}, nil},
		{[]string{"repl", "--backend", "local", "--backend", "ssh://h"}, 2, nil, []string{"--backend is given 2 times", "give it once", "kerneldeck repl --help"}},
		{[]string{"repl", "--owner", ""}, 2, nil, []string{"owner must not be empty"}},
		{[]string{"repl", "--task", " "}, 2, nil, []string{"task must not be empty"}},
		{[]string{"repl", "--idle-exit", "5ms"}, 2, nil, []string{"at least 1s"}},
		{[]string{"repl", "--bogus"}, 2, nil, []string{"bogus", "kerneldeck repl --help"}},
		{[]string{"repl", "--backend", "nowhere://x"}, 2, nil, []string{"nowhere://x"}},
		{[]string{"repl", "--config", "/nonexistent/kd.toml"}, 2, nil, []string{"does not exist"}},
	} {
		code, stdout, stderr := runCLI(t, "", tc.args...)
		if code != tc.code {
			t.Errorf("kerneldeck %q: exit %d, want %d (stderr %q)", tc.args, code, tc.code, stderr)
		}
		for _, w := range tc.stdout {
			if !strings.Contains(stdout, w) {
				t.Errorf("kerneldeck %q: stdout does not contain %q:\n%s", tc.args, w, stdout)
			}
		}
		for _, w := range tc.stderr {
			if !strings.Contains(stderr, w) {
				t.Errorf("kerneldeck %q: stderr does not contain %q:\n%s", tc.args, w, stderr)
			}
		}
	}
}

// TestBinaryREPLInterrupt drives the real binary: SIGINT (what ctrl+c sends)
// interrupts the running block, the session goes on with its state, and the
// end of input exits 0 with no kernel left.
func TestBinaryREPLInterrupt(t *testing.T) {
	bin := buildBinary(t)
	kernels := isolate(t)
	p := startPiped(t, bin, "repl")
	cmd, in, stderr := p.cmd, p.in, p.stderr
	out := bufio.NewReader(p.out)
	// readLine fails the test instead of hanging when no line comes.
	readLine := func(what string) string {
		t.Helper()
		got := make(chan string, 1)
		go func() {
			line, err := out.ReadString('\n')
			if err != nil {
				line += fmt.Sprintf(" (read error: %v)", err)
			}
			got <- line
		}()
		select {
		case line := <-got:
			return line
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%s: no line on stdout within 30s (stderr %s)", what, stderr.String())
			return ""
		}
	}
	io.WriteString(in, "x = 6\nimport os, time; print(os.getpid(), flush=True); time.sleep(60)\n")
	pid := firstPID(t, readLine("the runner pid"))
	start := time.Now()
	deadline := start.Add(20 * time.Second)
	// One ctrl+c, then patience: three during one cell kill its kernel, so
	// a second one is sent only if the first found no running cell yet.
	sent, last := 0, time.Time{}
	for !strings.Contains(stderr.String(), "KeyboardInterrupt") {
		if time.Now().After(deadline) {
			t.Fatalf("no KeyboardInterrupt after SIGINT; stderr %q", stderr.String())
		}
		if sent == 0 || (sent == 1 && time.Since(last) > 8*time.Second) {
			cmd.Process.Signal(syscall.SIGINT)
			sent, last = sent+1, time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	io.WriteString(in, "print(x * 7)\n")
	if line := readLine("after the interrupt"); line != "42\n" {
		t.Fatalf("after the interrupt: %q (stderr %s)", line, stderr.String())
	}
	in.Close()
	done := make(chan error, 1)
	go func() {
		io.Copy(io.Discard, out)
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit at end of input: %v (stderr %s)", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("kerneldeck repl did not exit within 20s of the end of input")
	}
	waitRunnerDead(t, pid)
	wantNoProcessesUnder(t, kernels)
}
