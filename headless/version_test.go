package headless

import (
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

// The listing's version changes with everything the listing says, the
// cap, idle_exit and spares included, with kernels listed or none: an
// attached dashboard told "unchanged" keeps what it showed.
func TestListingVersionSeesEveryChange(t *testing.T) {
	one := []engine.KernelInfo{{ID: "k1", Owner: "a", Task: "default", Backend: "local", PID: 7, ExecutionCount: 1}}
	for _, ks := range [][]engine.KernelInfo{nil, one} {
		base := listingVersion(4, time.Minute, 1, ks)
		for name, v := range map[string]string{
			"cap":       listingVersion(5, time.Minute, 1, ks),
			"idle_exit": listingVersion(4, time.Hour, 1, ks),
			"spares":    listingVersion(4, time.Minute, 0, ks),
		} {
			if v == base {
				t.Errorf("with %d kernels, a change of %s leaves the version %s", len(ks), name, v)
			}
		}
		if again := listingVersion(4, time.Minute, 1, ks); again != base {
			t.Errorf("the same listing has two versions: %s, %s", base, again)
		}
	}
	moved := append([]engine.KernelInfo{}, one...)
	moved[0].ExecutionCount++
	if listingVersion(4, time.Minute, 1, moved) == listingVersion(4, time.Minute, 1, one) {
		t.Error("a kernel's new execution count leaves the version")
	}
}
