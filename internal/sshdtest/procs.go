package sshdtest

import (
	"bytes"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// procID names a process across time: pid plus start time (in clock ticks
// since boot), so a reused pid is never mistaken for it. start 0 matches any.
type procID struct {
	pid   int
	start uint64
}

type procInfo struct {
	pid, ppid int
	pgid      int
	state     byte
	start     uint64
	comm      string
}

// procTable is one snapshot of /proc.
type procTable struct {
	procs map[int]procInfo
	kids  map[int][]int
}

func scanProcs() procTable {
	pt := procTable{procs: map[int]procInfo{}, kids: map[int][]int{}}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		info, ok := readStat(pid)
		if !ok {
			continue
		}
		pt.procs[pid] = info
		pt.kids[info.ppid] = append(pt.kids[info.ppid], pid)
	}
	return pt
}

// readStat parses /proc/<pid>/stat.
func readStat(pid int) (procInfo, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	// "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
	// majflt cmajflt utime stime cutime cstime priority nice threads
	// itrealvalue starttime ..."; comm may hold spaces and parentheses.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procInfo{}, false
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 20 {
		return procInfo{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	pgid, _ := strconv.Atoi(f[2])
	start, _ := strconv.ParseUint(f[19], 10, 64)
	return procInfo{pid: pid, ppid: ppid, pgid: pgid, state: f[0][0], start: start, comm: string(b[open+1 : end])}, true
}

func (pt procTable) children(pid int) []int { return pt.kids[pid] }

func (pt procTable) descendants(pid int) []int {
	var out []int
	stack := append([]int(nil), pt.kids[pid]...)
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		out = append(out, p)
		stack = append(stack, pt.kids[p]...)
	}
	return out
}

func (pt procTable) id(pid int) procID { return procID{pid: pid, start: pt.procs[pid].start} }

// alive reports whether id is in the table and not a zombie.
func (pt procTable) alive(id procID) bool {
	p, ok := pt.procs[id.pid]
	return ok && (id.start == 0 || p.start == id.start) && p.state != 'Z' && p.state != 'X'
}

func isSSHD(comm string) bool { return strings.HasPrefix(comm, "sshd") } // sshd, sshd-session, sshd-auth

// procAlive checks one process directly (no full scan).
func procAlive(id procID) bool {
	p, ok := readStat(id.pid)
	return ok && (id.start == 0 || p.start == id.start) && p.state != 'Z' && p.state != 'X'
}

func (id procID) signal(sig syscall.Signal) {
	if procAlive(id) {
		syscall.Kill(id.pid, sig)
	}
}

func (id procID) kill() { id.signal(syscall.SIGKILL) }

// freezeTrees SIGSTOPs every live root and its descendants for which keep
// returns true (nil keeps all), rescanning until nothing new appears and
// everything found is stopped, so none of them can fork a process that
// escapes. It returns what it stopped.
func freezeTrees(roots []procID, keep func(procInfo) bool) []procID {
	stopped := map[int]procID{}
	var order []procID
	for round := 0; round < 200; round++ {
		pt := scanProcs()
		added := false
		for _, r := range roots {
			if !pt.alive(r) {
				continue
			}
			for _, pid := range append([]int{r.pid}, pt.descendants(r.pid)...) {
				if _, ok := stopped[pid]; ok {
					continue
				}
				if keep != nil && !keep(pt.procs[pid]) {
					continue
				}
				id := pt.id(pid)
				syscall.Kill(pid, syscall.SIGSTOP)
				stopped[pid] = id
				order = append(order, id)
				added = true
			}
		}
		if !added && allStopped(pt, order) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return order
}

// allStopped reports whether every process in ids is stopped, a zombie or
// gone in pt.
func allStopped(pt procTable, ids []procID) bool {
	for _, id := range ids {
		p, ok := pt.procs[id.pid]
		if ok && p.start == id.start && p.state != 'T' && p.state != 't' && p.state != 'Z' && p.state != 'X' {
			return false
		}
	}
	return true
}

// waitGone waits until none of ids is alive (zombies count as gone).
func waitGone(ids []procID, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		var left []int
		for _, id := range ids {
			if procAlive(id) {
				left = append(left, id.pid)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still alive %v after SIGKILL", left, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connections returns the per-connection sshd processes: the children of the
// current listener plus the still-running connections of stopped listeners.
// s.mu must be held.
func (s *Server) connections(pt procTable) []procID {
	var out []procID
	if s.proc != nil {
		for _, c := range pt.children(s.proc.pid()) {
			out = append(out, pt.id(c))
		}
	}
	for _, d := range s.detached {
		if pt.alive(d) {
			out = append(out, d)
		}
	}
	return out
}

// serves reports whether connection process c is serving an authenticated
// login of name (uid): its process title says so ("sshd: NAME [priv]",
// "sshd: NAME@notty"), or an sshd process under it runs as uid.
func serves(pt procTable, c procID, name string, uid int) bool {
	if t := procTitle(c.pid); strings.Contains(t, ": "+name+" [priv]") || strings.Contains(t, ": "+name+"@") {
		return true
	}
	if uid < 0 {
		return false
	}
	for _, d := range pt.descendants(c.pid) {
		if isSSHD(pt.procs[d].comm) && procUID(d) == uid {
			return true
		}
	}
	return false
}

func procTitle(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
}

// procUID is the real uid of pid, or -1.
func procUID(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Uid:" {
			uid, err := strconv.Atoi(f[1])
			if err != nil {
				return -1
			}
			return uid
		}
	}
	return -1
}

func lookupUID(name string) int {
	u, err := user.Lookup(name)
	if err != nil {
		return -1
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return -1
	}
	return uid
}

// SessionPIDs returns the pids of the per-connection sshd processes (the
// monitors titled "sshd: NAME [priv]", or "sshd: root@notty" for root, which
// gets no separate unprivileged child; children of the listener, or of an
// earlier listener before a Restart) serving name's authenticated
// connections, one per connection.
func (s *Server) SessionPIDs(name string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	pt := scanProcs()
	uid := lookupUID(name)
	var out []int
	for _, c := range s.connections(pt) {
		if serves(pt, c, name, uid) {
			out = append(out, c.pid)
		}
	}
	return out
}

// KillSessions simulates a connection drop for every established connection
// of user name: it SIGKILLs the sshd processes serving them (the per-connection
// monitor and its unprivileged child), never the listener, and waits
// until they are gone, so the clients see their TCP connections close. The
// user's own processes started through those connections are left running
// (as after a network blip); cleanup kills them if they are still around.
// New connections keep working. It returns how many connections it dropped.
func (s *Server) KillSessions(t testing.TB, name string) int {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	pt := scanProcs()
	uid := lookupUID(name)
	var conns []procID
	for _, c := range s.connections(pt) {
		if serves(pt, c, name, uid) {
			conns = append(conns, c)
		}
	}
	if len(conns) == 0 {
		return 0
	}
	sshds := freezeTrees(conns, func(p procInfo) bool { return isSSHD(p.comm) })
	// The user's processes directly under the frozen sshd processes: after
	// the kill they are orphans outside the server's tree.
	pt = scanProcs()
	for _, id := range sshds {
		for _, k := range pt.children(id.pid) {
			if !isSSHD(pt.procs[k].comm) {
				s.leftovers = append(s.leftovers, pt.id(k))
			}
		}
	}
	for _, id := range sshds {
		id.kill()
	}
	if err := waitGone(sshds, 10*time.Second); err != nil {
		t.Fatalf("sshdtest: KillSessions(%q): %v", name, err)
	}
	return len(conns)
}

// waitState waits (bounded) until pid is in state st, or gone.
func waitState(pid int, st byte, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		p, ok := readStat(pid)
		if !ok || p.state == st || p.state == 'Z' {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// waitReaped waits (bounded) until those of ids that are children of parent
// have been reaped by it (gone from /proc, not just zombies).
func waitReaped(ids []procID, parent int, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		pending := false
		for _, id := range ids {
			if p, ok := readStat(id.pid); ok && p.start == id.start && p.ppid == parent {
				pending = true
				break
			}
		}
		if !pending {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// tagged returns the live processes whose environment holds EnvVar=s.dir:
// everything started through this server, attached or not.
func (s *Server) tagged() []procID {
	want := []byte(EnvVar + "=" + s.dir + "\x00")
	self := os.Getpid()
	var out []procID
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.HasPrefix(env, want) && !bytes.Contains(env, append([]byte{0}, want...)) {
			continue
		}
		if p, ok := readStat(pid); ok && p.state != 'Z' {
			out = append(out, procID{pid: pid, start: p.start})
		}
	}
	return out
}
