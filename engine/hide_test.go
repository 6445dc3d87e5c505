package engine_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// prober is a kernel's cell: for each dir it lists it and plants a file in
// it, for each file it reads it, and it tries /proc/<engine>/root, and
// unmounting what covers the state dir. It prints what each got, as JSON.
const prober = `
import ctypes, json, os
DIRS, FILES, ENGINE, STATE = %s, %s, %d, %q
out = {}
def attempt(name, f):
    try:
        out[name] = "ok: " + str(f())[:200]
    except OSError as e:
        out[name] = "refused: " + (e.strerror or str(e))
def plant(d):
    with open(os.path.join(d, "planted"), "w") as f:
        f.write("x")
for d in DIRS:
    attempt("list " + d, lambda: os.listdir(d))
    attempt("plant in " + d, lambda: plant(d))
for f in FILES:
    attempt("read " + f, lambda: len(open(f, "rb").read()))
attempt("/proc/<engine>/root", lambda: os.listdir("/proc/%%d/root%%s" %% (ENGINE, STATE)))
libc = ctypes.CDLL(None, use_errno=True)
def umount():
    if libc.umount2(STATE.encode(), 2) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return os.listdir(STATE)
attempt("umount", umount)
print(json.dumps(out))
`

// The engine's state dir is out of every kernel's sight, whole: its
// journal (every kernel's secret), its parked states and their key, its
// kept runners (code every later kernel runs) and its event log. Runners
// cover it with an empty mount; where they cannot, Landlock denies it,
// all of it: it once allowed everything in the state dir but the journal
// (the walk went down into the state dir to deny the journal inside it).
func TestTheStateDirIsHiddenFromKernels(t *testing.T) {
	for _, mode := range []string{"mounts", "landlock alone"} {
		t.Run(mode, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			h := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), func(c *engine.Config) {
				c.StateDir, c.JournalDir, c.ParkDir = state, filepath.Join(state, "journal"), filepath.Join(state, "parked")
				c.LandlockOnly = mode == "landlock alone"
			})
			// What an engine's state dir holds besides: kept runners and
			// the event log (the CLI's), made here by hand.
			for _, f := range []string{"runners/runner-0123.json", "events/0001.log", "parked/deep/deeper/x"} {
				p := filepath.Join(state, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(`{"secret": "not for kernels"}`), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			h.Run("alice", "x = 1", 30*time.Second)
			h.WaitFor("alice's kernel in the journal", 10*time.Second, func() bool {
				files, _ := filepath.Glob(filepath.Join(state, "journal", "*.json"))
				return len(files) == 1
			})
			var dirs, files []string
			filepath.WalkDir(state, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				} else if err == nil {
					files = append(files, p)
				}
				return nil
			})
			if !slices.Contains(files, filepath.Join(state, "parked", "park.key")) || len(dirs) < 6 {
				t.Fatalf("the state dir does not hold what an engine's does: %q %q", dirs, files)
			}
			quoted := func(s []string) string { b, _ := json.Marshal(s); return string(b) }
			res := h.Run("mallory", fmt.Sprintf(prober, quoted(dirs), quoted(files), os.Getpid(), state), 30*time.Second)
			var got map[string]string
			if res.Status != engine.StatusSuccess || json.Unmarshal([]byte(res.Stdout), &got) != nil {
				t.Fatalf("mallory's probe did not run: %q %q", res.Stdout, res.Traceback)
			}
			k, _ := h.Kernel("mallory")
			if !strings.HasPrefix(k.Confinement, "landlock:") {
				t.Skipf("runners here are not confined (%s)", k.Confinement)
			}
			hidden := strings.Contains(k.Confinement, "+mountns")
			if hidden != (mode == "mounts") {
				t.Errorf("confinement %q in mode %s", k.Confinement, mode)
			}
			for attempt, outcome := range got {
				// Hidden, the state dir is an empty dir of its own.
				if hidden && attempt == "list "+state && outcome == "ok: []" {
					continue
				}
				if !strings.HasPrefix(outcome, "refused") {
					t.Errorf("%s: %s; want it refused", attempt, outcome)
				}
			}
			for _, d := range dirs {
				if _, err := os.Lstat(filepath.Join(d, "planted")); err == nil {
					t.Errorf("mallory planted a file in %s", d)
				}
			}
			if t.Failed() || testing.Verbose() {
				t.Logf("confinement %s: %v", k.Confinement, got)
			}
		})
	}
}

