package eventlog_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/eventlog"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

func open(t *testing.T, dir string, o eventlog.Options) *eventlog.Log {
	t.Helper()
	l, err := eventlog.Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func readAll(t *testing.T, dir string, f eventlog.Filter) ([]engine.Event, *eventlog.Reader) {
	t.Helper()
	r := eventlog.NewReader(dir)
	var out []engine.Event
	if err := r.Read(f, func(ev engine.Event) error { out = append(out, ev); return nil }); err != nil {
		t.Fatal(err)
	}
	return out, r
}

func TestAppendReadAndFilter(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "events")
	c := &clock{now: time.Date(2030, 3, 1, 23, 59, 0, 0, time.UTC)}
	l := open(t, dir, eventlog.Options{Now: c.Now})
	evs := []engine.Event{
		{Type: engine.EventSpawned, Time: c.Now(), Kernel: "k1", Owner: "alice", Detail: "pid 1"},
		{Type: engine.EventCellFinished, Time: c.Now().Add(time.Minute), Kernel: "k1", Owner: "alice", Cell: "c1"},
		{Type: engine.EventEvictedCap, Time: c.Now().Add(2 * time.Minute), Kernel: "k2", Owner: "bob", Detail: "cap 1\x1b]52;c;x\x07"},
	}
	for _, ev := range evs {
		if err := l.Append(ev); err != nil {
			t.Fatal(err)
		}
	}
	got, r := readAll(t, dir, eventlog.Filter{})
	if len(got) != 3 || r.Bad != 0 {
		t.Fatalf("read %d events (%d bad), want 3", len(got), r.Bad)
	}
	for i := range got {
		if !got[i].Time.Equal(evs[i].Time) || got[i].Type != evs[i].Type || got[i].Detail != evs[i].Detail || got[i].Cell != evs[i].Cell {
			t.Fatalf("event %d read back as %+v, want %+v", i, got[i], evs[i])
		}
	}
	// The first event is on 1 March, the others on 2 March (UTC): two files.
	segs, _ := filepath.Glob(filepath.Join(dir, "events-*.jsonl"))
	if len(segs) != 2 || !strings.HasSuffix(segs[0], "events-2030-03-01-000.jsonl") || !strings.HasSuffix(segs[1], "events-2030-03-02-000.jsonl") {
		t.Fatalf("segments %v, want one for each UTC day", segs)
	}
	for _, tc := range []struct {
		name string
		f    eventlog.Filter
		want []engine.EventType
	}{
		{"owner", eventlog.Filter{Owner: "alice"}, []engine.EventType{engine.EventSpawned, engine.EventCellFinished}},
		{"kernel", eventlog.Filter{Kernel: "k2"}, []engine.EventType{engine.EventEvictedCap}},
		{"type", eventlog.Filter{Types: []engine.EventType{engine.EventEvictedCap, engine.EventSpawned}}, []engine.EventType{engine.EventSpawned, engine.EventEvictedCap}},
		{"since", eventlog.Filter{Since: evs[1].Time}, []engine.EventType{engine.EventCellFinished, engine.EventEvictedCap}},
		{"until", eventlog.Filter{Until: evs[1].Time}, []engine.EventType{engine.EventSpawned, engine.EventCellFinished}},
		{"none", eventlog.Filter{Owner: "carol"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := readAll(t, dir, tc.f)
			var types []engine.EventType
			for _, ev := range got {
				types = append(types, ev.Type)
			}
			if !slices.Equal(types, tc.want) {
				t.Fatalf("filter %+v gave %v, want %v", tc.f, types, tc.want)
			}
		})
	}
}

