package cli

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpClient is the SDK's own client on `kerneldeck mcp`, started by its
// CommandTransport.
type mcpClient struct {
	t  *testing.T
	cs *mcp.ClientSession

	mu       sync.Mutex
	progress []string
}

// startMCP starts the real binary as an MCP server for a client named
// name; opts may set an elicitation handler. version "" is the SDK's
// newest protocol.
func startMCP(t *testing.T, bin string, env []string, name, version string, opts *mcp.ClientOptions, args ...string) *mcpClient {
	t.Helper()
	mc := &mcpClient{t: t}
	if opts == nil {
		opts = &mcp.ClientOptions{}
	}
	opts.ProgressNotificationHandler = func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		mc.mu.Lock()
		mc.progress = append(mc.progress, req.Params.Message)
		mc.mu.Unlock()
	}
	cmd := exec.Command(bin, append([]string{"mcp"}, args...)...)
	cmd.Env = env
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "test"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect to kerneldeck mcp: %v\n%s", err, stderr.String())
	}
	mc.cs = cs
	t.Cleanup(func() {
		cs.Close()
		if t.Failed() {
			t.Logf("kerneldeck mcp's stderr:\n%s", stderr.String())
		}
	})
	return mc
}

// call calls a tool and decodes its structured result into a map.
func (mc *mcpClient) call(ctx context.Context, tool string, args map[string]any) (*mcp.CallToolResult, map[string]any, error) {
	res, err := mc.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return nil, nil, err
	}
	var m map[string]any
	if res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &m)
	}
	return res, m, nil
}

