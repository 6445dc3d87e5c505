package cli

// One engine, many clients, with the real binary: kerneldeck serve, agents
// on headless --connect, dashboards attached in tmux (here and over the
// real sshd), clients that die, and the engine's SIGTERM.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/proctest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
	"github.com/kerneldeck/kerneldeck/internal/tmuxtest"
)

// servedEngine is `kerneldeck serve` running on a socket of its own.
type servedEngine struct {
	t      *testing.T
	cmd    *exec.Cmd
	sock   string
	dirs   dashboardDirs
	stderr *syncBuffer
}

func startServe(t *testing.T, bin string, dirs dashboardDirs, args ...string) *servedEngine {
	t.Helper()
	sock := filepath.Join(filepath.Dir(dirs.state), "run", "engine.sock")
	cmd := exec.Command(bin, append([]string{"serve", "--listen", sock, "--state-dir", dirs.state, "--max-kernels", "4"}, args...)...)
	cmd.Env = dirs.env()
	se := &servedEngine{t: t, cmd: cmd, sock: sock, dirs: dirs, stderr: &syncBuffer{}}
	cmd.Stderr = se.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
		}
	})
	waitUntil(t, "the engine to serve", func() bool { return strings.Contains(se.stderr.String(), "serving the engine at") })
	return se
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(tmuxWait); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// agent is `kerneldeck headless --connect`, as an agent runs it: requests
// on its stdin, answers read from its stdout.
type agent struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	mu    sync.Mutex
	lines []map[string]any
	ended chan struct{}
	err   *syncBuffer
}

func startAgent(t *testing.T, bin string, env []string, args ...string) *agent {
	t.Helper()
	return startAgentAs(t, nil, bin, env, args...)
}

// startAgentAs is startAgent as another OS user (cred; nil: this one).
func startAgentAs(t *testing.T, cred *syscall.Credential, bin string, env []string, args ...string) *agent {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"headless"}, args...)...)
	cmd.Env = env
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	a := &agent{t: t, cmd: cmd, in: in, ended: make(chan struct{}), err: &syncBuffer{}}
	cmd.Stderr = a.err
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(a.ended)
		br := bufio.NewReader(out)
		for {
			raw, err := br.ReadBytes('\n')
			var m map[string]any
			if json.Unmarshal(raw, &m) == nil {
				a.mu.Lock()
				a.lines = append(a.lines, m)
				a.mu.Unlock()
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	return a
}

func (a *agent) send(req map[string]any) {
	a.t.Helper()
	b, _ := json.Marshal(req)
	if _, err := a.in.Write(append(b, '\n')); err != nil {
		a.t.Fatalf("agent stdin: %v", err)
	}
}

// answer waits for the line with id (and op, when given).
func (a *agent) answer(id string, op ...string) map[string]any {
	a.t.Helper()
	var got map[string]any
	waitUntil(a.t, "the answer to "+id, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, l := range a.lines {
			if l["id"] == id && (len(op) == 0 || l["op"] == op[0]) {
				got = l
				return true
			}
		}
		return false
	})
	return got
}

func (a *agent) seen(op string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.lines {
		if l["op"] == op {
			return true
		}
	}
	return false
}

