package runner

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// What a thread a cell left running prints between cells shows at the start
// of the next cell's output, as in a terminal, instead of being lost.
func TestRunnerShowsWhatWasPrintedBetweenCells(t *testing.T) {
	e := startEngineSide(t)
	e.write(cellFrame("start", "import threading\nlate = threading.Timer(0.1, print, ('printed between cells',))\nlate.start()"))
	if f, _ := e.result(); f.Status != "ok" || f.Stdout != "" {
		t.Fatalf("start: %s %q %s", f.Status, f.Stdout, f.Traceback)
	}
	time.Sleep(500 * time.Millisecond) // the timer prints while no cell runs
	e.write(cellFrame("next", "late.join()\n2"))
	if f, _ := e.result(); f.Status != "ok" || f.Stdout != "printed between cells\n2\n" {
		t.Errorf("next cell: %s %q %s; want what was printed between cells, then 2", f.Status, f.Stdout, f.Traceback)
	}
}

// What was printed between cells is shown even when the output files are
// due to be emptied (they hold more than OUTPUT_KEEP): they are emptied at a
// later cell instead.
func TestRunnerShowsWhatWasPrintedBetweenCellsOverTheKeep(t *testing.T) {
	e := startEngineSide(t)
	e.write(cellFrame("start", "import threading\nprint('y' * 20000)\nlate = threading.Timer(0.1, print, ('printed between cells',))\nlate.start()"))
	if f, _ := e.result(); f.Status != "ok" || len(f.Stdout) != 20001 {
		t.Fatalf("start: %s, %d bytes of stdout %s", f.Status, len(f.Stdout), f.Traceback)
	}
	time.Sleep(500 * time.Millisecond)
	for _, id := range []string{"next", "after"} { // the files are emptied at "after"
		e.write(cellFrame(id, "late.join()\n2"))
		want := "2\n"
		if id == "next" {
			want = "printed between cells\n2\n"
		}
		if f, _ := e.result(); f.Status != "ok" || f.Stdout != want {
			t.Errorf("cell %s: %s %q %s; want %q", id, f.Status, f.Stdout, f.Traceback, want)
		}
	}
	if st, err := os.Stat(filepath.Join(e.kd, "cells", "_stdout")); err != nil {
		t.Error(err)
	} else if st.Size() != 2 {
		t.Errorf("stdout file after the emptying cell: %d bytes; want 2 (emptied, then 2)", st.Size())
	}
}

// A cell whose whole output became its spill file leaves fds 1 and 2 on a
// new output file: what is printed after it goes to the next cell, never
// into the spill file the engine fetches.
func TestRunnerLeavesASpillFileAlone(t *testing.T) {
	e := startEngineSide(t)
	e.write(cellFrame("big", "import threading\nprint('x' * 60000)\nlate = threading.Timer(0.1, print, ('after the spill',))\nlate.start()"))
	if f, _ := e.result(); f.Status != "ok" || !f.StdoutClipped || len(f.Stdout) > 50100 || !strings.Contains(f.Stdout, "bytes not shown") {
		t.Fatalf("big: %s, %d bytes of stdout %.80q %s; want about 50,000 (clipped)", f.Status, len(f.Stdout), f.Stdout, f.Traceback)
	}
	time.Sleep(500 * time.Millisecond) // the timer prints while no cell runs
	// Read before the next cell comes: that acknowledges big's result, and
	// its files are removed.
	data, err := os.ReadFile(filepath.Join(e.kd, "cells", "big.out"))
	if err != nil || string(data) != strings.Repeat("x", 60000)+"\n" {
		t.Errorf("spill file of big: %d bytes (%v), ends %q; want the cell's 60,001", len(data), err, data[max(0, len(data)-40):])
	}
	e.write(cellFrame("next", "late.join()\n2"))
	if f, _ := e.result(); f.Status != "ok" || f.Stdout != "after the spill\n2\n" {
		t.Errorf("next cell: %s %q %s; want what was printed after the spill, then 2", f.Status, f.Stdout, f.Traceback)
	}
}

// A warm cell points fds 1 and 2 at the output files once (two dup2, which
// also put back what an earlier cell moved) and finds where each file ends
// once, when its result is made (two lseeks, and a pread when there is
// output): not the four dup2 and four lseeks of redirecting to the files
// and back to the log for every cell.
func TestRunnerRedirectsOncePerCell(t *testing.T) {
	e := startEngineSide(t)
	e.write(cellFrame("wrap", `import os
_counts = {"dup2": 0, "lseek": 0, "fstat": 0}
def _counting(name, f):
    def call(*a):
        _counts[name] += 1
        return f(*a)
    return call
_dup2, _lseek, _fstat = os.dup2, os.lseek, os.fstat
os.dup2, os.lseek, os.fstat = _counting("dup2", _dup2), _counting("lseek", _lseek), _counting("fstat", _fstat)`))
	if f, _ := e.result(); f.Status != "ok" {
		t.Fatalf("wrap: %s %s", f.Status, f.Traceback)
	}
	const n = 100
	e.runOnes(n)
	// The wrapping cell's result counts too (two lseeks), and the counting
	// cell's start (two dup2).
	e.write(cellFrame("count", "os.dup2, os.lseek, os.fstat = _dup2, _lseek, _fstat\nprint(_counts['dup2'], _counts['lseek'], _counts['fstat'])"))
	f, _ := e.result()
	if want := strconv.Itoa(2*(n+1)) + " " + strconv.Itoa(2*(n+1)) + " 0\n"; f.Stdout != want {
		t.Errorf("dup2, lseek and fstat calls over %d cells and the wrapping one: %q (%s %s); want %q", n, f.Stdout, f.Status, f.Traceback, want)
	}
}

