package engine

import (
	"fmt"
	"sync"
	"time"
	"unicode/utf8"
)

// What the engine remembers of recent cells, whoever ran them, so that a
// dashboard attached later shows what an agent ran. It is bounded: at most
// cellsPerKernel records a kernel and cellsTotal in all (the oldest go
// first), each holding at most recordCodeMax bytes of code, the head and
// tail of each stream (recordHeadMax + recordTailMax) and the last
// recordTracebackMax bytes of its traceback: about 40 MB at most.
const (
	cellsPerKernel     = 20
	cellsTotal         = 2000
	recordCodeMax      = 4 << 10
	recordHeadMax      = 2 << 10
	recordTailMax      = 4 << 10
	recordTracebackMax = 4 << 10
)

// CellRecord is what the engine remembers of one recent cell.
type CellRecord struct {
	ID          string        `json:"id"`
	Kernel      string        `json:"kernel"`
	Owner       string        `json:"owner"`
	Key         string        `json:"key"`
	Code        string        `json:"code"`
	CodeClipped bool          `json:"code_clipped,omitempty"`
	Running     bool          `json:"running"`
	Status      CellStatus    `json:"status,omitempty"`
	Started     time.Time     `json:"started"`
	Duration    time.Duration `json:"-"`
	Stdout      Excerpt       `json:"stdout"`
	Stderr      Excerpt       `json:"stderr"`
	Traceback   string        `json:"traceback,omitempty"`
	// SpillPath and StderrSpillPath hold the whole stream on the engine's
	// machine when it was clipped.
	SpillPath       string `json:"spill_path,omitempty"`
	StderrSpillPath string `json:"stderr_spill_path,omitempty"`
	ToolCallsMade   int    `json:"tool_calls_made"`
	// Error is why the engine could not give the cell a result.
	Error string `json:"error,omitempty"`
	// key is the kernel key the cell ran for: an id names a cell of its
	// key alone (another key's cell of the same id is another record).
	key Key
	// done is closed when the cell finishes.
	done chan struct{}
}

// cellRef names a record: a cell id is its caller's, within its key.
type cellRef struct {
	key Key
	id  string
}

func (r *CellRecord) ref() cellRef { return cellRef{r.key, r.ID} }

// Excerpt is the head and tail of a stream; Bytes is its length as the
// engine saw it, so Bytes > len(Head)+len(Tail) means the middle is left
// out. Clipped says the runner cut the stream there (the spill file holds
// all of it).
type Excerpt struct {
	Head    string `json:"head"`
	Tail    string `json:"tail,omitempty"`
	Bytes   int64  `json:"bytes"`
	Clipped bool   `json:"clipped,omitempty"`
}

// cut says whether the middle of the stream is left out.
func (x Excerpt) cut() bool { return x.Bytes > int64(len(x.Head)+len(x.Tail)) }

// text is the excerpt as one text, saying where its middle is left out.
func (x Excerpt) text() string {
	if !x.cut() {
		return x.Head + x.Tail
	}
	return fmt.Sprintf("%s\n[kerneldeck: %d bytes left out]\n%s", x.Head, x.Bytes-int64(len(x.Head)+len(x.Tail)), x.Tail)
}

// add appends text, keeping the head and a rolling tail.
func (x *Excerpt) add(text string) {
	x.Bytes += int64(len(text))
	if room := recordHeadMax - len(x.Head); room > 0 && x.Tail == "" {
		cut := min(room, len(text))
		for cut < len(text) && !utf8.RuneStart(text[cut]) {
			cut-- // whole runes only
		}
		x.Head += text[:cut]
		text = text[cut:]
	}
	if text == "" {
		return
	}
	x.Tail = lastBytes(x.Tail+text, recordTailMax)
}

// excerptOf is the excerpt of a whole stream.
func excerptOf(s string) Excerpt {
	var x Excerpt
	x.add(s)
	return x
}

// lastBytes is the end of s, at most n bytes, starting on a rune.
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}

// cellLog holds the records; all its methods are safe for concurrent use.
type cellLog struct {
	mu       sync.Mutex
	byKernel map[string][]*CellRecord
	byID     map[cellRef]*CellRecord
	order    []*CellRecord // by start, oldest first; dropped ones are skipped
	live     int           // records in order that are not dropped
}

func newCellLog() *cellLog {
	return &cellLog{byKernel: map[string][]*CellRecord{}, byID: map[cellRef]*CellRecord{}}
}