// TestSharedEngine: serve, two agents of different owners, an attached
// dashboard that shows both and streams one agent's running cell; the
// dashboard SIGKILLed and an agent SIGKILLed mid-cell change nothing for
// the engine; SIGTERM tells the clients and leaves nothing running.
func TestSharedEngine(t *testing.T) {
	tmuxtest.Require(t)
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	se := startServe(t, bin, dirs)
	env := dirs.env()
	mark := filepath.Join(dirs.kernels, "go")

	// alice's agent does not dial again: it is told the engine stops.
	alice := startAgent(t, bin, env, "--connect", se.sock, "--no-reconnect")
	bob := startAgent(t, bin, env, "--connect", se.sock)
	bob.send(map[string]any{"id": "b1", "op": "execute", "owner": "bob", "code": "print('bob was here')"})
	if r := bob.answer("b1"); r["stdout"] != "bob was here\n" {
		t.Fatalf("bob's cell: %v", r)
	}
	// Alice's cell prints a tick every 0.2 s until the mark exists.
	alice.send(map[string]any{"id": "a1", "op": "execute", "owner": "alice", "code": fmt.Sprintf(
		"import os, time\ni = 0\nwhile not os.path.exists(%q):\n    i += 1\n    print('tick', i, flush=True)\n    time.sleep(0.2)\nprint('alice done')", mark)})

	// The dashboard attached as alice: her target, both owners' kernels,
	// her running cell's ticks as they come.
	dashEnv := envWithOverrides(env, map[string]string{"USER": "alice"})
	s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "--attach", se.sock, "--state-dir", dirs.state}, Env: dashEnv, Width: 200, Height: 40})
	screen := s.WaitScreen("both owners' kernels and alice's ticks", tmuxWait, func(screen string) bool {
		return findKernelRow(screen, "alice", "default")["STATE"] == "running" && findKernelRow(screen, "bob", "default") != nil &&
			strings.Contains(screen, "(another client)") && strings.Contains(screen, "tick ")
	})
	if h := headerLine(screen); !strings.Contains(h, "attached to "+se.sock) {
		t.Errorf("header %q, want it to say where the engine is", h)
	}
	first := tickCount(screen)
	s.WaitScreen("more ticks streamed", tmuxWait, func(screen string) bool { return tickCount(screen) > first })

	// SIGKILL the dashboard: alice's cell goes on, and ends once.
	dash := s.PID()
	syscall.Kill(dash, syscall.SIGKILL)
	waitProcessDead(t, dash)
	os.WriteFile(mark, nil, 0o600)
	res := alice.answer("a1")
	if !strings.HasSuffix(res["stdout"].(string), "alice done\n") || res["status"] != "success" {
		t.Fatalf("alice's cell after the dashboard was killed: %v", res)
	}
	aliceKernel := res["kernel"].(map[string]any)["id"].(string)

	// An agent killed mid-cell: its cell finishes once; cells returns it.
	mark2 := filepath.Join(dirs.kernels, "go2")
	carol := startAgent(t, bin, env, "--connect", se.sock)
	carol.send(map[string]any{"id": "c1", "op": "execute", "owner": "carol", "code": fmt.Sprintf(
		"import os, time\nwhile not os.path.exists(%q):\n    time.sleep(0.05)\nprint('carol finished')", mark2)})
	var carolKernel string
	waitUntil(t, "carol's cell to run", func() bool {
		bob.send(map[string]any{"id": "k", "op": "kernels"})
		time.Sleep(100 * time.Millisecond)
		bob.mu.Lock()
		defer bob.mu.Unlock()
		for i := len(bob.lines) - 1; i >= 0; i-- {
			if bob.lines[i]["op"] == "kernels" {
				for _, k := range bob.lines[i]["kernels"].([]any) {
					if km := k.(map[string]any); km["owner"] == "carol" && km["state"] == "running" {
						carolKernel = km["id"].(string)
						return true
					}
				}
				return false
			}
		}
		return false
	})
	carol.cmd.Process.Kill()
	carol.cmd.Wait()
	os.WriteFile(mark2, nil, 0o600)
	var cells []any
	waitUntil(t, "carol's cell recorded as finished", func() bool {
		id := fmt.Sprintf("cells-%d", time.Now().UnixNano())
		bob.send(map[string]any{"id": id, "op": "cells", "kernel": carolKernel})
		cells, _ = bob.answer(id)["cells"].([]any)
		return len(cells) == 1 && cells[0].(map[string]any)["running"] == false
	})
	c := cells[0].(map[string]any)
	if c["status"] != "success" || c["stdout"].(map[string]any)["head"] != "carol finished\n" {
		t.Fatalf("carol's cell record after her agent was killed: %v", c)
	}

	// SIGTERM: the clients are told, the kernels killed, nothing is left.
	se.cmd.Process.Signal(syscall.SIGTERM)
	if err := se.cmd.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v\n%s", err, se.stderr.String())
	}
	if !strings.Contains(se.stderr.String(), "stopped; killed 3 kernels") {
		t.Errorf("serve's stderr %q, want the kernels it killed", se.stderr.String())
	}
	<-alice.ended
	if !alice.seen("goodbye") {
		t.Error("alice's agent was not told that the engine stops")
	}
	alice.cmd.Wait()
	if code := alice.cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(alice.err.String(), "said goodbye") {
		t.Errorf("alice's agent exited %d with %q, want 1 saying the engine said goodbye", code, alice.err.String())
	}
	wantNoProcessesUnder(t, dirs.kernels)
	if _, err := os.Lstat(se.sock); !os.IsNotExist(err) {
		t.Errorf("the socket is still there after SIGTERM: %v", err)
	}
	_ = aliceKernel
}

