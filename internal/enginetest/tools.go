package enginetest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
)

// ToolHarness is a Harness whose engine serves the built-in host tools from
// a private workspace on this machine (tools always run on the operator's
// host, whatever backend the kernel runs on).
type ToolHarness struct {
	*Harness
	Workspace string
	Registry  *hosttools.Registry
}

// NewTools starts an engine on env with the built-in tools, every call
// allowed, and tool output over 4000 bytes stored under the state dir;
// mutate changes the config before the engine starts.
func NewTools(t *testing.T, env backends.Env, mutate func(*engine.Config)) *ToolHarness {
	t.Helper()
	ws := t.TempDir()
	w, err := hosttools.NewWorkspace(ws)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	reg := hosttools.NewRegistry()
	if err := (&hosttools.Builtins{Workspace: w}).Register(reg); err != nil {
		t.Fatal(err)
	}
	th := &ToolHarness{Workspace: w.Root(), Registry: reg}
	th.Harness = New(t, env, func(c *engine.Config) {
		store, err := hosttools.NewStorage(c.StateDir, 4000, 100)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		c.Tools, c.ToolOutput = reg, store
		c.Approvals = engine.Approvals{Default: engine.PolicyAllow}
		c.ApprovalTimeout = 10 * time.Second
		if mutate != nil {
			mutate(c)
		}
	})
	return th
}

// Call runs code for owner in a kernel with the given tools.
func (h *ToolHarness) Call(owner string, tools []string, code string) *engine.Result {
	h.T.Helper()
	res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: owner, Tools: tools, Code: code, Timeout: 30 * time.Second})
	if err != nil {
		h.T.Fatalf("execute for %s: %v", owner, err)
	}
	return res
}

// WriteWorkspace creates a file in the workspace.
func (h *ToolHarness) WriteWorkspace(name, content string) {
	h.T.Helper()
	if err := os.WriteFile(filepath.Join(h.Workspace, name), []byte(content), 0o600); err != nil {
		h.T.Fatal(err)
	}
}

// forgePy defines forge(name, body) in a cell: it writes a request file into
// the kernel's rpc/ dir the way a forger inside the kernel could, holding the
// runner's own secret: a body whose "token" is TOKEN gets the real MAC of
// its fields; forge_raw signs raw JSON texts (for arguments no dict holds).
const forgePy = `
import json as _j, os as _o, sys as _s
_R = _s.modules["__main__"].RUNNER
TOKEN, CELL = "@TOKEN@", _R.running
def _write(name, data):
    p = _o.path.join(_R.rpc_dir, name)
    with open(p + ".tmp", "w") as f:
        f.write(data)
    _o.replace(p + ".tmp", p)
def forge_raw(name, seq_raw, tool, args_raw, cell):
    mac = _R.auth.mac("rpc", seq_raw, cell, tool, args_raw)
    _write(name, '{"seq": %s, "tool": %s, "args": %s, "cell": %s, "token": "%s"}' % (seq_raw, _j.dumps(tool), args_raw, _j.dumps(cell), mac))
def forge(name, body):
    if isinstance(body, dict) and body.get("token") == TOKEN:
        return forge_raw(name, _j.dumps(body["seq"]), body["tool"], _j.dumps(body["args"]), body["cell"])
    _write(name, body if isinstance(body, str) else _j.dumps(body))
import kerneldeck_tools as kt
`

func expectOK(t *testing.T, res *engine.Result, wantStdout string) {
	t.Helper()
	if res.Status != "success" || res.Stdout != wantStdout {
		// The kernel and fallback say whether a respawn or a per-call run
		// (a spawn that failed under load) explains a state that went missing.
		t.Fatalf("status %q stdout %q, want success %q; stderr %q traceback %q; fallback %q kernel %+v",
			res.Status, res.Stdout, wantStdout, res.Stderr, res.Traceback, res.Fallback, res.Kernel)
	}
}

// rejectedFor returns the rpc_rejected details that name the request file name.
func (h *ToolHarness) rejectedFor(name string) []string {
	var out []string
	for _, ev := range h.EventsOf(engine.EventRPCRejected) {
		if strings.HasPrefix(ev.Detail, name+":") {
			out = append(out, ev.Detail)
		}
	}
	return out
}

