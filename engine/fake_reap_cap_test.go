package engine_test

// Idle reaping, the cap, owner shutdown and Close.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
)

func TestOwnerShutdownKillsOnlyThatOwner(t *testing.T) {
	r := newRig(t)
	a1 := r.exec(engine.Request{Owner: "owner-a", Task: "t1", Code: "1"})
	a2 := r.exec(engine.Request{Owner: "owner-a", Task: "t2", Code: "1"})
	b := r.exec(engine.Request{Owner: "owner-b", Task: "t1", Code: "1"})
	if n := r.eng.ShutdownOwner(context.Background(), "owner-a"); n != 2 {
		t.Fatalf("ShutdownOwner = %d, want 2", n)
	}
	if got := r.owners(); !slices.Equal(got, []string{"owner-b"}) {
		t.Fatalf("owners left %v", got)
	}
	killed := r.killedPIDs()
	slices.Sort(killed)
	want := []int{a1.Kernel.PID, a2.Kernel.PID}
	slices.Sort(want)
	if !slices.Equal(killed, want) {
		t.Fatalf("killed %v, want %v", killed, want)
	}
	if n := r.env.Count("kill"); n != 1 {
		t.Fatalf("%d kill commands for 2 kernels on one host, want 1 naming both", n)
	}
	if hostKernel(t, r.host, b.Kernel.ID).Killed {
		t.Fatal("owner-b's kernel was killed")
	}
	if got := r.ev.of(engine.EventOwnerShutdown); len(got) != 1 || got[0].Owner != "owner-a" {
		t.Fatalf("owner_shutdown events: %+v", got)
	}
	if again := r.exec(engine.Request{Owner: "owner-b", Task: "t1", Code: "1"}); !again.Kernel.Reused {
		t.Fatalf("owner-b's kernel must still be reusable: %+v", *again.Kernel)
	}
}

func TestCloseKillsEveryKernelUnlessKept(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			r := newRig(t)
			a := r.exec(engine.Request{Owner: "a", Code: "1"})
			b := r.exec(engine.Request{Owner: "b", Code: "1"})
			if err := r.eng.Close(context.Background(), keep); err != nil {
				t.Fatal(err)
			}
			// Both kernels are on one host: one kill command names both.
			wantCmds, wantPIDs := 1, []int{a.Kernel.PID, b.Kernel.PID}
			if keep {
				wantCmds, wantPIDs = 0, nil
			}
			killed := r.killedPIDs()
			slices.Sort(killed)
			slices.Sort(wantPIDs)
			if n := r.env.Count("kill"); n != wantCmds || !slices.Equal(killed, wantPIDs) {
				t.Fatalf("%d kill commands for pids %v after Close(keep=%v), want %d for %v", n, killed, keep, wantCmds, wantPIDs)
			}
			if _, err := r.eng.Execute(context.Background(), engine.Request{Code: "1"}); err == nil {
				t.Fatal("Execute after Close must fail")
			}
		})
	}
}

// ---- idle reap and cap -----------------------------------------------------

// A call for a different key reaps kernels idle longer than idle_exit on
// entry, without touching or reviving them; kernels idle less stay.
func TestIdleKernelReapedOnNextCall(t *testing.T) {
	r := newRig(t) // no background sweep: only the call can reap
	stale := r.exec(engine.Request{Owner: "stale", Code: "1"})
	r.clock.Advance(20 * time.Minute)
	recent := r.exec(engine.Request{Owner: "recent", Code: "1"})
	r.clock.Advance(11 * time.Minute) // stale idle 31m > 30m; recent idle 11m
	r.exec(engine.Request{Owner: "fresh", Code: "1"})

	if got := r.owners(); !slices.Equal(got, []string{"fresh", "recent"}) {
		t.Fatalf("owners %v, want [fresh recent]", got)
	}
	eventually(t, "the stale kernel's kill", func() bool { return len(r.killedPIDs()) == 1 })
	if got := r.killedPIDs(); got[0] != stale.Kernel.PID {
		t.Fatalf("killed %v, want the stale kernel %d", got, stale.Kernel.PID)
	}
	if got := r.ev.of(engine.EventReapedIdle); len(got) != 1 || got[0].Owner != "stale" {
		t.Fatalf("reaped_idle events: %+v", got)
	}
	if k := hostKernel(t, r.host, stale.Kernel.ID); len(k.Cells) != 1 {
		t.Fatalf("the stale kernel was touched again: cells %v", k.Cells)
	}
	if hostKernel(t, r.host, recent.Kernel.ID).Killed {
		t.Fatal("a kernel idle less than idle_exit was killed")
	}
}

