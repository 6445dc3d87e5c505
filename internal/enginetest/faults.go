package enginetest

// Faults on real backends: a host temp dir that fills up, and a runner that
// writes a huge output or a result the engine cannot read. Each subtest
// provokes the fault for real (a small tmpfs as the backend's TempDir, a cell
// that rewrites the runner's own result, 100 MB of stdout) and checks what
// the product promises: a clear error or a truthful result, never a hang,
// never a partial file left behind, and bounded engine memory.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/proctest"
)

// RequireTmpfsEnv set to "1" turns a tmpfs that cannot be mounted from a
// skip into a failure.
const RequireTmpfsEnv = "KERNELDECK_REQUIRE_TMPFS"

// faultHang bounds a call that must not hang: far above anything these
// scenarios take on a loaded machine, and far below the cells' timeouts, so
// only a call stuck until its timeout misses it.
const faultHang = 45 * time.Second

// faultCellTimeout is the timeout of every call in these suites.
const faultCellTimeout = 120 * time.Second

// MountTmpfs mounts a tmpfs of the given size (e.g. "256k") with mode 1777
// on a fresh directory that every user can reach, and unmounts it at
// cleanup. It skips the test when mounting is not permitted, unless
// KERNELDECK_REQUIRE_TMPFS=1.
func MountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kdfs")
	if err != nil {
		t.Fatal(err)
	}
	// Other users (the ssh test users) must be able to traverse to it.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=1777", "tmpfs", dir).CombinedOutput()
	if err != nil {
		os.Remove(dir)
		msg := fmt.Sprintf("cannot mount a %s tmpfs on %s (needs root or CAP_SYS_ADMIN): %v: %s", size, dir, err, strings.TrimSpace(string(out)))
		if os.Getenv(RequireTmpfsEnv) == "1" {
			t.Fatalf("%s; %s=1 makes that a failure", msg, RequireTmpfsEnv)
		}
		t.Skipf("%s (set %s=1 to make this a failure)", msg, RequireTmpfsEnv)
	}
	t.Cleanup(func() {
		// A runner killed at the engine's Close may take a moment to exit
		// on a loaded machine; one still there after 10 s is a leak.
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, err := exec.Command("umount", dir).CombinedOutput()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				// Detach it so the machine is not left with a mount.
				t.Errorf("umount %s: %v: %s; processes using it: %q", dir, err, out, proctest.Using(dir))
				exec.Command("umount", "-l", dir).Run()
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		os.Remove(dir)
	})
	return dir
}

// SharedDir is a fresh directory that any user may write to (mode 1777),
// for marker files that cells on any backend user write.
func SharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kdm")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// FreeBytes is the space left for files on the filesystem holding dir.
func FreeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// FillUp writes a file at path until the filesystem is full and returns how
// many bytes it holds.
func FillUp(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	var n int64
	for {
		w, err := f.Write(chunk)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatalf("fill %s: %v", path, err)
		}
	}
	if free := FreeBytes(t, filepath.Dir(path)); free != 0 {
		t.Fatalf("filled %s with %d bytes, but %d bytes are still free", path, n, free)
	}
	return n
}

