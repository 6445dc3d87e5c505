// Package eventlog keeps the engine's events on disk as JSON lines, so an
// operator can ask the next morning why a kernel was evicted at 03:12: one
// owner-only dir, files of one UTC day cut into segments, a size cap with
// the oldest segment dropped first, and a retention.
package eventlog

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

// Defaults of Options.
const (
	DefaultMaxBytes  = 256 << 20
	DefaultRetention = 7 * 24 * time.Hour
)

// MaxLineBytes bounds one line of the log; a longer one is not an event.
const MaxLineBytes = 1 << 20

// Options tunes a Log.
type Options struct {
	// MaxBytes caps the files in all (default DefaultMaxBytes); past it the
	// oldest segment goes.
	MaxBytes int64
	// Retention is how long events are kept (default DefaultRetention).
	Retention time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Log appends events to the files of one dir. Its methods are safe for
// concurrent use.
type Log struct {
	dir  string
	opts Options

	mu    sync.Mutex
	f     *os.File
	name  string // the open segment's file name
	size  int64  // bytes in the open segment
	total int64  // bytes in every segment
	swept time.Time
	// shares counts each owner's bytes per segment (shares.go); oldest
	// is the segment the cap drops next.
	shares *shares
	oldest string
}

// segmentMax is how big one segment grows before the next one starts, so
// that the cap drops a part of a day, not a whole one.
func (l *Log) segmentMax() int64 { return max(l.opts.MaxBytes/16, 64<<10) }

// Open opens (creating, 0700) the log dir. It fails closed on a dir that is
// not private to us.
func Open(dir string, opts Options) (*Log, error) {
	opts.MaxBytes = cmp.Or(opts.MaxBytes, DefaultMaxBytes)
	opts.Retention = cmp.Or(opts.Retention, DefaultRetention)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := engine.EnsurePrivateDir(dir); err != nil {
		return nil, fmt.Errorf("event log: %w", err)
	}
	l := &Log{dir: dir, opts: opts, shares: newShares()}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweepLocked()
	segs, err := segments(dir)
	if err != nil {
		return nil, fmt.Errorf("event log: %w", err)
	}
	for _, sg := range segs {
		l.shares.load(dir, sg.name, sg.size)
	}
	// An index whose segment is gone is nobody's.
	indexes, _ := filepath.Glob(filepath.Join(dir, "events-*"+indexSuffix))
	for _, ix := range indexes {
		if _, ok := l.shares.bySeg[strings.TrimSuffix(filepath.Base(ix), indexSuffix)]; !ok {
			os.Remove(ix)
		}
	}
	return l, nil
}

// Dir is where the log's files are.
func (l *Log) Dir() string { return l.dir }

// segment is one file of the log.
type segment struct {
	name string
	size int64
	day  time.Time
}

// segmentName is "events-YYYY-MM-DD-NNN.jsonl"; names sort by time.
func segmentName(day time.Time, n int) string {
	return fmt.Sprintf("events-%s-%03d.jsonl", day.UTC().Format(time.DateOnly), n)
}

func parseSegmentName(name string) (day time.Time, n int, ok bool) {
	rest, found := strings.CutPrefix(name, "events-")
	if !found || !strings.HasSuffix(rest, ".jsonl") || len(rest) != len("2006-01-02-000.jsonl") {
		return time.Time{}, 0, false
	}
	day, err := time.Parse(time.DateOnly, rest[:10])
	if err != nil || rest[10] != '-' {
		return time.Time{}, 0, false
	}
	if _, err := fmt.Sscanf(rest[11:14], "%03d", &n); err != nil {
		return time.Time{}, 0, false
	}
	return day, n, true
}

// segments lists dir's segments, oldest first.
func segments(dir string) ([]segment, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []segment
	for _, e := range entries {
		day, _, ok := parseSegmentName(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, segment{name: e.Name(), size: info.Size(), day: day})
	}
	slices.SortFunc(out, func(a, b segment) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// sweepLocked drops segments past the retention and, oldest first, past the
// cap; it never drops the open one.
func (l *Log) sweepLocked() {
	now := l.opts.Now()
	l.swept = now
	segs, err := segments(l.dir)
	if err != nil {
		return
	}
	l.total = 0
	for _, s := range segs {
		l.total += s.size
	}
	l.oldest = ""
	for _, s := range segs {
		expired := s.day.Add(24 * time.Hour).Before(now.Add(-l.opts.Retention))
		if (!expired && l.total <= l.opts.MaxBytes) || s.name == l.name {
			if l.oldest == "" {
				l.oldest = s.name
			}
			if s.name == l.name {
				continue
			}
			break
		}
		if os.Remove(filepath.Join(l.dir, s.name)) == nil {
			l.total -= s.size
			l.shares.drop(s.name)
			os.Remove(filepath.Join(l.dir, s.name+indexSuffix))
		}
	}
}

// Append writes one event as a line.
func (l *Log) Append(ev engine.Event) error {
	line, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("event log: encode event: %w", err)
	}
	line = append(line, '\n')
	if len(line) > MaxLineBytes {
		return fmt.Errorf("event log: an event of %d bytes is over the %d-byte line limit", len(line), MaxLineBytes)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.openLocked(ev.Time, int64(len(line))); err != nil {
		return err
	}
	if err := l.overShareLocked(ev.Owner, int64(len(line))); err != nil {
		return err
	}
	n, err := l.f.Write(line)
	if err != nil {
		// A partial line would run into the next one: cut it off (this
		// works on a full disk), or start a new segment if that fails.
		if n > 0 && l.f.Truncate(l.size) != nil {
			l.f.Close()
			l.f = nil
		}
		return fmt.Errorf("event log: write %s: %w", filepath.Join(l.dir, l.name), err)
	}
	l.size += int64(n)
	l.total += int64(n)
	l.shares.add(l.name, ev.Owner, int64(n))
	return nil
}

// openLocked makes sure the open segment is today's and has room for n
// more bytes.
func (l *Log) openLocked(t time.Time, n int64) error {
	day := t.UTC().Truncate(24 * time.Hour)
	if l.f != nil && strings.HasPrefix(l.name, "events-"+day.Format(time.DateOnly)) && l.size+n <= l.segmentMax() {
		return nil
	}
	if l.f != nil {
		l.shares.save(l.dir, l.name)
		l.f.Close()
		l.f = nil
	}
	// The next segment: after the highest of the day, or a new day's first.
	next := 0
	segs, _ := segments(l.dir)
	for _, s := range segs {
		if d, k, _ := parseSegmentName(s.name); d.Equal(day) && k >= next {
			next = k
			if s.size+n > l.segmentMax() || s.name == l.name {
				next = k + 1
			}
		}
	}
	name := segmentName(day, next)
	path := filepath.Join(l.dir, name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		return fmt.Errorf("event log: open %s: %w", path, err)
	}
	st, err := f.Stat()
	if err == nil {
		sys, ok := st.Sys().(*syscall.Stat_t)
		if !st.Mode().IsRegular() || st.Mode().Perm()&0o077 != 0 || !ok || int(sys.Uid) != os.Geteuid() {
			err = fmt.Errorf("it must be a regular file of yours with mode 0600 (found %v); remove it", st.Mode())
		}
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("event log: %s: %w", path, err)
	}
	l.f, l.name, l.size = f, name, st.Size()
	l.sweepLocked()
	return nil
}

// Close closes the open segment.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	// An index that cannot be written (a full disk) leaves the segment's
	// bytes unaccounted for, which only holds owners back.
	l.shares.save(l.dir, l.name)
	err := l.f.Close()
	l.f = nil
	return err
}

// ReportEvery is how often Run reports events it could not write.
const ReportEvery = time.Minute

// Run appends every event from events until it closes (a subscription's C).
// A write that fails (a full disk) never stops it: the failures are counted
// and, at most once per ReportEvery (of the events' own clock), told to
// report.
func (l *Log) Run(events <-chan engine.Event, report func(detail string)) {
	tick := time.NewTicker(ReportEvery)
	defer tick.Stop()
	var lastReport time.Time
	failed, lastErr := 0, error(nil)
	flush := func(now time.Time, force bool) {
		if failed == 0 || (!force && now.Sub(lastReport) < ReportEvery) {
			return
		}
		if report != nil {
			report(fmt.Sprintf("event log: %d events could not be written to %s: %v", failed, l.dir, lastErr))
		}
		lastReport, failed, lastErr = now, 0, nil
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				flush(l.opts.Now(), true)
				return
			}
			if err := l.Append(ev); err != nil {
				failed++
				lastErr = err
				flush(ev.Time, false)
			}
			if ev.Time.Sub(l.sweptAt()) > time.Hour {
				l.mu.Lock()
				l.sweepLocked()
				l.mu.Unlock()
			}
		case <-tick.C:
			flush(l.opts.Now(), false)
		}
	}
}

