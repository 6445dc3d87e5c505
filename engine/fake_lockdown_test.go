package engine_test

// Shared-host lockdown: the token, owner-only dirs, failing closed.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/fakeenv"
)

// spawnSecret is the kernel secret on a spawn's stdin (its config line).
func spawnSecret(t *testing.T, a fakeenv.SpawnArgs) string {
	t.Helper()
	cfg, err := a.RunnerConfig()
	if err != nil || len(cfg.Secret) != 64 {
		t.Fatalf("spawn stdin config %q: %+v, %v", a.Config, cfg, err)
	}
	return cfg.Secret
}

// The kernel's secret reaches the host only in the config line on spawn's
// stdin: never in a command string, an event or a result. Tool calls bring
// back per-request MACs under it, never it; those go no further either: not
// into the answers, a refusal, or the quote of a host answer the engine
// could not make sense of.
func TestLockdownTokenNeverInCommands(t *testing.T) {
	reg, _ := fakeEchoTools(t)
	r := newRig(t, fakeToolsAllowed(reg))
	r.host.OnCell = func(req fakeenv.CellRequest) fakeenv.Outcome {
		out := fakeenv.Outcome{Hang: req.Code == "hang()", Stdout: "ok\n"}
		if req.Code == "3" {
			out.Calls = []fakeenv.ToolCall{
				// Authenticated (the kernel's own token) but refused: it names
				// another cell. Its token must not leak into the refusal.
				{Tool: "echo", Args: map[string]int{"x": 4}, Cell: "c-earlier", NoWait: true},
				{Tool: "echo", Args: map[string]int{"x": 3}},
			}
		}
		if req.Code == "5" {
			out.Calls = []fakeenv.ToolCall{{Tool: "echo", Args: map[string]int{"x": 5}}}
		}
		return out
	}
	var results []*engine.Result
	results = append(results, r.exec(engine.Request{Owner: "a", Code: "1", Tools: []string{"read_file"}}))
	results = append(results, r.exec(engine.Request{Owner: "a", Code: "hang()", Tools: []string{"read_file"}, Timeout: 50 * time.Millisecond}))
	results = append(results, r.exec(engine.Request{Owner: "a", Code: "2", Tools: []string{"read_file"}, Reset: true}))
	results = append(results, r.exec(engine.Request{Owner: "b", Code: "3", Tools: []string{"echo"}}))
	r.env.Prepend(fakeenv.On("spawn", fakeenv.SpawnFailed("cannot create kernel dir")).Once())
	results = append(results, r.exec(engine.Request{Owner: "c", Code: "4"}))
	// The answer to b's next cell command is cut off after a forwarded
	// request (no KD:RPCWAIT): the engine gives the kernel up and quotes
	// what the host said.
	r.env.Prepend(fakeenv.On("cell", func(ctx context.Context, c fakeenv.Call) (backends.Result, error) {
		res, err := r.host.Cell(ctx, c)
		res.Output = strings.Replace(res.Output, "KD:RPCWAIT\n", "", 1)
		return res, err
	}).If(fakeenv.StdinContains(`"code":"5"`)).Once())
	results = append(results, r.exec(engine.Request{Owner: "b", Code: "5", Tools: []string{"echo"}}))
	r.eng.ShutdownOwner(context.Background(), "a")

	var tokens []string
	for _, c := range r.env.CallsOf("spawn") {
		a, err := fakeenv.ParseSpawn(c.Command, c.Stdin)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, spawnSecret(t, a))
	}
	// Five spawns: a, a after the reset, b, c's failed one, and the
	// transient kernel of c's per-call run (the per-call run used to be one
	// "once" command, without a spawn of its own).
	if len(tokens) != 5 || len(slices.Compact(slices.Sorted(slices.Values(tokens)))) != 5 {
		t.Fatalf("want 5 spawns with distinct tokens, got %v", tokens)
	}
	if len(r.env.CallsOf("kill")) == 0 || len(r.host.PerCallCells()) != 1 || !slices.ContainsFunc(r.env.CallsOf("spawn"), fakeenv.Transient) {
		t.Fatal("the scenario must cover kill and a per-call run in a transient kernel")
	}
	if results[3].ToolCallsMade != 1 || !slices.ContainsFunc(r.env.CallsOf("cell"), fakeenv.Answering) ||
		len(r.ev.of(engine.EventRPCCall)) != 1 || len(r.ev.of(engine.EventRPCRejected)) != 1 {
		t.Fatalf("the scenario must cover a served and a refused tool call: %+v, %d rpc_call, %d rpc_rejected",
			results[3], len(r.ev.of(engine.EventRPCCall)), len(r.ev.of(engine.EventRPCRejected)))
	}
	// The request MACs the host forwarded are credentials too.
	var macs []string
	for _, k := range r.host.Kernels() {
		for _, f := range k.Forwarded {
			if m := regexp.MustCompile(`"token":"([0-9a-f]{64})"`).FindStringSubmatch(f); m != nil {
				macs = append(macs, m[1])
			}
		}
	}
	if len(macs) < 3 || !slices.ContainsFunc(r.env.CallsOf("cell"), func(c fakeenv.Call) bool {
		return slices.ContainsFunc(macs, func(m string) bool { return strings.Contains(c.Result.Output, m) }) &&
			!strings.Contains(c.Result.Output, "KD:RPCWAIT")
	}) {
		t.Fatalf("no cut-off answer brought a request MAC back from the host (%d forwarded); the test proves nothing about it", len(macs))
	}
	if res := results[5]; res.Kernel == nil || !res.Kernel.StateLost || !strings.Contains(res.Traceback, "unexpected answer from the host") {
		t.Fatalf("the cut-off answer must lose the kernel with a quote of the host: %+v", res)
	}
	for _, c := range r.env.Calls() {
		for _, tok := range tokens {
			if strings.Contains(c.Result.Output, tok) {
				t.Fatalf("a kernel secret came back from the host in a %s answer", c.Marker)
			}
		}
	}
	for _, tok := range append(tokens, macs...) {
		for _, c := range r.env.Calls() {
			if strings.Contains(c.Command, tok) {
				t.Fatalf("token in the %s command line (seq %d)", c.Marker, c.Seq)
			}
			if c.Marker != "spawn" && bytes.Contains(c.Stdin, []byte(tok)) {
				t.Fatalf("token on the stdin of a %s command", c.Marker)
			}
		}
		for _, ev := range r.ev.all() {
			if strings.Contains(fmt.Sprintf("%+v", ev), tok) {
				t.Fatalf("token in event %+v", ev)
			}
		}
		for _, res := range results {
			if strings.Contains(fmt.Sprintf("%+v %+v", res, res.Kernel), tok) {
				t.Fatalf("token in a result: %+v", res)
			}
		}
	}
}

