package eventlog_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/eventlog"
)

// logOf writes mb MB of events, 300 bytes each, a second apart, into dir's
// segments of 12 MB.
func logOf(b *testing.B, mb int) (dir string, last time.Time) {
	b.Helper()
	dir = filepath.Join(b.TempDir(), "events")
	if err := os.Mkdir(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	start := time.Date(2030, 3, 1, 0, 0, 0, 0, time.UTC)
	var sb strings.Builder
	seg, i := 0, 0
	flush := func() {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("events-2030-03-01-%03d.jsonl", seg)), []byte(sb.String()), 0o600); err != nil {
			b.Fatal(err)
		}
		sb.Reset()
		seg++
	}
	for written := 0; written < mb<<20; i++ {
		last = start.Add(time.Duration(i) * 100 * time.Millisecond)
		n, _ := fmt.Fprintf(&sb, `{"type":"cell_finished","time":%q,"kernel":"k%012d","owner":"o%d","detail":%q}`+"\n",
			last.Format(time.RFC3339Nano), i, i%50, "cell c1: success in 1ms "+strings.Repeat("x", 180))
		written += n
		if sb.Len() > 12<<20 {
			flush()
		}
	}
	flush()
	return dir, last
}

// What an engine's history costs, and `events --since 10m --owner X`,
// against the log's size: both stay flat (an engine once read the whole log
// at its start, 28 ms a MB).
func BenchmarkHistoryAgainstLogSize(b *testing.B) {
	for _, mb := range []int{1, 40, 190} {
		dir, last := logOf(b, mb)
		b.Run(fmt.Sprintf("recent-10000/%dMB", mb), func(b *testing.B) {
			for b.Loop() {
				if evs, err := eventlog.Recent(dir, time.Time{}, engine.DefaultHistory); err != nil || len(evs) == 0 || len(evs) > engine.DefaultHistory {
					b.Fatalf("%d events, %v", len(evs), err)
				}
			}
		})
		b.Run(fmt.Sprintf("since-10m-owner/%dMB", mb), func(b *testing.B) {
			f := eventlog.Filter{Since: last.Add(-10 * time.Minute), Owner: "o3"}
			for b.Loop() {
				n := 0
				if err := eventlog.NewReader(dir).Read(f, func(engine.Event) error { n++; return nil }); err != nil || n == 0 {
					b.Fatalf("%d events, %v", n, err)
				}
			}
		})
	}
}
