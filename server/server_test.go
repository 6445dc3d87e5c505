package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/server"
	"github.com/kerneldeck/kerneldeck/wire"
)

// newEngine is an engine on the local backend, and the others given.
func newEngine(t *testing.T, more ...backends.Env) *engine.Engine {
	t.Helper()
	eng, err := engine.New(engine.Config{Backends: append([]backends.Env{backends.NewLocal(t.TempDir())}, more...), StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		eng.Close(ctx, false)
	})
	return eng
}

// serve listens on path and serves until the test ends.
func serve(t *testing.T, eng *engine.Engine, o server.Options) *server.Server {
	t.Helper()
	s, err := server.Listen(eng, o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Shutdown(ctx, "test over")
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

// shared is a dir every user can traverse, for sockets other users reach.
func shared(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kdsrv")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

type client struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, path string) *client {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c, br: bufio.NewReader(c)}
}

func (c *client) send(req map[string]any) {
	c.t.Helper()
	b, _ := json.Marshal(req)
	if _, err := c.c.Write(append(b, '\n')); err != nil {
		c.t.Fatal(err)
	}
}

// next reads the next line that is not an event.
func (c *client) next() map[string]any {
	c.t.Helper()
	c.c.SetReadDeadline(time.Now().Add(60 * time.Second))
	for {
		raw, err := c.br.ReadBytes('\n')
		if err != nil {
			c.t.Fatalf("read: %v (after %q)", err, raw)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			c.t.Fatalf("line %q: %v", raw, err)
		}
		if m["op"] != "event" {
			return m
		}
	}
}

func (c *client) call(req map[string]any) map[string]any {
	c.t.Helper()
	c.send(req)
	return c.next()
}

func TestTwoClientsOneEngine(t *testing.T) {
	eng := newEngine(t)
	dir := filepath.Join(t.TempDir(), "run")
	path := filepath.Join(dir, wire.SocketName)
	serve(t, eng, server.Options{Path: path, Version: "test"})
	for p, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, path: 0o600 | os.ModeSocket} {
		if st, err := os.Lstat(p); err != nil || st.Mode() != want {
			t.Fatalf("%s: mode %v (%v), want %v", p, st.Mode(), err, want)
		}
	}
	a, b := dial(t, path), dial(t, path)
	if h := a.call(map[string]any{"id": "h", "op": "hello"}); h["op"] != "hello" || h["you"].(map[string]any)["uid"] != float64(os.Geteuid()) {
		t.Fatalf("hello: %v", h)
	}
	ra := a.call(map[string]any{"id": "1", "op": "execute", "owner": "alice", "code": "x = 'a'; print(x)"})
	rb := b.call(map[string]any{"id": "1", "op": "execute", "owner": "bob", "code": "print('b')"})
	if ra["stdout"] != "a\n" || rb["stdout"] != "b\n" {
		t.Fatalf("results %v / %v", ra, rb)
	}
	// Each sees the other's kernel: one engine.
	if ks := b.call(map[string]any{"id": "k", "op": "kernels"}); ks["count"] != float64(2) {
		t.Fatalf("kernels seen by b: %v", ks)
	}
	// A client that leaves kills nothing.
	a.c.Close()
	time.Sleep(100 * time.Millisecond)
	if again := b.call(map[string]any{"id": "2", "op": "execute", "owner": "alice", "code": "print(x)"}); again["stdout"] != "a\n" {
		t.Fatalf("alice's kernel after her client left: %v", again)
	}
}

func TestOneEnginePerSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", wire.SocketName)
	serve(t, newEngine(t), server.Options{Path: path})
	_, err := server.Listen(newEngine(t), server.Options{Path: path})
	if !errors.Is(err, server.ErrInUse) || !strings.Contains(err.Error(), "--attach "+path) || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Fatalf("a second engine on the same socket: %v, want ErrInUse saying how to attach", err)
	}
}

func TestStaleSocketIsReplaced(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	os.Mkdir(dir, 0o700)
	path := filepath.Join(dir, wire.SocketName)
	// A dead engine's socket: bound, then its process gone (not unlinked).
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatal("the stale socket is not there")
	}
	serve(t, newEngine(t), server.Options{Path: path})
	c := dial(t, path)
	if h := c.call(map[string]any{"id": "h", "op": "hello"}); h["op"] != "hello" {
		t.Fatalf("hello on the replacing engine: %v", h)
	}
}

