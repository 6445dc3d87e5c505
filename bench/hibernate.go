package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// sessionSetup gives a session a small namespace: 50 names of 2 KB each
// (100 KB), which its hibernation parks and its wake restores.
const sessionSetup = "import os\nglobals().update({'v%d' % i: os.urandom(2048) for i in range(50)})"

// sessionCheck reads two of the names back: a wake that lost the state
// fails it.
const sessionCheck, sessionWant = "print(len(v0) + len(v49))", "4096\n"

// wakeRate is how many calls a second the wake stream sends by default,
// to random sessions, whatever their answers' pace (an open loop).
const wakeRate = 50

// hibernatePhase holds cfg.Sessions sessions on one host, all hibernated
// (issue 56): each made with a small namespace and left idle for
// hibernate_after (1 s here); then what they hold in all (the engine, its
// spares, no runner of theirs), the engine's idle CPU, and a stream of
// calls to random sessions (each wakes one) at wakeRate a second: their
// latency from when each was due, and failures.
func hibernatePhase(ctx context.Context, cfg config, env *setupEnv, res *results, log io.Writer) {
	t := newTB("hibernate", log)
	defer t.close()
	temp := shortTempDir(t)
	state := t.TempDir()
	park := filepath.Join(state, "parked")
	eng, err := engine.New(engine.Config{Backends: []backends.Env{backends.NewLocal(temp)}, StateDir: state, ParkDir: park,
		Python: cfg.Python, MaxKernels: 512, IdleExit: time.Hour, HibernateAfter: time.Second, CellTimeout: time.Minute,
		SpareKernels: map[string]int{"local": 8}, ParkTotalBytes: 8 << 30})
	if err != nil {
		res.fail("hibernate: %v", err)
		return
	}
	closed := false
	defer func() {
		if !closed {
			closeEngine(eng)
		}
	}()
	session := func(i int) string { return fmt.Sprintf("s%05d", i) }

	// Make them, a few at a time.
	start := time.Now()
	var made atomic.Int64
	err = eachAtOnce(ctx, cfg.Sessions, 4, func(i int) error {
		out, err := eng.Execute(ctx, engine.Request{Owner: session(i), Code: sessionSetup, Timeout: time.Minute})
		if err == nil && out.Status != engine.StatusSuccess {
			err = fmt.Errorf("%s", describe(out))
		}
		if err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		if n := made.Add(1); n%1000 == 0 {
			fmt.Fprintf(log, "bench: hibernate: %d sessions made in %v\n", n, time.Since(start).Round(time.Second))
		}
		return nil
	})
	if err != nil {
		res.fail("hibernate: make: %v", err)
		return
	}
	res.add("hibernate.make.per_s", float64(made.Load())/time.Since(start).Seconds())
	asleep := func() int {
		n := 0
		for _, p := range eng.Parked() {
			if p.Hibernated {
				n++
			}
		}
		return n
	}
	// settle waits until no kernel is awake and want sessions sleep.
	settle := func(within time.Duration, want int) bool {
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if len(eng.Kernels()) == 0 && asleep() == want {
				return true
			}
			time.Sleep(200 * time.Millisecond)
		}
		return false
	}
	if !settle(5*time.Minute, int(made.Load())) {
		res.fail("hibernate: %d kernels still awake, %d of %d sessions hibernated", len(eng.Kernels()), asleep(), made.Load())
		return
	}
	fmt.Fprintf(log, "bench: hibernate: %d sessions made and hibernated in %v\n", made.Load(), time.Since(start).Round(time.Second))
	res.add("hibernate.sessions", float64(asleep()))

	held := func() {
		time.Sleep(cfg.CPUSettle)
		c0 := selfCPU()
		time.Sleep(cfg.CPUWindow)
		c1 := selfCPU()
		res.add("hibernate.idle_cpu_pct", 100*float64(c1-c0)/float64(cfg.CPUWindow))
		self, runners := rssKB(os.Getpid())/1024, rssUnder(temp)/1024
		res.add("hibernate.rss.engine_mb", self)
		res.add("hibernate.rss.runners_mb", runners)
		res.add("hibernate.rss.total_mb", self+runners)
		res.add("hibernate.park_mb", float64(dirBytes(park))/(1<<20))
	}
	held()

	// One session's wake by the size of its namespace, with nothing else
	// going on: 1 MB (a spare's pace is the target), and 200 MB for a
	// figure per GB (E2B publishes about 1 s to resume a sandbox).
	for _, size := range []struct {
		name  string
		names int
		each  int
	}{{"1mb", 50, 20 << 10}, {"200mb", 200, 1 << 20}} {
		if cfg.Quick && size.name == "200mb" {
			res.note("hibernate.wake_200mb", "quick run: not made")
			res.note("hibernate.wake_per_gb", "quick run: not made")
			continue
		}
		owner := "size-" + size.name
		code := fmt.Sprintf("import os\nglobals().update({'v%%d' %% i: os.urandom(%d) for i in range(%d)})", size.each, size.names)
		check := fmt.Sprintf("print(len(v0) + len(v%d))", size.names-1)
		want := fmt.Sprintf("%d\n", 2*size.each)
		var lat []float64
		for range max(3, cfg.Rounds) {
			if _, err := kdRun(ctx, eng, engine.Request{Owner: owner, Code: code + "\nprint(1)", Timeout: time.Minute}, "1\n"); err != nil {
				res.fail("hibernate: %s namespace: %v", size.name, err)
				return
			}
			if !settle(time.Minute, int(made.Load())+1) {
				res.fail("hibernate: a %s namespace did not hibernate", size.name)
				return
			}
			time.Sleep(500 * time.Millisecond) // the spares made up again
			start := time.Now()
			if _, err := kdRun(ctx, eng, engine.Request{Owner: owner, Code: check, Timeout: time.Minute}, want); err != nil {
				res.fail("hibernate: wake a %s namespace: %v", size.name, err)
				return
			}
			lat = append(lat, ms(time.Since(start)))
			eng.ShutdownOwner(ctx, owner)
		}
		res.add("hibernate.wake_"+size.name, median(lat))
		if size.name == "200mb" {
			res.add("hibernate.wake_per_gb", median(lat)*1024/200)
		}
	}

	for r := range cfg.Rounds {
		lat, fails, why := wakeStream(ctx, eng, cfg.WakeCalls, cfg.WakeRate, int(made.Load()), session)
		res.add("hibernate.wake.p50", quantile(lat, 0.5))
		res.add("hibernate.wake.p99", quantile(lat, 0.99))
		res.add("hibernate.wake.fail", float64(fails))
		if why != "" {
			res.fail("hibernate: wake: %s", why)
		}
		fmt.Fprintf(log, "bench: hibernate round %d/%d: %d wakes at %d/s, p50 %.1f ms, p99 %.1f ms, %d failed\n",
			r+1, cfg.Rounds, cfg.WakeCalls, cfg.WakeRate, quantile(lat, 0.5), quantile(lat, 0.99), fails)
		if !settle(time.Minute, int(made.Load())) {
			res.fail("hibernate: after round %d, %d kernels still awake", r+1, len(eng.Kernels()))
			return
		}
	}
	closeEngine(eng)
	closed = true
	res.add("hibernate.left", float64(runnersUnder(temp)))
}

