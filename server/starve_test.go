package server_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/server"
	"github.com/kerneldeck/kerneldeck/wire"
)

// flooder holds connections open as another user: it opens n, waits a
// moment on each for a refusal line, prints one line per connection
// ("open" or what the engine said), and keeps the open ones until its
// stdin closes.
const flooder = `
import socket, sys
path, n = sys.argv[1], int(sys.argv[2])
held = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.settimeout(0.3)
    try:
        got = s.recv(4096).decode().strip()
    except socket.timeout:
        got = "open"
    print(got or "closed", flush=True)
    held.append(s)
sys.stdin.read()
`

// One member of the group cannot take the engine from its own user: its
// connections are bounded, and the engine's user still connects.
func TestConnectionFloodLeavesRoomForTheEngine(t *testing.T) {
	needRoot(t)
	eng := newEngine(t)
	path := filepath.Join(shared(t), "run", wire.SocketName)
	serve(t, eng, server.Options{Path: path, AllowGroup: "users", SilentTimeout: time.Minute})
	const n = server.MaxConnsPerMember + 8
	cmd := exec.Command("/usr/bin/python3", "-c", flooder, path, fmt.Sprint(n))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{100}}}
	cmd.Dir = "/"
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	br := bufio.NewReader(out)
	var opened, refused int
	for i := 0; i < n; i++ {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the flooder after %d connections: %v", i, err)
		}
		switch {
		case strings.TrimSpace(line) == "open":
			opened++
		case strings.Contains(line, "the most one member of the group may have"):
			refused++
		default:
			t.Fatalf("connection %d of the member: %q", i, line)
		}
	}
	if opened != server.MaxConnsPerMember || refused != n-server.MaxConnsPerMember {
		t.Fatalf("the member opened %d and was refused %d, want %d and %d", opened, refused, server.MaxConnsPerMember, n-server.MaxConnsPerMember)
	}
	// While the member holds its connections, the engine's user is served.
	if h := dial(t, path).call(map[string]any{"id": "h", "op": "hello"}); h["op"] != "hello" {
		t.Fatalf("the engine's user while a member floods: %v", h)
	}
}

// A connection that says nothing is closed, and told why.
func TestSilentConnectionIsClosed(t *testing.T) {
	eng := newEngine(t)
	path := filepath.Join(t.TempDir(), "run", wire.SocketName)
	serve(t, eng, server.Options{Path: path, SilentTimeout: 300 * time.Millisecond})
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.Contains(line, "sent nothing for 300ms") {
		t.Fatalf("a silent connection got %q %v, want an error line saying it was closed", line, err)
	}
	if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
		t.Fatal("the silent connection is still open")
	}
	// One that speaks at once is served past the timeout.
	ok := dial(t, path)
	ok.c.Write([]byte("\n"))
	time.Sleep(600 * time.Millisecond)
	if h := ok.call(map[string]any{"id": "h", "op": "hello"}); h["op"] != "hello" {
		t.Fatalf("a connection that spoke at once: %v", h)
	}
}

// A client that hands over blocking pipes and never reads its stdout
// cannot keep the engine from shutting down.
func TestBlockingPipesCannotHoldShutdown(t *testing.T) {
	eng := newEngine(t)
	path := filepath.Join(t.TempDir(), "run", wire.SocketName)
	s := serve(t, eng, server.Options{Path: path}) // its cleanup checks what Serve returned
	_, inW, _ := handOver(t, path, false)          // its stdout is never read
	// Far more answers than the pipe holds: the engine's writer is stuck.
	go func() {
		for i := 0; i < 2000; i++ {
			if _, err := fmt.Fprintf(inW, `{"id":"k%d","op":"kernels"}`+"\n", i); err != nil {
				return
			}
		}
	}()
	time.Sleep(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx, "the test stops the engine") }()
	select {
	case err := <-shut:
		// Its pipes are polled, so even its connection ended: Shutdown
		// did not have to give up on it.
		if err != nil && strings.Contains(err.Error(), "did not end") {
			t.Errorf("Shutdown: %v, want the stuck connection ended", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Shutdown was still waiting a minute after its deadline, held by a client's blocking pipe")
	}
}
