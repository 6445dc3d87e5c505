// Package backendtest holds test helpers shared by every backend and by the
// engine's tests: the backend contract suite (Contract) and an Env wrapper
// that counts round trips and stream frames (Counting).
package backendtest

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
)

// hangGuard bounds every call the suite makes, so a backend that ignores a
// timeout or hangs on a detached process fails the test instead of stalling
// it. It is a guard, not a measurement: the suite never asserts durations.
// It is generous because CI runs every package at once on two loaded cores:
// there, 20 concurrent calls queued behind an ssh connection's 6 sessions
// once took over 25 s (2 s on an idle machine).
const hangGuard = 90 * time.Second

// Contract runs the backend contract suite as subtests. newEnv is called once
// per subtest with that subtest's t and returns the Env to check: a fresh one
// (backends.NewLocal(t.TempDir())) or a shared one (one ssh connection); the
// suite only creates and removes its own scratch dirs under TempDir(). The
// subtests run in parallel; Contract returns when all of them have finished.
// A backend must have bash, coreutils, setsid and /proc on its host, and
// python3 when it offers streams (kernels need it anyway).
func Contract(t *testing.T, newEnv func(t *testing.T) backends.Env) {
	t.Helper()
	t.Run("contract", func(t *testing.T) {
		for _, c := range contractCases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				env := newEnv(t)
				if env == nil {
					t.Fatal("newEnv returned nil")
				}
				c.run(t, env)
			})
		}
	})
}

var contractCases = []struct {
	name string
	run  func(t *testing.T, env backends.Env)
}{
	{"Output", testOutput},
	{"NonZeroExitIsAResult", testExitCode},
	{"StdinByteExact", testStdin},
	{"StdinSplitWithHeadC", testHeadSplit},
	{"StderrInOutput", testStderr},
	{"TimeoutKillsProcessGroup", testTimeout},
	{"CancelEndsCommand", testCancel},
	{"CallerDeadlineIsNotTimeout", testCallerDeadline},
	{"RunsUnderBash", testBash},
	{"TempDirWritable", testTempDir},
	{"DetachedProcessDoesNotHang", testDetached},
	{"Concurrent", testConcurrent},
	{"OutputCapped", testOutputCap},
	{"StdinSecretsNotEchoed", testSecrets},
	{"StreamDialUnix", testDialUnix},
	{"StreamDialMissingPath", testDialMissing},
}

