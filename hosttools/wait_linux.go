//go:build linux

package hosttools

import (
	"os/exec"
	"syscall"
	"unsafe"
)

// awaitExit blocks until cmd's process has exited and returns the function
// that reaps it. On Linux it waits with waitid(WNOWAIT), which leaves the
// process a zombie: while it is unreaped its pid, which is also its process
// group id, cannot be reused, so killing the group afterwards can only hit
// the group's own stragglers and never an unrelated process.
func awaitExit(cmd *exec.Cmd) func() error {
	const pPID = 1         // P_PID from <sys/wait.h>
	var siginfo [16]uint64 // a siginfo_t is 128 bytes on Linux; its contents are not needed
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(cmd.Process.Pid),
			uintptr(unsafe.Pointer(&siginfo[0])), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return cmd.Wait
		case syscall.EINTR:
			continue
		}
		// waitid refused: the process has not been waited for, so wait the
		// ordinary way rather than report an exit that did not happen.
		err := cmd.Wait()
		return func() error { return err }
	}
}
