package backends

import (
	"io"
	"net"
	"sync"
	"time"
)

// withReadDeadlines gives c, a stream that has no deadlines (an ssh
// channel), read deadlines: a goroutine copies what c receives into a pipe
// whose other end is read; writes go straight to c. The engine reads a
// runner's stream until a deadline (a cell's timeout), so every stream a
// StreamDialer returns must keep them. What nobody reads waits in c's
// window: the pipe holds nothing.
func withReadDeadlines(c net.Conn) net.Conn {
	local, remote := net.Pipe()
	d := &deadlineConn{Conn: local, c: c, remote: remote}
	go func() {
		io.Copy(remote, c)
		remote.Close()
	}()
	return d
}

type deadlineConn struct {
	net.Conn // the local end of the pipe: Read and read deadlines
	c        net.Conn
	remote   net.Conn
	once     sync.Once
}

func (d *deadlineConn) Write(p []byte) (int, error) { return d.c.Write(p) }

// SetWriteDeadline is a no-op: the stream under it has none.
func (d *deadlineConn) SetWriteDeadline(time.Time) error { return nil }

func (d *deadlineConn) SetDeadline(t time.Time) error { return d.Conn.SetReadDeadline(t) }

// CloseWrite ends what this side sends, when the stream under it can (an
// ssh channel sends EOF): the peer sees the end and can still answer.
// Without it, the stream is closed both ways.
func (d *deadlineConn) CloseWrite() error {
	if cw, ok := d.c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return d.Close()
}

func (d *deadlineConn) Close() error {
	var err error
	d.once.Do(func() {
		err = d.c.Close()
		d.Conn.Close()
		d.remote.Close()
	})
	return err
}