// The recorded spawn command, replayed through a real bash with the recorded
// stdin under a private temp dir, refuses a symlinked kernel root (nothing
// written, named in the error), repairs a permissive one, and otherwise
// yields 0700 dirs and 0600 files, and a runner that holds the secret (it
// answers the socket challenge with it) though no file, argv or environment
// ever held it.
func TestLockdownSpawnReplayRealBash(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the replay checks /proc and GNU stat")
	}
	for _, tool := range []string{"bash", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not on PATH", tool)
		}
	}
	tmp := t.TempDir()
	r := newRig(t)
	r.env.SetTempDir(tmp)
	res := r.exec(engine.Request{Code: "1", Tools: []string{"read_file"}})
	spawns := r.env.CallsOf("spawn")
	if len(spawns) != 1 {
		t.Fatalf("%d spawns", len(spawns))
	}
	spawn := spawns[0]
	args, err := fakeenv.ParseSpawn(spawn.Command, spawn.Stdin)
	if err != nil {
		t.Fatal(err)
	}
	token := spawnSecret(t, args)
	if filepath.Base(res.Kernel.Dir) != args.ID {
		t.Fatalf("kernel dir %s does not end in the spawned id %s", res.Kernel.Dir, args.ID)
	}

	login, err := exec.Command("id", "-un").Output()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(tmp, "kerneldeck-"+strings.TrimSpace(string(login)))
	kd := filepath.Join(root, args.ID)

	replay := func() (string, int) {
		t.Helper()
		return replayBash(t, spawn)
	}

	// A symlinked kernel root fails closed: nothing is written or changed
	// through it.
	elsewhere := t.TempDir()
	if err := os.Chmod(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, root); err != nil {
		t.Fatal(err)
	}
	out, rc := replay()
	if rc == 0 || !strings.Contains(out, "KD:ERR") || !strings.Contains(out, root) || strings.Contains(out, "KD:SPAWNED") {
		t.Fatalf("symlinked root must fail closed naming %s: rc %d, %q", root, rc, out)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("files were written through the symlink: %v", entries)
	}
	if st, err := os.Stat(elsewhere); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("the symlink's target was changed through it: %v %v", st.Mode(), err)
	}

	// A world-writable existing root is locked down.
	os.Remove(root)
	if err := os.Mkdir(root, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(root, 0o777)

	out, rc = replay()
	m := regexp.MustCompile(`(?m)^KD:SPAWNED (\d+) (\S+)`).FindStringSubmatch(out)
	if rc != 0 || m == nil {
		t.Fatalf("replayed spawn failed: rc %d, %q", rc, out)
	}
	var pid int
	fmt.Sscan(m[1], &pid)
	t.Cleanup(func() { killRunner(t, pid) })
	if m[2] != kd {
		t.Fatalf("spawned in %s, want %s", m[2], kd)
	}

	for _, d := range []string{root, kd, kd + "/cells", kd + "/rpc"} {
		st, err := os.Lstat(d)
		if err != nil {
			t.Fatal(err)
		}
		if !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, want a 0700 directory", d, st.Mode())
		}
	}
	var files []string
	filepath.WalkDir(kd, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files = append(files, filepath.Base(p))
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, st.Mode().Perm())
		}
		return nil
	})
	for _, want := range []string{"runner.py", "kerneldeck_tools.py", "runner.log"} {
		if !slices.Contains(files, want) {
			t.Errorf("%s missing from %s (have %v)", want, kd, files)
		}
	}
	tools, _ := os.ReadFile(kd + "/kerneldeck_tools.py")
	if !bytes.Equal(tools, args.Tools) || !bytes.Contains(tools, []byte("def read_file(")) {
		t.Error("kerneldeck_tools.py is not the shipped stub module")
	}
	wantSecretOnlyInMemory(t, pid, kd, token)
	killRunner(t, pid)
}

