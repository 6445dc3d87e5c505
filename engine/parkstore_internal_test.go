package engine

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Filing a parked state never reads the others again (with ten thousand of
// them that was a scan per park): the prune after a park works on the
// headers in memory, and only a sweep reads the dir, once a parkRescanEvery.
func TestAParksPruneDoesNotReadTheDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "parked")
	s, err := openParkStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.list() // loaded, as after a first listing
	// What a read of the dir would find and remove: a file that is no
	// parked state.
	planted := filepath.Join(dir, "planted.park")
	if err := os.WriteFile(planted, []byte("no trailer"), 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	s.prune(now, time.Hour, 1<<30, false)
	s.prune(now, time.Hour, 1<<30, true) // a sweep, but the dir was read just now
	if _, err := os.Stat(planted); err != nil {
		t.Fatalf("a prune read the dir before its rescan was due: %v", err)
	}
	s.prune(now.Add(parkRescanEvery+time.Second), time.Hour, 1<<30, true)
	if _, err := os.Stat(planted); !os.IsNotExist(err) {
		t.Fatalf("a sweep's rescan left a file that is no parked state: %v", err)
	}
}
