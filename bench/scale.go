package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
	"github.com/kerneldeck/kerneldeck/ui"
)

// scaleEngine is an engine on a real local backend and the fake host, with
// room for n registered kernels, and a warm local kernel.
func scaleEngine(ctx context.Context, t *tb, n int) (*engine.Engine, error) {
	eng, err := engine.New(engine.Config{Backends: []backends.Env{backends.NewLocal(shortTempDir(t)), fakeenv.NewQuiet(fakeenv.NewHost(), "fake", "/nonexistent/kdbench-fake")},
		MaxKernels: n + 16, StateDir: t.TempDir()})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { closeEngine(eng) })
	if _, err := kdRun(ctx, eng, engine.Request{Owner: "warm", Code: "1"}, "1\n"); err != nil {
		return nil, err
	}
	return eng, nil
}

// register adds n idle kernels on the fake host, from a few goroutines.
func register(ctx context.Context, eng *engine.Engine, n int) error {
	return eachAtOnce(ctx, n, 4, func(i int) error {
		res, err := eng.Execute(ctx, engine.Request{Owner: fmt.Sprintf("k%05d", i), Backend: "fake", Code: "1", Timeout: time.Minute})
		if err == nil && (res.Status != "success" || res.Fallback != "") {
			err = fmt.Errorf("status %q fallback %q", res.Status, res.Fallback)
		}
		if err != nil {
			return fmt.Errorf("register kernel %d on the fake host: %w", i, err)
		}
		return nil
	})
}

// eachAtOnce runs f(0) … f(n-1) on workers goroutines, each taking the
// next index, until all ran, ctx ended or one failed; it returns the first
// failure.
func eachAtOnce(ctx context.Context, n, workers int, f func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil || failed.Load() {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// scalePhase measures what cfg.Kernels registered (idle) kernels cost: the
// extra time of a warm cell on a real local kernel in an engine that holds
// them, against the same cell in an engine that holds none (cells taken in
// alternating pairs; the figure is the median of the pairwise differences);
// one reap + cap sweep over the registry (SetLimits with no change runs both
// at once, as the per-second sweep and every Execute do); one Kernels()
// snapshot (what the dashboard takes every second); one dashboard View()
// over them (160x50 terminal); and a new dashboard's first frame (ui.New,
// which takes a snapshot and groups it as every tick's refresh does, plus
// View()).
func scalePhase(ctx context.Context, cfg config, env *setupEnv, res *results, log io.Writer) {
	t := newTB("scale", log)
	defer t.close()
	base, err := scaleEngine(ctx, t, cfg.Kernels)
	if err != nil {
		res.fail("scale: %v", err)
		return
	}
	loaded, err := scaleEngine(ctx, t, cfg.Kernels)
	if err != nil {
		res.fail("scale: %v", err)
		return
	}
	start := time.Now()
	if err := register(ctx, loaded, cfg.Kernels); err != nil {
		res.fail("scale: %v", err)
		return
	}
	reg := time.Since(start)
	if n := len(loaded.Kernels()); n != cfg.Kernels+1 {
		res.fail("scale: %d kernels registered, want %d", n, cfg.Kernels+1)
		return
	}
	res.add("scale.register", ms(reg)/float64(cfg.Kernels))
	fmt.Fprintf(log, "bench: registered %d kernels in %v\n", cfg.Kernels, reg.Round(time.Millisecond))

	m := ui.New(ui.Options{Engine: ui.Embedded{Engine: loaded}, TickEvery: -1, User: "bench"})
	defer m.Close()
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 50})
	if v := m.View(); v == "" {
		res.fail("scale: the dashboard drew nothing")
		return
	}

	req := engine.Request{Owner: "warm", Code: "1"}
	for r := range cfg.Rounds {
		var diffs, l0, l1 []float64
		for i := range cfg.ScaleCells {
			engines := []*engine.Engine{base, loaded}
			if i%2 == 1 {
				slices.Reverse(engines)
			}
			var d [2]time.Duration
			for _, eng := range engines {
				s := time.Now()
				if _, err := kdRun(ctx, eng, req, "1\n"); err != nil {
					res.fail("scale: warm cell: %v", err)
					return
				}
				if eng == base {
					d[0] = time.Since(s)
				} else {
					d[1] = time.Since(s)
				}
			}
			l0, l1 = append(l0, ms(d[0])), append(l1, ms(d[1]))
			diffs = append(diffs, ms(d[1])-ms(d[0]))
		}
		res.add("scale.cell.base", quantile(l0, 0.5))
		res.add("scale.cell.loaded", quantile(l1, 0.5))
		res.add("scale.overhead", median(diffs))

		timeIt := func(n int, f func()) float64 {
			var xs []float64
			for range n {
				s := time.Now()
				f()
				xs = append(xs, ms(time.Since(s)))
			}
			return median(xs)
		}
		res.add("scale.sweep", timeIt(10, func() {
			if err := loaded.SetLimits(nil, nil); err != nil {
				res.fail("scale: SetLimits: %v", err)
			}
		}))
		res.add("scale.kernels", timeIt(10, func() { loaded.Kernels() }))
		res.add("scale.view", timeIt(cfg.Views, func() { m.View() }))
		res.add("scale.uinew", timeIt(max(1, cfg.Views/4), func() {
			d := ui.New(ui.Options{Engine: ui.Embedded{Engine: loaded}, TickEvery: -1, User: "bench"})
			d.Update(tea.WindowSizeMsg{Width: 160, Height: 50})
			d.View()
			d.Close()
		}))
		ov, _ := lastOf(res, "scale.overhead")
		vw, _ := lastOf(res, "scale.view")
		fmt.Fprintf(log, "bench: scale round %d/%d: +%.3fms per cell, View() %.2fms\n", r+1, cfg.Rounds, ov, vw)
	}
	if n := len(loaded.Kernels()); n != cfg.Kernels+1 {
		res.fail("scale: %d kernels left after the rounds, want %d (something reaped or evicted them)", n, cfg.Kernels+1)
	}
}
