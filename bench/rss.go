package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// rssKB is a process's resident set (VmRSS) in KiB; 0 when unknown.
func rssKB(pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return n
		}
	}
	return 0
}

// rssPhase compares the memory an idle kernel holds: the local runner after
// its warm cells, a bare interpreter sleeping, and the ipykernel.
func rssPhase(ctx context.Context, cfg config, env *setupEnv, res *results, log io.Writer) {
	bare := exec.CommandContext(ctx, cfg.Python, "-c", "import sys, time; print('up', flush=True); time.sleep(120)")
	out, err := bare.StdoutPipe()
	if err != nil {
		res.fail("rss: %v", err)
		return
	}
	if err := bare.Start(); err != nil {
		res.fail("rss: start a bare %s: %v", cfg.Python, err)
		return
	}
	defer func() { bare.Process.Kill(); bare.Wait() }()
	bufio.NewReader(out).ReadString('\n')
	time.Sleep(200 * time.Millisecond)
	for r := range cfg.Rounds {
		b, k := rssKB(bare.Process.Pid), rssKB(env.local.runner)
		res.add("rss.bare", b/1024)
		res.add("rss.local", k/1024)
		res.add("rss.local_over_bare", (k-b)/1024)
		if env.jupyter != nil {
			if pid := env.jupyter.kernelPID; pid > 0 {
				res.add("rss.jupyter", rssKB(pid)/1024)
			}
		}
		fmt.Fprintf(log, "bench: rss round %d/%d: runner %.1f MB, bare python %.1f MB\n", r+1, cfg.Rounds, k/1024, b/1024)
	}
}
