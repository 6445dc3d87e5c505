package ui

import (
	"strings"
	"sync"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/uitest"
)

// versionedEngine is the fake engine with an attached engine's
// KernelsSince: its generation moves only when its listing is set.
type versionedEngine struct {
	*uitest.Engine
	mu  sync.Mutex
	gen uint64
}

func (v *versionedEngine) set(ks []engine.KernelInfo) {
	v.Engine.SetKernels(ks)
	v.mu.Lock()
	v.gen++
	v.mu.Unlock()
}

func (v *versionedEngine) KernelsSince(gen uint64) ([]engine.KernelInfo, uint64, bool) {
	v.mu.Lock()
	cur := v.gen
	v.mu.Unlock()
	if gen == cur {
		return nil, cur, false
	}
	return v.Engine.Kernels(), cur, true
}

// On an engine that says when its listing is unchanged, the 1 s refresh
// takes no copy of it while nothing changes, takes the new one when it
// does, and still lets a gone kernel's row go after its minute.
func TestRefreshSkipsAnUnchangedListing(t *testing.T) {
	v := &versionedEngine{Engine: uitest.New(testBackends, 8, 30*time.Minute)}
	v.set(twoOwnerKernels())
	clock := uitest.NewClock(t0)
	m := New(Options{Engine: v, Theme: mustTheme(t, "dark"), Now: clock.Now, User: "me", TickEvery: -1, LimitsPause: time.Hour})
	t.Cleanup(m.Close)
	m.Update(tea.WindowSizeMsg{Width: 120, Height: 40})
	tick := func() { m.Update(tickMsg(clock.Now())) }
	kernelsPane := m.kernels.View
	if n := v.KernelsCalls(); n != 1 {
		t.Fatalf("the first frame took %d listings, want 1", n)
	}
	for range 5 {
		clock.Advance(time.Second)
		tick()
	}
	if n := v.KernelsCalls(); n != 1 {
		t.Errorf("five refreshes of an unchanged listing took %d listings in all, want still 1", n)
	}
	ks := twoOwnerKernels()
	v.set([]engine.KernelInfo{ks[0], ks[2]}) // alice's etl kernel went
	tick()
	if n := v.KernelsCalls(); n != 2 {
		t.Errorf("a changed listing: %d listings in all, want 2", n)
	}
	if view := kernelsPane(); !strings.Contains(view, "etl") || !strings.Contains(view, "gone") {
		t.Fatalf("the gone kernel is not shown as gone:\n%s", view)
	}
	clock.Advance(showGoneFor + time.Second)
	tick()
	if view := kernelsPane(); strings.Contains(view, "etl") {
		t.Errorf("the gone kernel still shown %v after it went, with the listing unchanged:\n%s", showGoneFor+time.Second, view)
	}
	if n := v.KernelsCalls(); n != 2 {
		t.Errorf("%d listings in all, want still 2", n)
	}
}
