package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// hostPhase is scale on one host, with real local kernels (issue 42): a
// storm of new owners at once (time until every one has its first result,
// failures), those owners' warm cells at once (throughput, p99), then
// kernels up to HostKernels held idle (the engine's CPU and memory while
// they idle, a runner's memory), and no runner left after Close.
func hostPhase(ctx context.Context, cfg config, env *setupEnv, res *results, log io.Writer) {
	t := newTB("host", log)
	defer t.close()
	temp := shortTempDir(t)
	eng, err := engine.New(engine.Config{Backends: []backends.Env{backends.NewLocal(temp)}, StateDir: t.TempDir(),
		MaxKernels: cfg.HostKernels + 8, IdleExit: time.Hour, CellTimeout: 5 * time.Minute})
	if err != nil {
		res.fail("host: %v", err)
		return
	}
	closed := false
	defer func() {
		if !closed {
			closeEngine(eng)
		}
	}()
	burst := func(owners, cells int, owner func(int) string) ([]float64, time.Duration, int, string) {
		return ownersAtOnce(ctx, eng, owners, cells, owner)
	}
	storm := func(i int) string { return fmt.Sprintf("storm-%03d", i) }
	for r := range cfg.Rounds {
		lat, wall, fails, firstErr := burst(cfg.Storm, 1, storm)
		res.add("host.storm.wall", ms(wall))
		res.add("host.storm.p50", quantile(lat, 0.5))
		res.add("host.storm.fail", float64(fails))
		if firstErr != "" {
			res.fail("host: storm: %s", firstErr)
		}
		stormWall := wall
		lat, wall, fails, firstErr = burst(cfg.Storm, 10, storm)
		res.add("host.warm.per_s", float64(len(lat))/wall.Seconds())
		res.add("host.warm.p50", quantile(lat, 0.5))
		res.add("host.warm.p99", quantile(lat, 0.99))
		res.add("host.warm.fail", float64(fails))
		if firstErr != "" {
			res.fail("host: warm: %s", firstErr)
		}
		fmt.Fprintf(log, "bench: host round %d/%d: %d new owners at once in %v\n", r+1, cfg.Rounds, cfg.Storm, stormWall.Round(time.Millisecond))
		eng.ShutdownAll(ctx)
	}
	// Idle: HostKernels kernels, started 8 at a time.
	idle := func(i int) string { return fmt.Sprintf("idle-%04d", i) }
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var failed sync.Map
	for i := range cfg.HostKernels {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := kdRun(ctx, eng, engine.Request{Owner: idle(i), Code: "1"}, "1\n"); err != nil {
				failed.Store(i, err)
			}
		}()
	}
	wg.Wait()
	nfail := 0
	failed.Range(func(_, v any) bool {
		if nfail == 0 {
			res.fail("host: idle kernels: %v", v)
		}
		nfail++
		return true
	})
	res.add("host.idle.fail", float64(nfail))
	kernels := eng.Kernels()
	time.Sleep(cfg.CPUSettle)
	c0 := selfCPU()
	time.Sleep(cfg.CPUWindow)
	c1 := selfCPU()
	res.add("host.idle.kernels", float64(len(kernels)))
	res.add("host.idle.engine_cpu_pct", 100*float64(c1-c0)/float64(cfg.CPUWindow))
	res.add("host.idle.engine_rss_mb", rssKB(os.Getpid())/1024)
	var rss []float64
	for _, k := range kernels {
		if kb := rssKB(k.PID); kb > 0 {
			rss = append(rss, kb/1024)
		}
	}
	res.add("host.idle.runner_rss_mb", median(rss))
	fmt.Fprintf(log, "bench: host: %d kernels idle\n", len(kernels))
	closeEngine(eng)
	closed = true
	res.add("host.left", float64(runnersUnder(temp)))
}

// runnersUnder counts the processes whose command line names dir: runners
// (and their watchers) left on this host.
func runnersUnder(dir string) int {
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), dir) {
			n++
		}
	}
	return n
}
