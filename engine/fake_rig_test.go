package engine_test

// The rig of the fake-Env tests (fake_*_test.go, split by subject):
// protocol-level tests against internal/fakeenv, the behaviours of the
// reference implementation's suite ported, plus where DESIGN.md improves
// on it (interrupt before kill, exactly-once cells, FIFO serialization).

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
)

const phrase = "state from earlier calls was lost"

// ---- harness ---------------------------------------------------------------

type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	reads int
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	return c.now
}

// settle waits until the engine has read the clock n more times: with
// nothing else going on, that is its background sweep seeing the time.
func (c *fakeClock) settle(t *testing.T, n int) {
	t.Helper()
	c.mu.Lock()
	from := c.reads
	c.mu.Unlock()
	eventually(t, "the sweep to read the clock", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.reads >= from+n
	})
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// recorder keeps every event of one subscription. Events an Execute
// published are in the subscription's buffer when it returns, so reading
// whatever is buffered at each query sees them without a reader goroutine.
type recorder struct {
	mu     sync.Mutex
	sub    *engine.Subscription
	events []engine.Event
	closed bool
}

func record(sub *engine.Subscription) *recorder { return &recorder{sub: sub} }

func (r *recorder) all() []engine.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	for !r.closed {
		select {
		case ev, ok := <-r.sub.C:
			if !ok {
				r.closed = true
				break
			}
			r.events = append(r.events, ev)
			continue
		default:
		}
		break
	}
	return slices.Clone(r.events)
}

func (r *recorder) of(tp engine.EventType) []engine.Event {
	var out []engine.Event
	for _, ev := range r.all() {
		if ev.Type == tp {
			out = append(out, ev)
		}
	}
	return out
}

type rig struct {
	t     *testing.T
	env   *fakeenv.Env
	host  *fakeenv.Host
	eng   *engine.Engine
	clock *fakeClock
	ev    *recorder
	cfg   engine.Config
	// streams is the host's sockets, for a rig made by newStreamRig.
	streams *fakeenv.StreamEnv
}

// newRig starts an engine on a healthy fake host with small timeouts, a
// fake clock and no background sweep (SweepEvery one hour) unless mod
// changes them. Cleanup closes the engine and checks that no goroutine
// outlives Close.
func newRig(t *testing.T, mod ...func(*engine.Config)) *rig {
	t.Helper()
	env, host := fakeenv.Healthy()
	return newRigOn(t, env, env, host, mod...)
}

// newStreamRig is newRig on a host whose runners answer on their sockets
// too, so cells go by the stream door first.
func newStreamRig(t *testing.T, mod ...func(*engine.Config)) *rig {
	t.Helper()
	se, host := fakeenv.HealthyStreams()
	r := newRigOn(t, se, se.Env, host, mod...)
	r.streams = se
	return r
}

func newRigOn(t *testing.T, backend backends.Env, env *fakeenv.Env, host *fakeenv.Host, mod ...func(*engine.Config)) *rig {
	t.Helper()
	clock := &fakeClock{now: time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)}
	cfg := engine.Config{
		Backends:       []backends.Env{backend},
		MaxKernels:     4,
		IdleExit:       30 * time.Minute,
		CellTimeout:    5 * time.Second,
		InterruptGrace: 200 * time.Millisecond,
		WaitWindow:     time.Second,
		SweepEvery:     time.Hour,
		StateDir:       t.TempDir(),
		Now:            clock.Now,
	}
	for _, m := range mod {
		m(&cfg)
	}
	eng, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, env: env, host: host, eng: eng, clock: clock, ev: record(eng.Subscribe(1 << 16)), cfg: cfg}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := eng.Close(ctx, false); err != nil {
			t.Errorf("engine close: %v", err)
		}
		if se, ok := backend.(*fakeenv.StreamEnv); ok {
			se.Wait()
		}
		for _, ev := range r.ev.all() {
			if ev.Type == engine.EventMissed {
				t.Errorf("the test's subscription missed %d events", ev.Missed)
			}
		}
		goleak.VerifyNone(t)
	})
	return r
}

func (r *rig) exec(req engine.Request) *engine.Result {
	r.t.Helper()
	res, err := r.eng.Execute(context.Background(), req)
	if err != nil {
		r.t.Fatalf("Execute(%q): %v", req.Code, err)
	}
	return res
}

// owners returns the owners in the registry, sorted.
func (r *rig) owners() []string {
	var out []string
	for _, k := range r.eng.Kernels() {
		out = append(out, k.Owner)
	}
	slices.Sort(out)
	return out
}

// killedPIDs lists the pids every kill command sent so far named.
func (r *rig) killedPIDs() []int {
	r.t.Helper()
	var out []int
	for _, c := range r.env.CallsOf("kill") {
		targets, err := fakeenv.ParseKill(c.Command)
		if err != nil {
			r.t.Fatal(err)
		}
		for _, a := range targets {
			out = append(out, a.PID)
		}
	}
	return out
}

// publishedCodes lists the code of every cell command that carried a request.
func (r *rig) publishedCodes() []string {
	var out []string
	for _, c := range r.env.CallsOf("cell") {
		if len(c.Stdin) > 0 {
			out = append(out, requestCode(r.t, c.Stdin))
		}
	}
	return out
}

func requestCode(t *testing.T, stdin []byte) string {
	t.Helper()
	var req struct{ Code string }
	if err := json.Unmarshal(fakeenv.RequestBody(stdin), &req); err != nil {
		t.Fatalf("cell request on stdin is not JSON: %v", err)
	}
	return req.Code
}

func hostKernel(t *testing.T, h *fakeenv.Host, id string) fakeenv.Kernel {
	t.Helper()
	k, ok := h.Kernel(id, 0)
	if !ok {
		t.Fatalf("the host never spawned kernel %s", id)
	}
	return k
}

// eventually waits (bounded, not timed) for cond; background kills run
// asynchronously.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func types(evs []engine.Event) []engine.EventType {
	out := make([]engine.EventType, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

// ---- spawn and reuse -------------------------------------------------------
