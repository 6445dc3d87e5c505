package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// pyloopScript is the least a persistent Python kernel of this design can
// do per cell: read a JSON line from a Unix socket, compile and run the
// code with stdout captured, and write a JSON line back.
const pyloopScript = `import io, json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(1)
print("ready", flush=True)
c, _ = s.accept()
ns = {"__name__": "__main__"}
for line in c.makefile("rb"):
    req = json.loads(line)
    out, old = io.StringIO(), sys.stdout
    sys.stdout = out
    try:
        exec(compile(req["code"], "<cell>", "single"), ns)
        status = "ok"
    except BaseException:
        status = "error"
    finally:
        sys.stdout = old
    c.sendall((json.dumps({"status": status, "stdout": out.getvalue()}) + "\n").encode())
`

// pyloopFloor is that loop, driven from Go: the floor of a warm cell.
type pyloopFloor struct {
	cmd  *exec.Cmd
	conn net.Conn
	r    *bufio.Reader
}

func startPyloop(t *tb, python string) (*pyloopFloor, error) {
	dir, err := os.MkdirTemp("", "kdfloor")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	cmd := exec.Command(python, "-c", pyloopScript, sock)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the Python exec loop: %w", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		return nil, fmt.Errorf("the Python exec loop did not start: %q %v", line, err)
	}
	conn, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { conn.Close() })
	return &pyloopFloor{cmd: cmd, conn: conn, r: bufio.NewReader(conn)}, nil
}

func (f *pyloopFloor) key() string              { return "floor.pyloop" }
func (f *pyloopFloor) cpuRoots() []int          { return []int{f.cmd.Process.Pid} }
func (f *pyloopFloor) trips() (tripCount, bool) { return tripCount{}, false }
func (f *pyloopFloor) cold(context.Context) (time.Duration, tripCount, error) {
	return 0, tripCount{}, errNoCold
}

func (f *pyloopFloor) warm(_ context.Context, n int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, n)
	req := []byte(`{"code": "1"}` + "\n")
	for range n {
		start := time.Now()
		if _, err := f.conn.Write(req); err != nil {
			return lat, err
		}
		line, err := f.r.ReadBytes('\n')
		lat = append(lat, time.Since(start))
		var ans struct{ Status, Stdout string }
		if err != nil || json.Unmarshal(line, &ans) != nil || ans.Stdout != "1\n" {
			return lat, fmt.Errorf("the Python exec loop answered %q (%v)", line, err)
		}
	}
	return lat, nil
}

// echoScript answers every line it reads on a Unix socket with the same
// line: the far end of the ssh streamlocal floor.
const echoScript = `import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(1)
print("ready", flush=True)
c, _ = s.accept()
for line in c.makefile("rb"):
    c.sendall(line)
`

// streamlocalFloor is one line echoed over a kept direct-streamlocal
// channel of an open x/crypto/ssh connection: the least a warm cell costs
// over ssh in this design (kerneldeck's ssh fast path is such a channel).
type streamlocalFloor struct {
	conn  net.Conn
	r     *bufio.Reader
	roots func() []int
}

func startStreamlocal(t *tb, client *ssh.Client, dir string, roots func() []int) (*streamlocalFloor, error) {
	sock := dir + "/echo"
	sess, err := client.NewSession()
	if err != nil {
		return nil, err
	}
	out, err := sess.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := sess.Start("exec python3 -c " + shellQuote(echoScript) + " " + shellQuote(sock)); err != nil {
		return nil, fmt.Errorf("start the echo socket: %w", err)
	}
	t.Cleanup(func() { sess.Close() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		return nil, fmt.Errorf("the echo socket did not start: %q %v", line, err)
	}
	conn, err := client.Dial("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("direct-streamlocal to %s: %w", sock, err)
	}
	t.Cleanup(func() { conn.Close() })
	return &streamlocalFloor{conn: conn, r: bufio.NewReader(conn), roots: roots}, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (f *streamlocalFloor) key() string              { return "floor.ssh.streamlocal" }
func (f *streamlocalFloor) cpuRoots() []int          { return f.roots() }
func (f *streamlocalFloor) trips() (tripCount, bool) { return tripCount{}, false }
func (f *streamlocalFloor) cold(context.Context) (time.Duration, tripCount, error) {
	return 0, tripCount{}, errNoCold
}

func (f *streamlocalFloor) warm(_ context.Context, n int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, n)
	req := []byte(`{"op": "cell", "code": "1"}` + "\n")
	for range n {
		start := time.Now()
		if _, err := f.conn.Write(req); err != nil {
			return lat, err
		}
		line, err := f.r.ReadBytes('\n')
		lat = append(lat, time.Since(start))
		if err != nil || string(line) != string(req) {
			return lat, fmt.Errorf("the echo over streamlocal answered %q (%v)", line, err)
		}
	}
	return lat, nil
}
