package runner

import (
	"strconv"
	"strings"
	"testing"
)

// A warm cell sets the io thread's alarm once, when it starts; the alarm is
// not disarmed when the cell ends (one that fires later finds the turn
// taken), which spares a timerfd_settime a cell.
func TestRunnerArmsItsAlarmOncePerCell(t *testing.T) {
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
	const n = 100
	e.runOnes(n)
	// This cell's own arm counts too: n + 1 in all, each IO_DELAY.
	e.write(cellFrame("count", "R.alarm.settime = _settime\nprint(len(_calls), sorted(set(_calls)))"))
	f, _ := e.result()
	if want := strconv.Itoa(n+1) + " [0.002]\n"; f.Stdout != want {
		t.Errorf("timerfd_settime calls over %d cells and the count's: %q (%s %s); want %q", n, f.Stdout, f.Status, f.Traceback, want)
	}
}
