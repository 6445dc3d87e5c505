package cli

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/tmuxtest"
)

// TestKeptKernelsSurviveOneShotRuns is an operator's sequence: the dashboard
// with --keep-kernels sets a variable and quits; an agent's one-line
// headless call uses the same state dir; the next dashboard still finds the
// variable. A one-shot run must leave kept kernels alone and say so.
func TestKeptKernelsSurviveOneShotRuns(t *testing.T) {
	tmuxtest.Require(t)
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)

	s := startDashboardIn(t, bin, dirs, 100, 30, "--keep-kernels")
	writeCell(s, `precious = 42; import os; print("hello", 6*7, os.getpid())`)
	screen := s.WaitScreen(`output "hello 42 <pid>"`, tmuxWait, helloOutput.MatchString)
	pid, _ := strconv.Atoi(helloOutput.FindStringSubmatch(screen)[1])
	t.Cleanup(func() { killKeptKernel(t, pid) })
	s.Keys("C-c")
	wantExitKilled(t, s, "left 1 kernel running (--keep-kernels)")

	for _, args := range [][]string{{"headless"}, {"repl"}} {
		cmd := exec.Command(bin, append(args, "--state-dir", dirs.state)...)
		cmd.Env = dirs.env()
		cmd.Stdin = strings.NewReader(map[string]string{"headless": `{"id":"1","op":"kernels"}` + "\n", "repl": "1 + 1\n"}[args[0]])
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("kerneldeck %s: %v\nstderr: %s", args[0], err, stderr.String())
		}
		if want := "1 kept kernel left alone; --adopt takes them over"; !strings.Contains(stderr.String(), want) {
			t.Errorf("kerneldeck %s: stderr %q does not say %q", args[0], stderr.String(), want)
		}
		if strings.Contains(stdout.String(), strconv.Itoa(pid)) {
			t.Errorf("kerneldeck %s listed the kept kernel (pid %d): %s", args[0], pid, stdout.String())
		}
		if !tmuxtest.Alive(pid) {
			t.Fatalf("kerneldeck %s killed the kept kernel %d", args[0], pid)
		}
	}
	if _, err := os.Stat(engine.KeptStoreIn(dirs.state).Path); err != nil {
		t.Fatalf("the kept kernel's record is gone: %v", err)
	}

	s = startDashboardIn(t, bin, dirs, 100, 30, "--keep-kernels")
	writeCell(s, `print("precious is", precious)`)
	s.WaitScreen("the kept variable, or its loss", tmuxWait, func(screen string) bool {
		return strings.Contains(screen, "precious is 42") || strings.Contains(screen, "NameError")
	})
	if screen := s.LastScreen(); !strings.Contains(screen, "precious is 42") {
		t.Fatalf("the next dashboard lost the kept kernel's state:\n%s", screen)
	}
	s.Keys("C-c")
	wantExitKilled(t, s, "left 1 kernel running (--keep-kernels)")
}
