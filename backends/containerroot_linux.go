//go:build linux

package backends

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// containerRoot reaches into a container's own filesystem from this host
// through /proc/PID/root of a process in it, so that the engine can connect
// to a runner's socket as it does to a local one instead of relaying
// through an exec. It holds /proc/PID open: a descriptor that names that
// process, so that a pid reused after the container went opens nothing.
type containerRoot struct {
	mu   sync.RWMutex
	proc int // O_PATH descriptor of /proc/PID; -1 once closed
}

// errNotInContainer is what a pid that is not (or no longer) the
// container's gets: the relay is used instead.
var errNotInContainer = errors.New("the process is not in the container")

// openContainerRoot opens /proc/pid and checks that the process is in the
// container id's cgroup: a daemon on another machine (or in a VM) reports
// pids that mean nothing here.
func openContainerRoot(pid int, id string) (*containerRoot, error) {
	if pid <= 0 || len(id) < 12 {
		return nil, errNotInContainer
	}
	proc, err := unix.Open("/proc/"+strconv.Itoa(pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /proc/%d: %w", pid, err)
	}
	fd, err := unix.Openat(proc, "cgroup", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(proc)
		return nil, fmt.Errorf("read /proc/%d/cgroup: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), "cgroup")
	buf := make([]byte, 64<<10)
	n, _ := f.Read(buf)
	f.Close()
	if !strings.Contains(string(buf[:n]), id) {
		unix.Close(proc)
		return nil, errNotInContainer
	}
	return &containerRoot{proc: proc}, nil
}

// DialUnix connects to the Unix socket at p, a path in the container. No
// link is followed on the way (a kernel can plant one in its own dirs, and
// an absolute one would resolve on this host): each directory is opened
// without following, the socket too, and the connect goes through the
// descriptor's /proc/self/fd entry, which names that very inode.
func (r *containerRoot) DialUnix(ctx context.Context, p string) (net.Conn, error) {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return nil, fmt.Errorf("socket path %q is not a clean absolute path", p)
	}
	fd, err := r.openRoot()
	if err != nil {
		return nil, fmt.Errorf("open the container's root: %w", err)
	}
	parts := strings.Split(p[1:], "/")
	for i, part := range parts {
		flags := unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i < len(parts)-1 {
			flags |= unix.O_DIRECTORY // a link is not one: ENOTDIR
		}
		next, err := unix.Openat(fd, part, flags, 0)
		unix.Close(fd)
		if err != nil {
			return nil, fmt.Errorf("open %s in the container: %w", path.Join(append([]string{"/"}, parts[:i+1]...)...), err)
		}
		fd = next
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat %s in the container: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%s in the container is not a socket (mode %o)", p, st.Mode)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, fmt.Errorf("connect to %s in the container: %w", p, err)
	}
	return c, nil
}

// openRoot opens the container's / (following the magic link, which is
// what it is for); under the lock, so that a descriptor number Close
// released and the system gave to another file is never used.
func (r *containerRoot) openRoot() (int, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.proc < 0 {
		return -1, net.ErrClosed
	}
	return unix.Openat(r.proc, "root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// Close lets go of /proc/PID.
func (r *containerRoot) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc < 0 {
		return nil
	}
	err := unix.Close(r.proc)
	r.proc = -1
	return err
}