func (l *Log) sweptAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.swept
}

// Filter selects events; zero fields select all.
type Filter struct {
	Since, Until time.Time
	Owner        string
	Kernel       string
	Types        []engine.EventType
}

// Match reports whether ev passes f.
func (f Filter) Match(ev engine.Event) bool {
	switch {
	case !f.Since.IsZero() && ev.Time.Before(f.Since):
		return false
	case !f.Until.IsZero() && ev.Time.After(f.Until):
		return false
	case f.Owner != "" && ev.Owner != f.Owner:
		return false
	case f.Kernel != "" && ev.Kernel != f.Kernel:
		return false
	case len(f.Types) > 0 && !slices.Contains(f.Types, ev.Type):
		return false
	}
	return true
}

// ParseLine decodes one line of the log. Anything but one event object with
// known fields and a known type is an error.
func ParseLine(line []byte) (engine.Event, error) {
	var ev engine.Event
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return engine.Event{}, fmt.Errorf("not an event: %w", err)
	}
	if dec.More() {
		return engine.Event{}, errors.New("not an event: more than one value on the line")
	}
	if !slices.Contains(engine.EventTypes(), ev.Type) {
		return engine.Event{}, fmt.Errorf("not an event: unknown type %.40q", ev.Type)
	}
	if ev.Time.IsZero() {
		return engine.Event{}, errors.New("not an event: no time")
	}
	return ev, nil
}

