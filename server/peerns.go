package server

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Every runner moves itself into a user namespace of its own before any
// cell runs, and nothing a kernel starts can leave it (setsid, a double
// fork and nohup keep it). A peer outside the engine's own user namespace
// is therefore code of a kernel (or of a container) and never admitted,
// whatever its uid: SO_PEERCRED alone would report the engine's user.

// errOtherNamespace marks a peer that lives outside the engine's user
// namespace.
var errOtherNamespace = errors.New("it runs in another user namespace")

// userNS identifies a user namespace as seen from this process: the link
// /proc/PID/ns/user names, and the uid map, which anyone may read even of
// a process it may not trace (sshd's sessions, a non-dumpable runner).
type userNS struct {
	link   string
	uidMap []byte
}

// ownUserNS is the engine's own user namespace.
func ownUserNS() (userNS, error) {
	link, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		return userNS{}, fmt.Errorf("read the engine's user namespace: %w", err)
	}
	m, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return userNS{}, fmt.Errorf("read the engine's uid map: %w", err)
	}
	return userNS{link: link, uidMap: m}, nil
}

// checkPeerNS refuses a peer process outside ns. The process is the one
// that connected, held by a pidfd (SO_PEERPIDFD) so that a peer that
// exits and whose pid is reused cannot lend another process's namespace;
// on kernels before 6.5, without it,, the pid SO_PEERCRED gave is used. A
// peer that cannot be told is refused.
func checkPeerNS(uc *net.UnixConn, credPid int, ns userNS) error {
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	pidfd, perr := -1, error(nil)
	if err := raw.Control(func(fd uintptr) {
		pidfd, perr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return err
	}
	pid := credPid
	switch {
	case perr == nil:
		defer unix.Close(pidfd)
		if pid, err = pidfdPid(pidfd); err != nil {
			return err
		}
	case errors.Is(perr, unix.ENOPROTOOPT):
	default:
		return fmt.Errorf("SO_PEERPIDFD: %w", perr)
	}
	if pid <= 0 {
		return fmt.Errorf("the process that connected has exited")
	}
	proc := "/proc/" + strconv.Itoa(pid)
	same := false
	if link, err := os.Readlink(proc + "/ns/user"); err == nil {
		same = link == ns.link
	} else if errors.Is(err, os.ErrPermission) {
		// Not ours to trace (non-dumpable): the uid map, as it reads from
		// here, is the same only for a process of our namespace, as a
		// kernel's maps one id and ours more, or others.
		m, err := os.ReadFile(proc + "/uid_map")
		if err != nil {
			return fmt.Errorf("read its uid map: %w", err)
		}
		same = bytes.Equal(m, ns.uidMap)
	} else {
		return fmt.Errorf("read its user namespace: %w", err)
	}
	if pidfd >= 0 {
		// Still the process that connected, so the pid read above was its.
		// ESRCH says it exited; a non-root engine gets EPERM for another
		// user's process (a member), whose pidfd then tells (-1 once gone).
		err := unix.PidfdSendSignal(pidfd, 0, nil, 0)
		if errors.Is(err, unix.EPERM) {
			if now, perr := pidfdPid(pidfd); perr == nil && now == pid {
				err = nil
			}
		}
		if err != nil {
			return fmt.Errorf("the process that connected has exited")
		}
	}
	if !same {
		return errOtherNamespace
	}
	return nil
}

// pidfdPid is the pid a pidfd refers to, from its fdinfo (-1 once the
// process has exited, 0 when it is in no pid namespace of ours).
func pidfdPid(pidfd int) (int, error) {
	info, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(pidfd))
	if err != nil {
		return 0, fmt.Errorf("read the peer's pidfd: %w", err)
	}
	for line := range strings.SplitSeq(string(info), "\n") {
		if rest, ok := strings.CutPrefix(line, "Pid:"); ok {
			return strconv.Atoi(strings.TrimSpace(rest))
		}
	}
	return 0, fmt.Errorf("the peer's pidfd names no pid")
}
