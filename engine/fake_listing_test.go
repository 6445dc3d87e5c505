package engine_test

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

// The listing is sorted by owner, task, child, backend and id however the
// registry changed: kernels added out of order, one reset (a new id), one
// evicted. The order is cached between changes, so each kind of change
// must refresh it.
func TestKernelsListingStaysSorted(t *testing.T) {
	r := newRig(t, func(c *engine.Config) { c.MaxKernels = 6 })
	sorted := func(what string, want int) {
		t.Helper()
		ks := r.eng.Kernels()
		if len(ks) != want {
			t.Fatalf("%s: %d kernels listed, want %d: %+v", what, len(ks), want, ks)
		}
		if !slices.IsSortedFunc(ks, func(a, b engine.KernelInfo) int {
			return cmp.Or(cmp.Compare(a.Owner, b.Owner), cmp.Compare(a.Task, b.Task), cmp.Compare(a.Child, b.Child),
				cmp.Compare(a.Backend, b.Backend), cmp.Compare(a.ID, b.ID))
		}) {
			t.Fatalf("%s: listing not sorted: %+v", what, ks)
		}
	}
	// The clock moves between calls, so the least recently used kernel
	// (mallory's) is the one the cap takes later.
	for i, o := range []string{"mallory", "alice", "trent", "bob"} {
		r.exec(engine.Request{Owner: o, Code: "1"})
		r.clock.Advance(time.Second)
		sorted("after "+o, i+1)
	}
	r.exec(engine.Request{Owner: "bob", Task: "etl", Code: "1", Tools: []string{"read_file"}})
	r.clock.Advance(time.Second)
	r.exec(engine.Request{Owner: "bob", Task: "etl", Code: "1"})
	r.clock.Advance(time.Second)
	sorted("two bob/etl kernels, told apart by their tools and ids", 6)
	before := len(r.eng.Kernels())
	res := r.exec(engine.Request{Owner: "alice", Code: "1", Reset: true})
	if !res.Kernel.StateReset {
		t.Fatalf("reset: %+v", res.Kernel)
	}
	r.clock.Advance(time.Second)
	sorted("after alice's reset", 6)
	r.exec(engine.Request{Owner: "zed", Code: "1"}) // over the cap of 6: the LRU one goes
	sorted("after an eviction", 6)
	owners := map[string]bool{}
	for _, k := range r.eng.Kernels() {
		owners[k.Owner] = true
	}
	if !owners["zed"] || owners["mallory"] {
		t.Fatalf("after mallory's eviction for zed the listing has %v", owners)
	}
	found := false
	for _, k := range r.eng.Kernels() {
		found = found || k.ID == res.Kernel.ID
	}
	if !found || len(r.eng.Kernels()) != before {
		t.Fatalf("after the reset the listing lacks alice's new kernel %s: %+v", res.Kernel.ID, r.eng.Kernels())
	}
}
