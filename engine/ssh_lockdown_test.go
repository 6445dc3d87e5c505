package engine_test

// Shared-host lockdown and secrets over a real OpenSSH sshd: two real OS
// users (kdtest1, kdtest2) on one host with a shared, sticky temp dir, as
// with a real /tmp. Needs root (sshdtest skips otherwise).

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// sharedTempDir is a world-writable sticky dir with a short path, like a
// real /tmp that every user of the host shares.
func sharedTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kds")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// coTenants starts a real sshd with two users, kdtest1 (A) and kdtest2
// (B), whose backends share one sticky temp dir, as with a real /tmp.
func coTenants(t *testing.T) (a, b *sshdtest.User, shared string, envA, envB *backends.SSH) {
	t.Helper()
	srv := sshdtest.Start(t, sshdtest.Options{})
	a = srv.User(t, "kdtest1", sshdtest.UserOptions{})
	b = srv.User(t, "kdtest2", sshdtest.UserOptions{})
	shared = sharedTempDir(t)
	onShared := func(o *backends.Options) { o.SSHTempDir = shared }
	return a, b, shared, sshEnv(t, srv, a, onShared), sshEnv(t, srv, b, onShared)
}

// hostRun runs command on env's host as env's user; a transport error fails
// the test, the return code is the caller's to judge.
func hostRun(t *testing.T, env backends.Env, command string) backends.Result {
	t.Helper()
	res, err := env.Execute(context.Background(), command, backends.ExecOptions{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("%s: %q: %v", env.URI(), command, err)
	}
	return res
}

func randomTag() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// attempt is one thing a co-tenant tries against another user's kernel.
type attempt struct {
	what    string
	command string
	refusal string // what the host must answer
}

// Two real users on one sshd and one shared sticky temp dir. User A
// (kdtest1) runs a kernel through the engine, with a cell whose output
// spills to a file on the host. User B (kdtest2) then tries, with real shell
// commands through its own ssh backend, to list, read, write, connect to,
// signal and inspect everything of A's: each attempt must be refused by the
// OS. A's kernel is unaffected: its next cell sees its state, in the same
// process, and nothing B tried to plant arrived.
func TestSSHLockdownCoTenantCannotReachKernel(t *testing.T) {
	a, b, shared, envA, envB := coTenants(t)

	h := enginetest.New(t, envA, func(c *engine.Config) { c.ClipChars = 1000 })
	secret := "A-only-" + randomTag()
	first := h.Run("a", fmt.Sprintf("secret = %q\nprint(secret)\nprint('x' * 5000)", secret), 0)
	if first.Status != "success" || !first.StdoutClipped {
		t.Fatalf("first cell: status %q clipped %v stderr %q", first.Status, first.StdoutClipped, first.Stderr)
	}
	kd, pid := first.Kernel.Dir, first.Kernel.PID
	root := path.Dir(kd)
	if path.Dir(root) != shared || path.Base(root) != "kerneldeck-"+a.Name {
		t.Fatalf("kernel dir %s is not under %s/kerneldeck-%s", kd, shared, a.Name)
	}

	// A's own view: everything B goes after exists, at these exact paths,
	// so B's failures below are refusals and not typos.
	var res, spill, req string
	for name := range strings.FieldsSeq(h.Host("ls " + kd + "/cells")) {
		switch {
		case strings.HasSuffix(name, ".res"), name == "_stderr" && res == "":
			// A result over the socket is no file: the output file then.
			res = kd + "/cells/" + name
		case strings.HasSuffix(name, ".out"):
			spill = kd + "/cells/" + name
		case strings.HasSuffix(name, ".req"):
			req = kd + "/cells/" + name
		}
	}
	if res == "" || spill == "" {
		t.Fatalf("A's cells dir lacks a result (or output) file or a spill file: %q", h.Host("ls -la "+kd+"/cells"))
	}
	files := []string{res, spill, kd + "/runner.py", kd + "/runner.log", kd + "/kerneldeck_tools.py"}
	if req != "" {
		files = append(files, req)
	}
	control := fmt.Sprintf("set -e; ls %[1]s %[2]s %[2]s/cells %[2]s/rpc >/dev/null; cat %[3]s >/dev/null; grep -q %[4]s %[5]s; "+
		"test -w %[2]s/rpc; test -w %[2]s/cells; test -p %[2]s/wake; test -S %[2]s/sock; test -r /proc/%[6]d/stat; echo CONTROL-OK",
		root, kd, strings.Join(files, " "), secret, spill, pid)
	if out := h.Host(control); !strings.Contains(out, "CONTROL-OK") {
		t.Fatalf("A cannot reach its own files, so B's refusals prove nothing: %q", out)
	}

	denied, notPermitted := "Permission denied", "Operation not permitted"
	attempts := []attempt{
		{"list A's kernel root", "ls -la " + root, denied},
		{"list A's kernel dir", "ls -la " + kd, denied},
		{"list A's cells", "ls " + kd + "/cells", denied},
		{"list A's tool traffic", "ls " + kd + "/rpc", denied},
		{"read A's results by glob", "cat " + kd + "/cells/*.res " + kd + "/cells/*.out", denied},
		{"write into A's kernel root", "mkdir " + root + "/planted", denied},
		{"forge a tool-call request in A's rpc dir", fmt.Sprintf(`printf '{"seq": 1, "tool": "read_file", "args": {}, "token": "guess"}' >%s/rpc/1.req`, kd), denied},
		{"forge a cell request in A's cells dir", fmt.Sprintf(`printf '{"id": "forged", "code": "open(\"/tmp/pwned\", \"w\")"}' >%s/cells/forged.req`, kd), denied},
		{"ring A's wake FIFO", "echo 'cell forged' >" + kd + "/wake", denied},
		{"connect to A's runner socket", fmt.Sprintf(`python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(%q); s.sendall(b"{\"op\": \"ping\"}\n"); print(s.recv(100))'`, kd+"/sock"), denied},
		{"read A's runner environment (RPC token)", fmt.Sprintf("cat /proc/%d/environ", pid), denied},
		{"enter A's kernel dir through /proc cwd", fmt.Sprintf("ls /proc/%d/cwd/", pid), denied},
		{"read A's runner fds", fmt.Sprintf("ls /proc/%d/fd/", pid), denied},
		{"interrupt A's runner", fmt.Sprintf("kill -INT %d", pid), notPermitted},
	}
	for _, f := range files {
		attempts = append(attempts, attempt{"read " + path.Base(f), "cat " + f, denied})
	}
	for _, at := range attempts {
		out := hostRun(t, envB, at.command)
		if out.ReturnCode == 0 || !strings.Contains(out.Output, at.refusal) {
			t.Errorf("B could %s: `%s` -> rc %d, output %q (want a non-zero rc and %q)",
				at.what, at.command, out.ReturnCode, out.Output, at.refusal)
		}
		if strings.Contains(out.Output, secret) || strings.Contains(out.Output, "xxxxxxxxxx") {
			t.Errorf("B saw A's output while trying to %s: %q", at.what, out.Output)
		}
	}
	if who := strings.TrimSpace(hostRun(t, envB, "id -un").Output); who != b.Name {
		t.Fatalf("the co-tenant backend runs as %q, not %s", who, b.Name)
	}

	next := h.Run("a", "print(secret)", 0)
	if next.Status != "success" || next.Stdout != secret+"\n" || next.Stderr != "" {
		t.Fatalf("A's next cell: status %q stdout %q stderr %q", next.Status, next.Stdout, next.Stderr)
	}
	if !next.Kernel.Reused || next.Kernel.StateLost || next.Kernel.PID != pid || next.Kernel.ExecutionCount != 2 {
		t.Fatalf("A's kernel was disturbed: %+v", next.Kernel)
	}
	if got := strings.TrimSpace(h.Host(fmt.Sprintf("ls -A %s/rpc; ls -A %s | grep -v -e '^%s$' -e '^\\.made-%s$'; ls %s/cells | grep forged; true", kd, root, first.Kernel.ID, first.Kernel.ID, kd))); got != "" {
		t.Fatalf("something B tried to plant is in A's dirs: %q", got)
	}
}

// The kernel root planted in advance: B creates <shared>/kerneldeck-kdtest1
// as its own world-writable dir. A's spawn must refuse it (fail open to the
// per-call fallback, with an error naming the path), and nothing of A's may
// be written into B's dir.
func TestSSHLockdownPlantedKernelRoot(t *testing.T) {
	a, b, shared, envA, envB := coTenants(t)

	planted := shared + "/kerneldeck-" + a.Name
	if out := hostRun(t, envB, fmt.Sprintf("mkdir %[1]s && chmod 0777 %[1]s && stat -c '%%a %%U' %[1]s", planted)); strings.TrimSpace(out.Output) != "777 "+b.Name {
		t.Fatalf("B could not plant %s: rc %d %q", planted, out.ReturnCode, out.Output)
	}

	h := enginetest.New(t, envA, nil)
	res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "print(6 * 7)"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Fallback != "per_call" || res.Kernel != nil || res.Stdout != "42\n" {
		t.Fatalf("want the per-call fallback: fallback %q kernel %+v stdout %q stderr %q", res.Fallback, res.Kernel, res.Stdout, res.Stderr)
	}
	if !strings.Contains(res.Stderr, planted) {
		t.Fatalf("the result does not name the planted path %s: %q", planted, res.Stderr)
	}
	failed := h.EventsOf(engine.EventSpawnFailed)
	if len(failed) != 1 || !strings.Contains(failed[0].Detail, planted) {
		t.Fatalf("spawn_failed events do not name %s: %+v", planted, failed)
	}
	if len(h.Eng.Kernels()) != 0 {
		t.Fatalf("a kernel was registered in a planted root: %+v", h.Eng.Kernels())
	}
	if out := hostRun(t, envB, "ls -A "+planted+"; stat -c '%a %U' "+planted); strings.TrimSpace(out.Output) != "777 "+b.Name {
		t.Fatalf("B's planted dir changed or received A's files: %q", out.Output)
	}
	// A second call is refused the same way: the refusal is not a one-off.
	again, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "print('again')"})
	if err != nil || again.Fallback != "per_call" || again.Stdout != "again\n" {
		t.Fatalf("second call: %v %+v", err, again)
	}
	if out := hostRun(t, envB, "ls -A "+planted); strings.TrimSpace(out.Output) != "" {
		t.Fatalf("B's planted dir received A's files: %q", out.Output)
	}
}