// leftovers lists every file under dir (relative paths), except the names
// in keep.
func leftovers(t *testing.T, dir string, keep ...string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		for _, k := range keep {
			if rel == k {
				return nil
			}
		}
		if !d.IsDir() {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// partialFiles lists files under dir that look like half-done publishes:
// temp files of an atomic write, and cell requests.
func partialFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, f := range leftovers(t, dir) {
		base := filepath.Base(f)
		if strings.HasSuffix(base, ".tmp") || strings.HasPrefix(base, ".tmp") || strings.HasSuffix(base, ".req") ||
			strings.Contains(base, ".req.") || strings.Contains(base, ".res.") {
			out = append(out, f)
		}
	}
	return out
}

// requireEvicted checks that the kernel of res is out of the registry, its
// runner is dead and its dir is gone on the host.
func (h *Harness) requireEvicted(owner string, k *engine.KernelResult) {
	h.T.Helper()
	if got, ok := h.Kernel(owner); ok {
		h.T.Fatalf("kernel %s of %s is still registered after the fault: %+v", got.ID, owner, got)
	}
	h.WaitFor(fmt.Sprintf("runner %d to be gone", k.PID), 15*time.Second, func() bool { return !h.Alive(k.PID) })
	if out := strings.TrimSpace(h.Host("ls -d " + k.Dir + " 2>/dev/null; true")); out != "" {
		h.T.Fatalf("the evicted kernel's dir %s is still there", k.Dir)
	}
}

// EventText renders every event seen so far, one per line, for failure messages.
func (h *Harness) EventText() string {
	var b strings.Builder
	for _, ev := range h.AllEvents() {
		fmt.Fprintf(&b, "  %s %s %s\n", ev.Type, ev.Kernel, ev.Detail)
	}
	return b.String()
}

// timedExecute runs req and fails the test if it does not return within
// faultHang.
func (h *Harness) timedExecute(req engine.Request) (*engine.Result, time.Duration, error) {
	h.T.Helper()
	if req.Timeout == 0 {
		req.Timeout = faultCellTimeout
	}
	type answer struct {
		res *engine.Result
		err error
	}
	done := make(chan answer, 1)
	start := time.Now()
	go func() {
		res, err := h.Eng.Execute(context.Background(), req)
		done <- answer{res, err}
	}()
	select {
	case a := <-done:
		return a.res, time.Since(start), a.err
	case <-time.After(faultHang):
		h.T.Fatalf("Execute hung: no answer %v after it started (timeout %v)\nevents:\n%s", faultHang, req.Timeout, h.EventText())
		return nil, 0, nil
	}
}

// FullTempDir is the disk-full suite. newEnv returns a backend whose
// TempDir is tempDir (a small tmpfs the suite mounts and fills).
func FullTempDir(t *testing.T, newEnv func(t *testing.T, tempDir string) backends.Env) {
	// A cell whose request is larger than the space left: over the Execute
	// door the publish fails on the host, the call fails closed (an error that says why and that
	// the kernel was evicted), the code never runs, and no half-written
	// request or temp file is left.
	t.Run("RequestThatDoesNotFitFailsClosed", func(t *testing.T) {
		tmp := MountTmpfs(t, "256k")
		h := New(t, newEnv(t, tmp), nil)
		first := h.Run("a", "x = 1", 0)
		marker := filepath.Join(SharedDir(t), "ran")
		free := FreeBytes(t, tmp)
		// The code runs (if it ever did) only up to the marker; the rest is
		// ballast that makes the request larger than the free space.
		if backends.StreamsOf(h.Env) != nil {
			// Over the runner's socket a request is no file: it runs, once
			// (a confined kernel may not write a marker: the count says).
			res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Code: "x = 2\n#" + strings.Repeat("b", int(free)+64<<10)})
			if err != nil || res.Status != engine.StatusSuccess || res.Kernel.ID != first.Kernel.ID || res.Kernel.ExecutionCount != first.Kernel.ExecutionCount+1 {
				t.Fatalf("a request over the socket into a full temp dir: %v %+v", err, res)
			}
			return
		}
		code := fmt.Sprintf("open(%q, 'a').write('ran\\n')\n#%s\n", marker, strings.Repeat("b", int(free)+64<<10))
		res, took, err := h.timedExecute(engine.Request{Owner: "a", Code: code})
		t.Logf("publish into a full temp dir answered in %v: %v", took, err)
		if err == nil {
			t.Fatalf("a request larger than the free space (%d bytes) was accepted: %+v %+v\nevents:\n%s", free, res, res.Kernel, h.EventText())
		}
		msg := err.Error()
		if !strings.Contains(msg, "publish") || !strings.Contains(msg, "evicted") || !strings.Contains(msg, "No space left on device") {
			t.Fatalf("the error must say the publish failed, why (no space left) and that the kernel was evicted: %v", err)
		}
		h.requireEvicted("a", first.Kernel)
		if killed := h.EventsOf(engine.EventKilled); len(killed) != 1 || !strings.Contains(killed[0].Detail, "publish failed") {
			t.Fatalf("killed events %+v, want one saying publish failed", killed)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("the cell whose publish failed ran anyway")
		}
		if bad := partialFiles(t, tmp); len(bad) != 0 {
			t.Fatalf("partial files left in the temp dir after a failed publish: %v", bad)
		}
		// The next call does not reuse the kernel that missed a cell.
		next := h.Run("a", "print(globals().get('x', 'fresh'))", 0)
		expectStatus(t, next, "success")
		if next.Stdout != "fresh\n" || next.Kernel.Reused || next.Kernel.ID == first.Kernel.ID {
			t.Fatalf("the call after a failed publish: stdout %q kernel %+v; want a fresh kernel", next.Stdout, next.Kernel)
		}
	})

	// A cell that fills the disk itself: over the Execute door its result
	// cannot be written, the runner dies of it, and the call says so at once
	// (state_lost, an error), never waiting for its timeout; over the socket
	// the result needs no file and the kernel lives on. The ballast lived in the
	// kernel's dir, so the eviction frees the space and the next call works.
	t.Run("ResultThatDoesNotFitIsStateLost", func(t *testing.T) {
		tmp := MountTmpfs(t, "256k")
		h := New(t, newEnv(t, tmp), nil)
		first := h.Run("a", "x = 1", 0)
		fill := `import os, sys
R = sys.modules["__main__"].RUNNER
fd = os.open(os.path.join(R.kdir, "ballast"), os.O_WRONLY | os.O_CREAT, 0o600)
try:
    while True:
        os.write(fd, b"\0" * 4096)
except OSError:
    pass
os.close(fd)`
		res, took, err := h.timedExecute(engine.Request{Owner: "a", Code: fill})
		t.Logf("a cell that filled the disk answered in %v", took)
		if err != nil {
			t.Fatalf("a cell whose result could not be written: %v\nevents:\n%s", err, h.EventText())
		}
		if backends.StreamsOf(h.Env) != nil {
			// Over the runner's socket the result is no file: it arrives,
			// and the kernel keeps its state.
			if res.Status != engine.StatusSuccess || res.Kernel.StateLost || res.Kernel.ID != first.Kernel.ID {
				t.Fatalf("a cell that filled the disk, over the socket: status %q kernel %+v", res.Status, res.Kernel)
			}
			// It cannot print on the full disk; once the ballast is gone it can.
			if next := h.Run("a", "assert x == 1\nos.unlink(os.path.join(R.kdir, 'ballast'))", 0); next.Status != engine.StatusSuccess || next.Kernel.ID != first.Kernel.ID {
				t.Fatalf("the next cell on the full disk: status %s traceback %q kernel %+v", next.Status, next.Traceback, next.Kernel)
			}
			if next := h.Run("a", "print(x)", 0); next.Stdout != "1\n" {
				t.Fatalf("a cell after the space came back: stdout %q traceback %q", next.Stdout, next.Traceback)
			}
			return
		}
		if res.Status != "error" || res.Kernel == nil || !res.Kernel.StateLost ||
			!strings.Contains(res.Kernel.Note, "state from earlier calls was lost") {
			t.Fatalf("status %q traceback %q kernel %+v; want error with state_lost\nevents:\n%s", res.Status, res.Traceback, res.Kernel, h.EventText())
		}
		h.requireEvicted("a", first.Kernel)
		if bad := partialFiles(t, tmp); len(bad) != 0 {
			t.Fatalf("partial files left in the temp dir: %v", bad)
		}
		next := h.Run("a", "print(globals().get('x', 'fresh'))", 0)
		if next.Stdout != "fresh\n" || next.Kernel.ID == first.Kernel.ID {
			t.Fatalf("the call after the full disk: stdout %q kernel %+v", next.Stdout, next.Kernel)
		}
	})

	// A tool call made when the disk is full: over the Execute door the
	// kernel-side call cannot write its request file, so the call fails in
	// the cell (an exception that says why), no partial request file is
	// left in rpc/ of the live kernel, nothing reaches the host's tools, and
	// the kernel keeps working. Over the socket it needs no file and goes
	// through.
	t.Run("ToolRequestThatDoesNotFitLeavesNoPartialFile", func(t *testing.T) {
		tmp := MountTmpfs(t, "256k")
		h := NewTools(t, newEnv(t, tmp), nil)
		h.WriteWorkspace("f", "from the host")
		first := h.Call("a", []string{"read_file"}, "import kerneldeck_tools as kt\nx = kt.read_file('f')")
		expectOK(t, first, "")
		res := h.Call("a", []string{"read_file"}, `import os, sys
R = sys.modules["__main__"].RUNNER
ballast = os.path.join(R.kdir, "ballast")
fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
try:
    while True:
        os.write(fd, b"\0" * 4096)
except OSError:
    pass
os.close(fd)
try:
    kt.read_file("f")
    outcome = "the call went through"
except Exception as e:
    outcome = "%s: %s" % (type(e).__name__, e)
os.unlink(ballast)  # room again, for this cell's own output
print(outcome)
print(sorted(os.listdir(R.rpc_dir)))
print(x)`)
		if res.Status != "success" || res.Kernel == nil || res.Kernel.PID != first.Kernel.PID {
			t.Fatalf("status %q stdout %q traceback %q kernel %+v", res.Status, res.Stdout, res.Traceback, res.Kernel)
		}
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if backends.StreamsOf(h.Env) != nil {
			// Over the running cell's socket a tool request is no file: it
			// goes through on the full disk.
			if len(lines) != 3 || lines[0] != "the call went through" || lines[1] != "[]" || lines[2] != "from the host" || res.ToolCallsMade != 1 {
				t.Fatalf("a tool call over the socket on a full disk: stdout %q, %d calls made", res.Stdout, res.ToolCallsMade)
			}
			return
		}
		if len(lines) != 3 || !strings.Contains(lines[0], "No space left on device") {
			t.Fatalf("the failed tool call: stdout %q; want an exception naming the cause", res.Stdout)
		}
		if lines[1] != "[]" {
			t.Fatalf("partial request files left in the live kernel's rpc/ dir: %s", lines[1])
		}
		if lines[2] != "from the host" || res.ToolCallsMade != 0 {
			t.Fatalf("state %q, tool calls made %d; want the kernel's state kept and no call dispatched", lines[2], res.ToolCallsMade)
		}
	})

	// No room to spawn at all: the spawn and the per-call fallback both fail,
	// and the error names the cause; nothing half-made is left, nothing is
	// registered. Once space is freed, the next call spawns normally.
	t.Run("SpawnThatDoesNotFitNamesTheCause", func(t *testing.T) {
		tmp := MountTmpfs(t, "256k")
		h := New(t, newEnv(t, tmp), nil)
		filler := filepath.Join(tmp, "filler")
		n := FillUp(t, filler)
		t.Logf("filled the temp dir with %d bytes", n)
		marker := filepath.Join(SharedDir(t), "ran")
		code := fmt.Sprintf("open(%q, 'a').write('ran\\n')", marker)
		res, took, err := h.timedExecute(engine.Request{Owner: "a", Code: code})
		t.Logf("spawn into a full temp dir answered in %v: %v", took, err)
		if err == nil {
			t.Fatalf("a spawn into a full temp dir succeeded: %+v\nevents:\n%s", res, h.EventText())
		}
		msg := err.Error()
		if !strings.Contains(msg, "No space left on device") || !strings.Contains(msg, "per-call fallback failed too") {
			t.Fatalf("the error must name the cause (no space left) for the spawn and for the per-call fallback: %v", err)
		}
		if strings.Count(msg, "No space left on device") < 2 {
			t.Errorf("the per-call fallback's part of the error does not name the cause: %v", err)
		}
		if len(h.Eng.Kernels()) != 0 {
			t.Fatalf("a kernel is registered after a failed spawn: %+v", h.Eng.Kernels())
		}
		if got := h.EventsOf(engine.EventSpawnFailed); len(got) != 1 || !strings.Contains(got[0].Detail, "No space left on device") {
			t.Fatalf("spawn_failed events %+v, want one naming the cause", got)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("the code ran although no kernel could be spawned")
		}
		if left := leftovers(t, tmp, "filler"); len(left) != 0 {
			t.Fatalf("files left in the temp dir by the failed spawns: %v", left)
		}
		if ents, _ := os.ReadDir(tmp); len(ents) > 2 {
			t.Fatalf("dirs left in the temp dir by the failed spawns: %v", ents)
		}
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		next := h.Run("a", code, 0)
		if next.Fallback != "" || next.Kernel.Reused {
			t.Fatalf("the call after space was freed: %+v %+v", next, next.Kernel)
		}
		if b, _ := os.ReadFile(marker); string(b) != "ran\n" {
			t.Fatalf("marker %q after one successful call, want one run", b)
		}
	})
}