// Reader reads the events of a log dir in order.
type Reader struct {
	dir string
	// Bad counts the lines that were not events (skipped).
	Bad int
	// offset is where reading stopped in the last segment, for Follow.
	last   string
	offset int64
}

// NewReader reads the log in dir (which is not checked: reading is safe).
func NewReader(dir string) *Reader { return &Reader{dir: dir} }

// Read calls fn for every event of f in the log, oldest first, and
// remembers where it stopped; a later Read goes on from there (what was
// appended since, and the segments that followed).
func (r *Reader) Read(f Filter, fn func(engine.Event) error) error {
	segs, err := segments(r.dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read event log %s: %w", r.dir, err)
	}
	for _, s := range segs {
		if r.last != "" && s.name < r.last {
			continue
		}
		if !f.Until.IsZero() && s.day.After(f.Until) {
			break
		}
		if !f.Since.IsZero() && s.day.Add(24*time.Hour).Before(f.Since) {
			continue
		}
		var from int64
		if s.name == r.last {
			from = r.offset
		} else if !f.Since.IsZero() {
			// The read starts near Since: what --since 10m reads no longer
			// grows with the log.
			from = seekSince(filepath.Join(r.dir, s.name), s.size, f.Since.Add(-sinceSlack))
		}
		n, err := r.readSegment(filepath.Join(r.dir, s.name), from, f, fn)
		r.last, r.offset = s.name, n
		if err != nil {
			return err
		}
	}
	return nil
}

// sinceSlack is how far an event's time may run ahead of where it sits in
// its segment (engines sharing a log append as they go, each event a
// moment after its time): seeking by time starts this much early.
const sinceSlack = 10 * time.Second

// seekSince is the offset, in the segment at path of size bytes, of a
// line start at or before the first event of time since on, found by
// halving (its events are in time order, give or take sinceSlack); 0 when
// it cannot tell.
func seekSince(path string, size int64, since time.Time) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	// timeAt is the time of the first whole line at or after off, and
	// where that line starts; ok false past the last one.
	buf := make([]byte, 4096)
	timeAt := func(off int64) (at time.Time, start int64, ok bool) {
		n, _ := f.ReadAt(buf, off)
		b := buf[:n]
		if off > 0 {
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				return time.Time{}, 0, false
			}
			b, off = b[i+1:], off+int64(i+1)
		}
		var head struct {
			Time time.Time `json:"time"`
		}
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line = b[:i]
		}
		if json.Unmarshal(line, &head) != nil || head.Time.IsZero() {
			// A line longer than the buffer, or not an event: read from
			// here rather than guess past it.
			return time.Time{}, off, true
		}
		return head.Time, off, true
	}
	lo, hi := int64(0), size // the answer's line starts in [lo, hi]
	for hi-lo > int64(len(buf)) {
		mid := lo + (hi-lo)/2
		at, start, ok := timeAt(mid)
		switch {
		case !ok || start >= hi:
			hi = mid
		case at.IsZero() || !at.Before(since):
			hi = mid
		default:
			lo = start
		}
	}
	return lo
}