// tickCount is the highest tick number on the screen.
func tickCount(screen string) int {
	n := 0
	for _, m := range tickLine.FindAllStringSubmatch(screen, -1) {
		if i, _ := strconv.Atoi(m[1]); i > n {
			n = i
		}
	}
	return n
}

var tickLine = regexp.MustCompile(`tick (\d+)`)

// A second engine on the same socket refuses and says how to attach.
func TestServeTwiceRefused(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	se := startServe(t, bin, dirs)
	cmd := exec.Command(bin, "serve", "--listen", se.sock, "--state-dir", dirs.state)
	cmd.Env = dirs.env()
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another engine is serving there") || !strings.Contains(string(out), "--attach "+se.sock) {
		t.Fatalf("a second serve: %v\n%s", err, out)
	}
	// The first still serves.
	a := startAgent(t, bin, dirs.env(), "--connect", se.sock)
	a.send(map[string]any{"id": "h", "op": "hello"})
	if h := a.answer("h"); h["op"] != "hello" {
		t.Fatalf("hello after the refused second engine: %v", h)
	}
}

// The dashboard with its engine serves it: an agent that connects lands in
// the dashboard the operator watches.
func TestDashboardServesItsEngine(t *testing.T) {
	tmuxtest.Require(t)
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	s := startDashboardIn(t, bin, dirs, 200, 30)
	sock := filepath.Join(dirs.state, "engine.sock")
	if h := headerLine(s.LastScreen()); !strings.Contains(h, "serving at "+sock) {
		t.Fatalf("header %q, want serving at %s", h, sock)
	}
	a := startAgent(t, bin, dirs.env(), "--connect", "--state-dir", dirs.state)
	a.send(map[string]any{"id": "1", "op": "execute", "owner": "agent", "code": "print('agent here')"})
	if r := a.answer("1"); r["stdout"] != "agent here\n" {
		t.Fatalf("the agent's cell: %v", r)
	}
	s.WaitScreen("the agent's kernel in the dashboard", tmuxWait, func(screen string) bool {
		return findKernelRow(screen, "agent", "default") != nil
	})
	a.in.Close()
	<-a.ended
	quitKillingKernels(s)
	wantExitKilled(t, s, "killed 1 kernel")
	wantNoProcessesUnder(t, dirs.kernels)
}

// A dashboard on a laptop attaches to the gateway's engine over ssh, by an
// ssh config alias.
func TestAttachOverSSH(t *testing.T) {
	tmuxtest.Require(t)
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	se := startServe(t, bin, dirs)
	a := agentWithAKernel(t, bin, dirs.env(), se.sock)
	cfg := srv.WriteSSHConfig(t, "gateway", u)
	s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "--attach", "ssh://gateway" + se.sock, "--ssh-config", cfg},
		Env: dirs.env(), Width: 200, Height: 30})
	screen := s.WaitScreen("the gateway's kernels", tmuxWait, func(screen string) bool {
		return findKernelRow(screen, "agent", "default") != nil
	})
	if h := headerLine(screen); !strings.Contains(h, "attached to ssh://gateway"+se.sock) {
		t.Errorf("header %q", h)
	}
	s.Keys("C-c")
	if code := s.WaitExit(tmuxWait); code != 0 || !strings.Contains(s.Stderr(), "detached from the engine") {
		t.Fatalf("quitting the attached dashboard: %d, %q", code, s.Stderr())
	}
	// The engine and its kernel are untouched.
	a.send(map[string]any{"id": "2", "op": "execute", "owner": "agent", "code": "print(x)"})
	if r := a.answer("2"); r["stdout"] != "1\n" {
		t.Fatalf("the agent's kernel after the dashboard detached: %v", r)
	}
}