// A kernel works where its user works: it writes its home, the temp dir
// and its cwd, with the engine's umask (not the runner's 077), and reads
// what others put in the temp dir after it started (Landlock alone lost
// those, for it can only allow whole trees).
func TestKernelsWorkWhereTheirUserWorks(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	home, _ := os.UserHomeDir()
	if home == "" {
		t.Skip("no home dir")
	}
	h := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), nil)
	h.Run("alice", "import os\nprint(os.getpid())", 30*time.Second)
	late := filepath.Join(os.TempDir(), fmt.Sprintf("kd-late-%d", os.Getpid()))
	if err := os.WriteFile(late, []byte("made after the kernel started"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(late)
	mine := fmt.Sprintf("kd-work-%d", os.Getpid())
	places := []string{filepath.Join(home, "."+mine), filepath.Join(os.TempDir(), mine), mine}
	defer func() {
		for _, p := range places {
			os.Remove(p)
		}
	}()
	quoted, _ := json.Marshal(places)
	res := h.Run("alice", fmt.Sprintf(`import os
for p in %s:
    with open(p, "w") as f:
        f.write("x")
    print(p, oct(os.stat(p).st_mode & 0o777))
    os.remove(p)
print(open(%q).read())
print(os.environ.get("TMPDIR", "") == %q)
`, quoted, late, os.Getenv("TMPDIR")), 30*time.Second)
	if res.Status != engine.StatusSuccess {
		t.Fatalf("the cell failed: %s %s", res.Stdout, res.Traceback)
	}
	want := ""
	for _, p := range places {
		want += p + " 0o644\n"
	}
	want += "made after the kernel started\nTrue\n"
	if res.Stdout != want {
		k, _ := h.Kernel("alice")
		t.Errorf("confinement %s: the cell said\n%s\nwant\n%s", k.Confinement, res.Stdout, want)
	}
}

// Where Landlock alone hides (no mount namespace), a PermissionError the
// guard caused says so in the result, and what to do instead; one the
// guard had no part in says nothing of it.
func TestTheGuardSaysWhatItClosed(t *testing.T) {
	tmp := enginetest.ShortTempDir(t)
	h := enginetest.New(t, backends.NewLocal(tmp), func(c *engine.Config) { c.LandlockOnly = true })
	res := h.Run("alice", fmt.Sprintf("open(%q, 'w')", filepath.Join(tmp, "new.csv")), 30*time.Second)
	k, _ := h.Kernel("alice")
	if !strings.HasPrefix(k.Confinement, "landlock:") || strings.Contains(k.Confinement, "+mountns") {
		t.Skipf("runners here are not confined by Landlock alone (%s)", k.Confinement)
	}
	if res.Status != engine.StatusError || !strings.Contains(res.Traceback, "PermissionError") ||
		!strings.Contains(res.Traceback, "kerneldeck: the guard did this") || !strings.Contains(res.Traceback, "Write under $TMPDIR") {
		t.Errorf("a new file in the temp dir, which Landlock alone closes: %s %q", res.Status, res.Traceback)
	}
	res = h.Run("alice", "raise PermissionError(13, 'Permission denied', '/etc/kd-elsewhere')", 30*time.Second)
	if !strings.Contains(res.Traceback, "PermissionError") || strings.Contains(res.Traceback, "kerneldeck:") {
		t.Errorf("a PermissionError the guard had no part in: %q", res.Traceback)
	}
}