// A second Read goes on where the first stopped, and a line still being
// written is not read until it is whole.
func TestReaderFollows(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "events")
	c := &clock{now: time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC)}
	l := open(t, dir, eventlog.Options{Now: c.Now})
	l.Append(engine.Event{Type: engine.EventSpawned, Time: c.Now(), Kernel: "k1"})
	r := eventlog.NewReader(dir)
	var got []string
	read := func() {
		t.Helper()
		if err := r.Read(eventlog.Filter{}, func(ev engine.Event) error { got = append(got, ev.Kernel); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	read()
	seg, _ := filepath.Glob(filepath.Join(dir, "events-*.jsonl"))
	f, err := os.OpenFile(seg[0], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"type":"killed","time":"2030-03-01T12:00:01Z","kernel":"k`)
	read()
	f.WriteString("2\"}\n")
	f.Close()
	read()
	c.add(24 * time.Hour)
	l.Append(engine.Event{Type: engine.EventSpawned, Time: c.Now(), Kernel: "k3"})
	read()
	if !slices.Equal(got, []string{"k1", "k2", "k3"}) || r.Bad != 0 {
		t.Fatalf("followed %v (%d bad), want k1, k2, k3 once each", got, r.Bad)
	}
}

// Lines that are not events are skipped and counted, not fatal.
func TestBadLinesAreSkipped(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "events")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	lines := []string{
		`{"type":"spawned","time":"2030-03-01T12:00:00Z","kernel":"ok1"}`,
		`not json`,
		`{"type":"spawned","time":"2030-03-01T12:00:00Z","kernel":"x","extra":1}`,
		`{"type":"no_such_type","time":"2030-03-01T12:00:00Z"}`,
		`{"type":"spawned"}`,
		`{"type":"spawned","time":"2030-03-01T12:00:00Z"} {}`,
		strings.Repeat("x", eventlog.MaxLineBytes+10),
		`{"type":"killed","time":"2030-03-01T12:00:02Z","kernel":"ok2"}`,
	}
	if err := os.WriteFile(filepath.Join(dir, "events-2030-03-01-000.jsonl"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, r := readAll(t, dir, eventlog.Filter{})
	if len(got) != 2 || got[0].Kernel != "ok1" || got[1].Kernel != "ok2" || r.Bad != 6 {
		t.Fatalf("read %+v with %d bad lines, want ok1 and ok2 and 6 bad", got, r.Bad)
	}
}

// The cap drops the oldest segments first; the retention drops old days.
func TestCapAndRetention(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "events")
	c := &clock{now: time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC)}
	const maxBytes = 1 << 20
	l := open(t, dir, eventlog.Options{Now: c.Now, MaxBytes: maxBytes, Retention: 48 * time.Hour})
	detail := strings.Repeat("d", 900)
	const n = 4000 // ~3.7 MB
	for i := range n {
		if err := l.Append(engine.Event{Type: engine.EventCellFinished, Time: c.Now(), Kernel: fmt.Sprintf("k%05d", i), Detail: detail}); err != nil {
			t.Fatal(err)
		}
	}
	var total int64
	segs, _ := filepath.Glob(filepath.Join(dir, "events-*.jsonl"))
	for _, s := range segs {
		st, _ := os.Stat(s)
		total += st.Size()
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", s, st.Mode())
		}
	}
	if total > maxBytes+64<<10+1000 || len(segs) < 2 {
		t.Fatalf("%d bytes in %d segments, want at most the cap (%d) plus one segment", total, len(segs), maxBytes)
	}
	got, _ := readAll(t, dir, eventlog.Filter{})
	if len(got) == 0 || got[len(got)-1].Kernel != fmt.Sprintf("k%05d", n-1) || got[0].Kernel == "k00000" {
		t.Fatalf("after the cap: %d events, first %s, last %s; want the oldest gone and the newest kept", len(got), got[0].Kernel, got[len(got)-1].Kernel)
	}
	// Three days later, a new event: the old day is past the retention.
	c.add(72 * time.Hour)
	l.Append(engine.Event{Type: engine.EventSpawned, Time: c.Now(), Kernel: "late"})
	got, _ = readAll(t, dir, eventlog.Filter{})
	if len(got) != 1 || got[0].Kernel != "late" {
		t.Fatalf("after the retention: %d events, want only the late one", len(got))
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("log dir mode: %v %v, want 0700", st.Mode(), err)
	}
}

// The log fails closed on a dir or a file that is not private to us.
func TestRefusesWhatIsNotPrivate(t *testing.T) {
	t.Run("dir", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "events")
		os.Mkdir(dir, 0o755)
		os.Chmod(dir, 0o755)
		if _, err := eventlog.Open(dir, eventlog.Options{}); err == nil || !strings.Contains(err.Error(), dir) {
			t.Fatalf("Open of a 0755 dir: %v, want a refusal naming it", err)
		}
	})
	t.Run("symlinked segment", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "events")
		c := &clock{now: time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC)}
		l := open(t, dir, eventlog.Options{Now: c.Now})
		target := filepath.Join(t.TempDir(), "elsewhere")
		os.WriteFile(target, nil, 0o600)
		if err := os.Symlink(target, filepath.Join(dir, "events-2030-03-01-000.jsonl")); err != nil {
			t.Fatal(err)
		}
		if err := l.Append(engine.Event{Type: engine.EventSpawned, Time: c.Now()}); err == nil {
			t.Fatal("Append followed a symlinked segment")
		}
		if data, _ := os.ReadFile(target); len(data) != 0 {
			t.Fatalf("the symlink's target got %q", data)
		}
	})
	t.Run("readable segment", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "events")
		c := &clock{now: time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC)}
		l := open(t, dir, eventlog.Options{Now: c.Now})
		p := filepath.Join(dir, "events-2030-03-01-000.jsonl")
		os.WriteFile(p, nil, 0o644)
		os.Chmod(p, 0o644)
		if err := l.Append(engine.Event{Type: engine.EventSpawned, Time: c.Now()}); err == nil || !strings.Contains(err.Error(), "0600") {
			t.Fatalf("Append to a 0644 segment: %v, want a refusal", err)
		}
	})
}

