package cli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/exp/teatest"
	"golang.org/x/crypto/ssh"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/headless"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
	"github.com/kerneldeck/kerneldeck/ui"
)

// TestSecretsNeverLeak runs the real binary's headless mode on the local
// backend and over a real sshd through cells with output, a clipped output
// with a spill file, a cell error, tool calls (one with output large enough
// to be stored under the state dir), a forged tool request, a timeout and a
// listing; then the dashboard, in process on the real engine, through the
// same requests plus a cell typed into its editor. Every channel that
// leaves the engine is read back and must be non-empty and hold neither
// secret: any kernel's secret (from the kept-kernels record of a run with
// --keep-kernels, or from engine.Kept, never from a cell) and the ssh
// private key (its base64 body lines and its seed in every encoding). The
// channels: stdout, the event lines, stderr, the --trace file, every file
// under the state dir, each kernel's runner.log (read while the kernel
// lives), the dashboard's rendered frames and its final view. The state
// dir and everything under it must be owner-only (dirs 0700, files 0600),
// as must the trace.
func TestSecretsNeverLeak(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real kernels locally and over sshd")
	}
	bin := buildBinary(t)
	srv := sshdtest.Start(t, sshdtest.Options{})
	name := ""
	if sshdtest.CanCreateUsers() {
		name = "kdtest1"
	}
	u := srv.User(t, name, sshdtest.UserOptions{})
	sshConfig := srv.WriteSSHConfig(t, "kdbox", u)
	keySecrets := secretKeyMaterial(t, u.KeyFile)

	for _, tc := range []struct{ name, backend string }{{"local", "local"}, {"ssh", "ssh://kdbox"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Run("headless", func(t *testing.T) {
				ch, tokens := secretsHeadless(t, bin, tc.backend, sshConfig, u.KeyFile)
				secretsCheck(t, ch, tokens, keySecrets)
			})
			t.Run("dashboard", func(t *testing.T) {
				ch, tokens := secretsDashboard(t, tc.backend, sshConfig, u.KeyFile)
				secretsCheck(t, ch, tokens, keySecrets)
			})
		})
	}
}

// secretKeyMaterial returns what must never appear of a private key file:
// each base64 line of its body, and its ed25519 seed and private key raw,
// in hex and in base64.
func secretKeyMaterial(t *testing.T, keyFile string) []string {
	t.Helper()
	pemText, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	var secrets []string
	for l := range strings.SplitSeq(string(pemText), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "-----") {
			secrets = append(secrets, l)
		}
	}
	if len(secrets) == 0 {
		t.Fatalf("no key body in %s", keyFile)
	}
	raw, err := ssh.ParseRawPrivateKey(pemText)
	if err != nil {
		t.Fatal(err)
	}
	priv, ok := raw.(*ed25519.PrivateKey)
	if !ok {
		t.Fatalf("%s holds a %T, want an ed25519 key", keyFile, raw)
	}
	for _, b := range [][]byte{priv.Seed(), *priv} {
		secrets = append(secrets, string(b), hex.EncodeToString(b), base64.StdEncoding.EncodeToString(b),
			base64.RawStdEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b))
	}
	return secrets
}