func TestRefusesWhatItDidNotMake(t *testing.T) {
	t.Run("not a socket", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "run")
		os.Mkdir(dir, 0o700)
		path := filepath.Join(dir, wire.SocketName)
		os.WriteFile(path, []byte("precious"), 0o600)
		if _, err := server.Listen(newEngine(t), server.Options{Path: path}); err == nil || !strings.Contains(err.Error(), "not a socket") {
			t.Fatalf("Listen over a regular file: %v", err)
		}
		if data, _ := os.ReadFile(path); string(data) != "precious" {
			t.Fatal("the file was replaced")
		}
	})
	t.Run("shared dir", func(t *testing.T) {
		dir := shared(t)
		if _, err := server.Listen(newEngine(t), server.Options{Path: filepath.Join(dir, wire.SocketName)}); err == nil || !strings.Contains(err.Error(), "mode") {
			t.Fatalf("Listen in a 0755 dir: %v", err)
		}
		if st, _ := os.Stat(dir); st.Mode().Perm() != 0o755 {
			t.Fatalf("the existing dir's mode was changed to %v", st.Mode().Perm())
		}
	})
	t.Run("relative", func(t *testing.T) {
		if _, err := server.Listen(newEngine(t), server.Options{Path: "engine.sock"}); err == nil || !strings.Contains(err.Error(), "absolute") {
			t.Fatalf("Listen on a relative path: %v", err)
		}
	})
}

// clientAs runs a Python client as another user: it sends each request
// line and prints every line it gets, until the server closes or 2 s pass
// with nothing new.
func clientAs(t *testing.T, path string, uid, gid int, groups []uint32, requests ...string) (lines []map[string]any, err error) {
	t.Helper()
	// The client reads until every request has its final answer (started
	// and output lines come first): a container's kernel may take seconds
	// to start on a loaded machine, so a pause is no sign of the end.
	script := `
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
pending = set()
try:
    for r in sys.argv[2:]:
        pending.add(json.loads(r).get("id"))
        s.sendall(r.encode() + b"\n")
except OSError:
    pass  # refused: read what the server said
deadline = time.monotonic() + 120
s.settimeout(1)
buf = b""
while pending and time.monotonic() < deadline:
    try:
        chunk = s.recv(65536)
    except socket.timeout:
        continue
    except OSError:
        break
    if not chunk:
        break
    buf += chunk
    for line in buf.split(b"\n")[:-1]:
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if isinstance(m, dict) and m.get("op") not in ("started", "output", "event"):
            pending.discard(m.get("id"))
sys.stdout.write(buf.decode())
`
	cmd := exec.Command("/usr/bin/python3", append([]string{"-c", script, path}, requests...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	for l := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			lines = append(lines, m)
		}
	}
	return lines, nil
}

const nobody = 65534

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
}

