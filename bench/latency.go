package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// latencyAcc is one subject's measurements in one round.
type latencyAcc struct {
	lat       []time.Duration
	cpu       time.Duration
	cells     int
	trips     tripCount
	hasTrips  bool
	colds     []float64
	coldTrips tripCount
}

// addWarm records the round's warm figures of subject k, if it ran warm
// cells (a cold-only floor runs none).
func (a *latencyAcc) addWarm(res *results, k string) {
	if a.cells == 0 {
		return
	}
	x := msAll(a.lat)
	res.add(k+".warm.p50", quantile(x, 0.5))
	res.add(k+".warm.p90", quantile(x, 0.9))
	res.add(k+".warm.p99", quantile(x, 0.99))
	res.add(k+".cpu", ms(a.cpu)/float64(a.cells))
	if a.hasTrips {
		n := float64(a.cells)
		res.add(k+".trips.warm", float64(a.trips.Commands+a.trips.Exchanges)/n)
		res.add(k+".exec.warm", float64(a.trips.Commands)/n)
		res.add(k+".counted.warm", float64(a.trips.Executes+a.trips.Frames)/n)
	}
}

// addCold records the round's cold-start figures of subject k, if it has
// a cold start.
func (a *latencyAcc) addCold(res *results, k string) {
	if len(a.colds) == 0 {
		return
	}
	res.add(k+".cold", median(a.colds))
	res.add(k+".cold.p95", quantile(a.colds, 0.95)) // of this round's: few, so near its slowest
	if a.hasTrips {
		n := float64(len(a.colds))
		res.add(k+".trips.cold", float64(a.coldTrips.Commands+a.coldTrips.Exchanges)/n)
		res.add(k+".exec.cold", float64(a.coldTrips.Commands)/n)
		res.add(k+".counted.cold", float64(a.coldTrips.Executes+a.coldTrips.Frames)/n)
	}
}