// Recent keeps the newest n events and leaves out cell output.
func TestRecent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "events")
	c := &clock{now: time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC)}
	l := open(t, dir, eventlog.Options{Now: c.Now})
	for i := range 50 {
		l.Append(engine.Event{Type: engine.EventSpawned, Time: c.Now().Add(time.Duration(i) * time.Second), Kernel: fmt.Sprint(i)})
	}
	got, err := eventlog.Recent(dir, c.Now().Add(10*time.Second), 5)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ev := range got {
		ids = append(ids, ev.Kernel)
	}
	if !slices.Equal(ids, []string{"45", "46", "47", "48", "49"}) {
		t.Fatalf("Recent gave %v", ids)
	}
}

// On a full disk the log keeps taking events, counts those it cannot write
// and reports them at most once a minute; once there is room it writes again.
func TestFullDisk(t *testing.T) {
	mnt := enginetest.MountTmpfs(t, "64k")
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, 16<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(mnt, "events")
	c := &clock{now: time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC)}
	l := open(t, dir, eventlog.Options{Now: c.Now})
	events := make(chan engine.Event)
	var mu sync.Mutex
	var reports []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(events, func(d string) { mu.Lock(); reports = append(reports, d); mu.Unlock() })
	}()
	detail := strings.Repeat("x", 1000)
	for i := range 200 { // ~220 KB into 64 KB, all at one time
		events <- engine.Event{Type: engine.EventCellFinished, Time: c.Now(), Kernel: fmt.Sprint(i), Detail: detail}
	}
	// A minute later by the events' clock, the failures since are reported.
	events <- engine.Event{Type: engine.EventCellFinished, Time: c.Now().Add(eventlog.ReportEvery), Kernel: "after a minute", Detail: detail}
	close(events)
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 2 || !strings.Contains(reports[0], "could not be written") || !strings.Contains(reports[0], "no space left") {
		t.Fatalf("reports %q, want one at the first failure and one a minute later", reports)
	}
	var n, m int
	fmt.Sscanf(reports[0], "event log: %d events", &n)
	fmt.Sscanf(reports[1], "event log: %d events", &m)
	got, r := readAll(t, dir, eventlog.Filter{})
	if n != 1 || len(got)+n+m != 201 || r.Bad != 0 {
		t.Fatalf("%d events written, %d+%d reported lost, %d bad lines: want 201 in all, the first report at once, no broken line", len(got), n, m, r.Bad)
	}
	// Room again: writing resumes, on a whole line.
	os.Remove(filler)
	if err := l.Append(engine.Event{Type: engine.EventSpawned, Time: c.Now(), Kernel: "again"}); err != nil {
		t.Fatalf("append after freeing space: %v", err)
	}
	got, r = readAll(t, dir, eventlog.Filter{Kernel: "again"})
	if len(got) != 1 || r.Bad != 0 {
		t.Fatalf("after freeing space: %d events of kernel again, %d bad lines", len(got), r.Bad)
	}
}

// No owner pushes the others' events out of the log: once the log is at
// its cap, an owner holding a quarter of it or more may not write what
// would drop a segment with others' events, also after a restart; an
// owner alone still fills the whole log.
func TestOwnersShareTheLog(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "events")
	c := &clock{now: time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC)}
	const maxBytes = 1 << 20
	opts := eventlog.Options{Now: c.Now, MaxBytes: maxBytes}
	l := open(t, dir, opts)
	detail := strings.Repeat("d", 900)
	write := func(l *eventlog.Log, owner string, n int) (refused int) {
		t.Helper()
		for i := range n {
			err := l.Append(engine.Event{Type: engine.EventCellFinished, Time: c.Now(), Owner: owner, Kernel: fmt.Sprintf("k%05d", i), Detail: detail})
			switch {
			case errors.Is(err, eventlog.ErrOverShare):
				refused++
			case err != nil:
				t.Fatal(err)
			}
		}
		return refused
	}
	count := func() map[string]int {
		got, _ := readAll(t, dir, eventlog.Filter{})
		m := map[string]int{}
		for _, ev := range got {
			m[ev.Owner]++
		}
		return m
	}
	if n := write(l, "alice", 200); n != 0 {
		t.Fatalf("alice refused %d times in an empty log", n)
	}
	if n := write(l, "bob", 4000); n == 0 {
		t.Fatal("bob wrote 4 MB into a 1 MB log with alice's events in it, and was never refused")
	}
	if got := count(); got["alice"] != 200 || got["bob"] == 0 {
		t.Fatalf("events after bob's flood: %v, want all 200 of alice's and some of bob's", got)
	}
	// The indexes keep the shares across a restart.
	l.Close()
	again := open(t, dir, opts)
	if n := write(again, "bob", 500); n != 500 {
		t.Fatalf("after a restart bob wrote %d more of 500, want none", 500-n)
	}
	if got := count(); got["alice"] != 200 {
		t.Fatalf("alice's events after the restart: %d, want 200", got["alice"])
	}
	for _, ix := range mustGlob(t, filepath.Join(dir, "*.owners")) {
		if st, err := os.Stat(ix); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("index %s: %v %v, want 0600", ix, st, err)
		}
	}

	// Alone, an owner fills the log: only its own events go.
	lone := filepath.Join(t.TempDir(), "events")
	solo := open(t, lone, opts)
	if n := write(solo, "carol", 4000); n != 0 {
		t.Fatalf("carol alone was refused %d times", n)
	}
	got, _ := readAll(t, lone, eventlog.Filter{})
	if len(got) == 0 || got[len(got)-1].Kernel != "k03999" || got[0].Kernel == "k00000" {
		t.Fatalf("carol alone: %d events; want the newest kept and the oldest gone", len(got))
	}
}