// Another OS user is refused; with --allow-group, a member is admitted but
// held to its own owner.
func TestSecondUser(t *testing.T) {
	needRoot(t)
	users := 100 // Debian's "users" group
	box, err := backends.NewImageSandbox("docker-image://"+dockertest.Image(t), backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { box.Close() })
	sandbox := box.URI()
	eng := newEngine(t, box)
	watch := eng.Subscribe(1 << 10)
	defer watch.Close()

	t.Run("refused without allow-group", func(t *testing.T) {
		path := filepath.Join(shared(t), "run", wire.SocketName)
		serve(t, eng, server.Options{Path: path})
		_, err := clientAs(t, path, nobody, nobody, nil, `{"id":"h","op":"hello"}`)
		if err == nil || !strings.Contains(err.Error(), "Permission denied") {
			t.Fatalf("nobody connecting to a 0600 socket in a 0700 dir: %v, want permission denied", err)
		}
	})
	t.Run("refused by its credentials", func(t *testing.T) {
		// A socket others can reach (a mistake of the operator): the peer
		// check still refuses them.
		base := shared(t)
		path := filepath.Join(base, "run", wire.SocketName)
		serve(t, eng, server.Options{Path: path})
		os.Chmod(filepath.Dir(path), 0o755)
		os.Chmod(path, 0o666)
		lines, err := clientAs(t, path, nobody, nobody, nil, `{"id":"h","op":"hello"}`)
		if err != nil || len(lines) != 1 || lines[0]["op"] != "error" || !strings.Contains(lines[0]["error"].(string), "refused") {
			t.Fatalf("nobody through an open socket: %v %v, want one refusal line", lines, err)
		}
		waitNotice(t, watch, "refused a connection from user nobody (uid 65534)")
	})
	t.Run("allow-group", func(t *testing.T) {
		base := shared(t)
		path := filepath.Join(base, "run", wire.SocketName)
		serve(t, eng, server.Options{Path: path, AllowGroup: "users"})
		if st, _ := os.Lstat(path); st.Mode().Perm() != 0o660 || st.Sys().(*syscall.Stat_t).Gid != uint32(users) {
			t.Fatalf("socket with --allow-group: mode %v group %d, want 0660 of users", st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Gid)
		}
		// The member runs two kernels at once; a member's default quota is
		// a quarter of the cap (TestOwnerQuota).
		if err := eng.SetOwnerQuota(2); err != nil {
			t.Fatal(err)
		}
		// Another user's kernels are on local?user=daemon.
		if uri, err := eng.MemberBackend("local", 1); err != nil || uri != "local?user=daemon" {
			t.Fatalf("MemberBackend(local, daemon) = %q, %v", uri, err)
		}
		root := dial(t, path)
		alice := root.call(map[string]any{"id": "a", "op": "execute", "owner": "alice", "code": "secret = 42"})
		aliceK := alice["kernel"].(map[string]any)["id"].(string)
		lines, err := clientAs(t, path, nobody, nobody, []uint32{uint32(users)},
			`{"id":"h","op":"hello"}`,
			`{"id":"mine","op":"execute","code":"import os; print('mine', os.getuid(), os.getgid())"}`,
			`{"id":"dial","op":"execute","code":`+fmt.Sprintf("%q", fmt.Sprintf("import socket\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(10)\ns.connect(%q)\nprint(s.recv(4096).decode())", path))+`}`,
			`{"id":"elsewhere","op":"execute","backend":"local?user=daemon","code":"print('daemon')"}`,
			`{"id":"named","op":"execute","backend":"local?user=nobody","code":"import os; print(os.getuid())"}`,
			`{"id":"sandboxed","op":"execute","backend":"`+sandbox+`","code":"import os; print('mine', os.getpid())"}`,
			`{"id":"steal","op":"execute","owner":"alice","code":"print(secret)"}`,
			fmt.Sprintf(`{"id":"kill","op":"kill","kernel":%q}`, aliceK),
			fmt.Sprintf(`{"id":"cells","op":"cells","kernel":%q}`, aliceK),
			`{"id":"ls","op":"kernels"}`)
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]map[string]any{}
		for _, l := range lines {
			if id, ok := l["id"].(string); ok {
				byID[id] = l
			}
		}
		if you := byID["h"]["you"].(map[string]any); you["owner"] != "nobody" || you["uid"] != float64(nobody) {
			t.Fatalf("hello to a group member: %v", byID["h"])
		}
		// On the local backend of a root engine its kernel runs as its own
		// OS user, never as the engine's (nor as one it names); in a
		// container of its own it runs too.
		if m := byID["mine"]; m["stdout"] != fmt.Sprintf("mine %d %d\n", nobody, nobody) || m["kernel"].(map[string]any)["backend"] != "local?user=nobody" {
			t.Fatalf("the member's own cell on the local backend: %v, want it run as nobody", m)
		}
		// Its kernel, as its own user, never reaches the engine: nobody
		// is not in users by /etc/group, so the socket's dir keeps it out
		// (a member that is would be refused as a kernel, as in
		// TestKernelIsNeverAdmittedAsTheEngine).
		if m := byID["dial"]; !strings.Contains(fmt.Sprint(m["stdout"]), "refused: it runs in a kernel") &&
			!strings.Contains(fmt.Sprint(m["traceback"]), "Permission denied") {
			t.Fatalf("the member's kernel dialing the engine: %v, want it kept out", m)
		}
		if m := byID["named"]; m["stdout"] != fmt.Sprintf("%d\n", nobody) {
			t.Fatalf("the member naming its own backend: %v", m)
		}
		if m := byID["elsewhere"]; m["op"] != "error" || !strings.Contains(m["error"].(string), "not allowed") {
			t.Fatalf("the member naming another user's backend: %v, want a refusal", m)
		}
		if m := byID["sandboxed"]; !strings.HasPrefix(fmt.Sprint(m["stdout"]), "mine ") || m["kernel"].(map[string]any)["backend"] != sandbox {
			t.Fatalf("the member's own cell in a container: %v", m)
		}
		for _, id := range []string{"steal", "kill", "cells"} {
			if byID[id]["op"] != "error" || !strings.Contains(byID[id]["error"].(string), "not allowed") {
				t.Errorf("the member's %s: %v, want a refusal", id, byID[id])
			}
		}
		ls := byID["ls"]
		for _, k := range ls["kernels"].([]any) {
			if k.(map[string]any)["owner"] != "nobody" {
				t.Fatalf("the member's kernels listing: %v, want only its own", ls)
			}
		}
		if ls["count"] != float64(2) {
			t.Fatalf("the member's kernels listing: %v, want its two", ls)
		}
		if again := root.call(map[string]any{"id": "a2", "op": "execute", "owner": "alice", "code": "print(secret)"}); again["stdout"] != "42\n" {
			t.Fatalf("alice after the member's attempts: %v", again)
		}
		// Not in the group: refused at the socket.
		if _, err := clientAs(t, path, nobody, nobody, nil, `{"id":"h","op":"hello"}`); err == nil {
			t.Fatal("a user outside the group reached the engine")
		}
	})
}

