package engine_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// park100MB makes a namespace of 100 MB: an 80 MB numpy array and a
// 20 MB DataFrame.
const park100MB = `import numpy as np, pandas as pd
arr = np.random.rand(10_000_000)
df = pd.DataFrame({"x": np.random.rand(1_250_000), "y": np.random.rand(1_250_000)})`

// park100MBBytes is a namespace of 100 MB where numpy is not installed
// (the container tests' image): one bytearray.
const park100MBBytes = `import os
data = bytearray(os.urandom(100_000_000))`

// BenchmarkPark100MB parks a 100 MB namespace by hand (Engine.Park: the
// runner pickles it, the engine files it, the runner is killed) and times
// the owner's next call, which starts a runner, restores the namespace and
// runs a cell, beside a first call that restores nothing and the call that
// made the namespace (what an agent told state_lost runs again); on the local
// backend, over ssh on loopback (both an array and a DataFrame) and in a
// docker-image:// container of its own (a bytearray).
func BenchmarkPark100MB(b *testing.B) {
	run := func(b *testing.B, env backends.Env, python, setup, check string) {
		eng := rtBenchEngine(b, false, func(c *engine.Config) {
			c.Backends = []backends.Env{env}
			c.Python = python
			c.ParkDir = filepath.Join(b.TempDir(), "parked")
			c.ParkTimeout = time.Minute
		})
		ctx := context.Background()
		var setupT, park, restored, fresh time.Duration
		var size int64
		for i := 0; i < b.N; i++ {
			start := time.Now()
			setup := rtExec(b, eng, engine.Request{Owner: "bench", Code: setup})
			setupT += time.Since(start)
			start = time.Now()
			p, err := eng.Park(ctx, setup.Kernel.ID)
			if err != nil {
				b.Fatal(err)
			}
			park += time.Since(start)
			size = p.Bytes
			start = time.Now()
			res := rtExec(b, eng, engine.Request{Owner: "bench", Code: check})
			restored += time.Since(start)
			if res.Stdout != "100000000\n" || !res.Kernel.StateRestored {
				b.Fatalf("after the restore: %q %+v", res.Stdout, res.Kernel)
			}
			if err := eng.Kill(ctx, res.Kernel.ID); err != nil {
				b.Fatal(err)
			}
			start = time.Now()
			res = rtExec(b, eng, engine.Request{Owner: "fresh", Code: "print(1)"})
			fresh += time.Since(start)
			if err := eng.Kill(ctx, res.Kernel.ID); err != nil {
				b.Fatal(err)
			}
		}
		n := float64(b.N)
		b.ReportMetric(float64(park.Milliseconds())/n, "park-ms")
		b.ReportMetric(float64(restored.Milliseconds())/n, "restored-call-ms")
		b.ReportMetric(float64(fresh.Milliseconds())/n, "fresh-call-ms")
		b.ReportMetric(float64(setupT.Milliseconds())/n, "rebuild-ms")
		b.ReportMetric(float64(size)/(1<<20), "parked-MB")
	}
	const checkRich = "print(arr.nbytes + df.memory_usage(index=False).sum())"
	b.Run("local", func(b *testing.B) {
		run(b, backends.NewLocal(enginetest.ShortTempDir(b)), richPython, park100MB, checkRich)
	})
	b.Run("ssh", func(b *testing.B) {
		srv := sshdtest.Start(b, sshdtest.Options{})
		u := srv.User(b, "kdtest1", sshdtest.UserOptions{})
		run(b, sshEnv(b, srv, u, nil), richPython, park100MB, checkRich)
	})
	b.Run("docker-image", func(b *testing.B) {
		run(b, imageSandbox(b, ""), "", park100MBBytes, "print(len(data))")
	})
}