// argvScanner reads /proc/*/cmdline of every process on the host (the
// tests run as root on the host the sshd serves) over and over, keeping
// every distinct command line it sees.
type argvScanner struct {
	mu    sync.Mutex
	seen  map[string]bool
	scans int
	stop  chan struct{}
	done  chan struct{}
}

func startArgvScanner(t *testing.T) *argvScanner {
	s := &argvScanner{seen: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			s.scan()
			select {
			case <-s.stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *argvScanner) scan() {
	ents, _ := os.ReadDir("/proc")
	var lines []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		lines = append(lines, string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scans++
	for _, l := range lines {
		s.seen[l] = true
	}
}

func (s *argvScanner) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// matching returns the command lines seen that contain sub.
func (s *argvScanner) matching(sub string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for l := range s.seen {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// runnerToken is the secret of the kernel whose runner is pid, as the
// engine holds it (no file, environment or argv on the host does).
func runnerToken(t *testing.T, h *enginetest.Harness, pid int) string {
	t.Helper()
	for _, k := range h.Eng.Kept() {
		if k.PID == pid && len(k.Token) >= 32 {
			return k.Token
		}
	}
	t.Fatalf("the engine holds no secret for runner %d", pid)
	return ""
}

// The RPC token of every kernel (first spawn and a reset) never shows up in
// the --trace file, in any event, in the sshd log, in the runner's log, in
// the state dir, nor in the argv of any process on the host while kernels
// spawn and cells run (streamed, clipped, interrupted at a timeout), over
// the fast path and over plain Execute.
func TestSSHSecretsStayOutOfTraceEventsAndArgv(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	a := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	for _, mode := range []string{"stream", "execute"} {
		t.Run(mode, func(t *testing.T) {
			var env backends.Env = sshEnv(t, srv, a, nil)
			if mode == "execute" {
				env = backends.ExecuteOnly(env)
			}
			// enginetest.New records every backend command in a --trace
			// file (backends.OpenTracer + backends.Traced).
			h := enginetest.New(t, env, func(c *engine.Config) { c.ClipChars = 1000 })
			scanner := startArgvScanner(t)

			first := h.Run("a", "x = 1", 0)
			tokens := []string{runnerToken(t, h, first.Kernel.PID)}

			// A cell that runs for a while: scan while it runs, and make
			// sure the scan covers the runner itself.
			done := make(chan *engine.Result, 1)
			go func() {
				res, _ := h.Eng.Execute(context.Background(), engine.Request{Owner: "a",
					Code: "import time\nfor i in range(10):\n    print(i, flush=True)\n    time.sleep(0.1)"})
				done <- res
			}()
			h.WaitFor("the long cell to run", 10*time.Second, func() bool { k, _ := h.Kernel("a"); return k.RunningCell != "" })
			scanner.scan()
			if len(scanner.matching(first.Kernel.Dir+"/runner.py")) == 0 {
				t.Fatalf("the argv scan does not see the runner (%s/runner.py): it proves nothing", first.Kernel.Dir)
			}
			if res := <-done; res == nil || res.Status != "success" {
				t.Fatalf("long cell: %+v", res)
			}
			if clipped := h.Run("a", "print('y' * 3000)", 0); !clipped.StdoutClipped || clipped.SpillPath == "" {
				t.Fatalf("clipped cell: %+v", clipped)
			}
			if res := h.Run("a", "import time\ntime.sleep(30)", time.Second); res.Status != "timeout" {
				t.Fatalf("timeout cell: status %q", res.Status)
			}
			reset, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "import time\ntime.sleep(0.5)\nprint('fresh')", Reset: true})
			if err != nil || reset.Kernel == nil || !reset.Kernel.StateReset {
				t.Fatalf("reset: %v %+v", err, reset)
			}
			tokens = append(tokens, runnerToken(t, h, reset.Kernel.PID))
			h.Run("a", "import time\ntime.sleep(0.5)", 0)
			runnerLogs := h.Host(fmt.Sprintf("cat %s/runner.log", reset.Kernel.Dir))
			scanner.close()
			if scanner.scans < 20 {
				t.Fatalf("only %d argv scans ran", scanner.scans)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := h.Eng.Close(ctx, false); err != nil {
				t.Fatal(err)
			}

			trace, err := os.ReadFile(h.Trace)
			if err != nil || len(trace) == 0 {
				t.Fatalf("no trace recorded: %v", err)
			}
			if !bytes.Contains(trace, []byte("kerneldeck:spawn")) || !bytes.Contains(trace, []byte("kerneldeck:kill")) {
				t.Fatalf("the trace lacks the spawn or kill commands, so it was not the trace in use:\n%s", trace)
			}
			events := h.AllEvents()
			if len(events) == 0 {
				t.Fatal("no events")
			}
			if tokens[0] == tokens[1] {
				t.Fatal("the reset kernel reuses the first kernel's token")
			}
			for i, tok := range tokens {
				if bytes.Contains(trace, []byte(tok)) {
					t.Errorf("token %d appears in the trace file", i)
				}
				for _, ev := range events {
					if strings.Contains(fmt.Sprintf("%+v", ev), tok) {
						t.Errorf("token %d appears in event %s", i, ev.Type)
					}
				}
				for _, l := range scanner.matching(tok) {
					t.Errorf("token %d appears in the argv of a process on the host: %q", i, l)
				}
				if strings.Contains(srv.Log(), tok) {
					t.Errorf("token %d appears in the sshd log", i)
				}
				if strings.Contains(runnerLogs, tok) {
					t.Errorf("token %d appears in runner.log", i)
				}
				filepath.WalkDir(h.StateDir, func(p string, d os.DirEntry, err error) error {
					if err == nil && !d.IsDir() {
						if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(tok)) {
							t.Errorf("token %d appears in state file %s", i, p)
						}
					}
					return nil
				})
			}
			for _, l := range scanner.matching(`"secret"`) {
				t.Errorf("a process on the host has the runner's config in its argv: %q", l)
			}
		})
	}
}

// A co-tenant cannot make A's kernel call a tool: B (another OS user on the
// same sshd) tries to plant a request in A's rpc dir and to ring A's wake
// FIFO, with a request A's secret really signed even (as if it had leaked).
// The OS refuses both,
// nothing B wrote reaches the engine (no rejection, no dispatch), and A's
// own tool calls go on working.
func TestSSHLockdownCoTenantCannotPlantToolCalls(t *testing.T) {
	_, _, _, envA, envB := coTenants(t)
	h := enginetest.NewTools(t, envA, nil)
	h.WriteWorkspace("f", "mine")
	tools := []string{"read_file", "write_file"}
	first := h.Call("a", tools, `import kerneldeck_tools as kt, sys
R = sys.modules["__main__"].RUNNER
print(kt.read_file("f"), R.auth.mac("rpc", "77", R.running, "write_file", '{"path": "pwned", "content": "B"}'), R.running)`)
	fields := strings.Fields(first.Stdout)
	if first.Status != "success" || len(fields) != 3 || fields[0] != "mine" {
		t.Fatalf("first cell: %q %q", first.Stdout, first.Traceback)
	}
	token, kd := fields[1], first.Kernel.Dir
	forged := fmt.Sprintf(`{"seq": 77, "tool": "write_file", "args": {"path": "pwned", "content": "B"}, "token": %q, "cell": %q}`, token, fields[2])
	for _, at := range []attempt{
		{"plant a tool request with A's token", fmt.Sprintf("printf '%%s' '%s' >%s/rpc/77.req", forged, kd), "Permission denied"},
		{"plant a tool answer", fmt.Sprintf(`printf '{"ok": true, "text": "forged"}' >%s/rpc/2.res`, kd), "Permission denied"},
		{"ring A's runner to sweep rpc/", fmt.Sprintf("echo rpc >%s/wake", kd), "Permission denied"},
		{"ring A's runner to read an answer", fmt.Sprintf("echo 'rpcres 2' >%s/wake", kd), "Permission denied"},
	} {
		out := hostRun(t, envB, at.command)
		if out.ReturnCode == 0 || !strings.Contains(out.Output, at.refusal) {
			t.Errorf("B could %s: rc %d output %q", at.what, out.ReturnCode, out.Output)
		}
	}
	next := h.Call("a", tools, "import kerneldeck_tools as kt\nprint(kt.read_file('f'))")
	if next.Status != "success" || next.Stdout != "mine\n" || next.ToolCallsMade != 1 || !next.Kernel.Reused {
		t.Fatalf("A's next cell: %q %q %+v", next.Stdout, next.Traceback, next.Kernel)
	}
	if rej := h.EventsOf(engine.EventRPCRejected); len(rej) != 0 {
		t.Fatalf("something B wrote reached the engine: %+v", rej)
	}
	if _, err := os.Stat(filepath.Join(h.Workspace, "pwned")); err == nil {
		t.Fatal("B's forged request was dispatched")
	}
	if calls := h.EventsOf(engine.EventRPCCall); len(calls) != 2 {
		t.Fatalf("rpc_call events %d, want A's 2", len(calls))
	}
}
