package main

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Host CPU time per cell: the user+system CPU of every process taking part
// (this process and its reaped children by getrusage, and each process tree
// the subject names by /proc/<pid>/stat: runners, ipykernel, sshd), divided
// by the number of cells. /proc counts 10 ms ticks, so it is summed over all
// the warm blocks of a round.

// clockTick is the /proc time unit (USER_HZ).
var clockTick = func() time.Duration {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && n > 0 {
			return time.Second / time.Duration(n)
		}
	}
	return 10 * time.Millisecond
}()

type procStat struct {
	ppid  int
	start uint64
	cpu   time.Duration // utime+stime+cutime+cstime
}

// readProcStat parses /proc/<pid>/stat.
func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return procStat{}, false
	}
	// After "(comm)": state ppid pgrp session tty tpgid flags minflt
	// cminflt majflt cmajflt utime stime cutime cstime priority nice
	// threads itrealvalue starttime.
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 20 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	var ticks uint64
	for _, i := range []int{11, 12, 13, 14} {
		n, _ := strconv.ParseUint(f[i], 10, 64)
		ticks += n
	}
	start, _ := strconv.ParseUint(f[19], 10, 64)
	return procStat{ppid: ppid, start: start, cpu: time.Duration(ticks) * clockTick}, true
}

type procKey struct {
	pid   int
	start uint64
}

// cpuSnap is the CPU used so far by the bench and by the trees of roots.
type cpuSnap struct {
	self  time.Duration
	procs map[procKey]procStat
}

func rusage(who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuBefore and cpuAfter snapshot the bench's own CPU and that of roots
// and all their descendants, at the start and at the end of a window. The
// bench's own reading is taken on the window's side of the /proc scan, so
// the scan's own CPU stays out of the window.
func cpuBefore(roots []int) cpuSnap {
	s := scanCPU(roots)
	s.self = selfCPU()
	return s
}

func cpuAfter(roots []int) cpuSnap {
	self := selfCPU()
	s := scanCPU(roots)
	s.self = self
	return s
}

func selfCPU() time.Duration { return rusage(syscall.RUSAGE_SELF) + rusage(syscall.RUSAGE_CHILDREN) }

// scanCPU reads the CPU of roots and all their descendants from /proc.
func scanCPU(roots []int) cpuSnap {
	var s cpuSnap
	if len(roots) == 0 {
		return s
	}
	all := map[int]procStat{}
	kids := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readProcStat(pid); ok {
			all[pid] = st
			kids[st.ppid] = append(kids[st.ppid], pid)
		}
	}
	s.procs = map[procKey]procStat{}
	self := os.Getpid()
	stack := append([]int(nil), roots...)
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		st, ok := all[pid]
		if !ok || pid == self {
			continue
		}
		k := procKey{pid, st.start}
		if _, seen := s.procs[k]; seen {
			continue
		}
		s.procs[k] = st
		stack = append(stack, kids[pid]...)
	}
	return s
}

// cpuSince is the CPU used between before and after: the bench's own, plus
// each process's growth (whole, for processes new in after). A process of
// before that a tracked parent reaped meanwhile had its whole CPU folded
// into that parent's cutime, so its share from before is taken out again.
func cpuSince(before, after cpuSnap) time.Duration {
	d := after.self - before.self
	live := map[int]bool{}
	for k, st := range after.procs {
		d += st.cpu - before.procs[k].cpu
		live[k.pid] = true
	}
	for k, st := range before.procs {
		if _, still := after.procs[k]; !still && live[st.ppid] {
			d -= st.cpu
		}
	}
	return d
}