// The reap skips its scan while nothing can be idle long enough, and never
// misses a kernel because of it: each kernel goes exactly when it passes
// idle_exit, in turn, whatever the calls in between.
func TestIdleReapInTurnAcrossSkippedScans(t *testing.T) {
	r := newRig(t)
	r.exec(engine.Request{Owner: "first", Code: "1"})
	r.clock.Advance(10 * time.Minute)
	r.exec(engine.Request{Owner: "second", Code: "1"})
	for _, step := range []struct {
		advance time.Duration
		want    []string
	}{
		{15 * time.Minute, []string{"first", "probe", "second"}}, // first idle 25m
		{6 * time.Minute, []string{"probe", "second"}},           // first 31m: reaped
		{4 * time.Minute, []string{"probe", "second"}},           // second 25m
		{6 * time.Minute, []string{"probe"}},                     // second 31m: reaped
	} {
		r.clock.Advance(step.advance)
		r.exec(engine.Request{Owner: "probe", Code: "1"})
		if got := r.owners(); !slices.Equal(got, step.want) {
			t.Fatalf("owners %v, want %v", got, step.want)
		}
	}
	if got := r.ev.of(engine.EventReapedIdle); len(got) != 2 || got[0].Owner != "first" || got[1].Owner != "second" {
		t.Fatalf("reaped_idle events: %+v", got)
	}
}

// A call whose own kernel passed idle_exit gets a fresh kernel, and the
// result says the old state is gone instead of looking like a first call.
func TestOwnIdleKernelReapedSaysStateLost(t *testing.T) {
	r := newRig(t)
	old := r.exec(engine.Request{Owner: "me", Code: "x = 1"})
	r.clock.Advance(31 * time.Minute)
	res := r.exec(engine.Request{Owner: "me", Code: "x"})
	if res.Kernel.ID == old.Kernel.ID || res.Kernel.Reused || !res.Kernel.StateLost {
		t.Fatalf("a reaped kernel's successor: %+v", res.Kernel)
	}
	if !strings.Contains(res.Kernel.Note, old.Kernel.ID) || !strings.Contains(res.Kernel.Note, "idle") ||
		!strings.Contains(res.Kernel.Note, "state from earlier calls was lost") {
		t.Fatalf("note %q does not say the kernel was reaped after idle", res.Kernel.Note)
	}
}

// A spawn that fails after the key's kernel was reaped leaves no result to
// say the state is gone (an error, or a per-call run without a kernel): the
// key's next kernel must still say it (TestLoad found one that did not).
func TestStateLostSaidAfterAFailedSpawn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spawn fakeenv.HandlerFunc
	}{
		{"transport error", fakeenv.TransportError("command timed out after 30s")},
		{"host refused, per-call run", fakeenv.SpawnFailed("cannot create kernel dir")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			old := r.exec(engine.Request{Owner: "me", Code: "x = 1"})
			r.clock.Advance(31 * time.Minute)
			r.env.Prepend(fakeenv.On("spawn", tc.spawn).If(fakeenv.Not(fakeenv.Transient)).Once())
			if res, err := r.eng.Execute(context.Background(), engine.Request{Owner: "me", Code: "x"}); err == nil && res.Kernel != nil {
				t.Fatalf("the failed spawn gave a kernel: %+v", res.Kernel)
			}
			res := r.exec(engine.Request{Owner: "me", Code: "x"})
			if res.Kernel == nil || res.Kernel.Reused || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, old.Kernel.ID) {
				t.Fatalf("the kernel after a failed spawn: %+v; want state_lost naming %s", res.Kernel, old.Kernel.ID)
			}
		})
	}
}