// memProbe measures the engine process's heap while f runs: the bytes
// allocated in total, and the peak growth of the heap in use (sampled every
// 5 ms). The collector runs at GOGC=20 meanwhile, so that the heap in use
// follows the live heap closely instead of whenever the default pacing lets
// garbage pile up to twice the live heap.
func memProbe(f func()) (totalAlloc, peakInuse uint64) {
	defer debug.SetGCPercent(debug.SetGCPercent(20))
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	f()
	close(stop)
	wg.Wait()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	peak = max(peak, after.HeapInuse)
	grow := uint64(0)
	if peak > before.HeapInuse {
		grow = peak - before.HeapInuse
	}
	return after.TotalAlloc - before.TotalAlloc, grow
}

// Bounds on the engine's memory for a cell that printed 100 MB: the runner
// keeps 5 MB (SpillMax) and the engine copies that spill a few times over
// Execute (measured: 26-33 MB allocated, 18-31 MB peak growth). Both bounds
// stay under the 100 MB an engine that read the output once would need.
const (
	hugeOutputPeakBound  = 12 * engine.DefaultSpillMax
	hugeOutputAllocBound = 16 * engine.DefaultSpillMax
)

// RunnerOutputFaults is the suite for a runner that writes too much or
// writes what the engine cannot read.
func RunnerOutputFaults(t *testing.T, newEnv func(t *testing.T) backends.Env) {
	// 100 MB of stdout: the result is clipped, the spill file holds at most
	// SpillMax bytes (on the host and in the state dir), and the engine's
	// heap stays bounded by the spill size, not the output size.
	t.Run("HugeOutputIsClippedAndMemoryBounded", func(t *testing.T) {
		h := New(t, newEnv(t), nil)
		h.Run("a", "import sys", 0)
		var res *engine.Result
		var err error
		total, peak := memProbe(func() {
			res, _, err = h.timedExecute(engine.Request{Owner: "a", Code: "sys.stdout.write('x' * (100 << 20))\nprint('end')"})
		})
		t.Logf("100 MB of stdout: engine allocated %.1f MB in all (bound %d MB), heap in use grew by at most %.1f MB (bound %d MB)",
			float64(total)/(1<<20), hugeOutputAllocBound>>20, float64(peak)/(1<<20), hugeOutputPeakBound>>20)
		if err != nil {
			t.Fatal(err)
		}
		expectStatus(t, res, "success")
		if total > hugeOutputAllocBound || peak > hugeOutputPeakBound {
			t.Fatalf("for a 100 MB output the engine allocated %d bytes (want at most %d) and its heap in use grew by %d (want at most %d)",
				total, hugeOutputAllocBound, peak, hugeOutputPeakBound)
		}
		if !res.StdoutClipped || !HeadAndTail(res.Stdout, engine.DefaultClipChars, "xend\n") {
			t.Fatalf("stdout: clipped %v, %d chars %.60q...%.60q (want the head and tail of %d x's)", res.StdoutClipped, len(res.Stdout),
				res.Stdout, res.Stdout[max(0, len(res.Stdout)-60):], engine.DefaultClipChars)
		}
		if res.SpillPath == "" || !strings.HasPrefix(res.SpillPath, h.StateDir) {
			t.Fatalf("spill path %q not under the state dir %s", res.SpillPath, h.StateDir)
		}
		st, err := os.Stat(res.SpillPath)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != engine.DefaultSpillMax || st.Mode().Perm() != 0o600 {
			t.Fatalf("spill file %s: %d bytes mode %v; want exactly the spill max %d, 0600", res.SpillPath, st.Size(), st.Mode().Perm(), engine.DefaultSpillMax)
		}
		// The runner truncated its own copy on the host too.
		cell := strings.TrimSuffix(filepath.Base(res.SpillPath), ".stdout")
		hostOut := res.Kernel.Dir + "/cells/" + cell + ".out"
		size, err := strconv.Atoi(strings.TrimSpace(h.Host("stat -c %s " + hostOut)))
		if err != nil || size > engine.DefaultSpillMax {
			t.Fatalf("host copy %s: %d bytes (%v); want at most %d", hostOut, size, err, engine.DefaultSpillMax)
		}
		// The kernel lives on with its state.
		if next := h.Run("a", "print(sys.version_info >= (3,))", 0); next.Stdout != "True\n" || !next.Kernel.Reused {
			t.Fatalf("after the huge output: %q %+v", next.Stdout, next.Kernel)
		}
	})

	env := newEnv(t)
	if backends.StreamsOf(env) == nil {
		// Plain Execute: the engine reads cells/<id>.res from the host.
		t.Run("MalformedResultFileIsStateLost", func(t *testing.T) {
			malformedResultFile(t, newEnv)
		})
	} else {
		t.Run("NonJSONFrameIsIgnored", func(t *testing.T) { nonJSONFrames(t, newEnv(t)) })
		t.Run("OversizedFrameClosesTheStream", func(t *testing.T) { oversizedFrame(t, newEnv(t)) })
	}
}