// must calls a tool that must answer (isError or not).
func (mc *mcpClient) must(tool string, args map[string]any) (*mcp.CallToolResult, map[string]any) {
	mc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, m, err := mc.call(ctx, tool, args)
	if err != nil {
		mc.t.Fatalf("%s %v: %v", tool, args, err)
	}
	return res, m
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func kernelField(m map[string]any, f string) any {
	k, _ := m["kernel"].(map[string]any)
	return k[f]
}

// TestMCPStdio drives `kerneldeck mcp` over stdio with the SDK's client:
// the tools and their schemas, state across calls, errors as results, a
// timeout and a cancellation that keep the state, progress, reset, close,
// a kernel killed from outside, and bad input.
func TestMCPStdio(t *testing.T) {
	bin := buildBinary(t)
	isolate(t)
	mc := startMCP(t, bin, os.Environ(), "alice", "", nil)
	ctx := context.Background()

	tools, err := mc.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]*mcp.Tool{}
	for _, tl := range tools.Tools {
		names[tl.Name] = tl
	}
	for _, want := range []string{"python_exec", "python_sessions", "python_interrupt", "python_reset", "python_close"} {
		tl := names[want]
		if tl == nil || tl.InputSchema == nil || tl.OutputSchema == nil || tl.Description == "" {
			t.Fatalf("tool %s: %+v, want it listed with input and output schemas and a description", want, tl)
		}
	}
	schema, _ := json.Marshal(names["python_exec"].InputSchema)
	for _, want := range []string{`"code"`, `"session"`, `"timeout_s"`, `"reset"`, `"required":["code"]`} {
		if !strings.Contains(string(schema), want) {
			t.Errorf("python_exec's input schema %s lacks %s", schema, want)
		}
	}

	// State persists across calls.
	res, m := mc.must("python_exec", map[string]any{"code": "x = 41"})
	if res.IsError || m["status"] != "success" || m["session"] != "default" || kernelField(m, "reused") != false {
		t.Fatalf("first cell: %v %s", m, resultText(res))
	}
	kernel := kernelField(m, "id")
	res, m = mc.must("python_exec", map[string]any{"code": "print(x + 1)"})
	if m["stdout"] != "42\n" || kernelField(m, "reused") != true || kernelField(m, "id") != kernel || m["execution_count"] != float64(2) {
		t.Fatalf("second cell: %v", m)
	}
	if txt := resultText(res); !strings.Contains(txt, "42") || !strings.Contains(txt, "reused") {
		t.Errorf("second cell's text: %q", txt)
	}
	// An exception is a result with isError.
	res, m = mc.must("python_exec", map[string]any{"code": "1/0"})
	if !res.IsError || m["status"] != "error" || !strings.Contains(m["traceback"].(string), "ZeroDivisionError") {
		t.Fatalf("1/0: isError %v, %v", res.IsError, m)
	}
	// A timeout interrupts the cell; the state stays.
	res, m = mc.must("python_exec", map[string]any{"code": "import time\ntime.sleep(60)", "timeout_s": 1})
	if !res.IsError || m["status"] != "timeout" {
		t.Fatalf("timeout: %v", m)
	}
	if _, m = mc.must("python_exec", map[string]any{"code": "print(x)"}); m["stdout"] != "41\n" {
		t.Fatalf("after the timeout: %v", m)
	}

	// Progress: a long cell's output arrives while it runs.
	mc.mu.Lock()
	mc.progress = nil
	mc.mu.Unlock()
	params := &mcp.CallToolParams{Name: "python_exec", Arguments: map[string]any{
		"code": "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.4)"}}
	params.SetProgressToken("p1")
	if res, err := mc.cs.CallTool(ctx, params); err != nil || res.IsError {
		t.Fatalf("progress cell: %v %v", res, err)
	}
	mc.mu.Lock()
	got := strings.Join(mc.progress, "|")
	mc.mu.Unlock()
	for _, want := range []string{"tick 0", "tick 2"} {
		if !strings.Contains(got, want) {
			t.Errorf("progress notifications %q lack %q", got, want)
		}
	}

	// A cancelled call interrupts the cell; the kernel keeps its state. The
	// cancel waits for the cell's word that it is inside its try (CI: a
	// cancel sent as soon as the engine said "running" reached the cell
	// before its try, and the interrupt rightly left `interrupted` unset).
	mc.mu.Lock()
	mc.progress = nil
	mc.mu.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		params := &mcp.CallToolParams{Name: "python_exec", Arguments: map[string]any{
			"code": "import time\ntry:\n    print('in the try', flush=True)\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    interrupted = True\n    raise"}}
		params.SetProgressToken("p2")
		_, err := mc.cs.CallTool(cctx, params)
		done <- err
	}()
	waitUntil(t, "the long cell to run its try", func() bool {
		mc.mu.Lock()
		defer mc.mu.Unlock()
		return strings.Contains(strings.Join(mc.progress, "|"), "in the try")
	})
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled call returned no error")
	}
	waitUntil(t, "the interrupted cell to end", func() bool {
		_, m := mc.must("python_sessions", nil)
		ss, _ := m["sessions"].([]any)
		return len(ss) == 1 && ss[0].(map[string]any)["state"] == "idle"
	})
	if _, m = mc.must("python_exec", map[string]any{"code": "print(x, interrupted)"}); m["stdout"] != "41 True\n" {
		t.Fatalf("after the cancellation: %v, want the state kept and the cell interrupted", m)
	}

	// python_sessions: the timers.
	_, m = mc.must("python_sessions", nil)
	ss := m["sessions"].([]any)
	s0 := ss[0].(map[string]any)
	if m["owner"] != "alice" || len(ss) != 1 || s0["session"] != "default" || s0["kernel"] != kernel || s0["reap_in_s"] == nil || m["idle_exit_s"] != float64(1800) {
		t.Fatalf("python_sessions: %v", m)
	}

	// A kernel killed from outside: the next call says the state was lost.
	_, m = mc.must("python_exec", map[string]any{"code": "import os\nprint(os.getpid())"})
	pid := 0
	json.Unmarshal([]byte(strings.TrimSpace(m["stdout"].(string))), &pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	res, m = mc.must("python_exec", map[string]any{"code": "print('again')"})
	if kernelField(m, "state_lost") != true || kernelField(m, "note") == "" || !strings.Contains(resultText(res), "STATE LOST") {
		t.Fatalf("after a kill from outside: %v %s", m, resultText(res))
	}

	// Reset and close.
	mc.must("python_exec", map[string]any{"code": "y = 1", "session": "s2"})
	if _, m = mc.must("python_reset", map[string]any{"session": "s2"}); m["done"] != true {
		t.Fatalf("python_reset: %v", m)
	}
	if res, m = mc.must("python_exec", map[string]any{"code": "y", "session": "s2"}); !res.IsError || !strings.Contains(m["traceback"].(string), "NameError") {
		t.Fatalf("after reset: %v", m)
	}
	if _, m = mc.must("python_close", map[string]any{"session": "s2"}); m["done"] != true {
		t.Fatalf("python_close: %v", m)
	}
	_, m = mc.must("python_sessions", nil)
	for _, s := range m["sessions"].([]any) {
		if s.(map[string]any)["session"] == "s2" {
			t.Fatalf("s2 still listed after python_close: %v", m)
		}
	}
	if _, m = mc.must("python_close", map[string]any{"session": "s2"}); m["done"] != false {
		t.Fatalf("closing a closed session: %v", m)
	}

	// Bad input: each a clear error; the server goes on serving.
	if _, err := mc.cs.CallTool(ctx, &mcp.CallToolParams{Name: "python_nope"}); err == nil || !strings.Contains(err.Error(), "python_nope") {
		t.Errorf("an unknown tool: %v", err)
	}
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"code": 5}, "code"},
		{map[string]any{"code": "1", "timeout_s": "soon"}, "timeout_s"},
		{map[string]any{"code": "1", "timout_s": 1}, "timout_s"},
		{map[string]any{"code": strings.Repeat("#", 5<<20)}, "at most"},
		{map[string]any{"code": "1", "session": "a\x1b[2Jb"}, "control character"},
		{map[string]any{"code": "1", "timeout_s": -1}, "out of range"},
	} {
		res, _ := mc.must("python_exec", tc.args)
		if !res.IsError || !strings.Contains(resultText(res), tc.want) {
			t.Errorf("python_exec with %.80v: isError %v %q, want an error naming %q", tc.args, res.IsError, resultText(res), tc.want)
		}
	}
	if _, m = mc.must("python_exec", map[string]any{"code": "print('still here')"}); m["stdout"] != "still here\n" {
		t.Fatalf("after bad input: %v", m)
	}
}