func mustGlob(t *testing.T, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(pattern)
	if err != nil || len(m) == 0 {
		t.Fatalf("glob %s: %v %v", pattern, m, err)
	}
	return m
}

// Recent reads from the end: across segments, with lines longer than its
// blocks, an over-long line, bad lines and an unfinished last line, it
// gives what reading the whole log forward gives, the newest n of it.
func TestRecentReadsFromTheEnd(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "events")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC)
	n := 0
	event := func(detail int) string {
		n++
		return fmt.Sprintf(`{"type":"spawned","time":%q,"kernel":"k%d","detail":%q}`, day.Add(time.Duration(n)*time.Second).Format(time.RFC3339Nano), n, strings.Repeat("d", detail))
	}
	for seg, sizes := range [][]int{{10, 50000, 20}, {70000, 5, 40000, 90000}, {1, 2, 3}} {
		var lines []string
		for _, size := range sizes {
			lines = append(lines, event(size))
		}
		if seg == 1 {
			lines = append(lines, "not json", strings.Repeat("x", eventlog.MaxLineBytes+100), event(7))
		}
		body := strings.Join(lines, "\n") + "\n"
		if seg == 2 {
			body += `{"type":"spawned","time":"2030-03-01T13:00:00Z","kernel":"unfinished"}` // whole JSON, but no newline yet
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("events-2030-03-01-%03d.jsonl", seg)), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	all, _ := readAll(t, dir, eventlog.Filter{})
	var want []string
	for _, ev := range all {
		if len(ev.Detail) < 60000 { // the forward Reader skips lines over its 64 KiB buffer
			want = append(want, ev.Kernel)
		}
	}
	for _, k := range []int{1, 4, 6, 100} {
		got, err := eventlog.Recent(dir, time.Time{}, k)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, ev := range got {
			if len(ev.Detail) < 60000 {
				ids = append(ids, ev.Kernel)
			}
		}
		if len(got) != min(k, n) {
			t.Errorf("Recent(%d) gave %d events, want %d", k, len(got), min(k, n))
		}
		if tail := want[max(0, len(want)-len(ids)):]; !slices.Equal(ids, tail) {
			t.Errorf("Recent(%d) gave %v, want the newest of %v", k, ids, want)
		}
	}
}

// A read from a time on starts near it in each segment (halving by the
// events' times) and gives exactly what reading it all and filtering gives,
// events a few seconds out of order included.
func TestSinceSeeksAndMissesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "events")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC)
	var b strings.Builder
	for i := range 20000 {
		at := start.Add(time.Duration(i) * 100 * time.Millisecond)
		if i%97 == 0 {
			at = at.Add(-3 * time.Second) // written a moment after its time, behind others
		}
		fmt.Fprintf(&b, `{"type":"spawned","time":%q,"kernel":"k%d","detail":%q}`+"\n", at.Format(time.RFC3339Nano), i, strings.Repeat("d", i%300))
	}
	if err := os.WriteFile(filepath.Join(dir, "events-2030-03-01-000.jsonl"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	all, _ := readAll(t, dir, eventlog.Filter{})
	for _, since := range []time.Duration{0, time.Second, 7 * time.Minute, 33*time.Minute + 333*time.Millisecond, 2000 * time.Second, time.Hour} {
		f := eventlog.Filter{Since: start.Add(since)}
		var want []string
		for _, ev := range all {
			if f.Match(ev) {
				want = append(want, ev.Kernel)
			}
		}
		got, _ := readAll(t, dir, f)
		var ids []string
		for _, ev := range got {
			ids = append(ids, ev.Kernel)
		}
		if !slices.Equal(ids, want) {
			t.Errorf("since +%v: %d events, want %d", since, len(ids), len(want))
		}
	}
}
