package engine_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// BenchmarkToolCalls: one cell making 100 trivial tool calls on the local
// backend. The kernel times each call (the request over the runner's socket, host dispatch,
// answer) and the benchmark reports the median and p90 of one call as
// "call-p50-ms" and "call-p90-ms" (issue target: p50 <= 1 ms), and the
// whole cell divided by 100 as "cell-ms/call".
func BenchmarkToolCalls(b *testing.B) {
	for _, door := range rtDoors {
		b.Run(door.name, func(b *testing.B) {
			var env backends.Env = backends.NewLocal(enginetest.ShortTempDir(b))
			if door.executeOnly {
				env = backends.ExecuteOnly(env)
			}
			reg := hosttools.NewRegistry()
			err := reg.Register(hosttools.Tool{Name: "noop", Description: "Answer at once.",
				Handler: func(context.Context, hosttools.Call) (hosttools.Result, error) {
					return hosttools.Result{Text: "ok"}, nil
				}})
			if err != nil {
				b.Fatal(err)
			}
			eng, err := engine.New(engine.Config{Backends: []backends.Env{env}, StateDir: b.TempDir(),
				Tools: reg, MaxToolCalls: 1000, Approvals: engine.Approvals{Default: engine.PolicyAllow}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { rtClose(b, eng) })
			req := engine.Request{Owner: "bench", Tools: []string{"noop"}, Code: `import kerneldeck_tools as kt, time
lat = []
for _ in range(100):
    t = time.perf_counter()
    kt.noop()
    lat.append(time.perf_counter() - t)
print(" ".join("%.6f" % x for x in lat))`}
			rtExec(b, eng, req) // spawn outside the measurement
			var calls []time.Duration
			var total time.Duration
			for b.Loop() {
				start := time.Now()
				res, err := eng.Execute(context.Background(), req)
				total += time.Since(start)
				if err != nil || res.Status != "success" || res.ToolCallsMade != 100 {
					b.Fatalf("tool cell: %v %+v", err, res)
				}
				for _, f := range strings.Fields(res.Stdout) {
					s, err := strconv.ParseFloat(f, 64)
					if err != nil {
						b.Fatal(err)
					}
					calls = append(calls, time.Duration(s*float64(time.Second)))
				}
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N)/100, "cell-ms/call")
			rtReportPercentilesAs(b, calls, "call-")
		})
	}
}