// A tool call that asks for approval is put to the client by elicitation:
// approve and deny, on the newest protocol (the call is retried with the
// answer) and on 2025-11-25 (the server asks while the call runs).
func TestMCPApprovalByElicitation(t *testing.T) {
	bin := buildBinary(t)
	isolate(t)
	for _, version := range []string{"", "2025-11-25"} {
		t.Run("protocol "+cmp.Or(version, "newest"), func(t *testing.T) {
			var mu sync.Mutex
			decision, asked := "once", []string{}
			opts := &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				mu.Lock()
				defer mu.Unlock()
				asked = append(asked, req.Params.Message)
				if decision == "" {
					return &mcp.ElicitResult{Action: "decline"}, nil
				}
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": decision}}, nil
			}}
			mc := startMCP(t, bin, os.Environ(), "approver", version, opts, "--tools", "terminal")
			code := "import kerneldeck_tools as kt\nprint(kt.terminal('echo ran on the host'))"
			res, m := mc.must("python_exec", map[string]any{"code": code})
			if res.IsError || !strings.Contains(m["stdout"].(string), "ran on the host") || m["tool_calls_made"] != float64(1) {
				t.Fatalf("approved once: %v %s", m, resultText(res))
			}
			mu.Lock()
			if len(asked) != 1 || !strings.Contains(asked[0], "terminal") || !strings.Contains(asked[0], "echo ran on the host") {
				t.Fatalf("the elicitations: %q, want one naming the tool and its arguments", asked)
			}
			decision = ""
			mu.Unlock()
			res, m = mc.must("python_exec", map[string]any{"code": code})
			if strings.Contains(m["stdout"].(string), "ran on the host") || !strings.Contains(resultText(res), "denied") {
				t.Fatalf("declined: %v %s", m, resultText(res))
			}
			mu.Lock()
			if len(asked) != 2 {
				t.Fatalf("%d elicitations, want 2", len(asked))
			}
			mu.Unlock()
		})
	}
}

// A cell's input() is put to the client by elicitation, on the newest
// protocol and on 2025-11-25; getpass() is refused (MCP forbids asking for
// secrets so), and a client without elicitation gets EOFError saying why.
func TestMCPInputByElicitation(t *testing.T) {
	bin := buildBinary(t)
	isolate(t)
	for _, version := range []string{"", "2025-11-25"} {
		t.Run("protocol "+cmp.Or(version, "newest"), func(t *testing.T) {
			var mu sync.Mutex
			var asked []string
			opts := &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				mu.Lock()
				defer mu.Unlock()
				asked = append(asked, req.Params.Message)
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"value": "Ada"}}, nil
			}}
			mc := startMCP(t, bin, os.Environ(), "asker", version, opts)
			res, m := mc.must("python_exec", map[string]any{"code": "name = input('who are you? ')\nprint('hi', name)"})
			if res.IsError || m["stdout"] != "hi Ada\n" {
				t.Fatalf("input() answered by elicitation: %v %s", m, resultText(res))
			}
			mu.Lock()
			if len(asked) != 1 || !strings.Contains(asked[0], "who are you?") || !strings.Contains(asked[0], "session default") {
				t.Errorf("the elicitations: %q, want one with the prompt and the session", asked)
			}
			mu.Unlock()
			res, m = mc.must("python_exec", map[string]any{"code": "import getpass; getpass.getpass()"})
			if !res.IsError || !strings.Contains(fmt.Sprint(m["traceback"]), "getpass() cannot be answered over MCP") {
				t.Errorf("getpass() over MCP: %v, want EOFError saying MCP forbids it", m)
			}
			mu.Lock()
			if len(asked) != 1 {
				t.Errorf("getpass() was put to the client: %q", asked[1:])
			}
			mu.Unlock()
		})
	}
	mc := startMCP(t, bin, os.Environ(), "mute", "", nil)
	res, m := mc.must("python_exec", map[string]any{"code": "input('who? ')"})
	if !res.IsError || !strings.Contains(fmt.Sprint(m["traceback"]), "does not support elicitation") {
		t.Errorf("input() without elicitation: %v, want EOFError saying why", m)
	}
}

