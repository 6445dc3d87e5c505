package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

// toolCellCode makes 100 calls of the trivial tool and prints each call's
// latency as the kernel saw it (request file, ring, host dispatch, answer).
const toolCellCode = `import kerneldeck_tools as kt, time
lat = []
for _ in range(100):
    t = time.perf_counter()
    kt.noop()
    lat.append(time.perf_counter() - t)
print(" ".join("%.7f" % x for x in lat))`

// toolsPhase measures a cell making 100 tool calls, on the local backend and
// over ssh (light user).
func toolsPhase(ctx context.Context, cfg config, env *setupEnv, res *results, log io.Writer) {
	subs := []*kdSubject{env.local}
	if env.sshLight != nil {
		subs = append(subs, env.sshLight)
	} else {
		res.note("tools.ssh.light", "skipped: "+env.skipped["ssh"])
	}
	req := engine.Request{Owner: "tools", Tools: []string{"noop"}, Timeout: 2 * time.Minute}
	for _, s := range subs {
		req.Code = "1"
		if _, err := kdRun(ctx, s.eng, req, "1\n"); err != nil {
			res.fail("tools.%s: spawn: %v", s.key(), err)
			return
		}
	}
	req.Code = toolCellCode
	for r := range cfg.Rounds {
		for _, s := range subs {
			var calls []float64
			var wall time.Duration
			for range cfg.ToolCells {
				start := time.Now()
				out, err := s.eng.Execute(ctx, req)
				wall += time.Since(start)
				if err != nil || out.Status != "success" || out.ToolCallsMade != 100 {
					res.fail("tools.%s: cell of 100 tool calls: %v %s", s.key(), err, describe(out))
					return
				}
				for _, f := range strings.Fields(out.Stdout) {
					v, err := strconv.ParseFloat(f, 64)
					if err != nil {
						res.fail("tools.%s: bad latency %q in the cell's output", s.key(), f)
						return
					}
					calls = append(calls, v*1000)
				}
			}
			k := "tools." + s.key()
			res.add(k+".p50", quantile(calls, 0.5))
			res.add(k+".p90", quantile(calls, 0.9))
			res.add(k+".p99", quantile(calls, 0.99))
			res.add(k+".cell", ms(wall)/float64(100*cfg.ToolCells))
		}
		v, _ := lastOf(res, "tools.local.p50")
		fmt.Fprintf(log, "bench: tools round %d/%d: local call p50 %.3fms\n", r+1, cfg.Rounds, v)
	}
}

func describe(r *engine.Result) string {
	if r == nil {
		return ""
	}
	return fmt.Sprintf("status %q tool_calls_made %d stdout %.200q stderr %.200q traceback %.300q",
		r.Status, r.ToolCallsMade, r.Stdout, r.Stderr, r.Traceback)
}

// ownersPhase starts cfg.Owners owners at once on one ssh host (one
// backend, so one shared connection): first all their spawns together
// (each owner's first cell), then cfg.OwnerCells warm cells each, all at
// once, after one unmeasured cell each. Every round starts from no kernels.
// ownersAtOnce has owners owner(0) … owner(owners-1) each run cells
// trivial cells one after another, all owners at once: every cell's round
// trip, the wall time until the last, the failures and the first of them.
func ownersAtOnce(ctx context.Context, eng *engine.Engine, owners, cells int, owner func(int) string) (lat []float64, wall time.Duration, fails int, firstErr string) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for range cells {
				start := time.Now()
				_, err := kdRun(ctx, eng, engine.Request{Owner: owner(i), Code: "1"}, "1\n")
				d := time.Since(start)
				mu.Lock()
				lat = append(lat, ms(d))
				if err != nil {
					fails++
					if firstErr == "" {
						firstErr = fmt.Sprintf("%s: %v", owner(i), err)
					}
				}
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	return lat, time.Since(start), fails, firstErr
}

