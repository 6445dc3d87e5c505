package enginetest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// attackPy is bob's cell: it attacks alice's kernel (same login) through
// every door it can name and prints what each attempt got, as JSON. It
// knows alice's pid and dir (a runner's argv shows its dir), not her secret.
const attackPy = `
import json, os, socket, ctypes, signal
PID, KD = %d, %q
ROOT = os.path.dirname(KD)
out = {}
def attempt(name, f):
    try:
        out[name] = "ok: " + str(f())[:200]
    except Exception as e:
        out[name] = "refused: %%s: %%s" %% (type(e).__name__, e)

def sock_cell():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(KD + "/sock")
    hello = s.recv(4096)
    got, err = b"", ""
    try:
        s.sendall(b'{"op": "auth", "mac": "' + b"0" * 64 + b'", "nonce": "' + b"1" * 32 + b'"}\n')
        s.sendall(b'{"op": "cell", "id": "cpwned1", "code": "pwned = 1"}\n')
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except OSError as e:
        err = str(e)
    return "hello %%r, then %%r %%s" %% (hello[:60], got[:200], err)
attempt("socket", sock_cell)

def write(path, data):
    with open(path, "w") as f:
        f.write(data)
    return "wrote " + path
def ring(line):
    fd = os.open(KD + "/wake", os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, line.encode() + b"\n")
    os.close(fd)
    return "rang " + line
attempt("cell file", lambda: write(KD + "/cells/cpwned2.req", '{"id": "cpwned2", "code": "pwned = 2"}'))
attempt("ring cell", lambda: ring("cell cpwned2"))
attempt("tool request file", lambda: write(KD + "/rpc/999.req", json.dumps({"seq": 999, "tool": "write_file",
    "args": {"path": "PWNED", "content": "bob"}, "token": "0" * 64, "cell": ""})))
attempt("ring rpc", lambda: ring("rpc"))
attempt("tool answer file", lambda: write(KD + "/rpc/1.res", '{"ok": true, "text": "forged"}'))
attempt("ring interrupt", lambda: ring("int x " + "0" * 64))
attempt("read runner.log", lambda: open(KD + "/runner.log").read())
attempt("list kernel root", lambda: os.listdir(ROOT))
attempt("environ", lambda: open("/proc/%%d/environ" %% PID, "rb").read())
def mem():
    with open("/proc/%%d/maps" %% PID) as f:
        start = int(f.readline().split("-")[0], 16)
    with open("/proc/%%d/mem" %% PID, "rb") as f:
        f.seek(start)
        return "%%d bytes" %% len(f.read(64))
attempt("mem", mem)
def ptrace():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, PID, None, None) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    os.waitpid(PID, 0x40000000)  # __WALL: the tracee's stop
    libc.ptrace(17, PID, None, None)  # PTRACE_DETACH: let it go on
    return "attached"
attempt("ptrace", ptrace)
attempt("signal", lambda: os.kill(PID, signal.SIGCONT) or "sent")
print(json.dumps(out))
`