// corruptResult makes the runner write its next result file (the one of
// the cell that runs this code) through mangle, a Python expression of data
// (the bytes the runner would write).
func corruptResult(mangle string) string {
	return fmt.Sprintf(`import sys
_M = sys.modules["__main__"]
_write = _M.write_private
def _bad(path, data, _write=_write):
    if path.endswith(".res"):
        data = %s
    _write(path, data)
_M.write_private = _bad
print("corrupting my own result")`, mangle)
}

// A result file that is truncated, garbage, empty or about another cell:
// the call returns at once with an error that says the result was
// malformed, the kernel is treated as lost (evicted and killed, state_lost)
// because the engine cannot know what the cell did, and the next call
// respawns.
func malformedResultFile(t *testing.T, newEnv func(t *testing.T) backends.Env) {
	for _, tc := range []struct{ name, mangle string }{
		{"truncated", "data[: len(data) // 2]"},
		{"garbage", `b"not json at all {"`},
		{"empty", `b""`},
		{"other cell id", `data.replace(b'"id": "c', b'"id": "x', 1)`},
		{"not an object", `b"[1, 2, 3]"`},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			h := New(t, newEnv(t), nil)
			first := h.Run("a", "x = 1", 0)
			res, took, err := h.timedExecute(engine.Request{Owner: "a", Code: corruptResult(tc.mangle)})
			t.Logf("%s result file: answered in %v", tc.name, took)
			if err != nil {
				t.Fatalf("a %s result file: %v\nevents:\n%s", tc.name, err, h.EventText())
			}
			if res.Status != "error" || res.Kernel == nil || !res.Kernel.StateLost ||
				!strings.Contains(res.Kernel.Note, "malformed result") || !strings.Contains(res.Traceback, "malformed result") {
				t.Fatalf("a %s result file: status %q stdout %q traceback %q kernel %+v; want an error saying the result was malformed, with state_lost",
					tc.name, res.Status, res.Stdout, res.Traceback, res.Kernel)
			}
			if len(h.EventsOf(engine.EventStateLost)) != 1 {
				t.Fatalf("state_lost events: %+v", h.EventsOf(engine.EventStateLost))
			}
			h.requireEvicted("a", first.Kernel)
			next := h.Run("a", "print(globals().get('x', 'fresh'))", 0)
			if next.Stdout != "fresh\n" || next.Kernel.PID == first.Kernel.PID {
				t.Fatalf("the call after a malformed result: %q %+v", next.Stdout, next.Kernel)
			}
		})
	}
}