// secretsRequests are the requests both runs make. ws holds small.txt.
func secretsRequests() []string {
	forge := strings.Join([]string{
		"import json, os, time, kerneldeck_tools as kt",
		"kd = os.path.dirname(kt.__file__)",
		"p = os.path.join(kd, 'rpc', '900.req')",
		"with open(p + '.tmp', 'w') as f:",
		"    json.dump({'seq': 900, 'tool': 'read_file', 'args': {'path': 'small.txt'}, 'token': 'f' * 64, 'cell': 'forged'}, f)",
		"os.rename(p + '.tmp', p)",
		"w = os.open(os.path.join(kd, 'wake'), os.O_WRONLY | os.O_NONBLOCK)",
		"os.write(w, b'rpc\\n')",
		"os.close(w)",
		"time.sleep(1.5)",
		"print('forged a request')",
	}, "\n")
	tools := strings.Join([]string{
		"import kerneldeck_tools as kt",
		"print('read:', kt.read_file('small.txt').strip())",
		"print('terminal:', kt.terminal('echo from the host'))",
		"big = kt.terminal('seq 1 30000')",
		"print('stored:', kt.last_result.get('stored'), len(big))",
	}, "\n")
	// A peer that does not answer the runner's challenge: the runner logs it.
	refused := strings.Join([]string{
		"import os, socket",
		"s = socket.socket(socket.AF_UNIX)",
		"s.settimeout(10)",
		"import kerneldeck_tools",
		"s.connect(os.path.join(os.path.dirname(kerneldeck_tools.__file__), 'sock'))",
		"s.makefile().readline()",
		"s.sendall(b'not an answer\\n')",
		"s.recv(1)",
	}, "\n")
	reqs := []map[string]any{
		{"id": "out", "op": "execute", "owner": "sec", "code": "import os\nprint('hello from', os.getpid())\nos.getpid()"},
		{"id": "clip", "op": "execute", "owner": "sec", "code": "print('z' * 120000)"},
		{"id": "err", "op": "execute", "owner": "sec", "code": "1/0"},
		{"id": "late", "op": "execute", "owner": "sec", "code": "import threading\nthreading.Timer(0.2, lambda: print('printed after its cell', flush=True)).start()"},
		{"id": "refused", "op": "execute", "owner": "sec", "code": refused},
		{"id": "tools", "op": "execute", "owner": "sec", "tools": []string{"read_file", "terminal"}, "code": tools},
		{"id": "forge", "op": "execute", "owner": "sec", "tools": []string{"read_file", "terminal"}, "code": forge},
		{"id": "slow", "op": "execute", "owner": "sec", "code": "import time\ntime.sleep(30)", "timeout": 1},
		{"id": "ls", "op": "kernels"},
	}
	var lines []string
	for _, r := range reqs {
		b, _ := json.Marshal(r)
		lines = append(lines, string(b))
	}
	return lines
}

