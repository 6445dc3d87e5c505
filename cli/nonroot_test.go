package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// nonRootProbe is a kernel's cell on a non-root engine: what it gets of the
// engine's state dir and its keys, and of the user's home and /tmp.
const nonRootProbe = `
import ctypes, json, os
STATE = os.path.expanduser("~/.local/state/kerneldeck")
out = {}
def attempt(name, f):
    try:
        out[name] = "ok: " + str(f())[:120]
    except OSError as e:
        out[name] = "refused: " + type(e).__name__
def write(p):
    with open(p, "w") as f:
        f.write("x")
    mode = oct(os.stat(p).st_mode & 0o777)
    os.remove(p)
    return mode
attempt("state dir", lambda: os.listdir(STATE))
attempt("journal", lambda: os.listdir(STATE + "/journal"))
attempt("park key", lambda: open(STATE + "/parked/park.key", "rb").read())
attempt("plant", lambda: write(STATE + "/planted"))
attempt("home", lambda: write(os.path.expanduser("~/kd-probe.csv")))
attempt("tmp", lambda: write("/tmp/kd-probe-%d.csv" % os.getuid()))
libc = ctypes.CDLL(None, use_errno=True)
def umount():
    if libc.umount2(STATE.encode(), 2) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return os.listdir(STATE)
attempt("umount", umount)
print(json.dumps(out))
`

// TestANonRootEnginesKernels: the real binary run by a plain OS user, as a
// newcomer runs it (umask 022, its own home and state dir). Its kernel
// cannot see the engine's state dir (hidden under an empty mount, so it
// cannot read a key or plant a file there, nor unmount the cover), and
// writes the user's home and /tmp with the user's umask.
func TestANonRootEnginesKernels(t *testing.T) {
	u := sshdtest.OSUser(t, "kdtest1")
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	dir, err := os.MkdirTemp("", "kd-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(dir)
		os.RemoveAll(filepath.Join(u.HomeDir, ".local", "state", "kerneldeck"))
	})
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "kerneldeck")
	if out, err := exec.Command("go", "build", "-o", bin, "..").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	os.Chmod(bin, 0o755)
	req, _ := json.Marshal(map[string]any{"id": "probe", "op": "execute", "code": nonRootProbe})
	cmd := exec.Command("/bin/sh", "-c", `umask 022; exec "$0" headless --spare-kernels 0`, bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	cmd.Env = []string{"HOME=" + u.HomeDir, "USER=" + u.Username, "PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C.UTF-8"}
	cmd.Dir = u.HomeDir
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The probe, then (once it answered) the listing that says how its
	// kernel is confined.
	fmt.Fprintf(in, "%s\n", req)
	var result struct {
		Stdout, Traceback string
	}
	var confinement string
	lines := bufio.NewScanner(out)
	lines.Buffer(nil, 1<<20)
	for lines.Scan() {
		var m map[string]any
		if json.Unmarshal(lines.Bytes(), &m) != nil {
			continue
		}
		if m["id"] == "probe" {
			json.Unmarshal(lines.Bytes(), &result)
			fmt.Fprintln(in, `{"id":"ls","op":"kernels"}`)
			in.Close()
		}
		if ks, _ := m["kernels"].([]any); m["id"] == "ls" && len(ks) == 1 {
			confinement, _ = ks[0].(map[string]any)["confinement"].(string)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("headless as %s: %v\n%s", u.Username, err, stderr.String())
	}
	var got map[string]string
	if json.Unmarshal([]byte(result.Stdout), &got) != nil {
		t.Fatalf("the probe did not run: %q %q\nstderr: %s", result.Stdout, result.Traceback, stderr.String())
	}
	t.Logf("a kernel of %s's engine (%s): %v", u.Username, confinement, got)
	want := map[string]string{"state dir": "ok: []", "journal": "refused", "park key": "refused", "plant": "refused",
		"home": "ok: 0o644", "tmp": "ok: 0o644", "umount": "refused"}
	if !strings.Contains(confinement, "+mountns") {
		// Landlock alone: the state dir itself is refused too.
		want["state dir"] = "refused"
	}
	for name, w := range want {
		if !strings.HasPrefix(got[name], w) {
			t.Errorf("%s: %s; want %s", name, got[name], w)
		}
	}
	if _, err := os.Stat(filepath.Join(u.HomeDir, ".local", "state", "kerneldeck", "planted")); err == nil {
		t.Error("the kernel planted a file in the state dir")
	}
}
