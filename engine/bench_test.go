package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// Benchmarks on the real local backend with real python3 runners. Each
// reports the median latency of one call as "p50-ms" (and "p90-ms"); the
// issue's targets on the 2-core dev machine are warm p50 <= 2 ms and cold
// (spawn to first result) <= 100 ms.

var rtDoors = []struct {
	name        string
	executeOnly bool
}{{"stream", false}, {"execute", true}}

func rtBenchEngine(b *testing.B, executeOnly bool, opts ...func(*engine.Config)) *engine.Engine {
	b.Helper()
	var env backends.Env = backends.NewLocal(enginetest.ShortTempDir(b))
	if executeOnly {
		env = backends.ExecuteOnly(env)
	}
	cfg := engine.Config{Backends: []backends.Env{env}, StateDir: b.TempDir()}
	for _, o := range opts {
		o(&cfg)
	}
	eng, err := engine.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rtClose(b, eng) })
	return eng
}

func rtReportPercentiles(b *testing.B, lat []time.Duration) { rtReportPercentilesAs(b, lat, "") }

// rtReportPercentilesAs reports the median and p90 of lat as prefix+"p50-ms"
// and prefix+"p90-ms".
func rtReportPercentilesAs(b *testing.B, lat []time.Duration, prefix string) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	ms := func(q float64) float64 {
		return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(ms(0.5), prefix+"p50-ms")
	b.ReportMetric(ms(0.9), prefix+"p90-ms")
}

// BenchmarkWarmCell: a trivial cell on a kernel that is already running.
func BenchmarkWarmCell(b *testing.B) {
	for _, door := range rtDoors {
		b.Run(door.name, func(b *testing.B) {
			sbWarm(b, rtBenchEngine(b, door.executeOnly))
		})
	}
}

// sbWarm measures a trivial cell on a kernel that is already running.
func sbWarm(b *testing.B, eng *engine.Engine) {
	first := rtExec(b, eng, engine.Request{Owner: "bench", Code: "1"})
	var lat []time.Duration
	for b.Loop() {
		start := time.Now()
		res, err := eng.Execute(context.Background(), engine.Request{Owner: "bench", Code: "1"})
		lat = append(lat, time.Since(start))
		if err != nil || res.Status != "success" || res.Stdout != "1\n" || res.Kernel == nil || res.Kernel.ID != first.Kernel.ID {
			b.Fatalf("warm cell: %v, %+v", err, res)
		}
	}
	rtReportPercentiles(b, lat)
}

// sbCold measures spawn to first result for a new kernel (a new owner each
// iteration; the previous one is shut down outside the measurement). One
// warm-up spawn first lets the engine learn the interpreter path (and open a
// shared connection), as a long-running dashboard has.
func sbCold(b *testing.B, eng *engine.Engine) {
	rtExec(b, eng, engine.Request{Owner: "warmup", Code: "1"})
	eng.ShutdownOwner(context.Background(), "warmup")
	var lat []time.Duration
	i := 0
	for b.Loop() {
		owner := fmt.Sprintf("cold-%d", i)
		i++
		start := time.Now()
		res, err := eng.Execute(context.Background(), engine.Request{Owner: owner, Code: "1"})
		lat = append(lat, time.Since(start))
		if err != nil || res.Status != "success" || res.Stdout != "1\n" || res.Kernel == nil || res.Kernel.Reused || res.Fallback != "" {
			b.Fatalf("cold start: %v, %+v", err, res)
		}
		b.StopTimer()
		eng.ShutdownOwner(context.Background(), owner)
		b.StartTimer()
	}
	rtReportPercentiles(b, lat)
}

// BenchmarkColdStart: spawn to first result for a new kernel (a new owner
// each iteration; the previous one is shut down outside the measurement).
// stream-unconfined is the price of Landlock: the same without it.
func BenchmarkColdStart(b *testing.B) {
	for _, door := range rtDoors {
		b.Run(door.name, func(b *testing.B) {
			sbCold(b, rtBenchEngine(b, door.executeOnly))
		})
	}
	b.Run("stream-unconfined", func(b *testing.B) {
		sbCold(b, rtBenchEngine(b, false, func(c *engine.Config) { c.NoConfine = true }))
	})
}
