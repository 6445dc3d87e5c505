package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// The cell records stay within their bounds however many cells run: the
// oldest go first, per kernel and in all.
func TestCellLogBounds(t *testing.T) {
	l := newCellLog()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	kernel := func(i int) *Kernel {
		return &Kernel{id: fmt.Sprintf("k%d", i), key: Key{Owner: "o", Task: "t", Backend: "local"}}
	}
	// One kernel, 30 cells: the last 20 stay, in order.
	for i := range 30 {
		id := fmt.Sprintf("a%02d", i)
		l.start(kernel(0), id, "code "+id, now)
		l.finish(kernel(0).key, id, &Result{Status: StatusSuccess, Stdout: id}, nil, time.Millisecond)
	}
	recs := l.of("k0")
	if len(recs) != cellsPerKernel || recs[0].ID != "a10" || recs[len(recs)-1].ID != "a29" || recs[0].Stdout.Head != "a10" {
		t.Fatalf("kernel k0 keeps %d records, %s..%s, want the last %d", len(recs), recs[0].ID, recs[len(recs)-1].ID, cellsPerKernel)
	}
	// Many kernels: never more than cellsTotal records, the oldest dropped.
	for i := range 3 * cellsTotal {
		l.start(kernel(1+i), fmt.Sprintf("b%d", i), "", now)
	}
	if l.live != cellsTotal || len(l.byID) != cellsTotal || len(l.order) > 2*cellsTotal {
		t.Fatalf("%d live records, %d by id, %d in order; want %d (order at most twice that)", l.live, len(l.byID), len(l.order), cellsTotal)
	}
	if len(l.of("k0")) != 0 || len(l.of("k1")) != 0 || len(l.of(fmt.Sprintf("k%d", 3*cellsTotal))) != 1 {
		t.Fatal("the oldest kernels' records should be gone and the newest kept")
	}
	n := 0
	for _, ks := range l.byKernel {
		n += len(ks)
	}
	if n != cellsTotal {
		t.Fatalf("%d records by kernel, want %d", n, cellsTotal)
	}
}

// A record's code and streams are bounded, cut on whole runes.
func TestCellRecordExcerpts(t *testing.T) {
	l := newCellLog()
	code := strings.Repeat("é", recordCodeMax) // 2 bytes a rune
	l.start(&Kernel{id: "k"}, "c1", code, time.Now())
	for range 1000 {
		l.output(Key{}, "c1", "stdout", "ü€"+strings.Repeat("x", 97))
	}
	l.output(Key{}, "c1", "stderr", "warn\n")
	r := l.of("k")[0]
	if !r.CodeClipped || len(r.Code) > recordCodeMax || !utf8.ValidString(r.Code) {
		t.Fatalf("code: %d bytes, clipped %v, valid %v", len(r.Code), r.CodeClipped, utf8.ValidString(r.Code))
	}
	x := r.Stdout
	if x.Bytes != 1000*102 || len(x.Head) > recordHeadMax || len(x.Tail) > recordTailMax || !utf8.ValidString(x.Head) ||
		!utf8.ValidString(x.Tail) || !strings.HasSuffix(x.Tail, "ü€"+strings.Repeat("x", 97)) {
		t.Fatalf("stdout excerpt: %d bytes, head %d, tail %d", x.Bytes, len(x.Head), len(x.Tail))
	}
	if r.Stderr.Head != "warn\n" || r.Stderr.Tail != "" {
		t.Fatalf("stderr excerpt %+v", r.Stderr)
	}
	l.finish(Key{}, "c1", nil, fmt.Errorf("boom"), time.Second)
	if r := l.of("k")[0]; r.Running || r.Status != StatusError || r.Error != "boom" || r.Stdout.Bytes != 1000*102 {
		t.Fatalf("a cell that ended in an error: %+v", r)
	}
}

// A cell id names a cell within its key, told apart by the key's
// structure: two keys whose strings read the same ("a" with task "b/c",
// and "a/b" with task "c") keep records of the same id apart, and what one
// records, finishes or streams never reaches the other's.
func TestCellIDsBelongToTheirKey(t *testing.T) {
	l := newCellLog()
	a := &Kernel{id: "ka", key: Key{Owner: "a", Task: "b/c", Backend: "local"}}
	ab := &Kernel{id: "kab", key: Key{Owner: "a/b", Task: "c", Backend: "local"}}
	member := &Kernel{id: "km", key: Key{Owner: "a", Task: "b/c", Backend: "local?user=a"}}
	if a.key.String() != ab.key.String() {
		t.Fatalf("the keys' strings differ (%s, %s): this test wants them alike", a.key, ab.key)
	}
	now := time.Now()
	l.start(a, "x1", "secret = 1", now)
	l.start(ab, "x1", "mine = 2", now)
	l.start(member, "x1", "member = 3", now)
	l.output(a.key, "x1", "stdout", "a's secret\n")
	l.finish(a.key, "x1", &Result{Status: StatusSuccess, Stdout: "a's secret\n"}, nil, time.Millisecond)
	got, ok := l.get(ab.key, "x1")
	if !ok || got.Kernel != "kab" || got.Code != "mine = 2" || !got.Running || got.Stdout.Bytes != 0 {
		t.Fatalf("a/b's x1: %+v %v; want its own running record, untouched by a's", got, ok)
	}
	if got, _ := l.get(a.key, "x1"); got.Running || got.Stdout.Head != "a's secret\n" {
		t.Fatalf("a's x1: %+v", got)
	}
	if got, _ := l.get(member.key, "x1"); got.Kernel != "km" || !got.Running {
		t.Fatalf("the member's x1: %+v", got)
	}
	if _, ok := l.get(Key{Owner: "a"}, "x1"); ok {
		t.Fatal("a key that ran no x1 found a record of it")
	}
}