// wakeStream sends n calls at rate a second, each to a random one of
// sessions, and returns each call's latency from when it was due (ms),
// how many failed and the first failure.
func wakeStream(ctx context.Context, eng *engine.Engine, n, rate, sessions int, session func(int) string) ([]float64, int, string) {
	lat := make([]float64, n)
	var fails atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	begin := time.Now()
	for i := range n {
		due := begin.Add(time.Duration(i) * time.Second / time.Duration(rate))
		time.Sleep(time.Until(due))
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := eng.Execute(ctx, engine.Request{Owner: session(rand.IntN(sessions)), Code: sessionCheck, Timeout: time.Minute})
			lat[i] = ms(time.Since(due))
			if err == nil && (out.Stdout != sessionWant || out.Kernel == nil) {
				err = fmt.Errorf("%s", describe(out))
			}
			if err != nil {
				fails.Add(1)
				first.CompareAndSwap(nil, err.Error())
			}
		}()
	}
	wg.Wait()
	why, _ := first.Load().(string)
	return lat, int(fails.Load()), why
}

// rssUnder sums the resident memory (KiB) of the processes whose command
// line names dir: the runners of a local backend rooted there.
func rssUnder(dir string) float64 {
	total := 0.0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), dir) {
			var pid int
			fmt.Sscanf(p, "/proc/%d/cmdline", &pid)
			total += rssKB(pid)
		}
	}
	return total
}

// dirBytes is the size of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