// Two agents with different names on one shared engine (--connect): each
// its own kernels, neither sees the other's variables or sessions, and the
// engine's own listing has both.
func TestMCPOwnersApartOnASharedEngine(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	se := startServe(t, bin, dirs)
	alice := startMCP(t, bin, dirs.env(), "alice", "", nil, "--connect", se.sock)
	bob := startMCP(t, bin, dirs.env(), "bob", "", nil, "--connect", se.sock)
	if _, m := alice.must("python_exec", map[string]any{"code": "secret = 'alice only'"}); m["status"] != "success" {
		t.Fatalf("alice: %v", m)
	}
	res, m := bob.must("python_exec", map[string]any{"code": "print(secret)"})
	if !res.IsError || !strings.Contains(m["traceback"].(string), "NameError") {
		t.Fatalf("bob read alice's variable: %v", m)
	}
	_, m = bob.must("python_sessions", nil)
	if m["owner"] != "bob" || len(m["sessions"].([]any)) != 1 {
		t.Fatalf("bob's sessions: %v", m)
	}
	if _, m = bob.must("python_close", map[string]any{"session": "default"}); m["done"] != true {
		t.Fatalf("bob closing his session: %v", m)
	}
	if _, m = alice.must("python_exec", map[string]any{"code": "print(secret)"}); m["stdout"] != "alice only\n" {
		t.Fatalf("alice after bob closed his: %v", m)
	}
	// The engine's own listing (what an attached dashboard shows).
	out := runHeadless(t, bin, dirs.env(), `{"id":"k","op":"kernels"}`+"\n", "--connect", se.sock)
	if !strings.Contains(out, `"owner":"alice"`) {
		t.Fatalf("the engine's kernels lack alice's: %s", out)
	}
}

// bearer adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return b.next.RoundTrip(r)
}

// Streamable HTTP on a Unix socket: the token is required; two clients
// with different names are two owners of one engine.
func TestMCPOverHTTP(t *testing.T) {
	bin := buildBinary(t)
	isolate(t)
	dir := shortTempDir(t)
	tokenFile := filepath.Join(dir, "token")
	token := "0123456789abcdef0123456789abcdef"
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	sock := filepath.Join(dir, "mcp.sock")

	// Refused before serving: a public address, a token others may read.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--http", "0.0.0.0:0", "--token-file", tokenFile}, "loopback"},
		{[]string{"--http", "unix:" + sock}, "--token-file"},
		{[]string{"--http", "unix:" + sock, "--token-file", filepath.Join(dir, "open")}, "chmod 600"},
	} {
		os.WriteFile(filepath.Join(dir, "open"), []byte(token), 0o644)
		os.Chmod(filepath.Join(dir, "open"), 0o644)
		out, err := exec.Command(bin, append([]string{"mcp"}, tc.args...)...).CombinedOutput()
		if code := exitCode(err); code != exitUsage || !strings.Contains(string(out), tc.want) {
			t.Errorf("mcp %v: exit %d %q, want 2 saying %q", tc.args, code, out, tc.want)
		}
	}

	cmd := exec.Command(bin, "mcp", "--http", "unix:"+sock, "--token-file", tokenFile)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	waitUntil(t, "the HTTP server", func() bool { return strings.Contains(stderr.String(), "streamable HTTP at") })
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the socket: %v %v, want 0600", st.Mode().Perm(), err)
	}
	unix := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
	connect := func(name, tok string) (*mcp.ClientSession, error) {
		c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "test"}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://kerneldeck/",
			HTTPClient: &http.Client{Transport: bearer{tok, unix}}, MaxRetries: -1}, nil)
	}
	for _, tok := range []string{"", "wrong-token-wrong-token"} {
		if cs, err := connect("mallory", tok); err == nil {
			cs.Close()
			t.Errorf("a client with token %q connected", tok)
		}
	}
	exec1 := func(cs *mcp.ClientSession, code string) map[string]any {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "python_exec", Arguments: map[string]any{"code": code}})
		if err != nil {
			t.Fatalf("python_exec %q: %v", code, err)
		}
		var m map[string]any
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &m)
		return m
	}
	alice, err := connect("alice", token)
	if err != nil {
		t.Fatalf("alice with the token: %v\n%s", err, stderr.String())
	}
	defer alice.Close()
	bob, err := connect("bob", token)
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	exec1(alice, "n = 1")
	if m := exec1(alice, "n += 1\nprint(n)"); m["stdout"] != "2\n" {
		t.Fatalf("alice's state over HTTP: %v", m)
	}
	if m := exec1(bob, "print(n)"); m["status"] != "error" || !strings.Contains(m["traceback"].(string), "NameError") {
		t.Fatalf("bob read alice's variable: %v", m)
	}
	if strings.Contains(stderr.String(), token) {
		t.Fatalf("the token is in the server's output: %s", stderr.String())
	}
}

