package engine_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// Benchmarks of what many registered kernels cost the engine (the figures
// of the "engine overhead" table in BENCHMARKS.md, from `go run ./bench`).
// The kernels sit idle on a fake host, so they cost no process:
//
//	go test -run XXX -bench 'AmongKernels|KernelsSnapshot|Sweep' -count 6 ./engine/ | benchstat -

// scbEngine is an engine on the fake host holding n idle kernels (owners
// k00000...) besides room for a few more.
func scbEngine(b *testing.B, n int) *engine.Engine {
	b.Helper()
	eng, err := engine.New(engine.Config{Backends: []backends.Env{fakeenv.NewQuiet(fakeenv.NewHost(), "fake", "/nonexistent/kd-bench-fake")},
		MaxKernels: n + 16, StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rtClose(b, eng) })
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				res, err := eng.Execute(context.Background(), engine.Request{Owner: fmt.Sprintf("k%05d", i), Code: "1"})
				if err == nil && res.Status != "success" {
					err = fmt.Errorf("status %q", res.Status)
				}
				if err != nil {
					errs <- fmt.Errorf("register kernel %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	if got := len(eng.Kernels()); got != n {
		b.Fatalf("%d kernels registered, want %d", got, n)
	}
	return eng
}

var scbSizes = []int{0, 1_000, 10_000}

// BenchmarkExecuteAmongKernels: a warm cell on one fake kernel while n
// other kernels are registered; the growth with n is the per-call cost of
// the reap and cap checks every Execute runs, and of the lookup.
func BenchmarkExecuteAmongKernels(b *testing.B) {
	for _, n := range scbSizes {
		b.Run(fmt.Sprintf("kernels=%d", n), func(b *testing.B) {
			eng := scbEngine(b, n)
			req := engine.Request{Owner: "bench", Code: "1"}
			rtExec(b, eng, req)
			for b.Loop() {
				res, err := eng.Execute(context.Background(), req)
				if err != nil || res.Status != "success" || !res.Kernel.Reused {
					b.Fatalf("warm cell: %v %+v", err, res)
				}
			}
		})
	}
}

// BenchmarkKernelsSnapshot: one Kernels() snapshot (the dashboard and the
// headless "kernels" request take one) with n kernels registered.
func BenchmarkKernelsSnapshot(b *testing.B) {
	for _, n := range scbSizes[1:] {
		b.Run(fmt.Sprintf("kernels=%d", n), func(b *testing.B) {
			eng := scbEngine(b, n)
			for b.Loop() {
				if len(eng.Kernels()) != n {
					b.Fatal("kernels vanished")
				}
			}
		})
	}
}

// BenchmarkSweep: one reap + cap sweep over n registered kernels, none of
// them due (SetLimits with no change runs both, like the per-second sweep).
func BenchmarkSweep(b *testing.B) {
	for _, n := range scbSizes[1:] {
		b.Run(fmt.Sprintf("kernels=%d", n), func(b *testing.B) {
			eng := scbEngine(b, n)
			for b.Loop() {
				if err := eng.SetLimits(nil, nil); err != nil {
					b.Fatal(err)
				}
			}
			if len(eng.Kernels()) != n {
				b.Fatal("the sweep removed kernels")
			}
		})
	}
}

// BenchmarkSSHOwners: 50 owners, each with a warm kernel on one ssh host
// (light shell, one shared connection), run one cell each at once; an
// iteration is the whole burst. Reports "cells/s" and the burst's "p99-ms".
func BenchmarkSSHOwners(b *testing.B) {
	const owners = 50
	srv := sshdtest.Start(b, sshdtest.Options{})
	u := sbUser(b, srv, "light")
	env := sbEnv(b, srv, u)
	eng, err := engine.New(engine.Config{Backends: []backends.Env{env}, MaxKernels: owners + 4, StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rtClose(b, eng) })
	owner := func(i int) string { return fmt.Sprintf("owner-%02d", i) }
	var wg sync.WaitGroup
	for i := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := eng.Execute(context.Background(), engine.Request{Owner: owner(i), Code: "1", Timeout: time.Minute})
			if err != nil || res.Status != "success" || res.Fallback != "" {
				b.Errorf("owner %d first cell: %v %+v", i, err, res)
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	var lat []time.Duration
	var mu sync.Mutex
	var total time.Duration
	for b.Loop() {
		start := time.Now()
		for i := range owners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := time.Now()
				res, err := eng.Execute(context.Background(), engine.Request{Owner: owner(i), Code: "1"})
				d := time.Since(s)
				if err != nil || res.Status != "success" || res.Stdout != "1\n" || !res.Kernel.Reused {
					b.Errorf("owner %d: %v %+v", i, err, res)
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}()
		}
		wg.Wait()
		total += time.Since(start)
	}
	b.ReportMetric(float64(owners*b.N)/total.Seconds(), "cells/s")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[int(0.99*float64(len(lat)-1))].Microseconds())/1000, "p99-ms")
}
