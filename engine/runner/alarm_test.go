package runner

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// A run of warm cells sets the io thread's alarm at most once every
// IO_DELAY/2, not once a cell: a cell that starts while the alarm armed
// for an earlier one is still due at least that far ahead leaves it (and
// the alarm is never disarmed when a cell ends: one that fires later finds
// the turn taken). A cell that comes after a pause arms it again.
func TestRunnerArmsItsAlarmOnlyWhenItIsNotDueSoonAnyway(t *testing.T) {
	e := startEngineSide(t)
	e.write(cellFrame("wrap", `import sys
R = sys.modules["__main__"].RUNNER
if R.alarm.settime is None:
    print("no timerfd")
else:
    _calls, _settime = [], R.alarm.settime
    R.alarm.settime = lambda delay: (_calls.append(delay), _settime(delay))[1]`))
	if f, _ := e.result(); f.Status != "ok" {
		t.Fatalf("wrap the alarm: %s %s", f.Status, f.Traceback)
	} else if strings.Contains(f.Stdout, "no timerfd") {
		t.Skip("this interpreter's runner has no timerfd alarm (a pipe instead)")
	}
	count := func(id string) (int, string) {
		t.Helper()
		e.write(cellFrame(id, "print(len(_calls), sorted(set(_calls)))"))
		f, _ := e.result()
		n, vals, ok := strings.Cut(strings.TrimSpace(f.Stdout), " ")
		calls, err := strconv.Atoi(n)
		if f.Status != "ok" || !ok || err != nil {
			t.Fatalf("count the alarm's settings: %s %q %s", f.Status, f.Stdout, f.Traceback)
		}
		return calls, vals
	}
	// 100 cells sent at once run back to back, in a few ms.
	const n = 100
	var batch []byte
	for i := range n {
		batch = append(batch, cellFrame("n"+strconv.Itoa(i), "1")...)
	}
	before, _ := count("before")
	e.write(batch)
	for i := range n {
		if f, _ := e.result(); f.Status != "ok" || f.Stdout != "1\n" {
			t.Fatalf("cell %d: %s %q %s", i, f.Status, f.Stdout, f.Traceback)
		}
	}
	after, vals := count("after")
	if set := after - before - 1; set < 0 || set > n/2 || vals != "[0.002]" {
		t.Errorf("%d cells back to back set the alarm %d times (to %s); want at most %d, each to IO_DELAY (0.002)", n, set, vals, n/2)
	}
	// Past IO_DELAY the alarm is no longer due: the next cell sets it.
	time.Sleep(20 * time.Millisecond)
	e.write(cellFrame("lone", "1"))
	if f, _ := e.result(); f.Status != "ok" {
		t.Fatalf("a cell after a pause: %s %s", f.Status, f.Traceback)
	}
	if again, _ := count("again"); again != after+2 {
		t.Errorf("a cell after a pause set the alarm %d times, want 1", again-after-1)
	}
}