// exitCode is a finished command's exit status (0 for no error).
func exitCode(err error) int {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// shortTempDir is a 0700 temp dir with a path short enough for a socket.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kdmcp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestMCPCallRidesThroughAnEngineRestart: an agent's python_exec through
// `mcp --connect` whose engine is killed while the cell runs, and started
// again, gets the cell's one result, not an error; the kernel keeps its
// state.
func TestMCPCallRidesThroughAnEngineRestart(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	t.Cleanup(func() { killProcessesUnder(t, dirs.kernels) })
	se := startServe(t, bin, dirs)
	agent := startMCP(t, bin, dirs.env(), "agent", "", nil, "--connect", se.sock)
	if _, m := agent.must("python_exec", map[string]any{"code": "x = 1"}); m["status"] != "success" {
		t.Fatalf("x = 1: %v", m)
	}
	type answer struct {
		res *mcp.CallToolResult
		m   map[string]any
	}
	got := make(chan answer, 1)
	go func() {
		res, m := agent.must("python_exec", map[string]any{"code": "import time; time.sleep(3); x += 10; print('x is', x)"})
		got <- answer{res, m}
	}()
	waitUntil(t, "the cell to run", func() bool {
		out := runHeadless(t, bin, dirs.env(), `{"id":"k","op":"kernels"}`+"\n", "--connect", se.sock)
		return strings.Contains(out, `"state":"running"`)
	})
	se.cmd.Process.Kill()
	se.cmd.Wait()
	se = startServe(t, bin, dirs)
	var a answer
	select {
	case a = <-got:
	case <-time.After(tmuxWait):
		t.Fatal("the call in flight never came back after the restart")
	}
	if a.res.IsError || a.m["stdout"] != "x is 11\n" {
		t.Fatalf("the call in flight across the restart: %v %s", a.m, resultText(a.res))
	}
	if _, m := agent.must("python_exec", map[string]any{"code": "print(x)"}); m["stdout"] != "11\n" {
		t.Fatalf("the kernel after the restart (the cell in flight ran once: x is 11): %v", m)
	}
}

// A line that is not a JSON-RPC message gets a JSON-RPC error answer and
// the session goes on (the SDK's stdio transport ended it at the first
// such line): a client that sends one bad line keeps its kernels.
func TestMCPStdioSurvivesBadLines(t *testing.T) {
	bin := buildBinary(t)
	kernels := isolate(t)
	t.Cleanup(func() { killProcessesUnder(t, kernels) })
	cmd := exec.Command(bin, "mcp")
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	// The input stays open until the answers came: at its end the session
	// ends, and what it had not answered yet with it.
	io.WriteString(in, strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{not json`,
		`{"foo": 1}`,
		`[]`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
	}, "\n")+"\n")
	var codes []float64
	var lines []string
	listed := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Errorf("a line of the server's is not JSON: %q", sc.Text())
				continue
			}
			lines = append(lines, sc.Text())
			if e, ok := m["error"].(map[string]any); ok {
				codes = append(codes, e["code"].(float64))
			}
			if m["id"] == float64(2) && m["result"] != nil {
				listed <- true
				return
			}
		}
		listed <- false
	}()
	select {
	case ok := <-listed:
		if !ok || fmt.Sprint(codes) != "[-32700 -32600 -32600]" {
			t.Errorf("answers %q; want a parse error, two invalid requests, then the tools listed", lines)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no tools listed within 60 s")
	}
}