// secretsSetup makes the workspace, state dir and trace path of one run and
// returns the flags that point at them.
func secretsSetup(t *testing.T, backend, sshConfig, identity string) (args []string, state, trace string) {
	t.Helper()
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "small.txt"), []byte("a small file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Stored tool output goes with its kernel; keep it so the scan reads it.
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte("keep_tool_output = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state, trace = filepath.Join(dir, "state"), filepath.Join(dir, "trace.jsonl")
	return []string{"--config", cfg, "--backend", backend, "--events", "--trace", trace, "--state-dir", state, "--workspace", ws,
		"--approve", "all", "--ssh-config", sshConfig, "--identity", identity, "--cell-timeout", "60s"}, state, trace
}

// secretsHeadless runs the binary through the requests one at a time and
// returns every channel it wrote and the tokens of its kernels.
func secretsHeadless(t *testing.T, bin, backend, sshConfig, identity string) (map[string][]byte, []string) {
	isolate(t)
	args, state, trace := secretsSetup(t, backend, sshConfig, identity)
	// --keep-kernels: at the signal the kernels' secrets are recorded in the
	// state dir, the one place they may be kept, where the test reads them.
	p := startPiped(t, bin, append([]string{"headless", "--keep-kernels"}, args...)...)
	cmd, in, outPipe, stderr := p.cmd, p.in, p.out, p.stderr

	var mu sync.Mutex
	var stdout, events bytes.Buffer
	answers := map[string]map[string]any{}
	arrived := make(chan struct{}, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(outPipe)
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			var m map[string]any
			err := json.Unmarshal(sc.Bytes(), &m)
			mu.Lock()
			stdout.Write(sc.Bytes())
			stdout.WriteByte('\n')
			switch {
			case err != nil:
			case m["op"] == "event":
				events.Write(sc.Bytes())
				events.WriteByte('\n')
			default:
				if id, ok := m["id"].(string); ok {
					answers[id] = m
				}
			}
			mu.Unlock()
			select {
			case arrived <- struct{}{}:
			default:
			}
		}
	}()
	await := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.After(90 * time.Second)
		for {
			mu.Lock()
			ok := cond()
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-arrived:
			case <-time.After(100 * time.Millisecond):
			case <-deadline:
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("no %s within 90s; stdout so far:\n%.3000s\nstderr: %s", what, stdout.String(), stderr.String())
			}
		}
	}
	res := map[string]map[string]any{}
	for _, line := range secretsRequests() {
		var req map[string]any
		json.Unmarshal([]byte(line), &req)
		id := req["id"].(string)
		if _, err := io.WriteString(in, line+"\n"); err != nil {
			t.Fatal(err)
		}
		await("answer to "+id, func() bool { return answers[id] != nil })
		mu.Lock()
		res[id] = answers[id]
		mu.Unlock()
	}
	secretsWantResults(t, res, state)
	await("rpc_rejected event", func() bool { return strings.Contains(events.String(), `"type":"rpc_rejected"`) })

	// The kernels' logs, while they still run.
	ch := map[string][]byte{}
	var ids []string
	var pids []int
	for _, id := range []string{"out", "tools"} {
		k, _ := res[id]["kernel"].(map[string]any)
		pid, _ := k["pid"].(float64)
		dir, _ := k["dir"].(string)
		kid, _ := k["id"].(string)
		ids, pids = append(ids, kid), append(pids, int(pid))
		log := filepath.Join(dir, "runner.log")
		if id == "out" {
			// What a kernel prints goes to its cells' output, even after
			// its cell; the log has the runner's own lines, such as the
			// one for the peer of cell "refused".
			deadline := time.Now().Add(10 * time.Second)
			for data, _ := os.ReadFile(log); !bytes.Contains(data, []byte("refused a connection")); data, _ = os.ReadFile(log) {
				if time.Now().After(deadline) {
					t.Fatalf("%s never logged the refused connection: %q", log, data)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		data, err := os.ReadFile(log)
		if err != nil {
			t.Fatalf("runner log: %v", err)
		}
		if id == "out" || len(data) > 0 {
			ch["runner.log of "+id] = data
		}
	}
	// SIGTERM while stdin is open: the binary keeps its kernels (and records
	// them) and says so on stderr.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() { <-readDone; waitErr <- cmd.Wait() }()
	select {
	case err := <-waitErr:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("kerneldeck did not exit within 60s of SIGTERM")
	}
	in.Close()
	if !strings.Contains(stderr.String(), "the kernels keep running") {
		t.Errorf("stderr after SIGTERM: %q", stderr.String())
	}
	tokens := keptSecrets(t, state, ids, pids)

	ch["stdout"], ch["events"], ch["stderr"] = stdout.Bytes(), events.Bytes(), stderr.Bytes()
	trData, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	ch["trace"] = trData
	secretsWantModes(t, state, trace)
	secretsStateFiles(t, state, ch)
	return ch, tokens
}

// keptSecrets takes the secrets of kernels ids from the state dir's record
// of kept kernels (0600; taking removes it) and kills their runners (pids),
// which the signal left running.
func keptSecrets(t *testing.T, state string, ids []string, pids []int) []string {
	t.Helper()
	store := engine.KeptStoreIn(state)
	if st, err := os.Stat(store.Path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("kept kernels record %s: %v %v, want a 0600 file", store.Path, st, err)
	}
	kept, err := engine.LoadKept(store.Path)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		killKeptKernel(t, pid)              // it and its watcher gone, done with the dirs
		syscall.Kill(-pid, syscall.SIGKILL) // and what is left of its group
	}
	var tokens []string
	for _, id := range ids {
		for _, k := range kept {
			if k.ID == id && len(k.Token) >= 32 {
				tokens = append(tokens, k.Token)
			}
		}
	}
	if len(tokens) != len(ids) || tokens[0] == tokens[1] {
		t.Fatalf("secrets of %v: %d found, the same twice or missing", ids, len(tokens))
	}
	return tokens
}

// secretsWantResults checks that each request did what the scenario needs,
// so that every channel saw the case it is meant to show.
func secretsWantResults(t *testing.T, res map[string]map[string]any, state string) {
	t.Helper()
	want := func(id string, ok bool, what string) {
		t.Helper()
		if !ok {
			t.Fatalf("%s: want %s, got %v", id, what, res[id])
		}
	}
	str := func(id, key string) string { s, _ := res[id][key].(string); return s }
	want("out", str("out", "status") == "success" && strings.Contains(str("out", "stdout"), "hello from"), "success with output")
	spill := str("clip", "spill_path")
	want("clip", res["clip"]["stdout_clipped"] == true && strings.HasPrefix(spill, state+string(filepath.Separator)), "clipped stdout spilled under the state dir")
	if data, err := os.ReadFile(spill); err != nil || len(data) <= 100000 {
		t.Fatalf("spill file %s: %d bytes, %v", spill, len(data), err)
	}
	want("err", str("err", "status") == "error" && strings.Contains(str("err", "traceback"), "ZeroDivisionError"), "an error with its traceback")
	want("late", str("late", "status") == "success", "success")
	want("refused", str("refused", "status") == "success", "success")
	want("tools", str("tools", "status") == "success" && res["tools"]["tool_calls_made"] == 3.0 &&
		strings.Contains(str("tools", "stdout"), "read: a small file") && strings.Contains(str("tools", "stdout"), "from the host") &&
		strings.Contains(str("tools", "stdout"), filepath.Join(state, "tool-output")), "three tool calls, one stored under the state dir")
	want("forge", str("forge", "status") == "success" && strings.Contains(str("forge", "stdout"), "forged a request"), "the forging cell to finish")
	want("slow", str("slow", "status") == "timeout", "a timeout")
	want("ls", res["ls"]["op"] == "kernels" && res["ls"]["count"] == 2.0, "two kernels listed")
}

// secretsWantModes: the state dir and everything in it owner-only, the trace 0600.
func secretsWantModes(t *testing.T, state, trace string) {
	t.Helper()
	if st, err := os.Stat(trace); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("trace %s: %v %v, want 0600", trace, st.Mode(), err)
	}
	filepath.WalkDir(state, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Errorf("walk %s: %v", p, err)
			return nil
		}
		info, err := d.Info()
		if err != nil {
			t.Errorf("%s: %v", p, err)
			return nil
		}
		switch {
		case d.IsDir() && info.Mode().Perm() != 0o700:
			t.Errorf("dir %s has mode %v, want 0700", p, info.Mode().Perm())
		case info.Mode().IsRegular() && info.Mode().Perm() != 0o600:
			t.Errorf("file %s has mode %v, want 0600", p, info.Mode().Perm())
		case !d.IsDir() && !info.Mode().IsRegular():
			t.Errorf("%s is neither a dir nor a regular file: %v", p, info.Mode())
		}
		return nil
	})
}