// latencyPhase measures the warm trivial cell and the cold start of every
// subject, round by round. Within a round the warm cells run in blocks, the
// subjects taking turns block by block (and cold start by cold start), in
// an order rotated every round, so that a burst of load from elsewhere hits
// them alike; ratios are then taken within the round.
func latencyPhase(ctx context.Context, cfg config, env *setupEnv, res *results, log io.Writer) {
	subs := append([]subject(nil), env.subjects...)
	failed := map[string]bool{}
	for _, s := range subs {
		n := cfg.Warmup
		if s.key() == "floor.ssh.heavy" {
			n = min(n, 1) // each costs the rc, and there is nothing to warm
		}
		if _, err := s.warm(ctx, n); err != nil {
			failed[s.key()] = true
			res.fail("%s: %v", s.key(), err)
		}
	}
	for r := range cfg.Rounds {
		order := make([]subject, 0, len(subs))
		for i := range subs {
			order = append(order, subs[(i+r)%len(subs)])
		}
		acc := map[string]*latencyAcc{}
		for _, s := range subs {
			acc[s.key()] = &latencyAcc{}
		}
		for b := range cfg.Blocks {
			for _, s := range order {
				if failed[s.key()] || ctx.Err() != nil {
					continue
				}
				n := blockShare(warmCount(cfg, s), cfg.Blocks, b)
				if n == 0 {
					continue
				}
				a := acc[s.key()]
				roots := s.cpuRoots()
				t0, hasTrips := s.trips()
				c0 := cpuBefore(roots)
				lat, err := s.warm(ctx, n)
				c1 := cpuAfter(roots)
				t1, _ := s.trips()
				if err != nil {
					failed[s.key()] = true
					res.fail("%s: %v", s.key(), err)
					continue
				}
				a.lat = append(a.lat, lat...)
				a.cpu += cpuSince(c0, c1)
				a.cells += len(lat)
				a.hasTrips = hasTrips
				d := t1.sub(t0)
				a.trips = tripCount{a.trips.Commands + d.Commands, a.trips.Exchanges + d.Exchanges,
					a.trips.Executes + d.Executes, a.trips.Frames + d.Frames}
			}
		}
		backToBack(ctx, cfg, subs, failed, r, res)
		for range cfg.Cold {
			for _, s := range order {
				if failed[s.key()] || ctx.Err() != nil {
					continue
				}
				d, trips, err := s.cold(ctx)
				if errors.Is(err, errNoCold) {
					continue
				}
				if err != nil {
					failed[s.key()] = true
					res.fail("%s: %v", s.key(), err)
					continue
				}
				a := acc[s.key()]
				a.colds = append(a.colds, ms(d))
				a.coldTrips = tripCount{a.coldTrips.Commands + trips.Commands, a.coldTrips.Exchanges + trips.Exchanges,
					a.coldTrips.Executes + trips.Executes, a.coldTrips.Frames + trips.Frames}
			}
		}
		for _, s := range subs {
			a, k := acc[s.key()], s.key()
			if failed[k] {
				continue
			}
			a.addWarm(res, k)
			a.addCold(res, k)
		}
		// Ratios, pair by pair within this round.
		ratio := func(name, num, den string) {
			if !roundHas(res, r, num) || !roundHas(res, r, den) {
				return
			}
			nv, _ := lastOf(res, num)
			dv, _ := lastOf(res, den)
			if dv > 0 {
				res.add(name, nv/dv)
			}
		}
		ratio("ratio.local_jupyter.warm", "local.warm.p50", "jupyter.warm.p50")
		ratio("ratio.local_jupyter.cold", "local.cold", "jupyter.cold")
		ratio("ratio.freshheadless_jupyter.cold", "fresh.headless.cold", "jupyter.cold")
		ratio("ratio.local_bash.warm", "local.warm.p50", "floor.bash.warm.p50")
		ratio("ratio.local_pyloop.warm", "local.warm.p50", "floor.pyloop.warm.p50")
		ratio("ratio.local_pyloop.cold", "local.cold", "floor.pyloop.cold")
		ratio("ratio.spawnchain_pyloop.cold", "floor.spawnchain.cold", "floor.pyloop.cold")
		ratio("ratio.local_spawnchain.cold", "local.cold", "floor.spawnchain.cold")
		ratio("ratio.localtraced_local.warm", "local.traced.warm.p50", "local.warm.p50")
		ratio("ratio.sshlight_streamlocal.warm", "ssh.light.warm.p50", "floor.ssh.streamlocal.warm.p50")
		ratio("ratio.localspare_jupyter.cold", "local.spare.cold", "jupyter.cold")
		ratio("ratio.sshlight_floor.warm", "ssh.light.warm.p50", "floor.ssh.light.warm.p50")
		ratio("ratio.sshheavy_floor.warm", "ssh.heavy.warm.p50", "floor.ssh.heavy.warm.p50")
		ratio("ratio.sshheavy_light.warm", "ssh.heavy.warm.p50", "ssh.light.warm.p50")
		ratio("ratio.floorheavy_light.warm", "floor.ssh.heavy.warm.p50", "floor.ssh.light.warm.p50")
		ratio("ratio.sshlight_jupyter.warm", "ssh.light.warm.p50", "jupyter.warm.p50")
		ratio("ratio.docker_local.warm", "docker.warm.p50", "local.warm.p50")
		ratio("ratio.docker_floor.warm", "docker.warm.p50", "floor.docker.warm.p50")
		ratio("ratio.dockerimage_jupyter.cold", "docker-image.cold", "jupyter.cold")
		ratio("ratio.docker_jupyter.cold", "docker.cold", "jupyter.cold")
		ratio("ratio.headless_dockerimage_local.warm", "headless.docker-image.warm.p50", "headless.local.warm.p50")
		diff := func(name, a, b string) {
			if roundHas(res, r, a) && roundHas(res, r, b) {
				av, _ := lastOf(res, a)
				bv, _ := lastOf(res, b)
				res.add(name, av-bv)
			}
		}
		diff("diff.headless_dockerimage_container.cold", "headless.docker-image.cold", "floor.docker.container.cold")
		ratio("ratio.headless_k8simage_local.warm", "headless.k8s-image.warm.p50", "headless.local.warm.p50")
		ratio("ratio.headless_k8simage_dockerimage.warm", "headless.k8s-image.warm.p50", "headless.docker-image.warm.p50")
		diff("diff.headless_k8simage_pod.cold", "headless.k8s-image.cold", "floor.k8s.pod.cold")
		for _, pr := range backToBackPairs {
			ratio(pr.ratio, pr.num+".b2b.p50", pr.den+".b2b.p50")
		}
		fmt.Fprintf(log, "bench: latency round %d/%d:%s\n", r+1, cfg.Rounds, roundLine(res, subs, failed))
	}
}