// Shq quotes s for bash.
func Shq(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// guardCtx is a context canceled (not timed out, so that it can be told
// apart from ExecOptions.Timeout) after d, or when the test ends.
func guardCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	timer := time.AfterFunc(d, cancel)
	t.Cleanup(func() { timer.Stop(); cancel() })
	return ctx
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// run executes command and fails the test on a transport error.
func run(t *testing.T, env backends.Env, command string, stdin []byte) backends.Result {
	t.Helper()
	res, err := env.Execute(guardCtx(t, hangGuard), command, backends.ExecOptions{Stdin: stdin})
	if err != nil {
		t.Fatalf("Execute(%.80q): unexpected transport error: %v (output %.300q)", command, err, res.Output)
	}
	return res
}

// runOK executes command and fails the test unless it exits 0.
func runOK(t *testing.T, env backends.Env, command string, stdin []byte) string {
	t.Helper()
	res := run(t, env, command, stdin)
	if res.ReturnCode != 0 {
		t.Fatalf("Execute(%.80q): rc %d, want 0; output %.500q", command, res.ReturnCode, res.Output)
	}
	return res.Output
}

// hostDir makes a private scratch dir under env.TempDir() on the host and
// removes it when the test ends.
func hostDir(t *testing.T, env backends.Env) string {
	t.Helper()
	out := runOK(t, env, "umask 077; mktemp -d "+Shq(env.TempDir())+"/kd-contract.XXXXXXXX", nil)
	dir := strings.TrimSpace(out)
	if !path.IsAbs(dir) || strings.ContainsAny(dir, "\n'") {
		t.Fatalf("mktemp under TempDir %q printed %q", env.TempDir(), out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		env.Execute(ctx, "rm -rf -- "+Shq(dir), backends.ExecOptions{})
	})
	return dir
}

// alive reports whether pid runs on the host (a zombie counts as gone).
func alive(t *testing.T, env backends.Env, pid int) bool {
	t.Helper()
	out := runOK(t, env, fmt.Sprintf(
		`if kill -0 %[1]d 2>/dev/null && ! grep -qs '^State:[[:space:]]*Z' /proc/%[1]d/status; then echo ALIVE; else echo GONE; fi`, pid), nil)
	return strings.Contains(out, "ALIVE")
}

// requireGone waits (boundedly: a SIGKILLed process needs a moment to be
// reaped) until pid is gone on the host, and fails if it never goes.
func requireGone(t *testing.T, env backends.Env, pid int, what string) {
	t.Helper()
	for range 100 {
		if !alive(t, env, pid) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	runOK(t, env, fmt.Sprintf("kill -KILL %d 2>/dev/null; true", pid), nil)
	t.Fatalf("%s (pid %d) is still running: the backend did not kill the command's whole process group", what, pid)
}

// pidIn is the pid a command wrote into file on the host, 0 when there is
// none, and what the file held.
func pidIn(t *testing.T, env backends.Env, file string) (int, string) {
	t.Helper()
	out := runOK(t, env, "cat -- "+Shq(file)+" 2>/dev/null; true", nil)
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || pid <= 1 {
		return 0, out
	}
	return pid, out
}

// readPid reads a pid that a command wrote into file on the host.
func readPid(t *testing.T, env backends.Env, file string) int {
	t.Helper()
	pid, out := pidIn(t, env, file)
	if pid == 0 {
		t.Fatalf("no pid in %s (got %q): the command did not start", file, out)
	}
	return pid
}

func testOutput(t *testing.T, env backends.Env) {
	out := runOK(t, env, "echo hello; printf 'two\\nlines'", nil)
	if out != "hello\ntwo\nlines" {
		t.Fatalf("Output = %q, want %q", out, "hello\ntwo\nlines")
	}
	if out := runOK(t, env, "true", nil); out != "" {
		t.Fatalf("Output of true = %q, want empty", out)
	}
}

func testExitCode(t *testing.T, env backends.Env) {
	for _, c := range []struct {
		cmd  string
		rc   int
		want string
	}{
		{"echo partial; exit 7", 7, "partial\n"},
		{"false", 1, ""},
		{"exit 255", 255, ""},
		{"command-that-does-not-exist-kd 2>/dev/null", 127, ""},
		{"kill -TERM $$", 128 + 15, ""},
	} {
		res, err := env.Execute(guardCtx(t, hangGuard), c.cmd, backends.ExecOptions{})
		if err != nil {
			t.Fatalf("Execute(%q): a non-zero exit must be a Result.ReturnCode, not an error; got error %v", c.cmd, err)
		}
		if res.ReturnCode != c.rc || res.Output != c.want {
			t.Fatalf("Execute(%q) = rc %d, output %q; want rc %d, output %q", c.cmd, res.ReturnCode, res.Output, c.rc, c.want)
		}
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func testStdin(t *testing.T, env backends.Env) {
	allBytes := make([]byte, 0, 1024)
	for i := range 1024 {
		allBytes = append(allBytes, byte(i))
	}
	allBytes = append(allBytes, 0, 0, 0xff, 0xff, '\n', 0, '\r', '\n')
	cases := []struct {
		name  string
		stdin []byte
	}{
		{"binary", allBytes},
		{"1MiB", randomBytes(1 << 20)},
		{"no trailing newline", []byte("last line")},
		{"empty", []byte{}},
		{"nil", nil},
	}
	for _, c := range cases {
		// The hash and the size are computed on the host, so this checks what
		// the command read, independently of how Output is carried back.
		out := runOK(t, env, `wc -c | tr -d ' '`, c.stdin)
		if strings.TrimSpace(out) != strconv.Itoa(len(c.stdin)) {
			t.Fatalf("%s: the command read %s bytes of stdin, want %d", c.name, strings.TrimSpace(out), len(c.stdin))
		}
		out = runOK(t, env, `sha256sum | cut -c1-64`, c.stdin)
		if got, want := strings.TrimSpace(out), sha(c.stdin); got != want {
			t.Fatalf("%s: stdin did not reach the command byte-exact: sha256 %s on the host, %s sent", c.name, got, want)
		}
	}
	// A command that reads none or part of a large stdin is not an error.
	big := randomBytes(1 << 20)
	for cmd, want := range map[string]string{"true": "", "head -c 3 >/dev/null; echo read3": "read3\n", "exec 0<&-; echo closed": "closed\n"} {
		if out := runOK(t, env, cmd, big); out != want {
			t.Fatalf("%q with 1 MiB of stdin it does not read: output %q, want %q", cmd, out, want)
		}
	}
	// And back: bytes a command prints come back unchanged.
	if out := runOK(t, env, "cat", allBytes); out != string(allBytes) {
		t.Fatalf("cat of %d binary bytes returned %d bytes that differ", len(allBytes), len(out))
	}
}

func testHeadSplit(t *testing.T, env backends.Env) {
	// The engine's spawn ships several files on one stdin and splits them with
	// consecutive `head -c N`. That only works if head never reads past N from
	// a pipe. Sizes straddle the 64 KiB pipe buffer and are not block-aligned,
	// so any over-read shifts the later parts and changes their hashes.
	d := hostDir(t, env)
	names := []string{"a", "b", "c", "zero", "d"}
	sizes := []int{1000, 70001, 1, 0, 200003}
	var stdin []byte
	var parts [][]byte
	for _, n := range sizes {
		p := randomBytes(n)
		parts = append(parts, p)
		stdin = append(stdin, p...)
	}
	rest := append([]byte("trailer\x00\xff"), randomBytes(4099)...)
	stdin = append(stdin, rest...)
	var cmd strings.Builder
	fmt.Fprintf(&cmd, "d=%s\n", Shq(d))
	for i, n := range names {
		fmt.Fprintf(&cmd, "head -c %d >\"$d/%s\" || exit 9\n", sizes[i], n)
	}
	cmd.WriteString("cat >\"$d/rest\" || exit 9\n")
	cmd.WriteString(`for f in ` + strings.Join(names, " ") + ` rest; do printf '%s %s %s\n' "$f" "$(wc -c <"$d/$f" | tr -d ' ')" "$(sha256sum <"$d/$f" | cut -c1-64)"; done`)
	out := runOK(t, env, cmd.String(), stdin)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(names)+1 {
		t.Fatalf("unexpected output %q", out)
	}
	for i, line := range lines {
		name, data := "rest", rest
		if i < len(names) {
			name, data = names[i], parts[i]
		}
		want := fmt.Sprintf("%s %d %s", name, len(data), sha(data))
		if line != want {
			t.Fatalf("part %q: host has %q, want %q: `head -c` over-read from the stdin pipe or stdin was altered", name, line, want)
		}
	}
}

func testStderr(t *testing.T, env backends.Env) {
	res := run(t, env, "echo to-stdout; echo to-stderr >&2; exit 3", nil)
	if res.ReturnCode != 3 || !strings.Contains(res.Output, "to-stdout\n") || !strings.Contains(res.Output, "to-stderr\n") {
		t.Fatalf("got rc %d, output %q; want rc 3 and both streams in Output", res.ReturnCode, res.Output)
	}
}

func testTimeout(t *testing.T, env backends.Env) {
	// The kill can be checked only if the command got to its background
	// child before the timeout. On two loaded CI cores an ssh session's
	// shell once took longer than 3 s to start, so an attempt where it did
	// not is retried with a longer timeout; the last one must see it.
	timeouts := []time.Duration{3 * time.Second, 10 * time.Second, 30 * time.Second}
	for i, timeout := range timeouts {
		d := hostDir(t, env)
		// The child's pid is written aside and moved into place: a kill
		// between the redirect's truncation and the write would leave an
		// empty file, read as "no child" on the last attempt.
		cmd := fmt.Sprintf("d=%s; echo $$ >\"$d/shell\"; sleep 60 & echo $! >\"$d/child.tmp\"; mv \"$d/child.tmp\" \"$d/child\"; sleep 60; echo finished", Shq(d))
		res, err := env.Execute(guardCtx(t, hangGuard), cmd, backends.ExecOptions{Timeout: timeout})
		if err == nil {
			t.Fatalf("sleep 60 with Timeout %v returned no error (rc %d, output %q)", timeout, res.ReturnCode, res.Output)
		}
		if !errors.Is(err, backends.ErrTimeout) {
			t.Fatalf("sleep 60 with Timeout %v: error %v does not wrap backends.ErrTimeout (a hang guard of %v fired, or the backend reports timeouts wrongly)", timeout, err, hangGuard)
		}
		if errors.Is(err, backends.ErrNotStarted) {
			t.Fatalf("sleep 60 timed out after it started, but its error %v says it never reached the host", err)
		}
		if strings.Contains(res.Output, "finished") {
			t.Fatalf("the command ran to completion: %q", res.Output)
		}
		if pid, _ := pidIn(t, env, d+"/child"); pid == 0 && i < len(timeouts)-1 {
			t.Logf("the command did not reach its background child within %v; trying again with a longer timeout", timeout)
			continue
		}
		requireGone(t, env, readPid(t, env, d+"/shell"), "the timed-out shell")
		requireGone(t, env, readPid(t, env, d+"/child"), "a background child of the timed-out command")
		return
	}
}

func testCancel(t *testing.T, env backends.Env) {
	// An already canceled context fails at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := env.Execute(ctx, "echo never", backends.ExecOptions{}); err == nil {
		t.Fatal("Execute with a canceled context returned no error")
	}

	d := hostDir(t, env)
	ctx, cancel = context.WithCancel(guardCtx(t, hangGuard))
	defer cancel()
	type answer struct {
		res backends.Result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		cmd := fmt.Sprintf("d=%s; echo $$ >\"$d/shell\"; sleep 30 & echo $! >\"$d/child.tmp\"; mv \"$d/child.tmp\" \"$d/child\"; wait; echo finished", Shq(d))
		res, err := env.Execute(ctx, cmd, backends.ExecOptions{})
		done <- answer{res, err}
	}()
	// Cancel once the command is surely running (its child pid is written).
	started := false
	for range 200 {
		out := runOK(t, env, "test -s "+Shq(d+"/child")+" && echo yes; true", nil)
		if strings.TrimSpace(out) == "yes" {
			started = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !started {
		t.Fatal("the command never started")
	}
	cancel()
	a := <-done
	if a.err == nil {
		t.Fatalf("a command whose context was canceled returned no error (rc %d, output %q)", a.res.ReturnCode, a.res.Output)
	}
	if !errors.Is(a.err, context.Canceled) {
		t.Fatalf("cancel: error %v does not wrap context.Canceled", a.err)
	}
	if strings.Contains(a.res.Output, "finished") {
		t.Fatalf("the command ran to completion: %q", a.res.Output)
	}
	requireGone(t, env, readPid(t, env, d+"/shell"), "the canceled shell")
	requireGone(t, env, readPid(t, env, d+"/child"), "a background child of the canceled command")
}

// A deadline on the caller's context is not the command's Timeout: the
// error must let the caller tell them apart (ErrTimeout is documented as
// "exceeded its Timeout").
func testCallerDeadline(t *testing.T, env backends.Env) {
	ctx, cancel := context.WithTimeout(guardCtx(t, hangGuard), 1500*time.Millisecond)
	defer cancel()
	res, err := env.Execute(ctx, "sleep 30; echo finished", backends.ExecOptions{})
	if err == nil || strings.Contains(res.Output, "finished") {
		t.Fatalf("a command past its caller's deadline returned %v, output %q", err, res.Output)
	}
	if errors.Is(err, context.Canceled) {
		t.Fatalf("the caller's deadline was not honoured; the %v hang guard fired: %v", hangGuard, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("caller deadline: error %q does not wrap context.DeadlineExceeded", err)
	}
	if errors.Is(err, backends.ErrTimeout) {
		t.Errorf("caller deadline: error %q wraps backends.ErrTimeout, but the command had no Timeout", err)
	}
}

func testBash(t *testing.T, env backends.Env) {
	out := runOK(t, env, `[[ "ab" == a* ]] && x=(1 2 3) && echo "bash ${BASH_VERSION:-none} ${#x[@]} $(( 6 * 7 ))"`, nil)
	if !strings.HasPrefix(out, "bash ") || strings.Contains(out, "none") || !strings.HasSuffix(out, " 3 42\n") {
		t.Fatalf("the command does not run under bash: %q", out)
	}
}

func testTempDir(t *testing.T, env backends.Env) {
	td := env.TempDir()
	if td == "" || !path.IsAbs(td) {
		t.Fatalf("TempDir() = %q, want an absolute path", td)
	}
	out := runOK(t, env, fmt.Sprintf(`t=%s; [ -d "$t" ] || { echo "not a dir"; exit 1; }
[ -w "$t" ] || { echo "not writable"; exit 1; }
f=$(mktemp "$t/kd-contract-file.XXXXXXXX") && echo written >"$f" && cat "$f" && rm -f -- "$f"`, Shq(td)), nil)
	if out != "written\n" {
		t.Fatalf("writing into TempDir %s: %q", td, out)
	}
}

func testDetached(t *testing.T, env backends.Env) {
	// Kernels are started exactly like this: they must not hold Execute open.
	res, err := env.Execute(guardCtx(t, hangGuard),
		"setsid sleep 30 </dev/null >/dev/null 2>&1 & echo \"started $!\"", backends.ExecOptions{})
	if err != nil {
		t.Fatalf("Execute with a detached background process: %v (it must return as soon as bash exits)", err)
	}
	pidText, ok := strings.CutPrefix(strings.TrimSpace(res.Output), "started ")
	pid, perr := strconv.Atoi(pidText)
	if !ok || perr != nil || res.ReturnCode != 0 {
		t.Fatalf("got rc %d, output %q", res.ReturnCode, res.Output)
	}
	// The detached process is meant to outlive the command.
	if !alive(t, env, pid) {
		t.Errorf("the detached process %d did not survive the command", pid)
	}
	runOK(t, env, fmt.Sprintf("kill -KILL %d 2>/dev/null; true", pid), nil)
}

func testConcurrent(t *testing.T, env backends.Env) {
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stdin := fmt.Sprintf("request-%d-%s", i, randomHex(8))
			res, err := env.Execute(guardCtx(t, hangGuard), fmt.Sprintf("cat; echo ' n=%d'", i), backends.ExecOptions{Stdin: []byte(stdin)})
			switch {
			case err != nil:
				errs <- fmt.Errorf("call %d, %v after the calls began: %w", i, time.Since(start).Round(time.Millisecond), err)
			case res.ReturnCode != 0 || res.Output != stdin+fmt.Sprintf(" n=%d\n", i):
				errs <- fmt.Errorf("call %d: rc %d, output %q, want %q", i, res.ReturnCode, res.Output, stdin+fmt.Sprintf(" n=%d\n", i))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testOutputCap(t *testing.T, env backends.Env) {
	const total = 100_000_000
	res := run(t, env, fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; echo", total), nil)
	if res.ReturnCode != 0 {
		t.Fatalf("rc %d, output tail %q", res.ReturnCode, tail(res.Output))
	}
	if len(res.Output) > 33<<20 {
		t.Fatalf("a command printing %d bytes returned %d bytes of Output; it must be capped near 32 MiB", total, len(res.Output))
	}
	if len(res.Output) < 1<<20 || !strings.HasPrefix(res.Output, "xxxxxxxx") {
		t.Fatalf("only %d bytes of Output came back (head %.40q)", len(res.Output), res.Output)
	}
	if !strings.Contains(strings.ToLower(tail(res.Output)), "clipped") {
		t.Fatalf("clipped Output does not say it was clipped; tail %q", tail(res.Output))
	}
}

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}

func testSecrets(t *testing.T, env backends.Env) {
	secret := "kd-secret-" + randomHex(16)
	stdin := []byte("KERNELDECK_RPC_TOKEN=" + secret + "\nmore payload\n")
	check := func(what string, res backends.Result, err error) {
		t.Helper()
		if strings.Contains(res.Output, secret) {
			t.Errorf("%s: the stdin secret appears in Output %q", what, res.Output)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the stdin secret appears in the error %q", what, err)
		}
	}
	for _, cmd := range []string{
		"cat >/dev/null",
		"head -c 5 >/dev/null; exit 4",
		"cat >/dev/null; echo 'something went wrong' >&2; exit 1",
		"exit 2",
		"no-such-command-kd",
	} {
		res, err := env.Execute(guardCtx(t, hangGuard), cmd, backends.ExecOptions{Stdin: stdin})
		check(cmd, res, err)
	}
	res, err := env.Execute(guardCtx(t, hangGuard), "sleep 30", backends.ExecOptions{Stdin: stdin, Timeout: time.Second})
	if err == nil {
		t.Error("sleep 30 with a 1s timeout returned no error")
	}
	check("a timed-out command", res, err)
	if strings.Contains(env.URI(), secret) || strings.Contains(env.TempDir(), secret) {
		t.Error("the stdin secret appears in URI() or TempDir()")
	}
	// Control: the check above would see the secret if it were there.
	if out := runOK(t, env, "cat", stdin); !strings.Contains(out, secret) {
		t.Fatalf("control: cat of stdin did not print the secret: %q", out)
	}
}

const listenerPy = `import os, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
# The test waits for the path to exist: it appears only once the socket
# listens (bound under another name, renamed after listen), or a dial in
# between is refused.
s.bind(path + ".new")
s.listen(1)
os.rename(path + ".new", path)
s.settimeout(60)
try:
    c, _ = s.accept()
    c.settimeout(60)
    f = c.makefile("rwb")
    line = f.readline()
    f.write(b"echo: " + line)
    f.flush()
    c.close()
finally:
    s.close()
    os.unlink(path)
`

func testDialUnix(t *testing.T, env backends.Env) {
	dialer := backends.StreamsOf(env)
	if dialer == nil {
		t.Skipf("%s offers no StreamDialer", env.URI())
	}
	d := hostDir(t, env)
	sock := d + "/sock"
	out := runOK(t, env, fmt.Sprintf(`d=%s
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed on this host; kernels need it"; exit 1; }
cat >"$d/listen.py" || exit 1
setsid python3 "$d/listen.py" "$d/sock" </dev/null >"$d/listen.log" 2>&1 &
echo "PID $!"
for i in $(seq 400); do [ -S "$d/sock" ] && { echo READY; exit 0; }; sleep 0.05; done
echo "listener did not start:"; cat "$d/listen.log"; exit 1`, Shq(d)), []byte(listenerPy))
	var pid int
	fmt.Sscanf(out, "PID %d", &pid)
	if pid > 1 {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			env.Execute(ctx, fmt.Sprintf("kill -KILL %d 2>/dev/null; true", pid), backends.ExecOptions{})
		})
	}
	if !strings.Contains(out, "READY") {
		t.Fatalf("listener: %q", out)
	}
	conn, err := dialer.DialUnix(guardCtx(t, hangGuard), sock)
	if err != nil {
		t.Fatalf("DialUnix(%s): %v", sock, err)
	}
	defer conn.Close()
	// Read deadlines hold (the engine waits for a cell's frames until its
	// timeout), and the stream works on after one passed.
	conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := conn.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past a read deadline, nothing sent: %d bytes, %v; want os.ErrDeadlineExceeded", n, err)
	}
	conn.SetDeadline(time.Now().Add(hangGuard))
	msg := "hello " + randomHex(4) + "\n"
	if _, err := conn.Write([]byte(msg)); err != nil {
		t.Fatalf("write to the stream: %v", err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "echo: "+msg {
		t.Fatalf("read from the stream: %q, %v; want %q", line, err, "echo: "+msg)
	}
	// The listener closed its end: the stream reports EOF, not a hang.
	if n, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read after the peer closed: %d bytes, no error", n)
	}
}

func testDialMissing(t *testing.T, env backends.Env) {
	dialer := backends.StreamsOf(env)
	if dialer == nil {
		t.Skipf("%s offers no StreamDialer", env.URI())
	}
	d := hostDir(t, env)
	for _, p := range []string{d + "/no-such-sock", d + "/no-such-dir/sock"} {
		conn, err := dialer.DialUnix(guardCtx(t, hangGuard), p)
		if err == nil {
			conn.Close()
			t.Fatalf("DialUnix(%s) of a missing path returned no error", p)
		}
		if errors.Is(err, context.Canceled) {
			t.Fatalf("DialUnix(%s) of a missing path hung until the %v guard: %v", p, hangGuard, err)
		}
	}
	// A path that exists but is not a socket fails too.
	runOK(t, env, "echo x >"+Shq(d+"/plain"), nil)
	if conn, err := dialer.DialUnix(guardCtx(t, hangGuard), d+"/plain"); err == nil {
		conn.Close()
		t.Fatal("DialUnix of a regular file returned no error")
	} else if errors.Is(err, context.Canceled) {
		t.Fatalf("DialUnix of a regular file hung until the guard: %v", err)
	}
}