// secretsStateFiles adds every file under the state dir as a channel; the
// spill and the stored tool output must be among them.
func secretsStateFiles(t *testing.T, state string, ch map[string][]byte) {
	t.Helper()
	var spill, tool bool
	filepath.WalkDir(state, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("read %s: %v", p, err)
			return nil
		}
		rel, _ := filepath.Rel(state, p)
		ch["state dir: "+rel] = data
		spill = spill || strings.HasPrefix(rel, "spill"+string(filepath.Separator))
		tool = tool || strings.HasPrefix(rel, "tool-output"+string(filepath.Separator))
		return nil
	})
	if !spill || !tool {
		t.Fatalf("the state dir %s lacks a spill file (%v) or stored tool output (%v)", state, spill, tool)
	}
}

// frameLog accumulates everything a teatest program rendered.
type frameLog struct {
	r   io.Reader
	buf bytes.Buffer
}

func (f *frameLog) read() string {
	io.Copy(&f.buf, f.r)
	return ansi.Strip(f.buf.String())
}

func (f *frameLog) waitFor(t *testing.T, what string, cond func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond(f.read()) {
		if time.Now().After(deadline) {
			t.Fatalf("the dashboard never showed %s; last frames:\n%s", what, tail(f.read(), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// secretsDashboard runs the dashboard's model on the real engine (opened
// as the binary opens it) while the same requests go through headless
// serving into that engine, and a cell is typed into the editor. It
// returns the rendered frames, the final view, the served answers, the
// trace and the state dir files, and the tokens from engine.Kept.
func secretsDashboard(t *testing.T, backend, sshConfig, identity string) (map[string][]byte, []string) {
	isolate(t)
	args, state, trace := secretsSetup(t, backend, sshConfig, identity)
	f, err := parseHeadlessFlags(args)
	if err != nil {
		t.Fatal(err)
	}
	s, err := resolve(f)
	if err != nil {
		t.Fatal(err)
	}
	eng, cleanup, _, err := openEngine(f, s)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	closed := false
	closeEng := func() {
		if !closed {
			closed = true
			ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
			defer cancel()
			if err := eng.Close(ctx, false); err != nil {
				t.Errorf("engine close: %v", err)
			}
		}
	}
	defer closeEng()

	sub := eng.Subscribe(4096)
	defer sub.Close()
	m := ui.New(ui.Options{Engine: ui.Embedded{Engine: eng}, Events: sub.C, User: "kdui"})
	defer m.Close()
	tm := teatest.NewTestModel(t, m, teatest.WithInitialTermSize(220, 70))
	frames := &frameLog{r: tm.Output()}
	frames.waitFor(t, "the dashboard", func(s string) bool { return strings.Contains(s, "kerneldeck") })

	var served bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := headless.Serve(ctx, eng, strings.NewReader(strings.Join(secretsRequests(), "\n")+"\n"), &served, headless.Options{Events: true}); err != nil {
		t.Fatalf("serve: %v", err)
	}
	res := map[string]map[string]any{}
	for l := range strings.SplitSeq(strings.TrimSpace(served.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["op"] != "event" {
			if id, ok := m["id"].(string); ok {
				res[id] = m
			}
		}
	}
	secretsWantResults(t, res, state)

	tm.Type("e") // the editor, from the kernels list the dashboard starts in
	tm.Type("print('dashboard cell', 6*7)")
	tm.Send(tea.KeyMsg{Type: tea.KeyCtrlR})
	frames.waitFor(t, "the typed cell's output and the rejected request", func(s string) bool {
		return strings.Contains(s, "dashboard cell 42") && strings.Contains(s, "rpc_rejected")
	})
	var tokens []string
	for _, k := range eng.Kept() {
		tokens = append(tokens, k.Token)
	}
	if len(tokens) != 3 || slices.Contains(tokens, "") {
		t.Fatalf("engine.Kept lists %d kernels (%q), want 3 with tokens", len(tokens), tokens)
	}
	if err := tm.Quit(); err != nil {
		t.Fatal(err)
	}
	fm := tm.FinalModel(t, teatest.WithFinalTimeout(30*time.Second))
	view := ansi.Strip(fm.View())
	closeEng()

	ch := map[string][]byte{
		"dashboard frames":     []byte(frames.read()),
		"dashboard final view": []byte(view),
		"served answers":       served.Bytes(),
	}
	trData, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	ch["trace"] = trData
	secretsWantModes(t, state, trace)
	secretsStateFiles(t, state, ch)
	return ch, tokens
}

// secretsCheck fails for an empty channel (nothing to grep) and for any
// secret, or any 16-character piece of a token (which a line wrap or a
// clipped column could leave), found in a channel.
func secretsCheck(t *testing.T, ch map[string][]byte, tokens, keySecrets []string) {
	t.Helper()
	type needle struct{ what, s string }
	var needles []needle
	for i, tok := range tokens {
		if len(tok) < 32 {
			t.Fatalf("token %d %q is too short to be real", i, tok)
		}
		for j := 0; j+16 <= len(tok); j++ {
			needles = append(needles, needle{"RPC token " + strconv.Itoa(i) + " (chars " + strconv.Itoa(j) + "-" + strconv.Itoa(j+16) + ")", tok[j : j+16]})
		}
	}
	for i, k := range keySecrets {
		needles = append(needles, needle{"private key material " + strconv.Itoa(i), k})
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range ch {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range names {
		data := ch[n]
		if len(bytes.TrimSpace(data)) == 0 {
			t.Errorf("channel %q is empty: grepping it proves nothing", n)
			continue
		}
		for _, nd := range needles {
			if i := bytes.Index(data, []byte(nd.s)); i >= 0 {
				lo, hi := max(0, i-120), min(len(data), i+len(nd.s)+120)
				t.Errorf("%s found in %s: ...%q...", nd.what, n, data[lo:hi])
				break
			}
		}
	}
	t.Logf("grepped %d channels for %d tokens and %d pieces of key material: %s", len(names), len(tokens), len(keySecrets), strings.Join(names, ", "))
}