// backToBackPairs are the design-floor ratios also taken from cells run
// back to back: the interleaved blocks leave each subject idle before its
// turn, which slows the runner's Python work and not the near-empty
// floors' (BENCHMARKS.md, "Pauses slow kerneldeck's own work"). The targets
// stay judged on the interleaved figures; these show the pause's share.
var backToBackPairs = []struct{ num, den, ratio string }{
	{"local", "floor.pyloop", "ratio.local_pyloop.b2b"},
	{"ssh.light", "floor.ssh.streamlocal", "ratio.sshlight_streamlocal.b2b"},
}

// backToBack runs, for each pair of backToBackPairs whose subjects both
// work, one run of cfg.Warmup+cfg.Warm cells per subject with no pause
// between them, the two in turn (their order alternates by round), and
// keeps the p50 of the cells after the first cfg.Warmup as <key>.b2b.p50.
func backToBack(ctx context.Context, cfg config, subs []subject, failed map[string]bool, round int, res *results) {
	byKey := map[string]subject{}
	for _, s := range subs {
		byKey[s.key()] = s
	}
	for _, pr := range backToBackPairs {
		pair := []string{pr.num, pr.den}
		if round%2 == 1 {
			pair[0], pair[1] = pair[1], pair[0]
		}
		for _, k := range pair {
			s, ok := byKey[k]
			if !ok || failed[k] || ctx.Err() != nil {
				continue
			}
			lat, err := s.warm(ctx, cfg.Warmup+cfg.Warm)
			if err != nil {
				failed[k] = true
				res.fail("%s back to back: %v", k, err)
				continue
			}
			res.add(k+".b2b.p50", quantile(msAll(lat[min(cfg.Warmup, len(lat)):]), 0.5))
		}
	}
}

// warmCount is how many warm cells s runs per round: the heavy-rc floor
// pays the rc (a fifth of a second) for every exec, so it runs fewer.
func warmCount(cfg config, s subject) int {
	if s.key() == "floor.ssh.heavy" {
		return min(cfg.HeavyFloor, cfg.Warm)
	}
	return cfg.Warm
}

// blockShare splits n into blocks nearly equal parts and returns part b.
func blockShare(n, blocks, b int) int {
	return n/blocks + btoi(b < n%blocks)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// lastOf is the latest value recorded for a figure.
func lastOf(res *results, name string) (float64, bool) {
	res.mu.Lock()
	defer res.mu.Unlock()
	xs := res.vals[name]
	if len(xs) == 0 {
		return 0, false
	}
	return xs[len(xs)-1], true
}

// roundHas reports whether figure name got its value for round r (0-based).
func roundHas(res *results, r int, name string) bool {
	res.mu.Lock()
	defer res.mu.Unlock()
	return len(res.vals[name]) == r+1
}

func roundLine(res *results, subs []subject, failed map[string]bool) string {
	s := ""
	for _, sub := range subs {
		k := sub.key()
		if failed[k] {
			s += fmt.Sprintf(" %s FAILED", k)
			continue
		}
		if v, ok := lastOf(res, k+".warm.p50"); ok {
			s += fmt.Sprintf(" %s %.2fms", k, v)
		}
	}
	return s
}
