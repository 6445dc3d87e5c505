package engine

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
)

// A kernel that stays awake (it could not hibernate) is due at idle_exit
// only: it does not hold back idleSince, or every call would scan the
// registry from hibernate_after on.
func TestAnAwakeKernelDoesNotMakeEveryCallScan(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	state := t.TempDir()
	e, err := New(Config{Backends: []backends.Env{backends.NewLocal(t.TempDir())}, StateDir: state, ParkDir: filepath.Join(state, "parked"),
		HibernateAfter: time.Second, IdleExit: time.Hour, SweepEvery: time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background(), false) })
	key := Key{Owner: "o", Task: "t", Backend: "local"}
	k := &Kernel{key: key, id: "kawake", state: phaseReady, lastUsed: t0.Add(-5 * time.Second), awake: "threads of its own run (poller)"}
	e.mu.Lock()
	e.kernels[key] = k
	e.mu.Unlock()
	t.Cleanup(func() { e.mu.Lock(); delete(e.kernels, key); e.mu.Unlock() }) // never killed: it has no runner

	e.reapIdle()
	if e.idleSince != t0 || e.awakeSince != k.lastUsed {
		t.Fatalf("after a scan, idleSince %v and awakeSince %v; want %v (no kernel that can hibernate) and %v", e.idleSince, e.awakeSince, t0, k.lastUsed)
	}
	now = t0.Add(500 * time.Millisecond)
	e.reapIdle()
	if e.idleSince != t0 {
		t.Fatalf("a call half a second later scanned the registry again (idleSince %v)", e.idleSince)
	}
	if e.kernels[key] != k || k.holding {
		t.Fatal("the awake kernel was reaped or taken to hibernate")
	}
}