func ownersPhase(ctx context.Context, cfg config, env *setupEnv, res *results, log io.Writer) {
	if env.srv == nil {
		res.note("owners", "skipped: "+env.skipped["ssh"])
		return
	}
	t := newTB("owners", log)
	defer t.close()
	ecfg := engine.Config{MaxKernels: cfg.Owners + 4}
	s, err := newKD(ctx, t, "owners", env.sshEnv(t, env.light), env.dir, ecfg, false, nil)
	if err != nil {
		res.fail("owners: %v", err)
		return
	}
	s.eng.ShutdownAll(ctx)
	owner := func(i int) string { return fmt.Sprintf("owner-%02d", i) }
	for r := range cfg.Rounds {
		burst := func(cells int) (lat []float64, wall time.Duration, fails int, firstErr string) {
			return ownersAtOnce(ctx, s.eng, cfg.Owners, cells, owner)
		}
		lat, coldWall, fails, firstErr := burst(1)
		res.add("owners.cold.wall", ms(coldWall))
		res.add("owners.cold.p50", quantile(lat, 0.5))
		res.add("owners.cold.p99", quantile(lat, 0.99))
		res.add("owners.cold.fail", float64(fails))
		if fails > 0 {
			res.fail("owners: %d of %d first cells failed at once; first: %s", fails, cfg.Owners, firstErr)
		}
		if n := len(s.eng.Kernels()); n != cfg.Owners && fails == 0 {
			res.fail("owners: %d kernels registered after %d owners' first cells", n, cfg.Owners)
		}
		// One unmeasured cell each first: the measured burst is the steady
		// state of warm kernels, not the tail of the spawns.
		if _, _, fails, firstErr := burst(1); fails > 0 {
			res.fail("owners: %d of %d second cells failed; first: %s", fails, cfg.Owners, firstErr)
		}
		lat, wall, fails, firstErr := burst(cfg.OwnerCells)
		res.add("owners.warm.tput", float64(len(lat))/wall.Seconds())
		res.add("owners.warm.p50", quantile(lat, 0.5))
		res.add("owners.warm.p99", quantile(lat, 0.99))
		res.add("owners.warm.fail", float64(fails))
		if fails > 0 {
			res.fail("owners: %d of %d warm cells failed; first: %s", fails, len(lat), firstErr)
		}
		s.eng.ShutdownAll(ctx)
		fmt.Fprintf(log, "bench: owners round %d/%d: %d spawns in %.0fms, %d warm cells at %.0f cells/s, p99 %.1fms, %d failures\n",
			r+1, cfg.Rounds, cfg.Owners, ms(coldWall), len(lat), float64(len(lat))/wall.Seconds(), quantile(lat, 0.99), fails)
	}
}

// displaysCode makes img, an object whose _repr_png_ is 100 KB of PNG
// signature and random bytes (the engine checks base64, not the image).
const displaysCode = "import os\nclass Png:\n    def __init__(self, n):\n        self.data = b'\\x89PNG\\r\\n\\x1a\\n' + os.urandom(n)\n" +
	"    def _repr_png_(self):\n        return self.data\nimg = Png(100 << 10)"

// displaysPhase: a warm local cell that displays a 100 KB PNG beside a
// trivial warm cell, interleaved one by one in one kernel (issue 17's
// budget: at most 2 ms more).
func displaysPhase(ctx context.Context, cfg config, env *setupEnv, res *results, log io.Writer) {
	eng := env.local.eng
	req := engine.Request{Owner: "displays", Code: displaysCode}
	if _, err := kdRun(ctx, eng, req, ""); err != nil {
		res.fail("displays: setup: %v", err)
		return
	}
	for r := range cfg.Rounds {
		var plain, png []float64
		for i := range cfg.Warm {
			code, want := "1", "1\n"
			if i%2 == 1 {
				code, want = "display(img)", ""
			}
			req.Code = code
			start := time.Now()
			out, err := kdRun(ctx, eng, req, want)
			d := ms(time.Since(start))
			if err != nil {
				res.fail("displays: %v", err)
				return
			}
			if i%2 == 1 {
				if len(out.Displays) != 1 || len(out.Displays[0].Data["image/png"]) < 100<<10 {
					res.fail("displays: display(img) gave %d displays", len(out.Displays))
					return
				}
				png = append(png, d)
			} else {
				plain = append(plain, d)
			}
		}
		p, q := quantile(plain, 0.5), quantile(png, 0.5)
		res.add("displays.trivial", p)
		res.add("displays.png100k", q)
		res.add("displays.extra", q-p)
		fmt.Fprintf(log, "bench: displays round %d/%d: trivial %.3fms, 100 KB PNG %.3fms\n", r+1, cfg.Rounds, p, q)
	}
}