// The background sweep reaps an idle kernel without any call.
func TestBackgroundSweepReapsIdleKernel(t *testing.T) {
	r := newRig(t, func(c *engine.Config) { c.SweepEvery = 5 * time.Millisecond })
	res := r.exec(engine.Request{Code: "1"})
	r.clock.Advance(31 * time.Minute)
	eventually(t, "the sweep to reap", func() bool { return len(r.eng.Kernels()) == 0 })
	eventually(t, "the kill", func() bool { return slices.Equal(r.killedPIDs(), []int{res.Kernel.PID}) })
	if got := r.ev.of(engine.EventReapedIdle); len(got) != 1 {
		t.Fatalf("reaped_idle events: %+v", got)
	}
}

// Over the cap, the least recently used kernel is evicted.
func TestCapEvictsLeastRecentlyUsed(t *testing.T) {
	cases := []struct {
		calls   []string
		evicted string
		left    []string
	}{
		{[]string{"owner-0", "owner-1", "owner-2"}, "owner-0", []string{"owner-1", "owner-2"}},
		{[]string{"owner-0", "owner-1", "owner-0", "owner-2"}, "owner-1", []string{"owner-0", "owner-2"}},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.calls, ","), func(t *testing.T) {
			r := newRig(t, func(c *engine.Config) { c.MaxKernels = 2 })
			pids := map[string]int{}
			for _, owner := range tc.calls {
				pids[owner] = r.exec(engine.Request{Owner: owner, Code: "1"}).Kernel.PID
				r.clock.Advance(time.Second)
			}
			if got := r.owners(); !slices.Equal(got, tc.left) {
				t.Fatalf("owners %v, want %v", got, tc.left)
			}
			got := r.ev.of(engine.EventEvictedCap)
			if len(got) != 1 || got[0].Owner != tc.evicted {
				t.Fatalf("evicted_cap events %+v, want one for %s", got, tc.evicted)
			}
			// It says which new kernel needed the room, and for how long
			// the evicted one was idle.
			if d, newcomer := got[0].Detail, tc.calls[len(tc.calls)-1]; !strings.Contains(d, "; made room for "+newcomer+"/default") || !strings.Contains(d, ", idle ") {
				t.Errorf("evicted_cap detail %q, want it to name %s/default and the idle time", d, newcomer)
			}
			eventually(t, "the evicted kernel's kill", func() bool { return len(r.killedPIDs()) == 1 })
			if k := r.killedPIDs(); k[0] != pids[tc.evicted] {
				t.Fatalf("killed %v, want %s's pid %d", k, tc.evicted, pids[tc.evicted])
			}
		})
	}
}

