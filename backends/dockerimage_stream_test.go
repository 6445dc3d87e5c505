package backends_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
)

// A kernel's own container is made by this engine on this machine, so its
// streams go straight to the socket through the container's root: no relay
// exec is opened, and the stream is a real socket (deadlines and all).
// A link the kernel plants on the way is never followed to this host: an
// absolute link would name a socket of the host, and the engine would
// connect to it as the kernel's runner.
func TestSandboxStreamsSkipTheRelayAndFollowNoLink(t *testing.T) {
	b, err := backends.NewImageSandbox("docker-image://"+dockertest.Image(t), backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	env, err := b.Provision(context.Background(), "streams/default@x")
	if err != nil {
		t.Fatal(err)
	}
	relays := env.(interface{ RelayExecs() []string })
	dialer := backends.StreamsOf(env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A socket of this host, at a path the container can name too.
	hostDir, err := os.MkdirTemp("/tmp", "kd-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostDir) })
	hostSock := filepath.Join(hostDir, "engine.sock")
	l, err := net.Listen("unix", hostSock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	reached := make(chan struct{}, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			reached <- struct{}{}
			c.Close()
		}
	}()

	// In the container: a listener that echoes, a link to the host's
	// socket where a runner's socket would be, and a linked dir.
	res, err := env.Execute(ctx, fmt.Sprintf(`mkdir -p /tmp/k/real /tmp/k/planted && ln -s %s /tmp/k/planted/sock && ln -s %s /tmp/k/hostdir && ln -s /tmp/k/real /tmp/k/linked
setsid python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind("/tmp/k/real/sock"); s.listen(4)
while True:
    c, _ = s.accept(); c.sendall(b"runner " + c.recv(64))
' </dev/null >/dev/null 2>&1 &
for i in $(seq 200); do [ -S /tmp/k/real/sock ] && exit 0; sleep 0.05; done; exit 1`, hostSock, hostDir), backends.ExecOptions{})
	if err != nil || res.ReturnCode != 0 {
		t.Fatalf("set up the container: %v %+v", err, res)
	}

	c, err := dialer.DialUnix(ctx, "/tmp/k/real/sock")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := len(relays.RelayExecs()); n != 0 {
		t.Errorf("%d relay execs for a stream to a kernel's own container, want none", n)
	}
	if _, ok := c.(*net.UnixConn); !ok {
		t.Errorf("the stream is a %T, want the socket itself", c)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	c.Write([]byte("hello\n"))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "runner hello\n" {
		t.Fatalf("through the stream: %q, %v", line, err)
	}

	for _, p := range []string{"/tmp/k/planted/sock", hostDir + "/engine.sock", "/tmp/k/hostdir/engine.sock", "/tmp/k/linked/sock", "/tmp/k/../k/real/sock"} {
		if c, err := dialer.DialUnix(ctx, p); err == nil {
			c.Close()
			if !strings.Contains(p, "linked") {
				t.Errorf("DialUnix(%s) connected", p)
			}
		}
	}
	select {
	case <-reached:
		t.Fatal("a link planted in the container reached this host's socket")
	case <-time.After(200 * time.Millisecond):
	}
}