// replayBash runs a recorded command through a real bash with its recorded
// stdin and returns its output and exit code; what it started is killed at
// cleanup.
func replayBash(t *testing.T, c fakeenv.Call) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", c.Command)
	cmd.Stdin = bytes.NewReader(c.Stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	err = cmd.Wait()
	rc := 0
	if err != nil {
		rc = cmd.ProcessState.ExitCode()
	}
	return out.String(), rc
}

// The transient (per-call) kernel's spawn, replayed through a real bash:
// its dir is <TempDir>/kerneldeck-once-<id>, outside any kernel root.
// Anything already at that path (here a planted symlink) fails it closed
// with nothing written through it; otherwise it yields 0700 dirs, 0600
// files and a runner that holds the secret in its memory only.
func TestLockdownTransientSpawnReplayRealBash(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the replay checks /proc and GNU stat")
	}
	for _, tool := range []string{"bash", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not on PATH", tool)
		}
	}
	tmp := t.TempDir()
	r := newRig(t)
	r.env.SetTempDir(tmp)
	r.env.Prepend(fakeenv.On("spawn", fakeenv.SpawnFailed("kernel root unusable")).If(fakeenv.Not(fakeenv.Transient)))
	if res := r.exec(engine.Request{Code: "1", Tools: []string{"read_file"}}); res.Fallback != "per_call" {
		t.Fatalf("want the per-call fallback: %+v", res)
	}
	i := slices.IndexFunc(r.env.CallsOf("spawn"), fakeenv.Transient)
	if i < 0 {
		t.Fatal("no transient spawn recorded")
	}
	spawn := r.env.CallsOf("spawn")[i]
	args, err := fakeenv.ParseSpawn(spawn.Command, spawn.Stdin)
	if err != nil {
		t.Fatal(err)
	}
	token := spawnSecret(t, args)
	kd := args.Dir("")
	if kd != filepath.Join(tmp, "kerneldeck-once-"+args.ID) {
		t.Fatalf("transient dir %s", kd)
	}

	// Something planted at the path fails closed, naming it.
	elsewhere := t.TempDir()
	if err := os.Chmod(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, kd); err != nil {
		t.Fatal(err)
	}
	spawned := regexp.MustCompile(`(?m)^KD:SPAWNED (\d+) (\S+)`)
	out, rc := replayBash(t, spawn)
	if m := spawned.FindStringSubmatch(out); m != nil {
		var pid int
		fmt.Sscan(m[1], &pid)
		t.Cleanup(func() { killRunner(t, pid) }) // it runs in its own session
	}
	if rc == 0 || !strings.Contains(out, "KD:ERR") || !strings.Contains(out, kd) || strings.Contains(out, "KD:SPAWNED") {
		t.Fatalf("a planted symlink must fail closed naming %s: rc %d, %q", kd, rc, out)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("files were written through the symlink: %v", entries)
	}
	if st, err := os.Stat(elsewhere); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("the symlink's target was changed through it: %v %v", st.Mode(), err)
	}
	os.Remove(kd)

	out, rc = replayBash(t, spawn)
	m := spawned.FindStringSubmatch(out)
	if rc != 0 || m == nil {
		t.Fatalf("replayed spawn failed: rc %d, %q", rc, out)
	}
	var pid int
	fmt.Sscan(m[1], &pid)
	t.Cleanup(func() { killRunner(t, pid) })
	if m[2] != kd {
		t.Fatalf("spawned in %s, want %s", m[2], kd)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 1 {
		t.Fatalf("the temp dir holds %v, want only the transient dir (no kernel root)", entries)
	}
	for _, d := range []string{kd, kd + "/cells", kd + "/rpc"} {
		if st, err := os.Lstat(d); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want a 0700 directory", d, st.Mode(), err)
		}
	}
	filepath.WalkDir(kd, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if st, err := os.Lstat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, st.Mode().Perm())
		}
		return nil
	})
	wantSecretOnlyInMemory(t, pid, kd, token)
	killRunner(t, pid)
}

