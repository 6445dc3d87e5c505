package enginetest

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// floodPy starts a thread that outlives its cell and then writes frames to
// the engine's stream as fast as it can: what kernel code can do, since it
// runs in the runner's process. The second cell floods with the running
// cell's own id, which the engine does take, within its budget.
const floodPy = `
import sys, threading, time, json
R = sys.modules["__main__"].RUNNER
conn = R.waiters[R.running][0]
cell = R.running
def flood():
    while R.running == cell:
        time.sleep(0.005)
    line = (json.dumps({"op": "output", "id": cell, "stream": "stdout", "text": "x" * (4 << 20)}) + "\n").encode()
    try:
        for _ in range(64):  # 256 MB
            conn.sock.sendall(line)
    except OSError:
        pass
    FLOOD["done"] = True
FLOOD = {}
threading.Thread(target=flood, daemon=True).start()
print("armed")
`

// FloodBound checks, over env's stream door, that kernel code flooding the
// engine's stream with 256 MB of frames no cell asked for cannot make the
// engine hold more than a stated bound: the frames are dropped, counted,
// and the stream is closed; the kernel goes on working.
func FloodBound(t *testing.T, env backends.Env, bound uint64) {
	if backends.StreamsOf(env) == nil {
		t.Skip("the backend has no stream door")
	}
	h := New(t, env, nil)
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
		}
	}()
	expectOK(t, h.Run("a", floodPy, 0), "armed\n")
	h.WaitFor("the flood to end", 60*time.Second, func() bool {
		return len(h.EventsOf(engine.EventRunnerFlood)) > 0 ||
			strings.TrimSpace(h.Run("a", "print(FLOOD.get('done', False))", 0).Stdout) == "True"
	})
	close(stop)
	<-sampled
	growth := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("engine heap in use: %d MB before, peak %d MB during the 256 MB flood (growth %d MB, bound %d MB)",
		base.HeapInuse>>20, peak.Load()>>20, growth>>20, bound>>20)
	if growth > int64(bound) {
		t.Errorf("the engine's heap grew by %d MB under the flood, over the bound of %d MB", growth>>20, bound>>20)
	}
	if ev := h.EventsOf(engine.EventRunnerFlood); len(ev) != 1 || !strings.Contains(ev[0].Detail, "stream was closed") {
		t.Errorf("runner_flood events: %+v, want one saying the stream was closed", ev)
	}
	// The kernel itself goes on (a new stream), its state intact.
	expectOK(t, h.Run("a", "print(cell == R.running or 'kept')", 0), "kept\n")
}
