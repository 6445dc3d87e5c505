package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/pyecho"
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

// pyloopFloor is that loop, driven from Go: the floor of a warm cell, and,
// started anew, the floor of a cold start (an interpreter's start, a socket
// and one cell).
type pyloopFloor struct {
	cmd    *exec.Cmd
	python string
	lines
}

// lines is a connection that answers a line with a line.
type lines struct {
	conn net.Conn
	r    *bufio.Reader
}

// roundTrips writes req n times, each time reading the answer line and
// checking it with ok, and returns each round trip's latency.
func (l lines) roundTrips(n int, req []byte, what string, ok func(answer []byte) bool) ([]time.Duration, error) {
	return timeEach(n, func() error {
		if _, err := l.conn.Write(req); err != nil {
			return err
		}
		line, err := l.r.ReadBytes('\n')
		if err != nil || !ok(line) {
			return fmt.Errorf("%s answered %q (%v)", what, line, err)
		}
		return nil
	})
}

// launchPyloop starts the exec loop on a socket in a new private dir and
// connects to it; stop kills it and removes the dir. With chain it is
// started through spawnChainScript, as a spawn starts a runner, and cmd is
// the bash that has ended; else Go starts the interpreter itself.
func launchPyloop(python string, chain bool) (cmd *exec.Cmd, l lines, stop func(), err error) {
	dir, err := os.MkdirTemp("", "kdfloor")
	if err != nil {
		return nil, lines{}, nil, err
	}
	stops := []func(){func() { os.RemoveAll(dir) }}
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	sock := filepath.Join(dir, "s")
	if chain {
		cmd = exec.Command("bash", "-c", spawnChainScript, python, pyloopScript, sock)
		// The watcher and the loop stay in bash's group, killed whole.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, err := cmd.CombinedOutput() // bash ends once the loop said it is ready
		if cmd.Process != nil {
			stops = append(stops, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
		}
		if err != nil {
			return nil, lines{}, nil, fmt.Errorf("the exec loop started through bash and a watcher: %w %q", err, out)
		}
	} else {
		cmd = exec.Command(python, "-c", pyloopScript, sock)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, lines{}, nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, lines{}, nil, fmt.Errorf("start the Python exec loop: %w", err)
		}
		stops = append(stops, func() { cmd.Process.Kill(); cmd.Wait() })
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
			return nil, lines{}, nil, fmt.Errorf("the Python exec loop did not start: %q %v", line, err)
		}
	}
	conn, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return nil, lines{}, nil, err
	}
	stops = append(stops, func() { conn.Close() })
	return cmd, lines{conn, bufio.NewReader(conn)}, stop, nil
}

func startPyloop(t *tb, python string) (*pyloopFloor, error) {
	cmd, l, stop, err := launchPyloop(python, false)
	if err != nil {
		return nil, err
	}
	t.Cleanup(stop)
	return &pyloopFloor{cmd: cmd, python: python, lines: l}, nil
}

func (f *pyloopFloor) key() string              { return "floor.pyloop" }
func (f *pyloopFloor) cpuRoots() []int          { return []int{f.cmd.Process.Pid} }
func (f *pyloopFloor) trips() (tripCount, bool) { return tripCount{}, false }

func (f *pyloopFloor) warm(_ context.Context, n int) ([]time.Duration, error) {
	return pyloopCells(f.lines, n)
}

// pyloopCells runs n cells of `1` on the exec loop l.
func pyloopCells(l lines, n int) ([]time.Duration, error) {
	return l.roundTrips(n, []byte(`{"code": "1"}`+"\n"), "the Python exec loop", func(line []byte) bool {
		var ans struct{ Status, Stdout string }
		return json.Unmarshal(line, &ans) == nil && ans.Stdout == "1\n"
	})
}

// cold starts a new loop and runs its first cell: what a cold start of
// this design cannot go under (the interpreter's own start included).
func (f *pyloopFloor) cold(context.Context) (time.Duration, tripCount, error) {
	return pyloopCold(f.python, false)
}

// pyloopCold times a new exec loop's start (see launchPyloop) and first
// cell.
func pyloopCold(python string, chain bool) (time.Duration, tripCount, error) {
	start := time.Now()
	_, l, stop, err := launchPyloop(python, chain)
	if err != nil {
		return 0, tripCount{}, err
	}
	defer stop()
	if _, err := pyloopCells(l, 1); err != nil {
		return 0, tripCount{}, err
	}
	return time.Since(start), tripCount{}, nil
}

// spawnChainScript starts the exec loop the way a spawn starts a runner:
// bash, a watcher subshell that stays the interpreter's parent (the
// spawn's keeps its exit status), the interpreter in the background, and
// the answer once the loop says it is ready. $0 is the interpreter, $1 the
// loop's program, $2 its socket.
const spawnChainScript = `exec 5< <( exec 2>/dev/null
  "$0" -c "$1" "$2" </dev/null &
  wait )
read -r -u 5 line && [ "$line" = ready ]`

// spawnChainFloor is the exec loop's cold start through spawnChainScript:
// what a cold start of this design costs before any of kerneldeck's own
// work (the runner's setup, its confinement, the authentication), on this
// machine, where a fork may cost milliseconds. It has no warm figure (its
// cells are the exec loop's).
type spawnChainFloor struct {
	floor
	python string
}

func (spawnChainFloor) key() string     { return "floor.spawnchain" }
func (spawnChainFloor) cpuRoots() []int { return nil }

func (spawnChainFloor) warm(context.Context, int) ([]time.Duration, error) { return nil, nil }

func (f spawnChainFloor) cold(context.Context) (time.Duration, tripCount, error) {
	return pyloopCold(f.python, true)
}

// streamlocalFloor is one line echoed over a kept direct-streamlocal
// channel of an open x/crypto/ssh connection: the least a warm cell costs
// over ssh in this design (kerneldeck's ssh fast path is such a channel).
type streamlocalFloor struct {
	floor
	lines
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
	if err := sess.Start("exec python3 -c " + backends.ShellQuote(pyecho.Script) + " " + backends.ShellQuote(sock)); err != nil {
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
	return &streamlocalFloor{lines: lines{conn, bufio.NewReader(conn)}, roots: roots}, nil
}

func (f *streamlocalFloor) key() string     { return "floor.ssh.streamlocal" }
func (f *streamlocalFloor) cpuRoots() []int { return f.roots() }

func (f *streamlocalFloor) warm(_ context.Context, n int) ([]time.Duration, error) {
	req := []byte(`{"op": "cell", "code": "1"}` + "\n")
	return f.roundTrips(n, req, "the echo over streamlocal", func(line []byte) bool { return bytes.Equal(line, req) })
}