// ToolCalls is the tool RPC suite on one backend: calls served end to end,
// every rejection, limits, the workspace, approvals and stored output.
func ToolCalls(t *testing.T, newEnv func(t *testing.T) backends.Env) {
	t.Run("ReadFileAndTerminal", func(t *testing.T) {
		h := NewTools(t, newEnv(t), nil)
		h.WriteWorkspace("notes.txt", "line one\nline two\n")
		res := h.Call("a", []string{"read_file", "terminal"}, `import kerneldeck_tools as kt
print(repr(kt.read_file("notes.txt")))
r = kt.terminal("printf '%s' $((6 * 7)); pwd")
print(r["exit_code"], repr(r["output"]))`)
		expectOK(t, res, fmt.Sprintf("'line one\\nline two\\n'\n0 '42%s\\n'\n", h.Workspace))
		if res.ToolCallsMade != 2 {
			t.Fatalf("tool_calls_made %d, want 2", res.ToolCallsMade)
		}
		if calls := h.EventsOf(engine.EventRPCCall); len(calls) != 2 || !strings.Contains(calls[0].Detail, "read_file: ok") || !strings.Contains(calls[1].Detail, "terminal: ok") {
			t.Fatalf("rpc_call events: %+v", calls)
		}
		// State and the call counter are per cell: the next cell counts from zero.
		res = h.Call("a", []string{"read_file", "terminal"}, `print(kt.read_file("notes.txt", offset=5, limit=3))`)
		expectOK(t, res, "one\n")
		if res.ToolCallsMade != 1 || !res.Kernel.Reused {
			t.Fatalf("second cell: tool_calls_made %d reused %v", res.ToolCallsMade, res.Kernel.Reused)
		}
	})

	t.Run("SlowToolIsAnsweredWhileTheCellWaits", func(t *testing.T) {
		// Longer than the Execute path gathers answers for: the answer
		// travels on its own while the host-side wait goes on.
		h := NewTools(t, newEnv(t), nil)
		res := h.Call("a", []string{"terminal"}, `import kerneldeck_tools as kt, threading
out = {}
def slow():
    out["slow"] = kt.terminal("sleep 0.4; echo slow")["output"]
th = threading.Thread(target=slow)
th.start()
out["fast"] = kt.terminal("echo fast")["output"]
th.join()
print(out["fast"] + out["slow"], end="")`)
		expectOK(t, res, "fast\nslow\n")
		if res.ToolCallsMade != 2 {
			t.Fatalf("tool_calls_made %d, want 2", res.ToolCallsMade)
		}
	})

	t.Run("RejectionsAreReportedAndNeverDispatched", func(t *testing.T) {
		h := NewTools(t, newEnv(t), nil)
		h.WriteWorkspace("in.txt", "ok")
		tools := []string{"read_file", "write_file"}
		// A leftover: a thread of cell 1 publishes a well-formed request under
		// cell 1's authority, without ringing, once cell 2 runs. Written
		// during cell 1 it could be collected during cell 1 (a host-side
		// wait looks at rpc/ each second) and would rightly run.
		first := h.Call("a", tools, forgePy+`
import threading as _t, time as _tm
_planted = _t.Event()
def _plant_later(cell=CELL, token=TOKEN):
    while _R.running in (cell, None):
        _tm.sleep(0.005)
    forge("500.req", {"seq": 500, "tool": "write_file", "args": {"path": "pwned-leftover", "content": "x"}, "token": token, "cell": cell})
    _planted.set()
_t.Thread(target=_plant_later, daemon=True).start()
print("planted")`)
		expectOK(t, first, "planted\n")
		// By hand, from a shell on the host: the forger does not know the token.
		rpcDir := first.Kernel.Dir + "/rpc"
		h.Host(fmt.Sprintf(`umask 077; printf '%%s' '{"seq":900,"tool":"write_file","args":{"path":"pwned-token","content":"x"},"token":"%s","cell":"x"}' >%s/hand.req`,
			strings.Repeat("0", 64), rpcDir))
		res := h.Call("a", tools, forgePy+`
assert _planted.wait(30), "the leftover was not planted"
kt.read_file("in.txt")  # seq 1: a real call
forge("garbage.req", "{not json")
forge("notoken.req", {"seq": 901, "tool": "write_file", "args": {"path": "pwned-notoken", "content": "x"}, "cell": CELL})
forge("floatseq.req", {"seq": 1.5, "tool": "write_file", "args": {"path": "pwned-float", "content": "x"}, "token": TOKEN, "cell": CELL})
forge("strseq.req", {"seq": "7", "tool": "write_file", "args": {"path": "pwned-str", "content": "x"}, "token": TOKEN, "cell": CELL})
forge("replay.req", {"seq": 1, "tool": "write_file", "args": {"path": "pwned-replay", "content": "x"}, "token": TOKEN, "cell": CELL})
forge("stale.req", {"seq": 902, "tool": "write_file", "args": {"path": "pwned-stale", "content": "x"}, "token": TOKEN, "cell": "c0123456789abcdef"})
forge("bigargs.req", {"seq": 903, "tool": "write_file", "args": {"path": "pwned-big", "content": "x" * (1 << 20)}, "token": TOKEN, "cell": CELL})
forge("huge.req", "x" * (3 << 20))
forge_raw("dupargs.req", "904", "write_file", '{"path": "in.txt", "path": "pwned-dup", "content": "x"}', CELL)
forge("casekey.req", '{"seq": 905, "tool": "write_file", "args": {"path": "pwned-case", "content": "x"}, "TOKEN": "%s", "token": "%s", "cell": "%s"}' % ("0" * 64, TOKEN, CELL))
print(kt.read_file("in.txt"))  # a real call again: the sweep forwards everything
`)
		expectOK(t, res, "ok\n")
		if res.ToolCallsMade != 2 {
			t.Fatalf("tool_calls_made %d, want 2 (only the real calls)", res.ToolCallsMade)
		}
		want := map[string]string{
			"hand.req":     "wrong token",
			"garbage.req":  "unparseable",
			"notoken.req":  "missing token",
			"floatseq.req": "not a positive integer",
			"strseq.req":   "not a positive integer",
			"replay.req":   "duplicate seq 1",
			"stale.req":    "left over from an earlier cell",
			"500.req":      "left over from an earlier cell",
			"bigargs.req":  "oversized arguments",
			"huge.req":     "oversized",
			"dupargs.req":  `"path" appears twice`,
			"casekey.req":  `unknown field "TOKEN"`,
		}
		for name, reason := range want {
			got := h.rejectedFor(name)
			if len(got) != 1 || !strings.Contains(got[0], reason) {
				t.Errorf("%s: rpc_rejected %q, want exactly one saying %q", name, got, reason)
			}
		}
		// Nothing was dispatched, and a later sweep replays nothing.
		res = h.Call("a", tools, `print(kt.read_file("in.txt"))`)
		expectOK(t, res, "ok\n")
		for name := range want {
			if got := h.rejectedFor(name); len(got) != 1 {
				t.Errorf("%s was reported %d times, want once", name, len(got))
			}
		}
		if ents, _ := os.ReadDir(h.Workspace); len(ents) != 1 {
			t.Fatalf("a rejected request was dispatched: workspace holds %v", ents)
		}
		if calls := h.EventsOf(engine.EventRPCCall); len(calls) != 3 {
			t.Fatalf("%d rpc_call events, want 3 (the real calls)", len(calls))
		}
		if out := strings.TrimSpace(h.Host("ls -A " + rpcDir)); out != "" {
			t.Fatalf("request files left behind in rpc/: %q", out)
		}
	})

	t.Run("ToolSetLimitAndUnknownTools", func(t *testing.T) {
		h := NewTools(t, newEnv(t), func(c *engine.Config) { c.MaxToolCalls = 3 })
		h.WriteWorkspace("f", "x")
		res := h.Call("a", []string{"read_file", "ghost"}, `import kerneldeck_tools as kt
out = []
for i in range(5):
    try:
        out.append(kt.read_file("f"))
    except kt.ToolError as e:
        out.append(str(e))
for name in ("terminal", "ghost"):
    try:
        kt.call(name, command="true")
    except kt.ToolError as e:
        out.append(str(e))
print("\n".join(out))`)
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if res.Status != "success" || len(lines) != 7 {
			t.Fatalf("status %q stdout %q stderr %q", res.Status, res.Stdout, res.Traceback)
		}
		for i := range 3 {
			if lines[i] != "x" {
				t.Fatalf("call %d: %q", i, lines[i])
			}
		}
		for i := 3; i < 5; i++ {
			if !strings.Contains(lines[i], "limit reached") || !strings.Contains(lines[i], "3") {
				t.Fatalf("call %d past max_tool_calls: %q", i, lines[i])
			}
		}
		if !strings.Contains(lines[5], "not in this kernel's tool set") || !strings.Contains(lines[6], "no tool ghost") {
			t.Fatalf("unknown tools: %q / %q", lines[5], lines[6])
		}
		if res.ToolCallsMade != 3 {
			t.Fatalf("tool_calls_made %d, want 3", res.ToolCallsMade)
		}
	})

	t.Run("WorkspaceEscapesAreRefused", func(t *testing.T) {
		h := NewTools(t, newEnv(t), nil)
		outside := t.TempDir()
		secret := filepath.Join(outside, "secret.txt")
		if err := os.WriteFile(secret, []byte("top secret"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(secret, filepath.Join(h.Workspace, "link")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(h.Workspace, "dirlink")); err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(h.Workspace, secret)
		if err != nil {
			t.Fatal(err)
		}
		res := h.Call("a", []string{"read_file", "write_file"}, fmt.Sprintf(`import kerneldeck_tools as kt
for f, a in [(kt.read_file, {"path": %q}), (kt.read_file, {"path": %q}), (kt.read_file, {"path": "link"}),
             (kt.write_file, {"path": "dirlink/new.txt", "content": "x"}), (kt.write_file, {"path": "../escape.txt", "content": "x"})]:
    try:
        print("LEAK", f(**a))
    except kt.ToolError as e:
        print("refused", "workspace" in str(e))`, rel, secret))
		expectOK(t, res, strings.Repeat("refused True\n", 5))
		if _, err := os.Stat(filepath.Join(outside, "new.txt")); err == nil {
			t.Fatal("write_file wrote through a symlink out of the workspace")
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(h.Workspace), "escape.txt")); err == nil {
			t.Fatal("write_file wrote outside the workspace")
		}
	})

	t.Run("Approvals", func(t *testing.T) {
		h := NewTools(t, newEnv(t), func(c *engine.Config) {
			c.Approvals = engine.Approvals{Default: engine.PolicyAsk, Tools: map[string]engine.Policy{"terminal": engine.PolicyDeny}}
			c.ApprovalTimeout = 1500 * time.Millisecond
		})
		h.WriteWorkspace("f", "x")
		// The operator: answers each request with the next decision.
		decisions := make(chan engine.Decision, 8)
		sub := h.Eng.Subscribe(64)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range sub.C {
				if ev.Type != engine.EventApprovalRequest {
					continue
				}
				// Cell names the cell that asks, so its caller can answer.
				if ev.Tool != "read_file" || ev.Owner != "a" || !strings.Contains(string(ev.Args), `"f"`) || ev.Cell == "" || !ev.Until.After(ev.Time) {
					t.Errorf("approval request %+v", ev)
				}
				select {
				case d := <-decisions:
					if d != "" {
						if err := h.Eng.Approve(ev.Request, d); err != nil {
							t.Errorf("approve: %v", err)
						}
					}
				default:
				}
			}
		}()
		defer func() { sub.Close(); wg.Wait() }()
		code := `import kerneldeck_tools as kt
try:
    print(kt.read_file("f"))
except kt.ToolError as e:
    print("refused:", e)`
		for _, step := range []struct {
			decision engine.Decision
			want     string
		}{
			{engine.ApproveOnce, "x\n"},
			{engine.ApproveDeny, "refused: read_file: denied: the operator denied"},
			{"", "refused: read_file: denied: the operator did not answer within 1.5s"},
			{engine.ApproveAlways, "x\n"},
		} {
			decisions <- step.decision
			res := h.Call("a", []string{"read_file", "terminal"}, code)
			if res.Status != "success" || !strings.HasPrefix(res.Stdout, step.want) {
				t.Fatalf("decision %q: stdout %q, want prefix %q (traceback %q)", step.decision, res.Stdout, step.want, res.Traceback)
			}
		}
		before := len(h.EventsOf(engine.EventApprovalRequest))
		// "always" holds for this owner: no more questions...
		expectOK(t, h.Call("a", []string{"read_file"}, code), "x\n")
		if n := len(h.EventsOf(engine.EventApprovalRequest)); n != before || before != 4 {
			t.Fatalf("approval requests: %d before, %d after an always grant; want 4 and 4", before, n)
		}
		// ...but not for another owner, and never for a denied tool.
		res := h.Call("b", []string{"terminal"}, `import kerneldeck_tools as kt
try:
    kt.terminal("touch ran")
except kt.ToolError as e:
    print("refused:", e)`)
		if !strings.Contains(res.Stdout, "approval policy denies terminal") {
			t.Fatalf("policy deny: %q %q", res.Stdout, res.Traceback)
		}
		if _, err := os.Stat(filepath.Join(h.Workspace, "ran")); err == nil {
			t.Fatal("a denied terminal call ran")
		}
		if got := h.EventsOf(engine.EventApprovalDecided); len(got) != 4 || !strings.Contains(got[2].Detail, "no answer") {
			t.Fatalf("approval_decided events: %+v", got)
		}
		if err := h.Eng.Approve("a000000000000", engine.ApproveOnce); err == nil {
			t.Fatal("approving an unknown request succeeded")
		}
	})

	t.Run("LargeOutputIsStoredPrivately", func(t *testing.T) {
		h := NewTools(t, newEnv(t), nil)
		big := strings.Repeat("0123456789", 1000)
		h.WriteWorkspace("big.txt", big)
		res := h.Call("a", []string{"read_file"}, `import kerneldeck_tools as kt
text = kt.read_file("big.txt")
print(len(text), text[:10])
print(kt.last_result["stored"]["path"])`)
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if res.Status != "success" || len(lines) != 2 || lines[0] != "100 0123456789" {
			t.Fatalf("status %q stdout %q traceback %q", res.Status, res.Stdout, res.Traceback)
		}
		stored := lines[1]
		if !strings.HasPrefix(stored, h.StateDir+string(filepath.Separator)) || !strings.Contains(res.Stderr, stored) {
			t.Fatalf("stored at %q (state dir %s), stderr %q", stored, h.StateDir, res.Stderr)
		}
		data, err := os.ReadFile(stored)
		if err != nil || string(data) != big {
			t.Fatalf("stored output: %d bytes, err %v", len(data), err)
		}
		for p := stored; p != h.StateDir; p = filepath.Dir(p) {
			st, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			want := os.FileMode(0o700)
			if p == stored {
				want = 0o600
			}
			if st.Mode().Perm() != want {
				t.Fatalf("%s has mode %v, want %v", p, st.Mode().Perm(), want)
			}
		}
		// The stored output goes with its kernel.
		h.Eng.ShutdownOwner(context.Background(), "a")
		if _, err := os.Stat(filepath.Dir(stored)); !os.IsNotExist(err) {
			t.Fatalf("the kernel is gone but its stored output stays: %v", err)
		}
	})

	t.Run("KernelSideTimeoutAndInterrupt", func(t *testing.T) {
		h := NewTools(t, newEnv(t), func(c *engine.Config) {
			c.Approvals = engine.Approvals{Default: engine.PolicyAsk}
			c.ApprovalTimeout = time.Minute
		})
		h.WriteWorkspace("f", "x")
		// Nobody answers the approval. The kernel-side wait gives up with a
		// clear exception (its deadline moved close for the test)...
		res := h.Call("a", []string{"read_file"}, `import kerneldeck_tools as kt, sys, time
sys.modules["__main__"].RUNNER.cell_deadline = time.monotonic() - 10
try:
    kt.read_file("f")
except kt.ToolTimeout as e:
    print("timeout:", e)`)
		if res.Status != "success" || !strings.Contains(res.Stdout, "timeout: no answer from the host for tool read_file") {
			t.Fatalf("stdout %q traceback %q", res.Stdout, res.Traceback)
		}
		// ...and a cell whose call waits past the cell's timeout is
		// interrupted like any cell, keeping its kernel.
		start := time.Now()
		r2, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Tools: []string{"read_file"}, Timeout: 2 * time.Second,
			Code: "import kerneldeck_tools as kt\nkt.read_file('f')"})
		if err != nil {
			t.Fatal(err)
		}
		if r2.Status != "timeout" || r2.Kernel == nil || r2.Kernel.StateLost || time.Since(start) > 20*time.Second {
			t.Fatalf("status %q kernel %+v after %v", r2.Status, r2.Kernel, time.Since(start))
		}
		if len(h.Eng.PendingApprovals()) != 0 {
			t.Fatalf("approvals still pending after their cells ended: %+v", h.Eng.PendingApprovals())
		}
	})

	t.Run("TheDoorsAreReadAfterToolCalls", func(t *testing.T) {
		// While a cell's main thread waits for an answer it reads the doors
		// itself; after its calls (quick ones, and one longer than the
		// runner's IO_DELAY) the io thread must read them again, or the
		// engine's interrupt at the timeout goes unread and the kernel,
		// with its state, is killed.
		h := NewTools(t, newEnv(t), nil)
		h.WriteWorkspace("f", "x")
		tools := []string{"read_file", "terminal"}
		expectOK(t, h.Call("a", tools, "kept = 41"), "") // the spawn is not part of the timed cell
		// The calls must end before the timeout for the test to mean
		// anything: on a slow machine the timeout doubles until they do.
		for timeout := 2 * time.Second; ; timeout *= 2 {
			start := time.Now()
			res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "a", Tools: tools, Timeout: timeout,
				Code: "import kerneldeck_tools as kt, time\nfor _ in range(5):\n    kt.read_file('f')\nkt.terminal('sleep 0.05')\ntime.sleep(120)"})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status == "timeout" && res.ToolCallsMade < 6 && timeout < 32*time.Second {
				t.Logf("the timeout (%v) came after %d of 6 tool calls: again with more time", timeout, res.ToolCallsMade)
				if res.Kernel == nil || res.Kernel.StateLost {
					expectOK(t, h.Call("a", tools, "kept = 41"), "")
				}
				continue
			}
			if res.Status != "timeout" || res.Kernel == nil || res.Kernel.StateLost || res.ToolCallsMade != 6 {
				t.Fatalf("status %q, %d tool calls, kernel %+v after %v (timeout %v); want timeout, 6, state kept", res.Status, res.ToolCallsMade, res.Kernel, time.Since(start), timeout)
			}
			break
		}
		res := h.Call("a", tools, "print(kept + 1)")
		expectOK(t, res, "42\n")
	})

	t.Run("PerCallFallbackServesTools", func(t *testing.T) {
		env := newEnv(t)
		h := NewTools(t, env, nil)
		h.WriteWorkspace("f", "from the host")
		login := strings.TrimSpace(h.Host("id -un"))
		target := env.TempDir() + "/elsewhere"
		h.Host(fmt.Sprintf("mkdir -p %s && ln -s %s %s/kerneldeck-%s", target, target, env.TempDir(), login))
		res := h.Call("a", []string{"read_file"}, "import kerneldeck_tools as kt\nprint(kt.read_file('f'))")
		if res.Fallback != "per_call" || res.Kernel != nil || res.Stdout != "from the host\n" || res.ToolCallsMade != 1 {
			t.Fatalf("fallback %q kernel %+v stdout %q stderr %q calls %d", res.Fallback, res.Kernel, res.Stdout, res.Stderr, res.ToolCallsMade)
		}
		if out := strings.TrimSpace(h.Host("ls -d " + env.TempDir() + "/kerneldeck-once-* 2>/dev/null; ls -A " + target)); out != "" {
			t.Fatalf("the per-call run left files behind: %q", out)
		}
	})

	t.Run("ArgumentsAndResultsRoundTrip", func(t *testing.T) {
		h := NewTools(t, newEnv(t), nil)
		res := h.Call("a", []string{"write_file", "read_file", "list_files"}, `import kerneldeck_tools as kt, json
text = "snowman \u2603, quote \" backslash \\ newline\n\x00 tab\t"
kt.write_file("u.txt", text)
print(kt.read_file("u.txt") == text)
print(json.dumps([e["name"] for e in kt.list_files()["entries"]]))
try:
    kt.write_file("x", object())
except kt.ToolError as e:
    print("refused:", "JSON" in str(e))`)
		expectOK(t, res, "True\n[\"u.txt\"]\nrefused: True\n")
		if res.ToolCallsMade != 3 {
			t.Fatalf("tool_calls_made %d, want 3", res.ToolCallsMade)
		}
		var ev []engine.Event
		for _, e := range h.AllEvents() {
			if b, _ := json.Marshal(e); strings.Contains(string(b), "snowman") {
				ev = append(ev, e)
			}
		}
		if len(ev) != 0 {
			t.Fatalf("tool arguments leaked into events under the allow policy: %+v", ev)
		}
	})
}
