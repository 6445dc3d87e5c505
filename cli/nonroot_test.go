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
	_, bin := nonRootBinary(t)
	t.Cleanup(func() { os.RemoveAll(filepath.Join(u.HomeDir, ".local", "state", "kerneldeck")) })
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

// nonRootBinary copies the binary where another user can run it.
func nonRootBinary(t *testing.T) (dir, bin string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "kd-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin = filepath.Join(dir, "kerneldeck")
	if out, err := exec.Command("go", "build", "-o", bin, "..").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	os.Chmod(bin, 0o755)
	return dir, bin
}

// helloAs connects to sock as uid with the groups and says hello; it
// returns the engine's answer line, or why it could not.
func helloAs(t *testing.T, sock string, uid, gid int, groups []uint32) string {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", "-c", `
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(20)
try:
    s.connect(sys.argv[1])
    s.sendall(b'{"id":"h","op":"hello"}\n')
    print(s.makefile().readline().strip())
except OSError as e:
    print("error:", e)
`, sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}}
	out, _ := cmd.CombinedOutput()
	return strings.TrimSpace(string(out))
}

// A non-root engine shared with a group admits the group's members (it
// once refused every one: it read EPERM, which a non-root engine gets for
// another user's process, as "the process that connected has exited").
// Shared with a group its user is not in, serve says which group and how
// to join it.
func TestANonRootEngineAdmitsItsGroup(t *testing.T) {
	u := sshdtest.OSUser(t, "kdtest1")
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	dir, bin := nonRootBinary(t)
	run := filepath.Join(dir, "run")
	os.Mkdir(run, 0o755)
	os.Chown(run, uid, gid)
	t.Cleanup(func() { os.RemoveAll(filepath.Join(u.HomeDir, ".local", "state", "kerneldeck")) })
	serve := func(group string) (*exec.Cmd, *syncBuffer, string) {
		sock := filepath.Join(run, group, "engine.sock")
		cmd := exec.Command(bin, "serve", "--listen", sock, "--allow-group", group, "--spare-kernels", "0")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		cmd.Env = []string{"HOME=" + u.HomeDir, "USER=" + u.Username, "PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C.UTF-8"}
		cmd.Dir = u.HomeDir
		stderr := &syncBuffer{}
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
		return cmd, stderr, sock
	}
	_, stderr, sock := serve(u.Username)
	waitUntil(t, "the engine to serve", func() bool { return strings.Contains(stderr.String(), "serving the engine") })
	const nobody = 65534
	if got := helloAs(t, sock, nobody, nobody, []uint32{uint32(gid)}); !strings.Contains(got, `"owner":"nobody"`) {
		t.Errorf("a member's hello to a non-root engine: %s\nserve: %s", got, stderr.String())
	}
	if got := helloAs(t, sock, nobody, nobody, nil); strings.Contains(got, `"owner"`) {
		t.Errorf("a user outside the group was admitted: %s", got)
	}

	cmd, stderr, _ := serve("users")
	cmd.Wait()
	if want := "the engine's user is not in group users: add it (usermod -aG users kdtest1)"; !strings.Contains(stderr.String(), want) {
		t.Errorf("serve --allow-group users by a user outside it says:\n%s\nwant it to say %q", stderr.String(), want)
	}
}
