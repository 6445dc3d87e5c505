package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// stealer is mallory's cell: it reads the engine's journal for bob's
// kernel's secret and dir, and drives bob's runner over its socket with
// them. It prints what bob's kernel answered, or why it could not.
const stealer = `
import hashlib, hmac, json, os, socket
def mac(secret, kind, *parts):
    m = kind.encode() + b"\0"
    for x in parts:
        x = x.encode()
        m += b"%%d:" %% len(x) + x
    return hmac.new(bytes.fromhex(secret), m, hashlib.sha256).hexdigest()
try:
    journal = %q
    records = [k for n in os.listdir(journal) if n.endswith(".json") for k in json.load(open(os.path.join(journal, n)))["kernels"]]
except OSError as e:
    print("journal:", e.strerror)
    raise SystemExit
bob = [k for k in records if k["owner"] == "bob"]
print("journal read:", len(records), "records")
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(bob[0]["dir"] + "/sock")
f = s.makefile("rwb")
nonce = json.loads(f.readline())["nonce"]
f.write((json.dumps({"op": "auth", "mac": mac(bob[0]["token"], "engine", nonce), "nonce": "n" * 32}) + "\n").encode())
f.write((json.dumps({"op": "cell", "id": "stolen", "code": "print(secret)"}) + "\n").encode())
f.flush()
for line in f:
    if b'"result"' in line:
        print("bob's kernel said:", json.loads(line).get("stdout"))
        break
`

// A kernel never reads the engine's state dir: its journal holds every
// kernel's secret, with which mallory's kernel could drive bob's. With
// Landlock the dir is kept from local kernels (the socket of bob's runner
// is not: a path socket's connect is not a file access to Landlock, so
// the secret is what keeps it).
func TestAKernelCannotReadTheJournal(t *testing.T) {
	state := t.TempDir()
	journal := filepath.Join(state, "journal")
	h := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), func(c *engine.Config) {
		c.StateDir, c.JournalDir = state, journal
	})
	ctx := context.Background()
	bob, err := h.Eng.Execute(ctx, engine.Request{Owner: "bob", Code: "secret = 'bob only'"})
	if err != nil || bob.Status != engine.StatusSuccess {
		t.Fatalf("bob: %v %+v", err, bob)
	}
	h.WaitFor("bob's kernel in the journal", 10*time.Second, func() bool {
		files, _ := filepath.Glob(filepath.Join(journal, "*.json"))
		return len(files) == 1
	})
	mallory, err := h.Eng.Execute(ctx, engine.Request{Owner: "mallory", Code: fmt.Sprintf(stealer, journal)})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(mallory.Stdout+mallory.Traceback, "bob only") {
		t.Fatalf("mallory's kernel drove bob's with the secret from the journal:\n%s%s", mallory.Stdout, mallory.Traceback)
	}
	confinement := ""
	for _, k := range h.Eng.Kernels() {
		if k.Owner == "mallory" {
			confinement = k.Confinement
		}
	}
	if !strings.HasPrefix(confinement, "landlock:") {
		t.Skipf("runners here are not confined (%s): only Landlock keeps the state dir from kernels of the engine's user", confinement)
	}
	want := "journal: Permission denied\n" // Landlock alone
	if strings.Contains(confinement, "+mountns") {
		want = "journal: No such file or directory\n" // hidden under an empty mount
	}
	if mallory.Stdout != want {
		t.Errorf("mallory's cell (%s): %q %s; want the journal kept from it", confinement, mallory.Stdout, mallory.Traceback)
	}
}
