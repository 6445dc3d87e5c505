package backends

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// dlGuard bounds every wait in these tests: far longer than any of them.
const dlGuard = 20 * time.Second

// dlPair is a wrapped stream and its peer, over a real Unix socket pair
// (the wrapper never uses the socket's own deadlines).
func dlPair(t testing.TB) (wrapped net.Conn, peer net.Conn) {
	t.Helper()
	c, peer := dlSockets(t)
	wrapped = withReadDeadlines(c)
	t.Cleanup(func() { wrapped.Close() })
	return wrapped, peer
}

// dlSockets is a connected pair of Unix sockets, closed when the test ends.
func dlSockets(t testing.TB) (c net.Conn, peer net.Conn) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	c, err = net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	peer = <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() {
		c.Close()
		peer.Close()
	})
	return c, peer
}

// dlRead runs one Read in the background and returns its outcome, failing
// the test if it does not come within dlGuard.
func dlRead(t *testing.T, c net.Conn, start func()) (string, error) {
	t.Helper()
	type got struct {
		s   string
		err error
	}
	ch := make(chan got, 1)
	go func() {
		b := make([]byte, 64)
		n, err := c.Read(b)
		ch <- got{string(b[:n]), err}
	}()
	if start != nil {
		start()
	}
	select {
	case g := <-ch:
		return g.s, g.err
	case <-time.After(dlGuard):
		t.Fatalf("a Read did not return within %v", dlGuard)
		return "", nil
	}
}

func TestReadDeadlines(t *testing.T) {
	t.Run("a deadline with nothing sent", func(t *testing.T) {
		c, _ := dlPair(t)
		c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if s, err := dlRead(t, c, nil); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read: %q, %v; want os.ErrDeadlineExceeded", s, err)
		}
	})
	t.Run("a deadline moved into the past wakes a waiting Read", func(t *testing.T) {
		c, _ := dlPair(t)
		s, err := dlRead(t, c, func() {
			time.Sleep(50 * time.Millisecond) // the Read waits by now, or soon will
			c.SetReadDeadline(time.Unix(1, 0))
		})
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read: %q, %v; want os.ErrDeadlineExceeded", s, err)
		}
	})
	t.Run("a passed deadline holds what waits, the stream goes on after it", func(t *testing.T) {
		c, peer := dlPair(t)
		c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
		if _, err := dlRead(t, c, nil); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("first Read: %v; want os.ErrDeadlineExceeded", err)
		}
		if _, err := peer.Write([]byte("after\n")); err != nil {
			t.Fatal(err)
		}
		// As a net.Conn: a passed deadline fails a Read even with data there.
		time.Sleep(50 * time.Millisecond)
		if s, err := dlRead(t, c, nil); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read past the deadline with data waiting: %q, %v; want os.ErrDeadlineExceeded", s, err)
		}
		c.SetReadDeadline(time.Time{})
		if s, err := dlRead(t, c, nil); err != nil || s != "after\n" {
			t.Fatalf("Read after the deadline was cleared: %q, %v; want %q", s, err, "after\n")
		}
	})
	t.Run("the peer's end comes after its data", func(t *testing.T) {
		c, peer := dlPair(t)
		peer.Write([]byte("last words"))
		peer.Close()
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "last words" {
			t.Fatalf("ReadAll: %q, %v", got, err)
		}
	})
	t.Run("Close wakes a waiting Read", func(t *testing.T) {
		c, _ := dlPair(t)
		_, err := dlRead(t, c, func() {
			time.Sleep(50 * time.Millisecond)
			c.Close()
		})
		if err == nil {
			t.Fatal("a Read woken by Close reported no error")
		}
	})
	t.Run("lines in and out", func(t *testing.T) {
		c, peer := dlPair(t)
		go io.Copy(peer, peer) // an echo
		br := bufio.NewReader(c)
		for i := range 200 {
			msg := string(rune('a'+i%26)) + " line\n"
			c.SetReadDeadline(time.Now().Add(dlGuard))
			if _, err := c.Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
			if got, err := br.ReadString('\n'); err != nil || got != msg {
				t.Fatalf("echo %d: %q, %v; want %q", i, got, err, msg)
			}
		}
	})
}

// endless is a stream that always has more to give, and counts it.
type endless struct {
	net.Conn
	given atomic.Int64
}

func (e *endless) Read(p []byte) (int, error) {
	e.given.Add(int64(len(p)))
	return len(p), nil
}

func (e *endless) Close() error { return nil }

// What nobody reads stays in the stream under the wrapper, beyond one read
// of it (io.Copy's 32 KiB): a runner printing without end cannot grow the
// engine's memory through an ssh stream nobody reads.
func TestReadDeadlinesBoundWhatTheyHold(t *testing.T) {
	src := &endless{}
	c := withReadDeadlines(src)
	defer c.Close()
	const bound = 32 << 10
	settled := func() int64 {
		t.Helper()
		last := int64(-1)
		for end := time.Now().Add(dlGuard); ; time.Sleep(20 * time.Millisecond) {
			n := src.given.Load()
			if n == last {
				return n
			}
			if time.Now().After(end) {
				t.Fatalf("the wrapper kept reading: %d bytes taken", n)
			}
			last = n
		}
	}
	first := settled()
	if first > bound {
		t.Fatalf("with nobody reading, the wrapper took %d bytes; want at most %d", first, bound)
	}
	// Reading makes room: it takes more, and holds no more than the bound.
	const read = 40 << 10
	if _, err := io.ReadFull(c, make([]byte, read)); err != nil {
		t.Fatal(err)
	}
	if n := settled(); n <= first || n-read > bound {
		t.Fatalf("after %d bytes were read, %d taken (%d before); want more, and at most %d held", read, n, first, bound)
	}
}

// BenchmarkReadDeadlines is one line echoed over a Unix socket, read
// directly and through withReadDeadlines: what the wrapper adds to each
// warm cell on the ssh fast path (go test -run XXX -bench ReadDeadlines
// ./backends: ~4.5 µs on the 2-core machine, 2026-12-03; a buffered
// hand-off in place of net.Pipe measured the same).
func BenchmarkReadDeadlines(b *testing.B) {
	for _, wrap := range []bool{false, true} {
		b.Run(map[bool]string{false: "direct", true: "wrapped"}[wrap], func(b *testing.B) {
			c, peer := dlSockets(b)
			if wrap {
				c = withReadDeadlines(c)
			}
			go io.Copy(peer, peer)
			br := bufio.NewReader(c)
			msg := []byte(`{"op": "cell", "id": "c0123456789abcdef", "code": "1"}` + "\n")
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := br.ReadSlice('\n'); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
