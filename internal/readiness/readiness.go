// Package readiness tells a service manager that a daemon serves: a line on
// a descriptor it handed over (--ready-fd), and systemd's notify protocol
// (a datagram to $NOTIFY_SOCKET).
package readiness

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
)

// Notifier says when the daemon is ready and when it stops.
type Notifier struct {
	fd     *os.File // the --ready-fd descriptor; nil: none
	notify string   // $NOTIFY_SOCKET; "": none
}

// New checks fd (-1: none) and reads $NOTIFY_SOCKET through getenv. A fd
// that is not open is an error that says what to do.
func New(fd int, getenv func(string) string) (*Notifier, error) {
	n := &Notifier{notify: getenv("NOTIFY_SOCKET")}
	if n.notify != "" && !strings.HasPrefix(n.notify, "/") && !strings.HasPrefix(n.notify, "@") {
		return nil, fmt.Errorf("NOTIFY_SOCKET=%q is neither a path nor an abstract socket (@name); unset it, or let the service manager set it", n.notify)
	}
	if fd < 0 {
		return n, nil
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("--ready-fd %d: not an open file descriptor (%v); hand one over, e.g. 3>ready.pipe", fd, err)
	}
	// Handed over without close-on-exec, it would reach every kernel
	// spawned before it is closed.
	syscall.CloseOnExec(fd)
	n.fd = os.NewFile(uintptr(fd), fmt.Sprintf("ready-fd %d", fd))
	return n, nil
}

// Ready says the daemon serves at where: "READY where" and a newline on the
// descriptor, which is then closed, and READY=1 to the notify socket.
func (n *Notifier) Ready(where string) error {
	var errs []error
	if n.fd != nil {
		_, err := fmt.Fprintf(n.fd, "READY %s\n", where)
		errs = append(errs, err, n.fd.Close())
		n.fd = nil
	}
	errs = append(errs, n.send("READY=1\nSTATUS=serving at "+where))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("say the engine is ready: %w", err)
	}
	return nil
}

// Stopping tells the notify socket that the daemon is stopping.
func (n *Notifier) Stopping() error { return n.send("STOPPING=1") }

func (n *Notifier) send(state string) error {
	if n.notify == "" {
		return nil
	}
	addr := n.notify
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("NOTIFY_SOCKET %s: %w", n.notify, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("NOTIFY_SOCKET %s: %w", n.notify, err)
	}
	return nil
}
