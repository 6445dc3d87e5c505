package proctest

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestUsingFindsAProcessByItsWorkingDir(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("sleep", "30")
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	found := func() bool {
		for _, u := range Using(dir) {
			if strings.HasPrefix(u, pid+" ") && strings.Contains(u, "sleep 30") {
				return true
			}
		}
		return false
	}
	if !found() {
		t.Fatalf("Using(%s) = %q, want pid %s (sleep 30)", dir, Using(dir), pid)
	}
	if got := Using(dir + "-other"); len(got) != 0 {
		t.Fatalf("Using of a sibling path = %q, want none", got)
	}
	cmd.Process.Kill()
	cmd.Wait()
	WaitDead(t, cmd.Process.Pid, 5*time.Second)
	if found() {
		t.Fatalf("Using still lists the killed pid %s", pid)
	}
}
