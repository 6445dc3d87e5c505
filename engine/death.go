package engine

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
)

// exitCause reads the runner's exit status that a "KD:LOST 137" or
// "KD:DEAD 3" line carries (the spawn's watcher keeps it) and says what it
// means, as ": killed by SIGKILL (...)"; "" when the host did not know.
func exitCause(output string, m marker) string {
	line, ok := findLine(output, m)
	if !ok {
		return ""
	}
	status, why, _ := strings.Cut(strings.TrimSpace(line), " ")
	st, err := strconv.Atoi(status)
	if err != nil || st < 0 || st > 255 {
		return ""
	}
	if st == 128+int(syscall.SIGKILL) {
		if oom := oomCause(why).note(); oom != "" {
			return ": " + oom
		}
	}
	return ": " + describeExit(st)
}

// oomCause is how the spawn's watcher knew that a SIGKILL came from the
// OOM killer.
type oomCause string

const (
	oomCgroup  oomCause = "oom-cgroup"  // the kernel log: its memory cgroup's limit
	oomHost    oomCause = "oom-host"    // the kernel log: the host ran out
	oomCounter oomCause = "oom-counter" // its memory cgroup's oom_kill counter rose
)

// note says what c means for the kernel; "" for no known cause.
func (c oomCause) note() string {
	switch c {
	case oomCgroup:
		return "out of memory: the OOM killer of its memory cgroup killed it (SIGKILL) at the cgroup's memory limit"
	case oomHost:
		return "out of memory: the kernel's OOM killer killed it (SIGKILL) when the host ran out of memory"
	case oomCounter:
		return "out of memory: killed by SIGKILL as its memory cgroup's OOM killer fired (the cgroup's oom_kill count rose)"
	}
	return ""
}

// describeExit says what a shell's exit status of the runner means: an
// exit code of its own, or death by signal (128+n).
func describeExit(st int) string {
	if st <= 128 {
		return fmt.Sprintf("it exited by itself with status %d", st)
	}
	sig := syscall.Signal(st - 128)
	name := signalName(sig)
	switch sig {
	case syscall.SIGKILL:
		return "killed by " + name + " (from outside, or by the kernel's OOM killer: possibly out of memory)"
	case syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGILL, syscall.SIGFPE, syscall.SIGABRT:
		return fmt.Sprintf("it crashed: %s (%s)", name, sig)
	case syscall.SIGXCPU:
		return "killed by " + name + ": it used up its CPU time (kernel_cpu_time)"
	}
	return fmt.Sprintf("killed by %s (%s)", name, sig)
}

// signalName is a signal's SIGNAME, or "signal N".
func signalName(sig syscall.Signal) string {
	names := map[syscall.Signal]string{syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
		syscall.SIGILL: "SIGILL", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE",
		syscall.SIGKILL: "SIGKILL", syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
		syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM", syscall.SIGXCPU: "SIGXCPU",
		syscall.SIGXFSZ: "SIGXFSZ"}
	if n, ok := names[sig]; ok {
		return n
	}
	return fmt.Sprintf("signal %d", int(sig))
}