// The value of a cell's last expression is written in one write, the
// newline with it (sys.__displayhook__ writes twice), and becomes _ as
// there.
func TestRunnerShowsAValueInOneWrite(t *testing.T) {
	e := startEngineSide(t)
	e.write(cellFrame("wrap", `import sys
R = sys.modules["__main__"].RUNNER
class _Counting:
    def __init__(self, inner):
        self.inner, self.writes = inner, []
    def write(self, s):
        self.writes.append(s)
        return self.inner.write(s)
    def flush(self):
        self.inner.flush()
_real = sys.stdout
sys.stdout = R.stdout = _Counting(_real)`))
	if f, _ := e.result(); f.Status != "ok" {
		t.Fatalf("wrap: %s %s", f.Status, f.Traceback)
	}
	e.write(cellFrame("shown", "40 + 2"))
	if f, _ := e.result(); f.Status != "ok" || f.Stdout != "42\n" {
		t.Fatalf("shown: %s %q %s", f.Status, f.Stdout, f.Traceback)
	}
	e.write(cellFrame("count", "w = sys.stdout.writes\nsys.stdout = R.stdout = _real\nprint(w, _)"))
	if f, _ := e.result(); f.Stdout != "['42\\n'] 42\n" {
		t.Errorf("writes of the shown value, and _: %q (%s %s); want ['42\\n'] 42", f.Stdout, f.Status, f.Traceback)
	}
}

// A cell that closed fd 1 or pointed fd 2 elsewhere (a library silencing C
// output that never put it back) does not take the next cells' output.
func TestRunnerPutsMovedDescriptorsBack(t *testing.T) {
	e := startEngineSide(t)
	e.write(cellFrame("move", "import os\nos.close(1)\nos.dup2(os.open(os.devnull, os.O_WRONLY), 2)"))
	if f, _ := e.result(); f.Status != "ok" {
		t.Fatalf("move: %s %s", f.Status, f.Traceback)
	}
	e.write(cellFrame("next", "import sys\nprint('out')\nn = os.write(2, b'err\\n')"))
	if f, _ := e.result(); f.Status != "ok" || f.Stdout != "out\n" || f.Stderr != "err\n" {
		t.Errorf("next cell: %s stdout %q stderr %q %s; want out and err", f.Status, f.Stdout, f.Stderr, f.Traceback)
	}
}

// A clipped output keeps its head and its tail, cut at line ends, and says
// how much is between them; past spill_max the tail is the output's own.
func TestRunnerKeepsTheHeadAndTheTail(t *testing.T) {
	e := startEngineSide(t)
	for _, tc := range []struct {
		id, code, last string
	}{
		{"lines", "for i in range(200000): print(i)", "199999\n"},
		// 6 MB: more than spill_max (5 MB), so the file is cut.
		{"huge", "import sys\nfor i in range(600000): sys.stdout.write('%09d\\n' % i)", "000599999\n"},
	} {
		e.write(cellFrame(tc.id, tc.code))
		f, _ := e.result()
		if f.Status != "ok" || !f.StdoutClipped {
			t.Fatalf("%s: %s clipped=%v %s", tc.id, f.Status, f.StdoutClipped, f.Traceback)
		}
		head, tail, ok := strings.Cut(f.Stdout, "\n[... ")
		if !ok || !strings.HasPrefix(head, "0\n1\n") && !strings.HasPrefix(head, "000000000\n") {
			t.Fatalf("%s: stdout does not start with the head and its gap line: %.100q", tc.id, f.Stdout)
		}
		gap, tail, _ := strings.Cut(tail, "\n")
		if !strings.HasSuffix(tail, tc.last) || !strings.Contains(gap, "bytes not shown; the whole output is in the spill file") {
			t.Errorf("%s: gap %q, tail ends %q; want the output's last line %q", tc.id, gap, tail[max(0, len(tail)-30):], tc.last)
		}
		if n := len(f.Stdout); n < 45000 || n > 50200 {
			t.Errorf("%s: %d bytes of stdout, want about the clip (50,000)", tc.id, n)
		}
		for _, l := range strings.Split(strings.TrimSuffix(head, "\n")+"\n"+tail, "\n") {
			if _, err := strconv.Atoi(l); l != "" && err != nil {
				t.Errorf("%s: a line cut in the middle: %q", tc.id, l)
				break
			}
		}
	}
}
