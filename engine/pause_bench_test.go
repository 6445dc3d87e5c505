package engine_test

import (
	"bufio"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/pyecho"
)

// pauseEvery is how many warm cells run back to back between two pauses
// in BenchmarkWarmCellAfterPause: as many as the bench's blocks hold.
const pauseEvery = 25

// BenchmarkWarmCellAfterPause: the trivial warm cell in runs of
// pauseEvery, back to back ("pause=0s") or with a 20 ms pause before each
// run (as the bench's interleaved blocks, or an agent thinking between
// cells), beside a Python process that only echoes a line on a Unix
// socket, timed alike. It shows what the pauses cost each: on the dev
// machines, work done in the runner's Python after a pause takes up to
// twice as long, while the echo, which does next to nothing, does not slow.
func BenchmarkWarmCellAfterPause(b *testing.B) {
	for _, pause := range []time.Duration{0, 20 * time.Millisecond} {
		b.Run("kerneldeck/pause="+pause.String(), func(b *testing.B) {
			eng := rtBenchEngine(b, false)
			rtExec(b, eng, engine.Request{Owner: "bench", Code: "1"})
			pausedLoop(b, pause, func() {
				res, err := eng.Execute(context.Background(), engine.Request{Owner: "bench", Code: "1"})
				if err != nil || res.Status != "success" || res.Stdout != "1\n" {
					b.Fatalf("warm cell: %v, %+v", err, res)
				}
			})
		})
		b.Run("echo/pause="+pause.String(), func(b *testing.B) {
			c, br := startPyEcho(b)
			line := []byte(`{"op": "cell", "id": "c0123456789abcdef", "code": "1"}` + "\n")
			pausedLoop(b, pause, func() {
				if _, err := c.Write(line); err != nil {
					b.Fatal(err)
				}
				if _, err := br.ReadSlice('\n'); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// pausedLoop times one call of trip per iteration, sleeping pause before
// every pauseEvery-th, and reports the percentiles.
func pausedLoop(b *testing.B, pause time.Duration, trip func()) {
	var lat []time.Duration
	for i := 0; b.Loop(); i++ {
		if pause > 0 && i%pauseEvery == 0 {
			b.StopTimer()
			time.Sleep(pause)
			b.StartTimer()
		}
		start := time.Now()
		trip()
		lat = append(lat, time.Since(start))
	}
	rtReportPercentiles(b, lat)
}

// startPyEcho starts pyecho.Script and connects to it.
func startPyEcho(b *testing.B) (net.Conn, *bufio.Reader) {
	b.Helper()
	sock := filepath.Join(enginetest.ShortTempDir(b), "echo")
	cmd := exec.Command("python3", "-c", pyecho.Script, sock)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		b.Fatalf("the echo did not start: %q %v", line, err)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}
