package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/tmuxtest"
)

// The dashboard's own CPU (issue 18): the real binary, attached in a tmux
// pane to an engine in this process that holds 1,000 kernels, measured
// from /proc over a window while nothing changes (the editor focused, as
// a dashboard starts), and while one kernel (the one selected in the
// kernels pane, so its output is on screen) streams a line every 20 ms.

// streamCellCode prints a numbered line every 20 ms for about a minute; the
// phase interrupts it when its window is over.
const streamCellCode = `import time
for i in range(3000):
    print("line", i, flush=True)
    time.sleep(0.02)`

// dashboardPhase measures the dashboard process.
func dashboardPhase(ctx context.Context, cfg config, env *setupEnv, res *results, log io.Writer) {
	t := newTB("dashboard", log)
	defer t.close()
	eng, sock, err := servedFleet(ctx, t, 1000)
	if err != nil {
		res.fail("dashboard: %v", err)
		return
	}
	// Owner "a-stream" sorts first: its kernel is the row under the first
	// group.
	first, err := kdRun(ctx, eng, engine.Request{Owner: "a-stream", Code: "1"}, "1\n")
	if err != nil {
		res.fail("dashboard: %v", err)
		return
	}
	bin, err := buildKerneldeck(t)
	if err != nil {
		res.fail("dashboard: %v", err)
		return
	}
	home := t.TempDir()
	envv := append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, "config"),
		"XDG_STATE_HOME="+filepath.Join(home, "state"), "XDG_RUNTIME_DIR=", "NO_COLOR=")
	s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "--attach", sock}, Env: envv, Width: 160, Height: 50, StopTimeout: 10 * time.Second})
	s.WaitScreen("the dashboard showing the kernels", 30*time.Second, func(screen string) bool {
		return strings.Contains(screen, "a-stream") && strings.Contains(screen, "k00")
	})
	// Select a-stream's kernel, the row under its group (the dashboard
	// starts in the list): the output pane shows that kernel's cells. Then
	// to the editor (e), where an operator writes.
	kernelsFocused := func(screen string) bool { return strings.Contains(screen, "d detail") }
	editorFocused := func(screen string) bool { return strings.Contains(screen, "ctrl+r run cell") }
	s.WaitScreen("the kernels pane focused", 30*time.Second, kernelsFocused)
	s.Keys("Down")
	s.WaitScreen("the output pane on a-stream's kernel", 30*time.Second, func(screen string) bool { return strings.Contains(screen, "Output · a-stream/default") })
	s.Keys("e")
	s.WaitScreen("the editor focused", 30*time.Second, editorFocused)
	pid := s.PID()
	cpu := func() (float64, error) {
		// The first frames, the replayed history, a cell's start: let them pass.
		select {
		case <-time.After(cfg.CPUSettle):
		case <-ctx.Done():
		}
		p0, ok := readProcStat(pid)
		c0 := threadsCPU(pid)
		start := time.Now()
		select {
		case <-time.After(cfg.CPUWindow):
		case <-ctx.Done():
		}
		c1 := threadsCPU(pid)
		p1, ok1 := readProcStat(pid)
		if !ok || !ok1 || p0.start != p1.start {
			return 0, fmt.Errorf("the dashboard (pid %d) is gone: %s", pid, s.Stderr())
		}
		return 100 * (c1 - c0).Seconds() / time.Since(start).Seconds(), nil
	}
	for r := range cfg.Rounds {
		idle, err := cpu()
		if err != nil {
			res.fail("dashboard: %v", err)
			return
		}
		s.Keys("Escape") // the editor's way back to the list
		s.WaitScreen("the kernels pane focused", 30*time.Second, kernelsFocused)
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := eng.Execute(cctx, engine.Request{Owner: "a-stream", Code: streamCellCode, Timeout: 5 * time.Minute})
			done <- err
		}()
		s.WaitScreen("the streamed lines on screen", 30*time.Second, func(screen string) bool { return strings.Contains(screen, "line 1") })
		streaming, err := cpu()
		if ierr := eng.Interrupt(ctx, first.Kernel.ID); ierr != nil && err == nil {
			err = fmt.Errorf("interrupt the streaming cell: %w", ierr)
		}
		<-done
		cancel()
		if err != nil {
			res.fail("dashboard: %v", err)
			return
		}
		s.Keys("e")
		s.WaitScreen("the editor focused", 30*time.Second, editorFocused)
		res.add("dashboard.cpu.idle", idle)
		res.add("dashboard.cpu.stream", streaming)
		fmt.Fprintf(log, "bench: dashboard round %d/%d: %.2f%% of a core idle, %.2f%% with one cell streaming (1,000 kernels)\n",
			r+1, cfg.Rounds, idle, streaming)
	}
}

// threadsCPU is the CPU time of pid's threads so far, in nanoseconds from
// /proc/<pid>/task/*/schedstat: /proc/<pid>/stat counts 10 ms ticks, too
// coarse for a process that uses half a percent of a core. (A Go program
// keeps its threads, so none that ran in the window is missed.)
func threadsCPU(pid int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum time.Duration
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if first, _, ok := strings.Cut(string(b), " "); ok {
			if ns, err := strconv.ParseInt(first, 10, 64); err == nil {
				sum += time.Duration(ns)
			}
		}
	}
	return sum
}