// readSegment reads whole lines from offset from and returns where the
// last whole line ended.
func (r *Reader) readSegment(path string, from int64, f Filter, fn func(engine.Event) error) (int64, error) {
	file, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return from, nil // dropped meanwhile
		}
		return from, fmt.Errorf("read event log: %w", err)
	}
	defer file.Close()
	if _, err := file.Seek(from, io.SeekStart); err != nil {
		return from, fmt.Errorf("read event log %s: %w", path, err)
	}
	br := bufio.NewReaderSize(file, 64<<10)
	pos := from
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Over-long: skip to its end.
			n := int64(len(line))
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				n += int64(len(line))
			}
			if err != nil {
				return pos, nil // not yet whole
			}
			pos += n
			r.Bad++
			continue
		}
		if err != nil {
			return pos, nil // EOF: a line not yet whole waits for the next Read
		}
		pos += int64(len(line))
		ev, perr := ParseLine(line)
		if perr != nil {
			r.Bad++
			continue
		}
		if f.Match(ev) {
			if err := fn(ev); err != nil {
				return pos, err
			}
		}
	}
}

// Recent returns up to n events of the log from since on, the newest,
// oldest first; for an engine's Config.Earlier. It reads the segments
// from their ends back, so what it costs grows with n, not with the log.
func Recent(dir string, since time.Time, n int) ([]engine.Event, error) {
	segs, err := segments(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("read event log %s: %w", dir, err)
	}
	var out []engine.Event // newest first
	for i := len(segs) - 1; i >= 0 && len(out) < n; i-- {
		if s := segs[i]; !since.IsZero() && s.day.Add(24*time.Hour).Before(since) {
			break
		}
		done, err := backward(filepath.Join(dir, segs[i].name), func(line []byte) bool {
			ev, err := ParseLine(line)
			if err != nil || ev.Type == engine.EventCellOutput || ev.Type == engine.EventMissed {
				return true
			}
			if !since.IsZero() && ev.Time.Before(since) {
				return false
			}
			out = append(out, ev)
			return len(out) < n
		})
		if err != nil {
			return nil, err
		}
		if done {
			break
		}
	}
	slices.Reverse(out)
	return out, nil
}

// backward calls fn with each whole line of the file at path (its newline
// included), the last first, reading blocks from its end, until fn says to
// stop; it reports whether fn stopped it. A line not yet whole at the end
// is left out, and one longer than MaxLineBytes skipped.
func backward(path string, fn func(line []byte) bool) (stopped bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil // dropped meanwhile
		}
		return false, fmt.Errorf("read event log: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("read event log: %w", err)
	}
	const block = 64 << 10
	var carry []byte // the end of a line that began in an earlier block
	// dropping: the bytes after the block's last newline are no whole
	// line to give (the file's unfinished end, or an over-long line).
	dropping := true
	for end := st.Size(); end > 0; {
		start := max(0, end-block)
		data := make([]byte, end-start, int(end-start)+len(carry))
		if _, err := f.ReadAt(data, start); err != nil && !errors.Is(err, io.EOF) {
			return false, fmt.Errorf("read event log %s: %w", path, err)
		}
		data = append(data, carry...)
		if dropping {
			j := bytes.LastIndexByte(data, '\n')
			if j < 0 {
				carry, end = nil, start
				continue
			}
			data, dropping = data[:j+1], false
		}
		for len(data) > 0 {
			i := bytes.LastIndexByte(data[:len(data)-1], '\n')
			if i < 0 && start > 0 {
				break // the line began in an earlier block
			}
			if line := data[i+1:]; len(line) <= MaxLineBytes+1 && !fn(line) {
				return true, nil
			}
			data = data[:i+1]
		}
		carry = data
		if len(carry) > MaxLineBytes+1 {
			carry, dropping = nil, true
		}
		end = start
	}
	return false, nil
}
