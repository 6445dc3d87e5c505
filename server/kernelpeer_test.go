package server_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kerneldeck/kerneldeck/server"
	"github.com/kerneldeck/kerneldeck/wire"
)

// kernelDialer is a cell that dials the engine's socket from inside its
// kernel three ways (from the runner itself, from a process started with
// setsid, from a grandchild of a double fork that left the session) and
// asks to run code in alice's kernel as the engine's user. It prints one
// JSON line per way: what the engine answered.
const kernelDialer = `
import json, os, socket, subprocess, sys, time
PATH = %q
ASK = b'{"id":"steal","op":"execute","owner":"alice","code":"print(SECRET)"}\n{"id":"ls","op":"kernels"}\n'
DIAL = '''
import socket, sys
def ask(path, req):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    s.connect(path)
    try:
        s.sendall(req.encode())
    except OSError:
        pass  # refused and closed before it was sent
    got = b""
    while True:
        try:
            b = s.recv(65536)
        except OSError:
            break
        if not b:
            break
        got += b
        if b'"id":"ls"' in got:
            break  # served: the last answer came
    return got.decode()
if __name__ == "__main__":
    sys.stdout.write(ask(sys.argv[1], sys.argv[2]))
'''
exec(DIAL.replace("__main__", "not run"))
def dial():
    return ask(PATH, ASK.decode())
out = {}
out["runner"] = dial()  # in the runner's own process
out["setsid"] = subprocess.run(["setsid", "-w", sys.executable, "-c", DIAL, PATH, ASK.decode()], capture_output=True, text=True, timeout=60).stdout
r, w = os.pipe()
if os.fork() == 0:
    os.close(r)
    os.setsid()
    if os.fork() == 0:
        os.write(w, dial().encode())
    os._exit(0)
os.close(w)
got = b""
while True:
    b = os.read(r, 65536)
    if not b:
        break
    got += b
out["double fork"] = got.decode()
print(json.dumps(out))
`

// Code in a kernel runs as the engine's user, yet is never admitted on its
// socket as the engine's user, however it detached: it cannot run code in
// another owner's kernel or list the engine's kernels.
func TestKernelIsNeverAdmittedAsTheEngine(t *testing.T) {
	eng := newEngine(t)
	watch := eng.Subscribe(1 << 12)
	defer watch.Close()
	path := filepath.Join(t.TempDir(), "run", wire.SocketName)
	serve(t, eng, server.Options{Path: path})
	op := dial(t, path)
	if r := op.call(map[string]any{"id": "a", "op": "execute", "owner": "alice", "code": "SECRET = 'alices-secret-4242'"}); r["status"] != "success" {
		t.Fatalf("alice's cell: %v", r)
	}
	r := op.call(map[string]any{"id": "b", "op": "execute", "owner": "bob", "timeout": 120, "code": fmt.Sprintf(kernelDialer, path)})
	if r["status"] != "success" {
		t.Fatalf("bob's dialing cell: %v", r)
	}
	var ways map[string]string
	if err := json.Unmarshal([]byte(r["stdout"].(string)), &ways); err != nil || len(ways) != 3 {
		t.Fatalf("bob's dialing cell printed %q: %v", r["stdout"], err)
	}
	for way, got := range ways {
		if strings.Contains(got, "alices-secret") || strings.Contains(got, `"op":"kernels"`) || strings.Contains(got, `"op":"result"`) {
			t.Errorf("bob's kernel (%s) was served as the engine's user: %q", way, got)
		}
		if !strings.Contains(got, "refused: it runs in a kernel") {
			t.Errorf("bob's kernel (%s) got %q, want a refusal saying it runs in a kernel", way, got)
		}
	}
	waitNotice(t, watch, "it runs in a kernel")
	// The engine's user, outside any kernel, is still served, and alice's
	// state is hers.
	if again := op.call(map[string]any{"id": "a2", "op": "execute", "owner": "alice", "code": "print(SECRET)"}); again["stdout"] != "alices-secret-4242\n" {
		t.Fatalf("alice after bob's attempts: %v", again)
	}
	for _, k := range eng.Kernels() {
		if !strings.Contains(k.Confinement, "+userns") {
			t.Errorf("kernel %s of %s: confinement %q, want a user namespace of its own", k.ID, k.Owner, k.Confinement)
		}
	}
}