// An attached dashboard whose engine is killed says so in its header,
// drops the dead engine's kernels and timers, and dials it again: when an
// engine serves there again, it shows that one's kernels, the killed
// engine's kernel among them (taken back).
func TestAttachedDashboardSaysTheEngineIsGoneAndComesBack(t *testing.T) {
	tmuxtest.Require(t)
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	se := startServe(t, bin, dirs)
	agentWithAKernel(t, bin, dirs.env(), se.sock)
	s := tmuxtest.Start(t, tmuxtest.Options{Args: []string{bin, "--attach", se.sock}, Env: dirs.env(), Width: 160, Height: 30})
	s.WaitScreen("the engine's kernel", tmuxWait, func(screen string) bool { return findKernelRow(screen, "agent", "default") != nil })
	se.cmd.Process.Kill()
	se.cmd.Wait()
	t.Cleanup(func() { killProcessesUnder(t, dirs.kernels) })
	screen := s.WaitScreen("the header to say the engine is gone", tmuxWait, func(screen string) bool {
		return strings.Contains(headerLine(screen), "ENGINE GONE, reconnecting")
	})
	if findKernelRow(screen, "agent", "default") != nil || strings.Contains(headerLine(screen), "kernels 1/") {
		t.Fatalf("the gone engine's kernels are still shown:\n%s", screen)
	}
	if !strings.Contains(screen, "the engine is gone (") {
		t.Errorf("the kernels pane does not say why it is empty:\n%s", screen)
	}

	// An engine serves there again: the dashboard is back on it by itself,
	// showing the kernel the new engine took back.
	se = startServe(t, bin, dirs)
	screen = s.WaitScreen("the kernel the new engine took back", tmuxWait, func(screen string) bool {
		return findKernelRow(screen, "agent", "default") != nil && !strings.Contains(headerLine(screen), "ENGINE GONE")
	})
	if h := headerLine(screen); !strings.Contains(h, "attached to "+se.sock) {
		t.Errorf("header after the engine came back: %q", h)
	}
	s.Keys("C-c")
	if code := s.WaitExit(tmuxWait); code != 0 || !strings.Contains(s.Stderr(), "detached from the engine") {
		t.Fatalf("quitting after the engine came back: %d, %q", code, s.Stderr())
	}
}

// agentWithAKernel connects an agent to the engine at sock and gives it a
// kernel, owner agent, holding x = 1.
func agentWithAKernel(t *testing.T, bin string, env []string, sock string) *agent {
	t.Helper()
	a := startAgent(t, bin, env, "--connect", sock)
	a.send(map[string]any{"id": "1", "op": "execute", "owner": "agent", "code": "x = 1"})
	a.answer("1")
	return a
}

// Over ssh, --connect relays the lines; the end of its input ends the
// connection once every request is answered, and it exits 0, as on the
// local socket (it used to close the stream both ways and lose them).
func TestConnectOverSSHAnswersEveryLine(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "", sshdtest.UserOptions{})
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	se := startServe(t, bin, dirs)
	cfg := srv.WriteSSHConfig(t, "gateway", u)
	cmd := exec.Command(bin, "headless", "--connect", "ssh://gateway"+se.sock, "--ssh-config", cfg)
	cmd.Env = dirs.env()
	cmd.Stdin = strings.NewReader(`{"id":"1","op":"execute","owner":"remote","code":"print(6*7)"}` + "\n" + `{"id":"2","op":"hello"}` + "\n")
	var out, errOut syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("headless --connect ssh:// with its input ended: %v\nstderr: %s\nstdout: %s", err, errOut.String(), out.String())
	}
	got := out.String()
	if !strings.Contains(got, `"id":"1","op":"result","status":"success","stdout":"42\n"`) || !strings.Contains(got, `"id":"2","op":"hello"`) {
		t.Fatalf("answers over ssh:\n%s", got)
	}
}