// sendRawPy defines raw(data): it writes bytes straight onto the stream of
// the engine waiting for the running cell, as a broken runner would.
const sendRawPy = `import sys
_R = sys.modules["__main__"].RUNNER
def raw(data):
    conn = _R.waiters[_R.running][0]
    with conn.wlock:
        conn.sock.settimeout(120)
        conn.sock.sendall(data)
`

// Frames that are not JSON, and a result frame for another cell, are
// ignored: the cell's own result arrives, on the same stream (no re-dial)
// and the same kernel.
func nonJSONFrames(t *testing.T, env backends.Env) {
	h := New(t, env, nil)
	first := h.Run("a", "x = 1", 0)
	res := h.Run("a", sendRawPy+`raw(b"not json\n")
raw(b"\x00\xff{{{\n")
raw(b'{"op": "result", "id": "c0000000000000000", "status": "ok", "stdout": "forged"}\n')
raw(b'["op", "result"]\n')
x += 1
print(x)`, 0)
	expectStatus(t, res, "success")
	if res.Stdout != "2\n" || res.Kernel.PID != first.Kernel.PID || res.Kernel.StateLost {
		t.Fatalf("after junk frames: stdout %q kernel %+v", res.Stdout, res.Kernel)
	}
	next := h.Run("a", "print(x)", 0)
	if next.Stdout != "2\n" || next.Kernel.PID != first.Kernel.PID {
		t.Fatalf("the call after junk frames: %q %+v", next.Stdout, next.Kernel)
	}
	if n := len(h.EventsOf(engine.EventReconnected)); n != 0 {
		t.Fatalf("junk frames closed the stream (%d reconnected events); they must only be ignored", n)
	}
}

