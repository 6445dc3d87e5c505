package backends_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
)

func TestLocalContract(t *testing.T) {
	backendtest.Contract(t, func(t *testing.T) backends.Env {
		return backends.NewLocal(t.TempDir())
	})
}

// The tracing wrapper must not break the contract, and streams must still be
// found through it.
func TestTracedLocalContract(t *testing.T) {
	backendtest.Contract(t, func(t *testing.T) backends.Env {
		tr, err := backends.OpenTracer(filepath.Join(t.TempDir(), "trace.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return backends.Traced(backends.NewLocal(t.TempDir()), tr)
	})
}

func TestLocalBasics(t *testing.T) {
	dir := t.TempDir()
	l := backends.NewLocal(dir)
	if l.URI() != "local" || l.TempDir() != dir {
		t.Fatalf("URI %q TempDir %q", l.URI(), l.TempDir())
	}
	if got := backends.NewLocal("").TempDir(); got != os.TempDir() {
		t.Fatalf("NewLocal(\"\").TempDir() = %q, want os.TempDir() %q", got, os.TempDir())
	}
	var _ backends.StreamDialer = l
}

func TestExecuteOnlyHidesStreams(t *testing.T) {
	local := backends.NewLocal(t.TempDir())
	if backends.StreamsOf(local) != local {
		t.Fatal("StreamsOf(local) must be the local backend itself")
	}
	eo := backends.ExecuteOnly(local)
	if backends.StreamsOf(eo) != nil {
		t.Fatal("StreamsOf(ExecuteOnly(local)) must be nil")
	}
	if _, ok := eo.(backends.StreamDialer); ok {
		t.Fatal("ExecuteOnly(local) implements StreamDialer")
	}
	if _, ok := eo.(backends.Wrapper); ok {
		t.Fatal("ExecuteOnly(local) implements Wrapper, so StreamsOf would reach the inner dialer")
	}
	// Not even a tracer on top brings the streams back.
	tr, err := backends.OpenTracer(filepath.Join(t.TempDir(), "trace"))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if backends.StreamsOf(backends.Traced(eo, tr)) != nil {
		t.Fatal("StreamsOf(Traced(ExecuteOnly(local))) must be nil")
	}
	// Everything else passes through.
	if eo.URI() != local.URI() || eo.TempDir() != local.TempDir() {
		t.Fatalf("ExecuteOnly: URI %q TempDir %q", eo.URI(), eo.TempDir())
	}
	res, err := eo.Execute(context.Background(), "cat; exit 3", backends.ExecOptions{Stdin: []byte("through")})
	if err != nil || res.Output != "through" || res.ReturnCode != 3 {
		t.Fatalf("Execute through ExecuteOnly: %+v, %v", res, err)
	}
	if backends.StreamsOf(nil) != nil {
		t.Fatal("StreamsOf(nil) must be nil")
	}
}

func TestStreamsThroughTraced(t *testing.T) {
	local := backends.NewLocal(t.TempDir())
	if got := backends.Traced(local, nil); got != backends.Env(local) {
		t.Fatal("Traced(env, nil) must return env unchanged")
	}
	tr, err := backends.OpenTracer(filepath.Join(t.TempDir(), "trace"))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	traced := backends.Traced(local, tr)
	if backends.StreamsOf(traced) != local {
		t.Fatal("StreamsOf(Traced(local)) must find the local dialer through Unwrap")
	}
	w, ok := traced.(backends.Wrapper)
	if !ok || w.Unwrap() != backends.Env(local) {
		t.Fatal("Traced(local) must unwrap to local")
	}
	if traced.URI() != "local" || traced.TempDir() != local.TempDir() {
		t.Fatalf("Traced: URI %q TempDir %q", traced.URI(), traced.TempDir())
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	for _, uri := range []string{"local", "local://"} {
		env, err := backends.Open(uri, backends.Options{LocalTempDir: dir})
		if err != nil {
			t.Fatalf("Open(%q): %v", uri, err)
		}
		if env.URI() != "local" || env.TempDir() != dir {
			t.Fatalf("Open(%q): URI %q TempDir %q", uri, env.URI(), env.TempDir())
		}
		if backends.StreamsOf(env) == nil {
			t.Fatalf("Open(%q) lost the local fast path", uri)
		}
	}
	if env, err := backends.Open("local", backends.Options{}); err != nil || env.TempDir() != os.TempDir() {
		t.Fatalf("Open(local) without a temp dir: %v, %v", env, err)
	}
	// An ssh URI resolves without connecting: the first command dials.
	if env, err := backends.Open("ssh://alice@example.com:2222", backends.Options{}); err != nil || env.URI() != "ssh://alice@example.com:2222" {
		t.Fatalf("Open(ssh://alice@example.com:2222) = %v, %v", env, err)
	}
	for uri, wants := range map[string][]string{
		"ssh://":                 {`"ssh://"`, "ssh://[user@]host[:port]"},
		"ssh://devbox:0":         {`"ssh://devbox:0"`, "port"},
		"ssh://u:secret@devbox":  {"passwords do not belong in a URI"},
		"ssh://devbox/some/path": {"ssh://[user@]host[:port]"},
		"docker://web?memory=1g": {`"docker://web?memory=1g"`, `unknown option "memory"`},
		"docker-image://Web Box": {"not an image reference"},
		"":                       {`""`, "unknown backend", "local", "ssh://"},
		"garbage":                {`"garbage"`, "unknown backend", "local", "ssh://", "docker://", "docker-image://"},
		"LOCAL":                  {"unknown backend"},
		"http://example.com":     {"unknown backend"},
		"local-ish":              {"unknown backend"},
	} {
		env, err := backends.Open(uri, backends.Options{LocalTempDir: dir})
		if err == nil {
			t.Errorf("Open(%q) = %v, want an error", uri, env)
			continue
		}
		if env != nil {
			t.Errorf("Open(%q) returned an Env with its error", uri)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q) error repeats the password: %v", uri, err)
		}
		for _, w := range wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Open(%q) error %q does not mention %q", uri, err, w)
			}
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func readTrace(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("trace line %q is not JSON: %v", sc.Text(), err)
		}
		recs = append(recs, m)
	}
	return recs
}

func TestTracer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	tr, err := backends.OpenTracer(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
		t.Fatalf("trace file created with mode %v, want -rw-------", st.Mode())
	}

	secret := "kd-trace-secret-" + randomHex(16)
	stdin := []byte("KERNELDECK_RPC_TOKEN=" + secret + "\n")
	env := backends.Traced(backends.NewLocal(t.TempDir()), tr)
	ctx := context.Background()
	// The command prints its stdin: the secret is in the Output, but the
	// trace records commands, never payloads or output.
	res, err := env.Execute(ctx, "# kerneldeck:test\ncat", backends.ExecOptions{Stdin: stdin})
	if err != nil || !strings.Contains(res.Output, secret) {
		t.Fatalf("cat through Traced: %+v, %v", res, err)
	}
	if _, err := env.Execute(ctx, "cat >/dev/null; exit 4", backends.ExecOptions{Stdin: stdin}); err != nil {
		t.Fatal(err)
	}
	_, err = env.Execute(ctx, "sleep 30", backends.ExecOptions{Stdin: stdin, Timeout: 500 * time.Millisecond})
	if !errors.Is(err, backends.ErrTimeout) {
		t.Fatalf("sleep 30 with a timeout: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}

	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(secret)) || bytes.Contains(raw, []byte(hex.EncodeToString([]byte(secret)))) {
		t.Fatalf("the stdin payload reached the trace file:\n%s", raw)
	}
	recs := readTrace(t, path)
	if len(recs) != 3 {
		t.Fatalf("%d trace lines for 3 Execute calls:\n%s", len(recs), raw)
	}
	wantCmd := []string{"# kerneldeck:test\ncat", "cat >/dev/null; exit 4", "sleep 30"}
	wantRC := []float64{0, 4, -1}
	for i, r := range recs {
		for _, k := range []string{"time", "backend", "command", "rc", "ms"} {
			if _, ok := r[k]; !ok {
				t.Errorf("trace line %d has no %q: %v", i, k, r)
			}
		}
		if ts, _ := r["time"].(string); ts == "" {
			t.Errorf("line %d: time %v", i, r["time"])
		} else if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
			t.Errorf("line %d: time %q: %v", i, ts, err)
		}
		if r["backend"] != "local" || r["command"] != wantCmd[i] || r["rc"] != wantRC[i] {
			t.Errorf("line %d = %v, want backend local, command %q, rc %v", i, r, wantCmd[i], wantRC[i])
		}
		if ms, ok := r["ms"].(float64); !ok || ms < 0 {
			t.Errorf("line %d: ms %v", i, r["ms"])
		}
	}
	if e, _ := recs[2]["error"].(string); !strings.Contains(e, "timed out") {
		t.Errorf("the timed-out command's trace line has error %q", e)
	}
	if _, ok := recs[0]["error"]; ok {
		t.Errorf("a successful command's trace line has an error: %v", recs[0])
	}
	// Closed and nil tracers never fail a command.
	var nilTracer *backends.Tracer
	nilTracer.Record(backends.TraceRecord{Command: "x"})
	if err := nilTracer.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestTracerAppendsAndKeepsLinesWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(`{"command":"earlier"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tr, err := backends.OpenTracer(path)
	if err != nil {
		t.Fatalf("an existing 0600 trace file must be accepted: %v", err)
	}
	env := backends.Traced(backends.NewLocal(t.TempDir()), tr)
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A long command makes interleaved writes detectable.
			cmd := "echo " + strings.Repeat("x", 5000+i)
			if _, err := env.Execute(context.Background(), cmd, backends.ExecOptions{}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	tr.Close()
	recs := readTrace(t, path)
	if len(recs) != n+1 || recs[0]["command"] != "earlier" {
		t.Fatalf("%d lines (first %v), want the earlier line plus %d", len(recs), recs[0], n)
	}
}

func TestTracerRefusesUnsafeFiles(t *testing.T) {
	dir := t.TempDir()
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o666} {
		p := filepath.Join(dir, "open-"+mode.String())
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if tr, err := backends.OpenTracer(p); err == nil {
			tr.Close()
			t.Errorf("OpenTracer accepted an existing trace file with mode %v", mode)
		} else if !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "0600") {
			t.Errorf("mode %v: error %q should name the file and the mode it needs", mode, err)
		}
	}

	// A symlink to a private file, and a dangling one: both refused, and the
	// dangling target is not created.
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, dest := range map[string]string{"link": target, "dangling": filepath.Join(dir, "not-yet")} {
		link := filepath.Join(dir, name)
		if err := os.Symlink(dest, link); err != nil {
			t.Fatal(err)
		}
		if tr, err := backends.OpenTracer(link); err == nil {
			tr.Close()
			t.Errorf("OpenTracer followed the symlink %s -> %s", link, dest)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "not-yet")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a dangling symlink's target was created: %v", err)
	}
	if data, _ := os.ReadFile(target); len(data) != 0 {
		t.Errorf("the symlink target was written: %q", data)
	}

	// Not a regular file.
	if tr, err := backends.OpenTracer(dir); err == nil {
		tr.Close()
		t.Error("OpenTracer accepted a directory")
	}
	// A missing parent dir is an error, not a panic.
	if tr, err := backends.OpenTracer(filepath.Join(dir, "missing", "trace")); err == nil {
		tr.Close()
		t.Error("OpenTracer accepted a path in a missing dir")
	}
}

// A FIFO planted at the trace path must be refused, not block the process
// forever in open(2) waiting for a reader.
func TestTracerRefusesFIFOWithoutBlocking(t *testing.T) {
	p := filepath.Join(t.TempDir(), "trace.fifo")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		tr, err := backends.OpenTracer(p)
		if tr != nil {
			tr.Close()
		}
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second): // a hang guard, not a measurement
		t.Error("OpenTracer blocked on a FIFO at the trace path (open for writing waits for a reader)")
		// Unblock it so the test can finish.
		if r, rerr := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0); rerr == nil {
			defer r.Close()
		}
		err = <-done
	}
	if err == nil {
		t.Error("OpenTracer accepted a FIFO")
	}
}

// A trace file of another user is refused, however private its mode: it
// could be read by that user, or point where they want.
func TestTracerRefusesAnotherUsersFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a file of another user")
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if tr, err := backends.OpenTracer(path); err == nil || !strings.Contains(err.Error(), "belongs to another user") {
		if tr != nil {
			tr.Close()
		}
		t.Fatalf("OpenTracer of another user's file: %v, want a refusal", err)
	}
}
