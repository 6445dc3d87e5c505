package headless

import (
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

// The listing's version changes with everything the listing says, the
// cap, idle_exit, hibernate_after, spares and parked states (hibernated or not) included, with kernels listed or none: an
// attached dashboard told "unchanged" keeps what it showed.
func TestListingVersionSeesEveryChange(t *testing.T) {
	one := []engine.KernelInfo{{ID: "k1", Owner: "a", Task: "default", Backend: "local", PID: 7, ExecutionCount: 1}}
	parked := []engine.ParkedKernel{{Owner: "a", Task: "t", Backend: "local", Key: "a/t@local[]", Kernel: "k0", Parked: time.Unix(5, 0)}}
	for _, ks := range [][]engine.KernelInfo{nil, one} {
		base := listingVersion(4, time.Minute, 0, 1, ks, nil)
		for name, v := range map[string]string{
			"cap":             listingVersion(5, time.Minute, 0, 1, ks, nil),
			"idle_exit":       listingVersion(4, time.Hour, 0, 1, ks, nil),
			"spares":          listingVersion(4, time.Minute, 0, 0, ks, nil),
			"parked":          listingVersion(4, time.Minute, 0, 1, ks, parked),
			"hibernate_after": listingVersion(4, time.Minute, time.Second, 1, ks, nil),
		} {
			if v == base {
				t.Errorf("with %d kernels, a change of %s leaves the version %s", len(ks), name, v)
			}
		}
		if again := listingVersion(4, time.Minute, 0, 1, ks, nil); again != base {
			t.Errorf("the same listing has two versions: %s, %s", base, again)
		}
	}
	asleep := []engine.ParkedKernel{parked[0]}
	asleep[0].Hibernated = true
	if listingVersion(4, time.Minute, 0, 1, one, asleep) == listingVersion(4, time.Minute, 0, 1, one, parked) {
		t.Error("a parked state that stops being hibernated leaves the version")
	}
	moved := append([]engine.KernelInfo{}, one...)
	moved[0].ExecutionCount++
	if listingVersion(4, time.Minute, 0, 1, moved, nil) == listingVersion(4, time.Minute, 0, 1, one, nil) {
		t.Error("a kernel's new execution count leaves the version")
	}
}