// A kernel with a running cell is never evicted, even when it is the least
// recently used: while every kernel is attached the registry stays over the
// cap and says so; the first kernel to settle is the one evicted, never the
// busy one.
func TestBusyKernelNeverEvicted(t *testing.T) {
	r := newRig(t, func(c *engine.Config) { c.MaxKernels = 1 })
	busyGate, settledGate := fakeenv.NewGate(), fakeenv.NewGate()
	r.env.Prepend(
		fakeenv.On("cell", busyGate.Wrap(r.host.Cell)).If(fakeenv.StdinContains("busy()")).Once(),
		fakeenv.On("cell", settledGate.Wrap(r.host.Cell)).If(fakeenv.StdinContains("settle()")).Once(),
	)
	var wg sync.WaitGroup
	var busy, settled *engine.Result
	t.Cleanup(func() { busyGate.Open(); settledGate.Open(); wg.Wait() })

	wg.Go(func() { busy, _ = r.eng.Execute(context.Background(), engine.Request{Owner: "busy", Code: "busy()"}) })
	entered := <-busyGate.Entered()
	a, err := fakeenv.ParseCell(entered.Command)
	if err != nil {
		t.Fatal(err)
	}
	busyID, busyPID := filepath.Base(a.Dir), a.PID
	r.clock.Advance(time.Second)

	// A second kernel while the first is mid-cell: nothing can be evicted.
	wg.Go(func() {
		settled, _ = r.eng.Execute(context.Background(), engine.Request{Owner: "settled", Code: "settle()"})
	})
	<-settledGate.Entered()
	ks := r.eng.Kernels()
	if len(ks) != 2 || !ks[0].Attached || !ks[1].Attached {
		t.Fatalf("want both kernels attached, over the cap of 1: %+v", ks)
	}
	skipped := r.ev.of(engine.EventEvictSkippedBusy)
	if len(skipped) != 1 || !strings.Contains(skipped[0].Detail, busyID) {
		t.Fatalf("evict_skipped_busy events %+v, want one naming %s", skipped, busyID)
	}
	if got := r.ev.of(engine.EventEvictedCap); len(got) != 0 || r.env.Count("kill") != 0 {
		t.Fatalf("evicted while every kernel was busy: %+v, %d kills", got, r.env.Count("kill"))
	}

	// The second kernel settles first: it goes, the older busy one stays.
	r.clock.Advance(time.Second)
	settledGate.Open()
	eventually(t, "the settled call", func() bool {
		ev := r.ev.of(engine.EventEvictedCap)
		return len(ev) == 1
	})
	if got := r.ev.of(engine.EventEvictedCap); got[0].Owner != "settled" {
		t.Fatalf("evicted %+v, want the settled kernel", got)
	}
	// The reasons name kernels by owner and task, not by id alone.
	if d := r.ev.of(engine.EventEvictedCap)[0].Detail; !strings.Contains(d, "the only idle kernel") ||
		!strings.Contains(d, "busy, never evicted: busy/default ("+busyID+")") || strings.Contains(d, "made room for") {
		t.Fatalf("evicted_cap detail %q, want it to say it was the only idle kernel and name busy/default (and no room made for itself)", d)
	}
	if d := skipped[0].Detail; !strings.Contains(d, "busy/default ("+busyID+")") || !strings.Contains(d, "settled/default (") {
		t.Fatalf("evict_skipped_busy detail %q, want both busy kernels by owner/task", d)
	}
	if got := r.owners(); !slices.Equal(got, []string{"busy"}) {
		t.Fatalf("owners %v, want [busy]", got)
	}
	eventually(t, "the settled kernel's kill", func() bool { return len(r.killedPIDs()) == 1 })

	r.clock.Advance(time.Second)
	busyGate.Open()
	wg.Wait()
	if busy == nil || busy.Status != "success" || busy.Kernel.StateLost || settled == nil || settled.Status != "success" {
		t.Fatalf("busy call %+v, settled call %+v", busy, settled)
	}
	if got := r.killedPIDs(); got[0] != settled.Kernel.PID || slices.Contains(got, busyPID) {
		t.Fatalf("killed %v: want only the settled kernel %d, never the busy %d", got, settled.Kernel.PID, busyPID)
	}
	if got := r.owners(); !slices.Equal(got, []string{"busy"}) {
		t.Fatalf("owners %v, want [busy]", got)
	}
}

// ---- serialization and snapshots -------------------------------------------

