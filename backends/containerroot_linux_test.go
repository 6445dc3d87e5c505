package backends

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// A pid is taken for a container's only when the process is in that
// container's cgroup: a daemon elsewhere (another machine, a VM) reports
// pids that name unrelated processes here.
func TestContainerRootChecksThePidIsTheContainers(t *testing.T) {
	id := strings.Repeat("ab12", 16)
	for _, pid := range []int{os.Getpid(), 1, 0, -1} {
		if r, err := openContainerRoot(pid, id); err == nil {
			r.Close()
			t.Errorf("pid %d was taken for container %s's", pid, id[:12])
		}
	}
	if _, err := openContainerRoot(os.Getpid(), id); !errors.Is(err, errNotInContainer) {
		t.Errorf("this process, not in a container: %v, want errNotInContainer", err)
	}
}