// wantSecretOnlyInMemory checks that the runner pid in kd holds secret (it
// answers the socket's challenge with it) while no file under kd, nor its
// argv or environment, does.
func wantSecretOnlyInMemory(t *testing.T, pid int, kd, secret string) {
	t.Helper()
	filepath.WalkDir(kd, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		if data, _ := os.ReadFile(p); bytes.Contains(data, []byte(secret)) {
			t.Errorf("%s holds the kernel's secret", p)
		}
		return nil
	})
	for _, f := range []string{"environ", "cmdline"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
		if err == nil && bytes.Contains(data, []byte(secret)) {
			t.Errorf("/proc/%d/%s holds the kernel's secret", pid, f)
		}
	}
	if err := enginetest.Handshake(kd+"/sock", secret); err != nil {
		t.Errorf("the runner does not hold the secret shipped on its stdin: %v", err)
	}
	if err := enginetest.Handshake(kd+"/sock", strings.Repeat("ab", 32)); err == nil {
		t.Error("the runner accepted a handshake under another secret")
	}
}

// killRunner kills the runner's process group (it runs in its own session)
// and waits until it is gone or a zombie.
func killRunner(t *testing.T, pid int) {
	t.Helper()
	syscall.Kill(-pid, syscall.SIGKILL)
	syscall.Kill(pid, syscall.SIGKILL)
	eventually(t, fmt.Sprintf("runner %d to die", pid), func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		// Fields after the ")" that ends the command name: state first.
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		return len(rest) > 1 && rest[1] == 'Z'
	})
}