// One line longer than the engine's frame limit (64 MiB): the engine stops
// buffering at the limit and closes the stream instead of growing without
// bound; the cell's result is then collected over plain Execute from the
// same runner (the cell ran once), and the next call re-opens the stream.
func oversizedFrame(t *testing.T, env backends.Env) {
	h := New(t, env, nil)
	first := h.Run("a", "x = 1", 0)
	res, took, err := h.timedExecute(engine.Request{Owner: "a", Code: sendRawPy + `try:
    raw(b"x" * (65 << 20) + b"\n")
    how = "sent whole"
except OSError as e:
    how = "cut off"
x += 1
print(x, how)`})
	t.Logf("an oversized frame: answered in %v", took)
	if err != nil {
		t.Fatalf("an oversized frame: %v\nevents:\n%s", err, h.EventText())
	}
	expectStatus(t, res, "success")
	// Whether the runner's write was cut off depends on how much the
	// transport buffers (sshd takes it all); either way the cell goes on.
	if (res.Stdout != "2 cut off\n" && res.Stdout != "2 sent whole\n") || res.Kernel.PID != first.Kernel.PID || res.Kernel.StateLost {
		t.Fatalf("after an oversized frame: stdout %q kernel %+v; want the cell's own result from the same kernel",
			res.Stdout, res.Kernel)
	}
	t.Logf("the runner's write: %s", strings.TrimPrefix(strings.TrimSpace(res.Stdout), "2 "))
	next := h.Run("a", "print(x)", 0)
	if next.Stdout != "2\n" || next.Kernel.PID != first.Kernel.PID {
		t.Fatalf("the call after an oversized frame: %q %+v (the cell must have run exactly once)", next.Stdout, next.Kernel)
	}
	if n := len(h.EventsOf(engine.EventReconnected)); n != 1 {
		t.Fatalf("%d reconnected events, want 1: the oversized frame must close the stream, and the next call re-open it\nevents:\n%s", n, h.EventText())
	}
}
