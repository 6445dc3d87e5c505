package engine_test

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
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// testUIDs is a range of uids no user of a test machine has.
var testUIDs = engine.UIDRange{First: 3900000000, Last: 3900000009}

// kernelHomes is a homes dir for kernel uids (root's, 0755), removed with
// the kernel roots the uids made in the temp dir.
func kernelHomes(t *testing.T) string {
	t.Helper()
	homes, err := os.MkdirTemp("", "kd-homes-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(homes, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(homes)
		for uid := testUIDs.First; uid <= testUIDs.Last; uid++ {
			os.RemoveAll(filepath.Join("/tmp", fmt.Sprintf("kerneldeck-uid%d", uid)))
		}
	})
	return homes
}

// reachPy is a kernel's cell: what it is, and what of root's, the Docker
// Engine's and the other owner's it reaches.
const reachPy = `
import json, os, socket
out = {"uid": os.getuid(), "home": os.path.expanduser("~")}
def attempt(name, f):
    try:
        out[name] = "ok: " + str(f())[:100]
    except OSError as e:
        out[name] = "refused: " + type(e).__name__
def write(p):
    with open(p, "w") as f:
        f.write("x")
    os.remove(p)
    return p
def docker():
    s = socket.socket(socket.AF_UNIX)
    s.connect("/var/run/docker.sock")
    return "connected"
attempt("own home", lambda: write(os.path.expanduser("~/x.csv")))
attempt("tmp", lambda: write("/tmp/kd-uid-%%d.csv" %% os.getuid()))
attempt("/etc", lambda: write("/etc/kd-uid-probe"))
attempt("docker", docker)
attempt("other home", lambda: os.listdir(%q))
attempt("signal other", lambda: os.kill(%d, 0))
print(json.dumps(out))
`

// On a root engine with kernel_uids, each owner's kernels run as a uid of
// that owner's own, never root: each writes its own home and /tmp, and
// none writes /etc, speaks to the Docker Engine, or reaches the other
// owner's home or runner. An owner keeps its uid in the next engine on
// the state dir; a range that holds a user's uid is refused.
func TestARootEnginesOwnersRunAsUIDsOfTheirOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only a root engine runs kernels as other uids")
	}
	homes := kernelHomes(t)
	state := filepath.Join(t.TempDir(), "state")
	h := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), func(c *engine.Config) {
		c.StateDir, c.KernelUIDs, c.KernelHomes = state, testUIDs, homes
	})
	who := func(owner string) (uid int, backend string) {
		res := h.Run(owner, "import os\nprint(os.getuid())", 30*time.Second)
		fmt.Sscan(res.Stdout, &uid)
		return uid, res.Kernel.Backend
	}
	alice, aliceBackend := who("alice")
	bob, _ := who("bob")
	if alice == bob || alice < int(testUIDs.First) || alice > int(testUIDs.Last) || bob < int(testUIDs.First) || bob > int(testUIDs.Last) {
		t.Fatalf("alice runs as uid %d, bob as %d; want two uids of %v", alice, bob, testUIDs)
	}
	if aliceBackend != fmt.Sprintf("local?uid=%d", alice) {
		t.Errorf("alice's kernel's backend is %q", aliceBackend)
	}
	bobKernel, _ := h.Kernel("bob")
	res := h.Run("alice", fmt.Sprintf(reachPy, filepath.Join(homes, fmt.Sprint(bob)), bobKernel.PID), 30*time.Second)
	var got map[string]any
	if json.Unmarshal([]byte(res.Stdout), &got) != nil {
		t.Fatalf("alice's cell: %q %q", res.Stdout, res.Traceback)
	}
	t.Logf("alice's kernel (uid %d) reached: %v", alice, got)
	if got["home"] != filepath.Join(homes, fmt.Sprint(alice)) {
		t.Errorf("alice's home is %v", got["home"])
	}
	for name, want := range map[string]string{"own home": "ok", "tmp": "ok", "/etc": "refused", "docker": "refused",
		"other home": "refused", "signal other": "refused"} {
		if s, _ := got[name].(string); !strings.HasPrefix(s, want) {
			t.Errorf("%s: %v; want %s", name, got[name], want)
		}
	}
	if _, err := os.Stat("/etc/kd-uid-probe"); err == nil {
		os.Remove("/etc/kd-uid-probe")
		t.Error("alice's kernel wrote /etc")
	}

	// The next engine on the state dir gives alice the same uid.
	h.Eng.Close(context.Background(), false)
	again := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), func(c *engine.Config) {
		c.StateDir, c.KernelUIDs, c.KernelHomes = state, testUIDs, homes
	})
	res = again.Run("alice", "import os\nprint(os.getuid())", 30*time.Second)
	if res.Stdout != fmt.Sprintf("%d\n", alice) {
		t.Errorf("the next engine ran alice as %q, want uid %d", res.Stdout, alice)
	}

	// A range with a user's uid in it (nobody's) is refused, naming it.
	_, err := engine.New(engine.Config{Backends: []backends.Env{backends.NewLocal("")}, StateDir: t.TempDir(),
		KernelUIDs: engine.UIDRange{First: 65530, Last: 65540}})
	if err == nil || !strings.Contains(err.Error(), "nobody") {
		t.Errorf("a range holding nobody's uid: %v", err)
	}
}

// A member's kernel (local?user=LOGIN, on a root engine) and an owner's
// kernel of kernel_uids (local?uid=N) outlive their engine: the next one
// makes their backends again from its local backend and adopts them, with
// their state. A member's kernel was once left running, "not configured
// here", and its owner's next call ran in a new kernel.
func TestKernelsOfOtherUsersAreAdopted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only a root engine runs kernels as other users")
	}
	homes := kernelHomes(t)
	state := filepath.Join(t.TempDir(), "state")
	tmp := enginetest.ShortTempDir(t)
	mk := func() *enginetest.Harness {
		return enginetest.New(t, backends.NewLocal(tmp), func(c *engine.Config) {
			c.StateDir, c.KernelUIDs, c.KernelHomes = state, testUIDs, homes
		})
	}
	first := mk()
	member, err := first.Eng.MemberBackend("local", 65534)
	if err != nil || member != "local?user=nobody" {
		t.Fatalf("MemberBackend: %q %v", member, err)
	}
	ctx := context.Background()
	for _, req := range []engine.Request{{Owner: "nobody", Backend: member, Member: true, Code: "x = 'member'"}, {Owner: "alice", Code: "x = 'owner'"}} {
		if res, err := first.Eng.Execute(ctx, req); err != nil || res.Status != engine.StatusSuccess {
			t.Fatalf("%s: %v %+v", req.Owner, err, res)
		}
	}
	kept := first.Eng.Kept()
	if len(kept) != 2 {
		t.Fatalf("kept %d kernels, want 2", len(kept))
	}
	first.Eng.Close(ctx, true)

	second := mk()
	adopted, skipped := second.Eng.Adopt(ctx, kept)
	t.Cleanup(func() { second.Eng.Close(context.Background(), false) })
	if adopted != 2 || len(skipped) != 0 {
		t.Fatalf("adopted %d, skipped %v; want both", adopted, skipped)
	}
	for _, req := range []engine.Request{{Owner: "nobody", Backend: member, Member: true, Code: "print(x)"}, {Owner: "alice", Code: "print(x)"}} {
		res, err := second.Eng.Execute(ctx, req)
		if err != nil || res.Status != engine.StatusSuccess || !res.Kernel.Reused || res.Stdout == "" {
			t.Errorf("%s after the adoption: %v %+v", req.Owner, err, res)
		}
	}
}