// A failed publish (disk full) fails closed: Execute errors, the kernel is
// evicted and killed, and the cell never ran.
func TestLockdownFailedPublishFailsClosed(t *testing.T) {
	r := newRig(t)
	first := r.exec(engine.Request{Code: "x = 1"})
	r.env.Prepend(fakeenv.On("cell", fakeenv.PubFail("mv: No space left on device")).If(fakeenv.Publishing).Once())
	res, err := r.eng.Execute(context.Background(), engine.Request{Code: "x += 1", Timeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "evicted") || !strings.Contains(err.Error(), "No space left on device") {
		t.Fatalf("want an error that says the kernel was evicted and why, got %+v, %v", res, err)
	}
	if ks := r.eng.Kernels(); len(ks) != 0 {
		t.Fatalf("registry must be empty: %+v", ks)
	}
	if got := r.killedPIDs(); !slices.Equal(got, []int{first.Kernel.PID}) {
		t.Fatalf("kill commands %v, want [%d]", got, first.Kernel.PID)
	}
	if n := r.host.Runs("x += 1"); n != 0 {
		t.Fatalf("the unpublished cell ran %d times", n)
	}
	// The next call does not reuse the kernel that missed a cell.
	next := r.exec(engine.Request{Code: "x"})
	if next.Kernel.Reused || next.Kernel.ID == first.Kernel.ID || r.env.Count("spawn") != 2 {
		t.Fatalf("next call must get a fresh kernel: %+v", *next.Kernel)
	}
}

// A failed dir setup (the spawn script's owner-only check) ships nothing
// further and spawns nothing: no cell, no kill, no other command names the
// kernel; the caller gets the per-call fallback and the error names the path.
func TestLockdownFailedDirSetupSpawnsNothing(t *testing.T) {
	r := newRig(t)
	const reason = "not owner-only (want 700 0 directory): 775 0 directory:/tmp/kerneldeck-tester"
	r.env.Prepend(fakeenv.On("spawn", fakeenv.SpawnFailed(reason)).Once())
	res := r.exec(engine.Request{Code: "print(1)"})
	if res.Fallback != "per_call" || res.Kernel != nil {
		t.Fatalf("want the per-call fallback: %+v", res)
	}
	// After the failed spawn come only the transient kernel's commands, in
	// its own dir (spawn, cell, kill), none naming the failed kernel; before
	// the transient kernel, the only other command was one "once" script.
	tk := checkPerCallCommands(t, r)
	spawns := r.env.CallsOf("spawn")
	if hk := r.host.Kernels(); len(spawns) != 2 || len(hk) != 1 || hk[0].ID != tk.ID || len(r.eng.Kernels()) != 0 {
		t.Fatalf("spawns %d, host kernels %+v, registry %d; want 2, only the (killed) transient one, 0", len(spawns), hk, len(r.eng.Kernels()))
	}
	if got := r.ev.of(engine.EventSpawnFailed); len(got) != 1 || !strings.Contains(got[0].Detail, "/tmp/kerneldeck-tester") {
		t.Fatalf("spawn_failed must name the path: %+v", got)
	}
	// Nothing stale is left behind: the next call spawns normally.
	if next := r.exec(engine.Request{Code: "1"}); next.Fallback != "" || next.Kernel == nil || next.Kernel.Reused {
		t.Fatalf("next call: %+v", next)
	}
}

// ---- engine bugs found while porting ---------------------------------------
//
// These two tests fail against the engine as it is; the report that came
// with them names the lines and a fix.