// With a file for stdin and stdout (not pipes the engine can take over),
// --connect relays the lines itself, with the same answers.
func TestConnectRelaysFiles(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	se := startServe(t, bin, dirs)
	dir := t.TempDir()
	reqs := filepath.Join(dir, "requests.jsonl")
	os.WriteFile(reqs, []byte(`{"id":"1","op":"execute","owner":"filer","code":"print(6*7)"}`+"\n"+`{"id":"2","op":"hello"}`+"\n"), 0o600)
	in, _ := os.Open(reqs)
	defer in.Close()
	outPath := filepath.Join(dir, "answers.jsonl")
	out, _ := os.Create(outPath)
	cmd := exec.Command(bin, "headless", "--connect", se.sock, "--events")
	cmd.Env = dirs.env()
	cmd.Stdin, cmd.Stdout = in, out
	var errOut syncBuffer
	cmd.Stderr = &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("headless --connect with files: %v\n%s", err, errOut.String())
	}
	out.Close()
	data, _ := os.ReadFile(outPath)
	got := string(data)
	if !strings.Contains(got, `"id":"1","op":"result","status":"success","stdout":"42\n"`) || !strings.Contains(got, `"id":"2","op":"hello"`) ||
		!strings.Contains(got, `"type":"cell_finished"`) || strings.Contains(got, eventsSubscription) {
		t.Fatalf("answers relayed to a file:\n%s", got)
	}
}

// stuckClient hands the engine two blocking pipes, asks for far more
// answers than the stdout pipe holds and never reads them; it prints
// "HANDED" and then waits until its stdin closes.
const stuckClient = `
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
in_r, in_w = os.pipe()
out_r, out_w = os.pipe()
socket.send_fds(s, [b'{"op":"stdio","events":true}\n'], [in_r, out_w])
os.close(in_r)
os.close(out_w)
for i in range(3000):
    os.write(in_w, b'{"id":"k%d","op":"kernels"}\n' % i)
print("HANDED", flush=True)
sys.stdin.read()
`

// A client that hands serve blocking pipes and never reads its answers
// cannot keep serve from stopping: on SIGTERM it exits within
// --cell-timeout and the shutdown's few seconds, killing its kernels.
func TestServeStopsWhateverItsClientsDo(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	se := startServe(t, bin, dirs, "--cell-timeout", "2s")
	op := startAgent(t, bin, dirs.env(), "--connect", se.sock)
	op.send(map[string]any{"id": "a", "op": "execute", "owner": "alice", "code": "import os; print(os.getpid())"})
	pid, _ := strconv.Atoi(strings.TrimSpace(fmt.Sprint(op.answer("a")["stdout"])))
	if pid <= 0 {
		t.Fatalf("alice's cell: %v", op.answer("a"))
	}
	stuck := exec.Command("python3", "-c", stuckClient, se.sock)
	stuck.Env = dirs.env()
	stdin, _ := stuck.StdinPipe()
	out, _ := stuck.StdoutPipe()
	if err := stuck.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); stuck.Process.Kill(); stuck.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "HANDED\n" {
		t.Fatalf("the stuck client: %q %v", line, err)
	}
	time.Sleep(time.Second) // the engine's writer fills the pipe and waits
	se.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- se.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatalf("serve was still running 90 s after SIGTERM with --cell-timeout 2s:\n%s", se.stderr.String())
	}
	if !strings.Contains(se.stderr.String(), "stopped; killed 1 kernel") {
		t.Errorf("serve's last words: %s", se.stderr.String())
	}
	for deadline := time.Now().Add(10 * time.Second); proctest.Alive(pid); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("alice's runner %d outlived serve", pid)
		}
	}
}