// An owner at its quota gives up its own least recently used idle kernel
// for a new one, never another owner's; with all of its kernels busy, the
// new one is refused. A member's owner has a quarter of the cap when no
// quota is set; other owners then have none.
func TestOwnerQuota(t *testing.T) {
	r := newRig(t, func(c *engine.Config) { c.MaxKernels = 8 })
	alice := r.exec(engine.Request{Owner: "alice", Code: "1"})
	for i := range 3 {
		r.clock.Advance(time.Second)
		r.exec(engine.Request{Owner: "carol", Task: fmt.Sprint("t", i), Code: "1"}) // no quota for the engine's user's owners
	}
	r.clock.Advance(time.Second)
	b1 := r.exec(engine.Request{Owner: "bob", Task: "t1", Code: "1", Member: true})
	r.clock.Advance(time.Second)
	r.exec(engine.Request{Owner: "bob", Task: "t2", Code: "1", Member: true})
	r.clock.Advance(time.Second)
	// bob's quota is 8/4 = 2: his third kernel costs his first, though
	// alice's is older.
	r.exec(engine.Request{Owner: "bob", Task: "t3", Code: "1", Member: true})
	ids := map[string]bool{}
	for _, k := range r.eng.Kernels() {
		ids[k.ID] = true
	}
	if !ids[alice.Kernel.ID] || ids[b1.Kernel.ID] || len(ids) != 6 {
		t.Fatalf("kernels after bob's third: %v; want alice's kept and bob's first gone", r.eng.Kernels())
	}
	ev := r.ev.of(engine.EventEvictedCap)
	if len(ev) != 1 || ev[0].Kernel != b1.Kernel.ID || !strings.Contains(ev[0].Detail, "owner bob at its quota of 2 kernels (max_kernels_per_owner)") {
		t.Fatalf("evicted_cap events %+v, want bob's first kernel, naming his quota", ev)
	}

	// Both of bob's kernels busy: a third is refused, and nothing is evicted.
	gate := fakeenv.NewGate()
	r.env.Prepend(fakeenv.On("cell", gate.Wrap(r.host.Cell)).If(fakeenv.StdinContains("hold()")))
	var wg sync.WaitGroup
	t.Cleanup(func() { gate.Open(); wg.Wait() })
	for _, task := range []string{"t2", "t3"} {
		wg.Go(func() {
			r.eng.Execute(context.Background(), engine.Request{Owner: "bob", Task: task, Code: "hold()", Member: true})
		})
		<-gate.Entered()
	}
	_, err := r.eng.Execute(context.Background(), engine.Request{Owner: "bob", Task: "t4", Code: "1", Member: true})
	if !errors.Is(err, engine.ErrOwnerQuota) || !strings.Contains(err.Error(), `owner "bob" has 2 kernels`) {
		t.Fatalf("bob's third kernel while two are busy: %v, want ErrOwnerQuota", err)
	}
	if n := len(r.ev.of(engine.EventEvictedCap)); n != 1 {
		t.Fatalf("%d evictions, want none more", n)
	}
	gate.Open()
	wg.Wait()

	// A quota set for all applies to every owner.
	if err := r.eng.SetOwnerQuota(1); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(time.Second)
	r.exec(engine.Request{Owner: "alice", Task: "other", Code: "1"})
	for _, k := range r.eng.Kernels() {
		if k.ID == alice.Kernel.ID {
			t.Fatal("alice's first kernel stayed past a quota of 1")
		}
	}
	if err := r.eng.SetOwnerQuota(-1); err == nil {
		t.Fatal("a negative quota was taken")
	}
}

// A kernel that comes while every kernel is busy is made room for once an
// older one settles: that eviction names it.
func TestEvictionNamesTheKernelItMadeRoomFor(t *testing.T) {
	r := newRig(t, func(c *engine.Config) { c.MaxKernels = 1 })
	firstGate, secondGate := fakeenv.NewGate(), fakeenv.NewGate()
	r.env.Prepend(
		fakeenv.On("cell", firstGate.Wrap(r.host.Cell)).If(fakeenv.StdinContains("first()")).Once(),
		fakeenv.On("cell", secondGate.Wrap(r.host.Cell)).If(fakeenv.StdinContains("second()")).Once(),
	)
	var wg sync.WaitGroup
	t.Cleanup(func() { firstGate.Open(); secondGate.Open(); wg.Wait() })
	wg.Go(func() { r.eng.Execute(context.Background(), engine.Request{Owner: "ann", Code: "first()"}) })
	<-firstGate.Entered()
	r.clock.Advance(time.Second)
	wg.Go(func() { r.eng.Execute(context.Background(), engine.Request{Owner: "dave", Code: "second()"}) })
	<-secondGate.Entered()
	firstGate.Open() // ann's kernel settles first: it goes, for dave's
	eventually(t, "ann's eviction", func() bool { return len(r.ev.of(engine.EventEvictedCap)) == 1 })
	ev := r.ev.of(engine.EventEvictedCap)[0]
	if ev.Owner != "ann" || !strings.Contains(ev.Detail, "; made room for dave/default (") {
		t.Fatalf("evicted_cap %+v, want ann's kernel, made room for dave/default", ev)
	}
	// dave's kernel is busy too, but named once: as the one made room for.
	if n := strings.Count(ev.Detail, "dave/default"); n != 1 {
		t.Errorf("evicted_cap %q names dave's kernel %d times, want once", ev.Detail, n)
	}
}
