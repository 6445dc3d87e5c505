// Package proctest answers whether a local process still runs, for tests
// that check nothing is left behind.
package proctest

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Alive reports whether pid runs on this machine. A zombie counts as dead:
// a killed runner stays one until its adopter reaps it, and some container
// inits never do.
func Alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// WaitDead fails the test unless pid is gone within the given time.
func WaitDead(t testing.TB, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive after %v", pid, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Using lists the processes ("pid command") whose working directory or an
// open file lies under dir, for a message about what keeps a mount busy.
func Using(dir string) []string {
	dir = strings.TrimSuffix(dir, "/")
	under := func(p string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	procs, _ := os.ReadDir("/proc")
	var out []string
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		base := "/proc/" + p.Name()
		hit := false
		if cwd, err := os.Readlink(base + "/cwd"); err == nil && under(cwd) {
			hit = true
		}
		if fds, err := os.ReadDir(base + "/fd"); err == nil && !hit {
			for _, fd := range fds {
				if target, err := os.Readlink(base + "/fd/" + fd.Name()); err == nil && under(target) {
					hit = true
					break
				}
			}
		}
		if hit {
			cmd, _ := os.ReadFile(base + "/cmdline")
			out = append(out, strconv.Itoa(pid)+" "+strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")))
		}
	}
	return out
}

// Runners lists the live (not zombie) processes running a kerneldeck
// runner under dir: the last word of a runner's argv is its path,
// <dir>/…/runner.py.
func Runners(dir string) []int {
	dir = strings.TrimSuffix(dir, "/")
	procs, _ := os.ReadDir("/proc")
	var out []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		if p, ok := RunnerPath(string(cmd)); ok && strings.HasPrefix(p, dir+"/") && Alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// RunnerPath returns the runner's path (…/runner.py) from a process's
// /proc/<pid>/cmdline: its last word, after the interpreter and its -c
// start program; ok is false for any other process.
func RunnerPath(cmdline string) (string, bool) {
	argv := strings.Split(strings.TrimSuffix(cmdline, "\x00"), "\x00")
	if len(argv) < 4 || argv[len(argv)-3] != "-c" {
		return "", false
	}
	p := argv[len(argv)-1]
	return p, strings.HasSuffix(p, "/runner.py")
}

// Mentioning lists the live processes other than this one whose command
// line mentions one of words, as "pid N: command line" (clipped), for a
// message about what was left behind.
func Mentioning(words ...string) []string {
	procs, _ := os.ReadDir("/proc")
	var out []string
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		if err != nil {
			continue
		}
		line := strings.ReplaceAll(string(cmd), "\x00", " ")
		if slices.ContainsFunc(words, func(w string) bool { return strings.Contains(line, w) }) && Alive(pid) {
			out = append(out, fmt.Sprintf("pid %d: %.200s", pid, line))
		}
	}
	return out
}