// start records a cell that begins on kernel k.
func (l *cellLog) start(k *Kernel, id, code string, now time.Time) {
	rec := &CellRecord{ID: id, Kernel: k.id, Owner: k.key.Owner, Key: k.key.String(), key: k.key, Running: true, Started: now, done: make(chan struct{})}
	if len(code) > recordCodeMax {
		cut := recordCodeMax
		for cut > 0 && !utf8.RuneStart(code[cut]) {
			cut--
		}
		rec.Code, rec.CodeClipped = code[:cut], true
	} else {
		rec.Code = code
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if old := l.byID[rec.ref()]; old != nil {
		l.dropLocked(old) // a cell id is one cell of its key: the newer record is the one
	}
	l.byID[rec.ref()] = rec
	l.byKernel[rec.Kernel] = append(l.byKernel[rec.Kernel], rec)
	l.order = append(l.order, rec)
	l.live++
	if ks := l.byKernel[rec.Kernel]; len(ks) > cellsPerKernel {
		l.dropLocked(ks[0])
	}
	for l.live > cellsTotal {
		l.dropLocked(l.oldestLocked())
	}
	if len(l.order) > 2*cellsTotal { // compact the skipped entries away
		kept := l.order[:0]
		for _, r := range l.order {
			if l.byID[r.ref()] == r {
				kept = append(kept, r)
			}
		}
		clear(l.order[len(kept):])
		l.order = kept
	}
}

func (l *cellLog) oldestLocked() *CellRecord {
	for len(l.order) > 0 {
		r := l.order[0]
		if l.byID[r.ref()] == r {
			return r
		}
		l.order = l.order[1:]
	}
	return nil
}

func (l *cellLog) dropLocked(r *CellRecord) {
	if r == nil || l.byID[r.ref()] != r {
		return
	}
	delete(l.byID, r.ref())
	l.live--
	ks := l.byKernel[r.Kernel]
	for i, x := range ks {
		if x == r {
			ks = append(ks[:i:i], ks[i+1:]...)
			break
		}
	}
	if len(ks) == 0 {
		delete(l.byKernel, r.Kernel)
	} else {
		l.byKernel[r.Kernel] = ks
	}
}

// output adds streamed output to a running cell's record and returns the
// cell's kernel and owner (ok false for a cell it does not hold).
func (l *cellLog) output(key Key, id, stream, text string) (kernel, owner string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.byID[cellRef{key, id}]
	if r == nil || !r.Running {
		return "", "", false
	}
	switch stream {
	case StreamDisplay: // the result brings the display; its stdout stays the kernel's
	case "stderr":
		r.Stderr.add(text)
	default:
		r.Stdout.add(text)
	}
	return r.Kernel, r.Owner, true
}

// moved notes that a cell's kernel was respawned under a new id.
func (l *cellLog) moved(key Key, id, kernel string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.byID[cellRef{key, id}]
	if r == nil || r.Kernel == kernel {
		return
	}
	old := l.byKernel[r.Kernel]
	for i, x := range old {
		if x == r {
			old = append(old[:i:i], old[i+1:]...)
			break
		}
	}
	if len(old) == 0 {
		delete(l.byKernel, r.Kernel)
	} else {
		l.byKernel[r.Kernel] = old
	}
	r.Kernel = kernel
	l.byKernel[kernel] = append(l.byKernel[kernel], r)
}

// finish records how a cell ended: its result, or the error that left it
// without one.
func (l *cellLog) finish(key Key, id string, res *Result, err error, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.byID[cellRef{key, id}]
	if r == nil || !r.Running {
		return
	}
	r.Running, r.Duration = false, d
	close(r.done)
	if err != nil {
		r.Status, r.Error = StatusError, err.Error()
		return
	}
	r.Status, r.ToolCallsMade = res.Status, res.ToolCallsMade
	// The streamed excerpt, when there is one, saw the whole stream; the
	// result's may be clipped.
	if r.Stdout.Bytes <= int64(len(res.Stdout)) {
		r.Stdout = excerptOf(res.Stdout)
	}
	if r.Stderr.Bytes <= int64(len(res.Stderr)) {
		r.Stderr = excerptOf(res.Stderr)
	}
	r.Stdout.Clipped, r.Stderr.Clipped = res.StdoutClipped, res.StderrClipped
	r.Traceback = lastBytes(res.Traceback, recordTracebackMax)
	r.SpillPath, r.StderrSpillPath = res.SpillPath, res.StderrSpillPath
}

// of returns copies of kernel's records, oldest first.
func (l *cellLog) of(kernel string) []CellRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	ks := l.byKernel[kernel]
	out := make([]CellRecord, len(ks))
	for i, r := range ks {
		out[i] = *r
	}
	return out
}

// get returns a copy of the record of key's cell id; ok false when there is
// none (another key's cell of that id is none of key's).
func (l *cellLog) get(key Key, id string) (rec CellRecord, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.byID[cellRef{key, id}]
	if r == nil {
		return CellRecord{}, false
	}
	return *r, true
}

// Cells returns what the engine remembers of the recent cells of kernel
// id (also after the kernel is gone, until newer cells push them out),
// oldest first, running ones included.
func (e *Engine) Cells(id string) []CellRecord { return e.cells.of(id) }
