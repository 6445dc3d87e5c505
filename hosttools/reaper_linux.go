//go:build linux

package hosttools

import (
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// reaperArg, as the first argument, makes any binary that links this
// package run reaperMain instead of its own main: the terminal tool starts
// its own executable that way (see init).
const reaperArg = "__kerneldeck_terminal_reaper"

func init() {
	if len(os.Args) > 2 && os.Args[1] == reaperArg {
		os.Exit(reaperMain(os.Args[2:]))
	}
}

// terminalCommand is how a terminal call starts bash: under a reaper, a
// copy of this executable that is the child subreaper of everything the
// command starts, so a process that daemonizes (setsid, nohup, a double
// fork) still ends with the call.
func terminalCommand(command string) *exec.Cmd {
	self, err := os.Executable()
	if err != nil {
		return exec.Command("bash", "-c", command)
	}
	return exec.Command(self, reaperArg, "bash", "-c", command)
}

// reaperMain runs argv as the child subreaper of all it starts. When the
// command exits, or this process is told to stop (SIGTERM, SIGINT, SIGHUP),
// every descendant is killed and reaped, and the command's status becomes
// this process's: its exit code, or 128+N for death by signal N.
func reaperMain(argv []string) int {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		os.Stderr.WriteString("kerneldeck: cannot become a subreaper: " + errno.Error() + "\n")
		return 126
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	path, err := exec.LookPath(argv[0])
	if err != nil {
		os.Stderr.WriteString("kerneldeck: " + err.Error() + "\n")
		return 127
	}
	proc, err := os.StartProcess(path, argv, &os.ProcAttr{Env: os.Environ(), Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		os.Stderr.WriteString("kerneldeck: " + err.Error() + "\n")
		return 127
	}
	child := proc.Pid
	status := make(chan int, 1)
	go func() {
		// Reap every child that ends (orphans reparent to us); report the
		// command's own status.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, 0, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil {
				return
			}
			if pid == child {
				code := ws.ExitStatus()
				if ws.Signaled() {
					code = 128 + int(ws.Signal())
				}
				status <- code
			}
		}
	}()
	code := 0
	select {
	case code = <-status:
	case <-stop:
		syscall.Kill(child, syscall.SIGKILL)
		code = <-status
	}
	killDescendants()
	return code
}

// killDescendants kills this process's children until none is left: the
// children of a killed child reparent to us (we are their subreaper) and are
// killed in the next round.
func killDescendants() {
	self := os.Getpid()
	for round := 0; round < 1000; round++ {
		kids := children(self)
		if len(kids) == 0 {
			return
		}
		for _, pid := range kids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(2 * time.Millisecond) // the reaper loop collects them
	}
}

// children lists the live processes whose parent is pid.
func children(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := strconv.Itoa(pid)
	var out []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parens.
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		f := strings.Fields(rest)
		if len(f) >= 2 && f[1] == want && f[0] != "Z" {
			out = append(out, n)
		}
	}
	return out
}
