// Package cgrouptest makes a memory cgroup of a test's own, with a limit,
// so that a test can have the kernel's OOM killer end a process for real.
package cgrouptest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RequireEnv is the environment variable that, set to "1", turns a host
// without a writable memory cgroup from a skip into a test failure.
const RequireEnv = "KERNELDECK_REQUIRE_CGROUP"

// Memory is a memory cgroup under the test process's own one. Processes
// added to it (and their later children) are charged to it and are killed
// by its OOM killer past its limit.
type Memory struct {
	dir    string
	parent string
	events string // the file holding "oom_kill N"
}

// NewMemory makes a memory cgroup limited to limit bytes (without swap),
// removed when the test ends. The host must have the memory controller of
// cgroup v1 mounted at /sys/fs/cgroup/memory, or cgroup v2 with memory
// delegated to the test's cgroup; otherwise the test is skipped.
func NewMemory(t testing.TB, limit int64) *Memory {
	t.Helper()
	m, err := create(limit)
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("no memory cgroup for the test (%s=1): %v", RequireEnv, err)
		}
		t.Skipf("no memory cgroup for the test: %v", err)
	}
	t.Cleanup(func() {
		if err := m.remove(); err != nil {
			t.Errorf("remove cgroup %s: %v", m.dir, err)
		}
	})
	return m
}

func create(limit int64) (*Memory, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var v1, v2 string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case strings.Contains(","+parts[1]+",", ",memory,"):
			v1 = parts[2]
		}
	}
	leaf := fmt.Sprintf("kerneldeck-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	var m *Memory
	switch {
	case v1 != "":
		parent := filepath.Join("/sys/fs/cgroup/memory", v1)
		m = &Memory{dir: filepath.Join(parent, leaf), parent: parent}
		m.events = filepath.Join(m.dir, "memory.oom_control")
		if err := os.Mkdir(m.dir, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup v1 memory controller: %w", err)
		}
		limits := [][2]string{{"memory.limit_in_bytes", strconv.FormatInt(limit, 10)}, {"memory.swappiness", "0"}}
		if _, err := os.Stat(filepath.Join(m.dir, "memory.memsw.limit_in_bytes")); err == nil {
			limits = append(limits, [2]string{"memory.memsw.limit_in_bytes", strconv.FormatInt(limit, 10)})
		}
		for _, kv := range limits {
			if err := os.WriteFile(filepath.Join(m.dir, kv[0]), []byte(kv[1]), 0o644); err != nil {
				m.remove()
				return nil, fmt.Errorf("set %s: %w", kv[0], err)
			}
		}
	case v2 != "":
		parent := filepath.Join("/sys/fs/cgroup", v2)
		ctl, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
		if err != nil || !strings.Contains(" "+string(ctl)+" ", " memory ") {
			return nil, fmt.Errorf("cgroup v2 without the memory controller delegated to %s", parent)
		}
		m = &Memory{dir: filepath.Join(parent, leaf), parent: parent}
		m.events = filepath.Join(m.dir, "memory.events")
		if err := os.Mkdir(m.dir, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup v2: %w", err)
		}
		for _, kv := range [][2]string{{"memory.max", strconv.FormatInt(limit, 10)}, {"memory.swap.max", "0"}} {
			if err := os.WriteFile(filepath.Join(m.dir, kv[0]), []byte(kv[1]), 0o644); err != nil && kv[0] == "memory.max" {
				m.remove()
				return nil, fmt.Errorf("set %s: %w", kv[0], err)
			}
		}
	default:
		return nil, errors.New("no memory cgroup in /proc/self/cgroup")
	}
	return m, nil
}

// Add moves a process into the cgroup.
func (m *Memory) Add(t testing.TB, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(m.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("move pid %d into cgroup %s: %v", pid, m.dir, err)
	}
}

// OOMKills is how many processes the cgroup's OOM killer has killed.
func (m *Memory) OOMKills(t testing.TB) int {
	t.Helper()
	data, err := os.ReadFile(m.events)
	if err != nil {
		t.Fatalf("read %s: %v", m.events, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == "oom_kill" {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatalf("%s: %q", m.events, line)
			}
			return n
		}
	}
	t.Fatalf("%s has no oom_kill line", m.events)
	return 0
}

// remove moves what is left in the cgroup back to its parent and removes it.
func (m *Memory) remove() error {
	var err error
	for range 50 {
		if data, rerr := os.ReadFile(filepath.Join(m.dir, "cgroup.procs")); rerr == nil {
			for _, pid := range strings.Fields(string(data)) {
				os.WriteFile(filepath.Join(m.parent, "cgroup.procs"), []byte(pid), 0o644)
			}
		}
		if err = os.Remove(m.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}