func waitNotice(t *testing.T, sub *engine.Subscription, want string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-sub.C:
			if ev.Type == engine.EventNotice && strings.Contains(ev.Detail, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no notice event saying %q", want)
		}
	}
}

// Shutdown tells the clients, lets a running cell finish, and removes the
// socket.
func TestShutdownTellsClients(t *testing.T) {
	eng := newEngine(t)
	path := filepath.Join(t.TempDir(), "run", wire.SocketName)
	s := serve(t, eng, server.Options{Path: path})
	c := dial(t, path)
	c.send(map[string]any{"id": "slow", "op": "execute", "code": "import time; time.sleep(0.5); print('finished')"})
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go s.Shutdown(ctx, "SIGTERM: the engine is stopping")
	bye := c.next()
	if bye["op"] != "goodbye" || bye["reason"] != "SIGTERM: the engine is stopping" {
		t.Fatalf("first line after shutdown: %v, want goodbye", bye)
	}
	if res := c.next(); res["id"] != "slow" || res["stdout"] != "finished\n" {
		t.Fatalf("the running cell after goodbye: %v, want its result", res)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the socket is still there after shutdown")
		}
	}
	if _, err := net.Dial("unix", path); err == nil {
		t.Fatal("a client connected after shutdown")
	}
}

// A client on this machine can hand the engine its stdin and stdout: the
// engine then reads requests from the one and answers on the other, and
// says on the socket when it is done.
func TestStdioHandOver(t *testing.T) {
	eng := newEngine(t)
	path := filepath.Join(t.TempDir(), "run", wire.SocketName)
	serve(t, eng, server.Options{Path: path})
	c, inW, outR := handOver(t, path, true)
	inW.Write([]byte(`{"id":"1","op":"execute","code":"print('through the pipe')"}` + "\n"))
	inW.Close()
	out := bufio.NewReader(outR)
	sawEvent, sawResult := false, false
	for {
		line, err := out.ReadBytes('\n')
		if err != nil {
			break // the engine closed its end: done
		}
		var m map[string]any
		json.Unmarshal(line, &m)
		switch m["op"] {
		case "event":
			sawEvent = true
		case "result":
			sawResult = m["stdout"] == "through the pipe\n"
		}
	}
	if !sawResult || !sawEvent {
		t.Fatalf("through the handed-over pipes: result %v, events %v", sawResult, sawEvent)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	ended, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.Contains(ended, `"op":"ended"`) || !strings.Contains(ended, `"goodbye":""`) {
		t.Fatalf("the socket after the pipes ended: %q %v", ended, err)
	}
}

// handOver connects to path and hands the engine the read end of one pipe
// as its stdin and the write end of another as its stdout, as headless
// --connect does (nonblocking: the pipes as it makes them; else blocking,
// as a hostile client may). It returns the connection and the ends the
// test keeps, all closed when it ends.
func handOver(t *testing.T, path string, nonblocking bool) (c net.Conn, in, out *os.File) {
	t.Helper()
	inR, inW, _ := os.Pipe()
	outR, outW, _ := os.Pipe()
	t.Cleanup(func() { inW.Close(); outR.Close() })
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if nonblocking {
		syscall.SetNonblock(int(inR.Fd()), true)
		syscall.SetNonblock(int(outW.Fd()), true)
	}
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix([]byte(`{"op":"stdio","events":true}`+"\n"), syscall.UnixRights(int(inR.Fd()), int(outW.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	inR.Close() // the engine holds its own copies now
	outW.Close()
	return c, inW, outR
}