// Isolation attacks, from one owner's kernel, another owner's kernel of the
// same login on env: its socket, its request and answer files, its wake
// FIFO, its /proc files, ptrace and signals. Where runners hide (a mount
// namespace each) bob cannot even see alice's dir; with Landlock alone
// every door is closed by the kernel; unconfined, the runner's secret and
// its being non-dumpable must still keep the attacker from running code
// in it, reading its state or secret, or making tool calls as it.
func Isolation(t *testing.T, newEnv func(t *testing.T) backends.Env) {
	for _, mode := range []string{"hidden", "landlock alone", "unconfined"} {
		confine := mode != "unconfined"
		t.Run(mode, func(t *testing.T) {
			h := NewTools(t, newEnv(t), func(c *engine.Config) { c.NoConfine, c.LandlockOnly = !confine, mode == "landlock alone" })
			tools := []string{"write_file", "terminal"}
			alice := h.Call("alice", tools, "secret_value = 'alice-42'\nprint('ready')")
			expectOK(t, alice, "ready\n")
			t.Cleanup(func() {
				// What alice's runner said, when a door did not answer.
				if t.Failed() {
					t.Logf("alice's runner.log:\n%s", h.Host("tail -c 4000 "+backends.ShellQuote(alice.Kernel.Dir+"/runner.log")+" 2>&1; true"))
				}
			})
			k, _ := h.Kernel("alice")
			if confine && !strings.HasPrefix(k.Confinement, "landlock:") {
				t.Skipf("runners on this host are not confined (%s): the unconfined subtest checks the layers that hold without Landlock", k.Confinement)
			}
			hidden := strings.Contains(k.Confinement, "+mountns")
			if mode == "hidden" && !hidden {
				t.Skipf("runners on this host have no mount namespace (%s): the subtest with Landlock alone checks the fallback", k.Confinement)
			}
			if mode != "hidden" && hidden {
				t.Errorf("confinement %q: runners hid with mounts although told not to", k.Confinement)
			}
			abi := 0
			fmt.Sscanf(k.Confinement, "landlock:%d", &abi)
			var secret string
			for _, k := range h.Eng.Kept() {
				if k.ID == alice.Kernel.ID {
					secret = k.Token
				}
			}
			// Alice runs a cell while bob attacks: the moment a forged tool
			// call or an injected cell would be most useful.
			done := make(chan *engine.Result, 1)
			go func() {
				res, _ := h.Eng.Execute(context.Background(), engine.Request{Owner: "alice", Tools: tools, Timeout: 60 * time.Second,
					Code: fmt.Sprintf("import os, time\nwhile not os.path.exists(%q):\n    time.sleep(0.02)\nprint('alice done')", alice.Kernel.Dir+"/stop")})
				done <- res
			}()
			h.WaitFor("alice's cell to run", 20*time.Second, func() bool { k, _ := h.Kernel("alice"); return k.RunningCell != "" })
			bob := h.Call("bob", nil, fmt.Sprintf(attackPy, alice.Kernel.PID, alice.Kernel.Dir))
			var got map[string]string
			if bob.Status != "success" || json.Unmarshal([]byte(bob.Stdout), &got) != nil {
				t.Fatalf("bob's attack did not run: %q %q", bob.Stdout, bob.Traceback)
			}
			h.Host("touch " + alice.Kernel.Dir + "/stop")
			var res *engine.Result
			select {
			case res = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("alice's cell did not end")
			}
			expectOK(t, res, "alice done\n")
			if res.ToolCallsMade != 0 {
				t.Errorf("alice's cell made %d tool calls: bob's forged request ran as alice", res.ToolCallsMade)
			}
			after := h.Call("alice", tools, "print('pwned' in dir(), secret_value)")
			expectOK(t, after, "False alice-42\n")

			root := os.Geteuid() == 0 && h.Host("id -u") == "0\n"
			for attack, outcome := range got {
				refused := strings.HasPrefix(outcome, "refused")
				why := ""
				switch {
				case confine && attack == "signal" && abi < 6:
					// Signals are scoped from Landlock ABI 6 on.
				case hidden && attack == "list kernel root":
					// bob sees a kernel root with his own dir alone in it.
					if !strings.HasPrefix(outcome, "ok: ['k") || strings.Contains(outcome, alice.Kernel.ID) || strings.Contains(outcome, ",") {
						t.Errorf("list kernel root: %s; want bob's own dir alone", outcome)
					}
				case hidden:
					// alice's dir is not there for bob: every door to it is.
					if !strings.HasPrefix(outcome, "refused") && attack != "environ" {
						t.Errorf("%s: %s; want it refused (alice's dir is hidden from bob)", attack, outcome)
					}
					if strings.Contains(outcome, secret) {
						t.Errorf("%s holds alice's secret", attack)
					}
				case attack == "socket":
					// Landlock does not cover connecting to a named socket:
					// the runner takes the connection but no peer that
					// fails its challenge.
					if !strings.Contains(outcome, "hello") || strings.Contains(outcome, "result") || strings.Contains(outcome, "auth_ok") {
						t.Errorf("socket: %s; want the challenge and then nothing", outcome)
					}
				case attack == "environ":
					// The secret was never in it; root may read it anyway.
					if strings.Contains(outcome, secret) {
						t.Errorf("environ holds alice's secret")
					}
					if !root && !refused {
						t.Errorf("environ: %s; want it refused: the runner is non-dumpable", outcome)
					}
				case confine:
					// Landlock closes every other door: the dirs, /proc of
					// other domains, ptrace, and (ABI 6) signals.
					why = "Landlock"
				case attack == "mem" || attack == "ptrace":
					if !root {
						why = "the runner is non-dumpable"
					}
				}
				if why != "" && !refused {
					t.Errorf("%s: %s; want it refused (%s)", attack, outcome, why)
				}
				t.Logf("%s: %s", attack, outcome)
			}
			if _, err := os.Stat(filepath.Join(h.Workspace, "PWNED")); err == nil {
				t.Error("bob's forged tool request was dispatched")
			}
			for _, ev := range h.EventsOf(engine.EventRPCCall) {
				t.Errorf("a tool call was dispatched: %+v", ev)
			}
			if !confine {
				// Unconfined, the forged request reached alice's rpc/ dir and
				// the engine refused it for its MAC.
				h.WaitFor("the forged request's rejection", 10*time.Second, func() bool { return len(h.rejectedFor("999.req")) > 0 })
				if r := h.rejectedFor("999.req"); !strings.Contains(r[0], "wrong token") {
					t.Errorf("the forged request was refused for %q, want its MAC (wrong token)", r)
				}
			}
		})
	}
}
