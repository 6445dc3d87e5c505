package headless

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"go.uber.org/goleak"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/syncbuf"
	"github.com/kerneldeck/kerneldeck/wire"

	"github.com/kerneldeck/kerneldeck/internal/proctest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newEngine starts a real engine on the local backend; it is closed (every
// runner killed) when the test ends.
func newEngine(t *testing.T, cfg engine.Config) *engine.Engine {
	t.Helper()
	if cfg.Backends == nil {
		cfg.Backends = []backends.Env{backends.NewLocal(t.TempDir())}
	}
	cfg.StateDir = t.TempDir()
	eng, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := eng.Close(ctx, false); err != nil {
			t.Errorf("engine close: %v", err)
		}
	})
	return eng
}

type line = map[string]any

// harness drives Serve through pipes, the way a script drives the binary.
type harness struct {
	t      *testing.T
	in     *io.PipeWriter
	lines  chan line
	done   chan error
	gate   chan struct{} // output is not read until it is closed
	events []line
	closed bool
}

func start(t *testing.T, eng *engine.Engine, opts Options) *harness {
	return startGated(t, eng, opts, false)
}

func startGated(t *testing.T, eng *engine.Engine, opts Options, gated bool) *harness {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	h := &harness{t: t, in: inW, lines: make(chan line, 100000), done: make(chan error, 1), gate: make(chan struct{})}
	if !gated {
		close(h.gate)
	}
	go func() {
		err := Serve(context.Background(), eng, inR, outW, opts)
		outW.Close()
		h.done <- err
	}()
	go func() {
		defer close(h.lines)
		<-h.gate
		br := bufio.NewReaderSize(outR, 1<<20)
		for {
			raw, err := br.ReadBytes('\n')
			if len(raw) > 0 {
				var l line
				if json.Unmarshal(raw, &l) != nil || l == nil || raw[len(raw)-1] != '\n' {
					l = line{"__bad__": string(raw)}
				}
				h.lines <- l
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		if !h.closed {
			h.finish()
		}
	})
	return h
}

func (h *harness) sendRaw(s string) {
	h.t.Helper()
	if _, err := io.WriteString(h.in, s+"\n"); err != nil {
		h.t.Fatalf("write request: %v", err)
	}
}

func (h *harness) send(req line) {
	h.t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		h.t.Fatal(err)
	}
	h.sendRaw(string(b))
}

// next returns the next response line, keeping event lines aside.
func (h *harness) next() line {
	h.t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-h.lines:
			if !ok {
				h.t.Fatal("output ended while waiting for a response")
			}
			if bad, ok := l["__bad__"]; ok {
				h.t.Fatalf("output line is not one complete JSON object: %.200q", bad)
			}
			if l["op"] == "event" {
				h.events = append(h.events, l)
				continue
			}
			return l
		case <-timeout:
			h.t.Fatal("no response within 60s")
		}
	}
}

// await collects the responses to ids, in whatever order they come.
func (h *harness) await(ids ...string) map[string]line {
	h.t.Helper()
	got := map[string]line{}
	for len(got) < len(ids) {
		l := h.next()
		id, ok := l["id"].(string)
		if !ok || !slices.Contains(ids, id) {
			h.t.Fatalf("unexpected response while waiting for %v: %v", ids, l)
		}
		if _, dup := got[id]; dup {
			h.t.Fatalf("two responses for id %q", id)
		}
		got[id] = l
	}
	return got
}

func (h *harness) call(req line) line {
	h.t.Helper()
	h.send(req)
	return h.await(req["id"].(string))[req["id"].(string)]
}

// finish closes the input and returns Serve's error and every line after.
func (h *harness) finish() (error, []line) {
	h.t.Helper()
	h.closed = true
	h.in.Close()
	var rest []line
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-h.lines:
			if !ok {
				return <-h.done, rest
			}
			if _, bad := l["__bad__"]; bad {
				h.t.Errorf("output line is not one complete JSON object: %.200q", l["__bad__"])
			}
			if l["op"] == "event" {
				h.events = append(h.events, l)
			}
			rest = append(rest, l)
		case <-timeout:
			h.t.Fatal("Serve did not return within 60s of EOF")
		}
	}
}

func execReq(id, code string, extra ...any) line {
	l := line{"id": id, "op": "execute", "code": code}
	for i := 0; i+1 < len(extra); i += 2 {
		l[extra[i].(string)] = extra[i+1]
	}
	return l
}

func wantKeys(t *testing.T, what string, l line, keys ...string) {
	t.Helper()
	got := slices.Sorted(maps.Keys(l))
	slices.Sort(keys)
	if !slices.Equal(got, keys) {
		t.Errorf("%s has keys %v, want exactly %v", what, got, keys)
	}
}

func kernelOf(t *testing.T, res line) line {
	t.Helper()
	k, ok := res["kernel"].(line)
	if !ok {
		t.Fatalf("result has no kernel object: %v", res)
	}
	return k
}

func alive(pid int) bool { return proctest.Alive(pid) }

func waitDead(t *testing.T, pid int) { proctest.WaitDead(t, pid, 10*time.Second) }

func pidOf(t *testing.T, res line) int {
	t.Helper()
	pid, ok := kernelOf(t, res)["pid"].(float64)
	if !ok || pid <= 0 {
		t.Fatalf("result kernel has no pid: %v", res)
	}
	return int(pid)
}

func TestExecuteReuseResetAndResultShape(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})

	first := h.call(execReq("a", "x = 41", "owner", "alice"))
	if first["op"] != "result" || first["status"] != "success" {
		t.Fatalf("first result: %v", first)
	}
	k1 := kernelOf(t, first)
	if k1["reused"] != false || k1["execution_count"] != 1.0 || k1["backend"] != "local" {
		t.Errorf("first kernel: %v", k1)
	}

	second := h.call(execReq("b", "x += 1\nprint(x)", "owner", "alice"))
	wantKeys(t, "result", second, "id", "op", "status", "stdout", "stderr", "traceback", "stdout_clipped",
		"stderr_clipped", "spill_path", "stderr_spill_path", "tool_calls_made", "duration_ms", "fallback", "kernel", "cell")
	k2 := kernelOf(t, second)
	wantKeys(t, "result kernel", k2, "id", "pid", "dir", "backend", "reused", "execution_count",
		"state_lost", "state_reset", "state_restored", "note")
	if second["stdout"] != "42\n" || second["status"] != "success" || second["fallback"] != "" {
		t.Errorf("second result: %v", second)
	}
	if k2["reused"] != true || k2["execution_count"] != 2.0 || k2["id"] != k1["id"] || k2["pid"] != k1["pid"] {
		t.Errorf("second cell did not reuse kernel %v: %v", k1, k2)
	}
	if d, ok := second["duration_ms"].(float64); !ok || d <= 0 || d > 10000 {
		t.Errorf("duration_ms = %v, want a positive number of milliseconds", second["duration_ms"])
	}

	failed := h.call(execReq("c", "1/0", "owner", "alice"))
	if failed["status"] != "error" || !strings.Contains(failed["traceback"].(string), "ZeroDivisionError") {
		t.Errorf("error cell: %v", failed)
	}

	reset := h.call(execReq("d", "print('x' in globals())", "owner", "alice", "reset", true))
	kr := kernelOf(t, reset)
	if reset["stdout"] != "False\n" || kr["state_reset"] != true || kr["id"] == k1["id"] {
		t.Errorf("reset result: %v", reset)
	}
	waitDead(t, pidOf(t, first))

	// A different owner is a different kernel.
	other := h.call(execReq("e", "print('x' in globals())", "owner", "bob"))
	if other["stdout"] != "False\n" || kernelOf(t, other)["id"] == kr["id"] {
		t.Errorf("other owner's result: %v", other)
	}
}

func TestTimeoutIsSecondsAndDefaultsToCellTimeout(t *testing.T) {
	eng := newEngine(t, engine.Config{CellTimeout: 1500 * time.Millisecond, InterruptGrace: time.Second})
	h := start(t, eng, Options{})
	h.call(execReq("warm", "pass")) // the spawn must not eat into the timeouts below

	begin := time.Now()
	res := h.call(execReq("t1", "import time\ntime.sleep(20)", "timeout", 0.4))
	took := time.Since(begin)
	if res["status"] != "timeout" || took < 350*time.Millisecond || took > 10*time.Second {
		t.Errorf("timeout 0.4 (seconds): status %v after %v, want timeout after about 0.4s", res["status"], took)
	}

	begin = time.Now()
	res = h.call(execReq("t2", "import time\ntime.sleep(20)"))
	took = time.Since(begin)
	if res["status"] != "timeout" || took < 1400*time.Millisecond || took > 20*time.Second {
		t.Errorf("no timeout: status %v after %v, want the configured 1.5s", res["status"], took)
	}

	res = h.call(execReq("t3", "import time\ntime.sleep(0.2)\nprint('ok')", "timeout", 5))
	if res["status"] != "success" || res["stdout"] != "ok\n" {
		t.Errorf("timeout 5: %v", res)
	}
}

// hibernate_after is a limit like the others: set live (0: never) and
// listed.
func TestHibernateAfterIsALimit(t *testing.T) {
	eng := newEngine(t, engine.Config{ParkDir: filepath.Join(t.TempDir(), "parked"), HibernateAfter: time.Minute})
	h := start(t, eng, Options{})
	for _, secs := range []float64{120, 0} {
		if ok := h.call(line{"id": "l", "op": "limits", "hibernate_after": secs}); ok["op"] != "ok" {
			t.Fatalf("limits hibernate_after %v: %v", secs, ok)
		}
		if l := h.call(line{"id": "k", "op": "kernels"}); l["hibernate_after"] != secs {
			t.Errorf("after hibernate_after %v the listing says %v", secs, l["hibernate_after"])
		}
	}
}

func TestKernelsListing(t *testing.T) {
	eng := newEngine(t, engine.Config{MaxKernels: 3, IdleExit: 90 * time.Second})
	h := start(t, eng, Options{})

	empty := h.call(line{"id": "k0", "op": "kernels"})
	if empty["count"] != 0.0 || empty["kernels"] == nil {
		t.Errorf("empty listing: %v (kernels must be [], not null)", empty)
	}

	a := h.call(execReq("a", "pass", "owner", "alice", "task", "t1", "tools", []string{"b_tool", "a_tool", "a_tool"}))
	b := h.call(execReq("b", "pass", "owner", "bob", "child", "c1"))
	l := h.call(line{"id": "k1", "op": "kernels"})
	wantKeys(t, "kernels response", l, "id", "op", "count", "cap", "idle_exit", "hibernate_after", "kernels", "now", "version", "spares", "parked")
	if l["op"] != "kernels" || l["count"] != 2.0 || l["cap"] != 3.0 || l["idle_exit"] != 90.0 || l["spares"] != 0.0 || l["hibernate_after"] != 0.0 {
		t.Errorf("kernels header: %v", l)
	}
	ks, _ := l["kernels"].([]any)
	if len(ks) != 2 {
		t.Fatalf("kernels: %v", l["kernels"])
	}
	for i, want := range []struct {
		res   line
		owner string
		task  string
		child string
		tools []any
	}{
		{a, "alice", "t1", "", []any{"a_tool", "b_tool"}},
		{b, "bob", "default", "c1", []any{}},
	} {
		k := ks[i].(line)
		wantKeys(t, "kernel entry", k, "id", "owner", "task", "backend", "child", "tools", "pid", "dir",
			"attached", "queued", "idle_s", "execution_count",
			"state", "running_cell", "running_since", "last_used", "next_evict", "confinement", "python", "cwd")
		if cwd, _ := os.Getwd(); k["cwd"] != cwd {
			t.Errorf("kernel entry %v: cwd, want the engine's %s (the requests said none)", k, cwd)
		}
		if k["state"] != "idle" || k["running_cell"] != "" || k["running_since"] != nil || !strings.HasPrefix(k["confinement"].(string), "landlock:") ||
			!strings.HasPrefix(fmt.Sprint(k["python"]), "/") {
			t.Errorf("kernel entry %v: want an idle, confined kernel on an interpreter by its path", k)
		}
		rk := kernelOf(t, want.res)
		tools, isArray := k["tools"].([]any)
		if k["owner"] != want.owner || k["task"] != want.task || k["child"] != want.child || k["backend"] != "local" ||
			!isArray || !slices.Equal(tools, want.tools) || k["id"] != rk["id"] || k["pid"] != rk["pid"] ||
			k["dir"] != rk["dir"] || k["attached"] != false || k["queued"] != 0.0 || k["execution_count"] != 1.0 {
			t.Errorf("kernel %d = %v, want owner %s task %s child %q tools %v and the kernel of %v", i, k, want.owner,
				want.task, want.child, want.tools, rk)
		}
		if idle, ok := k["idle_s"].(float64); !ok || idle < 0 || idle > 60 {
			t.Errorf("idle_s = %v", k["idle_s"])
		}
	}
}

func TestLimitsApplyAtOnce(t *testing.T) {
	eng := newEngine(t, engine.Config{})
	h := start(t, eng, Options{})

	var pids []int
	for _, owner := range []string{"o1", "o2", "o3"} {
		pids = append(pids, pidOf(t, h.call(execReq(owner, "pass", "owner", owner))))
	}
	if ok := h.call(line{"id": "l1", "op": "limits", "max_kernels": 1}); ok["op"] != "ok" || len(ok) != 2 {
		t.Fatalf("limits: %v", ok)
	}
	l := h.call(line{"id": "k1", "op": "kernels"})
	ks, _ := l["kernels"].([]any)
	if l["cap"] != 1.0 || l["count"] != 1.0 || len(ks) != 1 || ks[0].(line)["owner"] != "o3" {
		t.Fatalf("after max_kernels 1, want only the most recently used kernel (o3): %v", l)
	}
	waitDead(t, pids[0])
	waitDead(t, pids[1])
	if !alive(pids[2]) {
		t.Errorf("the kernel under the cap (pid %d) was killed", pids[2])
	}

	if ok := h.call(line{"id": "l2", "op": "limits", "idle_exit": 1}); ok["op"] != "ok" {
		t.Fatalf("limits idle_exit: %v", ok)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		l := h.call(line{"id": "k2", "op": "kernels"})
		if l["idle_exit"] != 1.0 {
			t.Fatalf("idle_exit in listing = %v, want 1 (seconds)", l["idle_exit"])
		}
		if l["count"] == 0.0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle kernel not reaped 10s after idle_exit 1: %v", l)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitDead(t, pids[2])
}

func TestBadRequestsKeepServing(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})
	null := "<null>"
	for i, tc := range []struct {
		line string
		id   string // null for a null id
		want []string
	}{
		{`not json`, null, []string{"not valid JSON", "one JSON object per line"}},
		{`{"id":"x","op":"kernels"`, null, []string{"not valid JSON"}},
		{`[1,2]`, null, []string{"must be a JSON object"}},
		{`null`, null, []string{"must be a JSON object"}},
		{`"execute"`, null, []string{"must be a JSON object"}},
		{`{"op":"kernels"}`, null, []string{`needs "id" as a JSON string`, "missing"}},
		{`{"id":7,"op":"kernels"}`, "7", []string{`"id" as a JSON string`, "number 7", `"id":"4", not "id":4`}},
		{`{"id":[7],"op":"kernels"}`, null, []string{`"id" as a JSON string`, "array"}},
		{`{"id":"u1","op":"execute","code":"1","timout":1}`, "u1", []string{`unknown field "timout" in execute`, "timeout", "stream"}},
		{`{"id":"u2","op":"kernels","extra":[1]}`, "u2", []string{`unknown field "extra" in kernels`, "id, op"}},
		{`{"id":"e1"}`, "e1", []string{`no "op"`, "execute, kernels, limits"}},
		{`{"id":"d1","op":"kill","kernel":"k1","kernel":"k2"}`, "d1", []string{`gives "kernel" twice`, "send each field once"}},
		{`{"id":"d2","id":"d3","op":"kernels"}`, null, []string{`gives "id" twice`}},
		{`{"id":"e2","op":"launch"}`, "e2", []string{`unknown op "launch"`, "shutdown_all", "approve"}},
		{`{"id":"e3","op":5}`, "e3", []string{`"op" must be a string, got number 5`}},
		{`{"id":"e4","op":"execute"}`, "e4", []string{`execute needs "code"`, `"" is allowed`}},
		{`{"id":"e5","op":"execute","code":1}`, "e5", []string{`"code" must be a string, got number 1`}},
		{`{"id":"e6","op":"execute","code":"1","owner":2}`, "e6", []string{`"owner" must be a string`}},
		{`{"id":"e7","op":"execute","code":"1","task":true}`, "e7", []string{`"task" must be a string, got boolean`}},
		{`{"id":"e8","op":"execute","code":"1","backend":["local"]}`, "e8", []string{`"backend" must be a string, got array`}},
		{`{"id":"e9","op":"execute","code":"1","child":{}}`, "e9", []string{`"child" must be a string, got object`}},
		{`{"id":"e10","op":"execute","code":"1","tools":"read_file"}`, "e10", []string{`"tools" must be an array of strings`}},
		{`{"id":"e11","op":"execute","code":"1","tools":["a",1]}`, "e11", []string{`item 1 is number 1`}},
		{`{"id":"e12","op":"execute","code":"1","tools":["no-dash"]}`, "e12", []string{`"tools"`, "Python identifier"}},
		{`{"id":"e13","op":"execute","code":"1","reset":"yes"}`, "e13", []string{`"reset" must be true or false`}},
		{`{"id":"e14","op":"execute","code":"1","timeout":"5"}`, "e14", []string{`"timeout" must be a number`}},
		{`{"id":"e15","op":"execute","code":"1","timeout":-1}`, "e15", []string{`"timeout" is in seconds`, "got -1"}},
		{`{"id":"e16","op":"execute","code":"1","timeout":1e300}`, "e16", []string{`"timeout" is in seconds`}},
		{`{"id":"e17","op":"execute","code":"1","backend":"ssh://nowhere"}`, "e17", []string{`unknown backend "ssh://nowhere"`, "local"}},
		{`{"id":"e17c","op":"execute","code":"1","cwd":"project"}`, "e17c", []string{`"cwd", "python" and "umask" say where you work`, `dir "project" must be an absolute path`}},
		{`{"id":"e17p","op":"execute","code":"1","python":"/usr/bin/python3\n"}`, "e17p", []string{`python`, "without control characters"}},
		{`{"id":"e17u","op":"execute","code":"1","umask":512}`, "e17u", []string{`umask 512 must be from 0 to 0777`}},
		{`{"id":"e17v","op":"execute","code":"1","umask":"022"}`, "e17v", []string{`"umask" must be a number`}},
		{`{"id":"e18","op":"limits"}`, "e18", []string{`limits needs "max_kernels"`}},
		{`{"id":"e19","op":"limits","max_kernels":0}`, "e19", []string{`"max_kernels": 0 is invalid: it must be a whole number >= 1`}},
		{`{"id":"e20","op":"limits","max_kernels":2.5}`, "e20", []string{`whole number`}},
		{`{"id":"e21","op":"limits","max_kernels":"3"}`, "e21", []string{`"max_kernels" must be a number, got string`}},
		{`{"id":"e22","op":"limits","idle_exit":0.5}`, "e22", []string{`"idle_exit": 0.5 (seconds) is invalid: it must be a duration of at least 1s`}},
		{`{"id":"e22h","op":"limits","hibernate_after":0.5}`, "e22h", []string{`"hibernate_after": 0.5 (seconds) is invalid: it must be a duration of at least 1s (0: never)`}},
		{`{"id":"e22p","op":"limits","hibernate_after":60}`, "e22p", []string{`hibernate_after needs parking`}},
		{`{"id":"e23","op":"interrupt"}`, "e23", []string{`interrupt needs "kernel"`}},
		{`{"id":"e24","op":"kill","kernel":5}`, "e24", []string{`"kernel" must be a string`}},
		{`{"id":"e25","op":"kill","kernel":"knope"}`, "e25", []string{`no kernel with id "knope"`}},
		{`{"id":"e26","op":"interrupt","kernel":"knope"}`, "e26", []string{`no kernel with id "knope"`}},
		{`{"id":"e27","op":"shutdown_owner"}`, "e27", []string{`shutdown_owner needs "owner"`}},
		{`{"id":"e28","op":"shutdown_owner","owner":false}`, "e28", []string{`"owner" must be a string`}},
		{`{"id":"e29","op":"approve","decision":"once"}`, "e29", []string{`approve needs "request"`, "approval_request"}},
		{`{"id":"e30","op":"approve","request":"","decision":"once"}`, "e30", []string{`approve needs "request"`}},
		{`{"id":"e31","op":"approve","request":7,"decision":"once"}`, "e31", []string{`"request" must be a string, got number 7`}},
		{`{"id":"e32","op":"approve","request":"a1"}`, "e32", []string{`approve needs "decision"`, `"once"`, `"always"`, `"deny"`}},
		{`{"id":"e33","op":"approve","request":"a1","decision":"yes"}`, "e33", []string{`"decision" must be "once", "always" or "deny", got "yes"`}},
		{`{"id":"e34","op":"approve","request":"a1","decision":"allow"}`, "e34", []string{`got "allow"`}},
		{`{"id":"e35","op":"approve","request":"a1","decision":true}`, "e35", []string{`"decision" must be a string, got boolean`}},
		{`{"id":"e36","op":"approve","request":"anope","decision":"once"}`, "e36", []string{`no pending approval request "anope"`}},
		{`{"id":"e37","op":"approve","request":"anope","decision":"deny"}`, "e37", []string{`no pending approval request "anope"`}},
	} {
		h.sendRaw(tc.line)
		got := h.next()
		wantKeys(t, tc.line+" response", got, "id", "op", "error")
		msg, _ := got["error"].(string)
		idOK := got["id"] == tc.id || (tc.id == null && got["id"] == nil) || fmt.Sprint(got["id"]) == tc.id
		if got["op"] != "error" || !idOK {
			t.Errorf("%s: got %v, want op error with id %s", tc.line, got, tc.id)
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: error %q does not say %q", tc.line, msg, w)
			}
		}
		// Still serving after every bad line.
		okID := fmt.Sprintf("ok%d", i)
		if got := h.call(line{"id": okID, "op": "kernels"}); got["op"] != "kernels" {
			t.Fatalf("after %s: %v", tc.line, got)
		}
	}

	// Blank lines are skipped, null means absent.
	h.sendRaw("")
	h.sendRaw("   ")
	res := h.call(line{"id": "n", "op": "execute", "code": "print(2)", "owner": nil, "timeout": nil, "tools": nil})
	if res["stdout"] != "2\n" || kernelOf(t, res)["id"] == nil {
		t.Errorf("execute after the bad lines: %v", res)
	}
	// An empty code string is a valid cell.
	if res := h.call(execReq("empty", "")); res["status"] != "success" {
		t.Errorf("empty code: %v", res)
	}
}

func TestLongLines(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})

	big := 10 << 20
	res := h.call(execReq("big", "s = '"+strings.Repeat("a", big)+"'\nprint(len(s))"))
	if res["stdout"] != strconv.Itoa(big)+"\n" {
		t.Errorf("10 MiB request: %.300v", res)
	}

	h.sendRaw(`{"id":"huge","op":"execute","code":"` + strings.Repeat("b", MaxLineBytes+1) + `"}`)
	got := h.next()
	if got["op"] != "error" || got["id"] != nil || !strings.Contains(got["error"].(string), "longer than 16 MiB") {
		t.Errorf("over-long line: %v", got)
	}
	if got := h.call(line{"id": "after", "op": "kernels"}); got["count"] != 1.0 {
		t.Errorf("after an over-long line: %v", got)
	}
}

func TestReadLineLimit(t *testing.T) {
	exact := strings.Repeat("x", MaxLineBytes)
	input := exact + "\n" + exact + "y\nnext\r\n\nlast"
	br := bufio.NewReaderSize(strings.NewReader(input), 64<<10)
	var got []string
	for {
		l, eof := readLine(br)
		switch {
		case l.err != nil:
			t.Fatal(l.err)
		case l.tooLong > 0:
			got = append(got, fmt.Sprintf("too long %d", l.tooLong))
		case len(l.data) == MaxLineBytes:
			got = append(got, "max")
		default:
			got = append(got, strconv.Quote(string(l.data)))
		}
		if eof {
			break
		}
	}
	want := []string{"max", fmt.Sprintf("too long %d", MaxLineBytes+1), `"next\r"`, `""`, `"last"`}
	if !slices.Equal(got, want) {
		t.Errorf("lines = %v, want %v", got, want)
	}
}

func TestConcurrentRequests(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})
	// A barrier instead of a stopwatch: each cell checks in and waits until
	// all four have, and the test's own mark, made only after the quick
	// "kernels" request was answered. Cells run one after another would
	// each see fewer marks.
	dir := t.TempDir()
	ids := []string{"c1", "c2", "c3", "c4"}
	for _, id := range ids {
		code := fmt.Sprintf(`import os, time
d = %q
open(os.path.join(d, %q), "w").close()
end = time.time() + 60
while len(os.listdir(d)) < 5 and time.time() < end:
    time.sleep(0.01)
print(%q, len(os.listdir(d)))`, dir, id, id)
		h.send(execReq(id, code, "owner", id))
	}
	h.send(line{"id": "list", "op": "kernels"})
	if first := h.next(); first["id"] != "list" {
		t.Errorf("a quick request waited for slow ones: first response %v", first)
	}
	if err := os.WriteFile(filepath.Join(dir, "test"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got := h.await(ids...)
	for _, id := range ids {
		if got[id]["stdout"] != id+" 5\n" || got[id]["op"] != "result" {
			t.Errorf("response for %s: %v (want %q: all four cells running at once)", id, got[id], id+" 5\n")
		}
	}
}

func TestSameKernelRunsInArrivalOrder(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})
	h.call(execReq("init", "seen = []"))
	var ids []string
	for i := range 30 {
		id := "n" + strconv.Itoa(i)
		ids = append(ids, id)
		// A long first line makes this request slow to parse and pick up.
		pad := ""
		if i%2 == 0 {
			pad = "#" + strings.Repeat("p", 1<<18) + "\n"
		}
		h.send(execReq(id, pad+"seen.append("+strconv.Itoa(i)+")"))
	}
	h.await(ids...)
	res := h.call(execReq("check", "print(seen)"))
	want := make([]string, 30)
	for i := range want {
		want[i] = strconv.Itoa(i)
	}
	if res["stdout"] != "["+strings.Join(want, ", ")+"]\n" {
		t.Errorf("cells for one kernel ran out of arrival order: %v", res["stdout"])
	}
}

func TestQueuedRequestsCountTheirWait(t *testing.T) {
	eng := newEngine(t, engine.Config{CellTimeout: 1500 * time.Millisecond})
	h := start(t, eng, Options{})
	h.send(execReq("hog", "import time\ntime.sleep(2.5)\nprint('hog')", "owner", "q", "timeout", 10))
	waitAttached(t, h, "q")
	begin := time.Now()
	h.send(execReq("quick", "print('never')", "owner", "q", "timeout", 0.5))
	h.send(execReq("dflt", "print('never')", "owner", "q"))
	h.send(execReq("patient", "print('p')", "owner", "q", "timeout", 20))
	l := h.call(line{"id": "list", "op": "kernels"})
	if k := l["kernels"].([]any)[0].(line); k["queued"] != 3.0 || k["attached"] != true {
		t.Errorf("kernel with a running cell and 3 waiting requests listed as %v", k)
	}

	// Answers come in the order the waits end: 0.5s, the default 1.5s, then
	// the 2.5s cell and the one queued behind it. Those two end within a
	// millisecond of each other, and their answers are written by two
	// goroutines: either may come first.
	wants := []struct {
		id, status, stdout string
	}{
		{"quick", "timeout", ""},
		{"dflt", "timeout", ""},
		{"hog", "success", "hog\n"},
		{"patient", "success", "p\n"},
	}
	got := []line{h.next(), h.next(), h.next(), h.next()}
	if got[2]["id"] == "patient" {
		got[2], got[3] = got[3], got[2]
	}
	for i, want := range wants {
		if got[i]["id"] != want.id || got[i]["status"] != want.status || got[i]["stdout"] != want.stdout {
			t.Errorf("after %v got %v, want %s: %s %q", time.Since(begin), got[i], want.id, want.status, want.stdout)
		}
		if want.status == "timeout" && (got[i]["kernel"] != nil || !strings.Contains(got[i]["traceback"].(string), "never started")) {
			t.Errorf("%s timed out waiting, but reports %v", want.id, got[i])
		}
	}
	if res := h.call(execReq("count", "print('x')", "owner", "q")); kernelOf(t, res)["execution_count"] != 3.0 {
		t.Errorf("the requests that timed out while waiting must not have run: %v", res)
	}
}

// waitAttached polls until owner's kernel has a running cell and returns its id.
func waitAttached(t *testing.T, h *harness, owner string) string {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		l := h.call(line{"id": "poll", "op": "kernels"})
		for _, k := range l["kernels"].([]any) {
			if k := k.(line); k["owner"] == owner && k["attached"] == true && k["pid"].(float64) > 0 {
				time.Sleep(200 * time.Millisecond) // let the cell get going
				return k["id"].(string)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no running cell for owner %s", owner)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestInterruptKillShutdown(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})

	h.send(execReq("long", "import time\nkept = 1\ntime.sleep(60)", "owner", "A", "timeout", 120))
	kid := waitAttached(t, h, "A")
	// The interrupted cell's result may come before the interrupt's answer.
	h.send(line{"id": "int", "op": "interrupt", "kernel": kid})
	both := h.await("int", "long")
	if got := both["int"]; got["op"] != "ok" {
		t.Fatalf("interrupt: %v", got)
	}
	long := both["long"]
	if long["status"] != "interrupted" || kernelOf(t, long)["id"] != kid {
		t.Errorf("interrupted cell: %v", long)
	}
	after := h.call(execReq("after", "print(kept)", "owner", "A"))
	if after["stdout"] != "1\n" || kernelOf(t, after)["reused"] != true {
		t.Errorf("state not kept after an interrupt: %v", after)
	}

	b := h.call(execReq("b", "pass", "owner", "B"))
	bk := kernelOf(t, b)["id"].(string)
	if got := h.call(line{"id": "kill", "op": "kill", "kernel": bk}); got["op"] != "ok" {
		t.Fatalf("kill: %v", got)
	}
	waitDead(t, pidOf(t, b))
	for _, k := range h.call(line{"id": "k", "op": "kernels"})["kernels"].([]any) {
		if k.(line)["id"] == bk {
			t.Errorf("killed kernel %s still listed", bk)
		}
	}

	h.call(execReq("a2", "pass", "owner", "A", "task", "other"))
	got := h.call(line{"id": "so", "op": "shutdown_owner", "owner": "A"})
	wantKeys(t, "shutdown_owner response", got, "id", "op", "killed")
	if got["op"] != "ok" || got["killed"] != 2.0 {
		t.Errorf("shutdown_owner A: %v, want killed 2", got)
	}
	waitDead(t, pidOf(t, after))
	if got := h.call(line{"id": "so2", "op": "shutdown_owner", "owner": "nobody"}); got["killed"] != 0.0 {
		t.Errorf("shutdown_owner nobody: %v", got)
	}

	c := h.call(execReq("c", "pass", "owner", "C"))
	if got := h.call(line{"id": "sa", "op": "shutdown_all"}); got["op"] != "ok" {
		t.Errorf("shutdown_all: %v", got)
	}
	waitDead(t, pidOf(t, c))
	if l := h.call(line{"id": "k2", "op": "kernels"}); l["count"] != 0.0 {
		t.Errorf("after shutdown_all: %v", l)
	}
}

func TestEventsInterleaved(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{Events: true})
	h.send(execReq("e", "import time\ntime.sleep(0.3)", "owner", "ev"))
	res := h.next()
	if res["id"] != "e" {
		t.Fatalf("result: %v", res)
	}
	// The cell took 0.3s, so its start was written before its result.
	var before []string
	for _, ev := range h.events {
		before = append(before, ev["type"].(string))
	}
	if !slices.Contains(before, "spawned") || !slices.Contains(before, "cell_started") {
		t.Errorf("events before the result: %v, want spawned and cell_started", before)
	}
	if err, _ := h.finish(); err != nil {
		t.Fatal(err)
	}
	kid := kernelOf(t, res)["id"]
	var types []string
	for _, ev := range h.events {
		keys := []string{"op", "type", "time", "kernel", "owner", "detail", "seq"}
		if strings.HasPrefix(ev["type"].(string), "cell_") {
			keys = append(keys, "cell")
		}
		wantKeys(t, "event line", ev, keys...)
		if _, err := time.Parse(time.RFC3339Nano, ev["time"].(string)); err != nil {
			t.Errorf("event time: %v", err)
		}
		if ev["kernel"] == kid {
			types = append(types, ev["type"].(string))
			if ev["owner"] != "ev" {
				t.Errorf("event owner: %v", ev)
			}
		}
	}
	i := slices.Index(types, "spawned")
	if i < 0 || len(types) < i+3 || types[i+1] != "cell_started" || types[i+2] != "cell_finished" {
		t.Errorf("events for kernel %v: %v, want spawned, cell_started, cell_finished", kid, types)
	}
}

func TestEventsMissedWhenReaderLags(t *testing.T) {
	eng := newEngine(t, engine.Config{})
	watch := eng.Subscribe(1000)
	h := startGated(t, eng, Options{Events: true, EventBuffer: 1}, true)
	h.send(execReq("e", "pass"))
	// Nobody reads the output yet: wait until the engine has published the
	// cells' events, most of which cannot fit (the pump may take a burst
	// at once before its write blocks, so two cells).
	finished := 0
	for ev := range watch.C {
		if ev.Type == engine.EventCellFinished {
			if finished++; finished == 1 {
				h.send(execReq("e2", "pass"))
			} else {
				break
			}
		}
	}
	watch.Close()
	close(h.gate)
	h.next()
	h.next()
	// The missed count is delivered with the next event.
	h.call(line{"id": "l", "op": "limits", "max_kernels": 3})
	if err, _ := h.finish(); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range h.events {
		if ev["type"] == "missed" {
			found = true
			if n, _ := ev["count"].(float64); n < 1 || !strings.Contains(ev["detail"].(string), "dropped") {
				t.Errorf("missed event: %v", ev)
			}
		}
	}
	if !found {
		t.Errorf("no missed event among %v", h.events)
	}
}

// pumpEvents writes events as a connection's pump does (all: as with
// --events).
func pumpEvents(ch <-chan engine.Event, w *lineWriter, all bool) {
	p := &pump{w: w, all: all}
	for ev := range ch {
		if p.wants(ev) {
			w.write(wire.EventOf(ev))
		}
	}
}

func TestPumpEventsFormat(t *testing.T) {
	ch := make(chan engine.Event, 2)
	at := time.Date(2025, 1, 2, 3, 4, 5, 600, time.UTC)
	ch <- engine.Event{Type: engine.EventSpawned, Time: at, Kernel: "k1", Owner: "o", Key: "o/t@local[]", Detail: "pid 9"}
	ch <- engine.Event{Type: engine.EventMissed, Time: at, Missed: 5}
	close(ch)
	var buf strings.Builder
	pumpEvents(ch, &lineWriter{w: &buf, fail: func(error) {}}, true)
	want := `{"op":"event","type":"spawned","time":"2025-01-02T03:04:05.0000006Z","kernel":"k1","owner":"o","detail":"pid 9"}
{"op":"event","type":"missed","time":"2025-01-02T03:04:05.0000006Z","kernel":"","owner":"","detail":"5 events were dropped because this reader fell behind","count":5}
`
	if buf.String() != want {
		t.Errorf("event lines:\n%s\nwant:\n%s", buf.String(), want)
	}
}

// TestPumpApprovalEvents checks the approval event lines, which are written
// with or without --events, and that other events need --events.
func TestPumpApprovalEvents(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	events := []engine.Event{
		{Type: engine.EventCellStarted, Time: at, Kernel: "k1", Owner: "o", Detail: "cell c1"},
		{Type: engine.EventApprovalRequest, Time: at, Kernel: "k1", Owner: "o", Key: "o/t@local[terminal]",
			Request: "a0123456789ab", Tool: "terminal", Args: json.RawMessage(`{"command":"ls -l"}`), Detail: "o wants to call terminal"},
		{Type: engine.EventApprovalDecided, Time: at, Kernel: "k1", Owner: "o", Request: "a0123456789ab", Tool: "terminal",
			Detail: "once: approved once by the operator"},
		{Type: engine.EventMissed, Time: at, Missed: 2},
	}
	approvalLines := `{"op":"event","type":"approval_request","time":"2025-01-02T03:04:05Z","kernel":"k1","owner":"o","detail":"o wants to call terminal","request":"a0123456789ab","tool":"terminal","args":{"command":"ls -l"}}
{"op":"event","type":"approval_decided","time":"2025-01-02T03:04:05Z","kernel":"k1","owner":"o","detail":"once: approved once by the operator","request":"a0123456789ab","tool":"terminal"}
`
	for _, tc := range []struct {
		all  bool
		want string
	}{
		{false, approvalLines},
		{true, `{"op":"event","type":"cell_started","time":"2025-01-02T03:04:05Z","kernel":"k1","owner":"o","detail":"cell c1"}
` + approvalLines + `{"op":"event","type":"missed","time":"2025-01-02T03:04:05Z","kernel":"","owner":"","detail":"2 events were dropped because this reader fell behind","count":2}
`},
	} {
		ch := make(chan engine.Event, len(events))
		for _, ev := range events {
			ch <- ev
		}
		close(ch)
		var buf strings.Builder
		pumpEvents(ch, &lineWriter{w: &buf, fail: func(error) {}}, tc.all)
		if buf.String() != tc.want {
			t.Errorf("all=%v: event lines:\n%s\nwant:\n%s", tc.all, buf.String(), tc.want)
		}
		// The documented shape: request, tool and args are top-level fields.
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var m line
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("event line %q: %v", l, err)
			}
			if m["type"] == "approval_request" {
				wantKeys(t, "approval_request line", m, "op", "type", "time", "kernel", "owner", "detail", "request", "tool", "args")
				if args, _ := m["args"].(line); args["command"] != "ls -l" {
					t.Errorf("approval_request args: %v", m["args"])
				}
			}
		}
	}
}

// TestApproveAnsweredWhileCellRuns sends approve requests while a cell runs
// and another waits on the same kernel: they are answered at once, not
// queued behind the cells (an approve answers the tool call a running cell
// waits on). Without --events no other event lines appear.
func TestApproveAnsweredWhileCellRuns(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})
	h.send(execReq("busy", "import time\ntime.sleep(3)\nprint('busy')", "owner", "ap"))
	waitAttached(t, h, "ap")
	h.send(execReq("next", "print('next')", "owner", "ap"))
	begin := time.Now()
	h.send(line{"id": "ap1", "op": "approve", "request": "agone", "decision": "once"})
	h.send(line{"id": "ap2", "op": "approve", "request": "agone", "decision": "bogus"})
	got := h.await("ap1", "ap2")
	if waited := time.Since(begin); waited > 2*time.Second {
		t.Errorf("approve answered after %v, behind the running cell", waited)
	}
	if got["ap1"]["op"] != "error" || !strings.Contains(got["ap1"]["error"].(string), `no pending approval request "agone"`) {
		t.Errorf("approve of an unknown request: %v", got["ap1"])
	}
	if got["ap2"]["op"] != "error" || !strings.Contains(got["ap2"]["error"].(string), `"decision" must be`) {
		t.Errorf("approve with a bad decision: %v", got["ap2"])
	}
	res := h.await("busy", "next")
	if res["busy"]["stdout"] != "busy\n" || res["next"]["stdout"] != "next\n" {
		t.Errorf("cells: %v", res)
	}
	if err, rest := h.finish(); err != nil || len(rest) != 0 {
		t.Errorf("finish: %v, %v", err, rest)
	}
	if len(h.events) != 0 {
		t.Errorf("event lines without --events: %v", h.events)
	}
}

func TestEOFFinishesInFlight(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})
	h.send(execReq("slow", "import time\ntime.sleep(1)\nprint('done')"))
	h.send(line{"id": "q", "op": "kernels"})
	begin := time.Now()
	err, rest := h.finish()
	if err != nil {
		t.Fatalf("Serve at EOF: %v", err)
	}
	if time.Since(begin) < 500*time.Millisecond {
		t.Errorf("Serve returned after %v, before the running cell finished", time.Since(begin))
	}
	ids := map[any]line{}
	for _, l := range rest {
		ids[l["id"]] = l
	}
	if ids["slow"]["stdout"] != "done\n" || ids["q"]["op"] != "kernels" {
		t.Errorf("responses after EOF: %v", rest)
	}
}

func TestContextCancelStopsServe(t *testing.T) {
	eng := newEngine(t, engine.Config{})
	inR, inW := io.Pipe()
	defer inW.Close()
	var out syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, eng, inR, &out, Options{}) }()
	io.WriteString(inW, `{"id":"s","op":"execute","code":"import time\ntime.sleep(60)"}`+"\n")
	time.Sleep(500 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Serve after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context was cancelled")
	}
	if got := out.String(); !strings.Contains(got, `"id":"s","op":"error"`) {
		t.Errorf("the cancelled request got no answer: %q", got)
	}
}

func TestOutputAndInputFailures(t *testing.T) {
	eng := newEngine(t, engine.Config{})

	boom := errors.New("boom")
	inR, inW := io.Pipe()
	defer inW.Close()
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), eng, inR, failWriter{boom}, Options{}) }()
	io.WriteString(inW, `{"id":"1","op":"kernels"}`+"\n")
	select {
	case err := <-done:
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "write response") {
			t.Errorf("Serve with a failing output = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve kept running with a failing output")
	}

	var out syncBuffer
	in := io.MultiReader(strings.NewReader(`{"id":"1","op":"kernels"}`+"\n"), iotest.ErrReader(boom))
	err := Serve(context.Background(), eng, in, &out, Options{})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "read requests") {
		t.Errorf("Serve with a failing input = %v", err)
	}
	if !strings.Contains(out.String(), `"id":"1","op":"kernels"`) {
		t.Errorf("request before the read error not answered: %q", out.String())
	}
}

type failWriter struct{ err error }

func (f failWriter) Write([]byte) (int, error) { return 0, f.err }

// TestApprovalRoundTrip: a cell's tool call under the ask policy appears as
// an approval_request event line (without --events), an approve request
// answers it, and the cell gets the tool's result; a deny reaches the cell
// as a ToolError. End to end over a real runner and the real RPC channel.
func TestApprovalRoundTrip(t *testing.T) {
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "f.txt"), []byte("approved content"), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := hosttools.NewWorkspace(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	reg := hosttools.NewRegistry()
	if err := (&hosttools.Builtins{Workspace: w}).Register(reg); err != nil {
		t.Fatal(err)
	}
	eng := newEngine(t, engine.Config{Tools: reg, Approvals: engine.Approvals{Default: engine.PolicyAsk}, ApprovalTimeout: time.Minute})
	h := start(t, eng, Options{})
	code := "import kerneldeck_tools as kt\ntry:\n    print(kt.read_file('f.txt'))\nexcept kt.ToolError as e:\n    print('refused:', e)"
	for _, step := range []struct{ decision, want string }{
		{"once", "approved content\n"},
		{"deny", "refused: read_file: denied: the operator denied this read_file call\n"},
	} {
		h.send(execReq("x-"+step.decision, code, "owner", "alice", "tools", []string{"read_file"}))
		var ev line
		for ev == nil {
			select {
			case l := <-h.lines:
				if l["op"] == "event" && l["type"] == "approval_request" {
					ev = l
				} else if l["op"] != "event" {
					t.Fatalf("a response before the approval request: %v", l)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no approval_request event within 30s")
			}
		}
		args, _ := ev["args"].(map[string]any)
		if ev["owner"] != "alice" || ev["tool"] != "read_file" || args["path"] != "f.txt" || ev["request"] == "" {
			t.Fatalf("approval_request line: %v", ev)
		}
		if ok := h.call(line{"id": "ap-" + step.decision, "op": "approve", "request": ev["request"], "decision": step.decision}); ok["op"] != "ok" {
			t.Fatalf("approve: %v", ok)
		}
		res := h.await("x-" + step.decision)["x-"+step.decision]
		if res["stdout"] != step.want {
			t.Fatalf("%s: stdout %q, want %q (%v)", step.decision, res["stdout"], step.want, res)
		}
		wantCalls := 0.0
		if step.decision == "once" {
			wantCalls = 1
		}
		if res["tool_calls_made"] != wantCalls {
			t.Fatalf("%s: tool_calls_made %v, want %v", step.decision, res["tool_calls_made"], wantCalls)
		}
	}
	if err, _ := h.finish(); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a buffer Serve's goroutines share with the test.
type syncBuffer = syncbuf.Buffer

// TestComplete: complete answers what the kernel's namespace offers at the
// cursor, runs no cell, and says what is wrong with a bad request.
func TestComplete(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})
	set := h.call(execReq("set", "alpha_value = 1", "owner", "A"))
	kid := kernelOf(t, set)["id"].(string)
	got := h.call(line{"id": "c", "op": "complete", "kernel": kid, "code": "print(alpha_v", "cursor": 13})
	wantKeys(t, "complete response", got, "id", "op", "start", "matches")
	matches, _ := got["matches"].([]any)
	if got["op"] != "completions" || got["start"] != 6.0 || !slices.Contains(matches, any("alpha_value")) {
		t.Errorf("complete: %v, want alpha_value from 6", got)
	}
	for _, tc := range []struct {
		req  line
		want string
	}{
		{line{"id": "e1", "op": "complete", "code": "x", "cursor": 1}, `complete needs "kernel"`},
		{line{"id": "e2", "op": "complete", "kernel": kid, "code": "x", "cursor": 5}, "cursor 5 is outside the code's 1 characters"},
		{line{"id": "e3", "op": "complete", "kernel": "k-none", "code": "x", "cursor": 1}, `no kernel with id "k-none"`},
		{line{"id": "e4", "op": "complete", "kernel": kid, "code": "x", "cursor": "1"}, `"cursor"`},
	} {
		if got := h.call(tc.req); got["op"] != "error" || !strings.Contains(fmt.Sprint(got["error"]), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.req, got, tc.want)
		}
	}
	if after := h.call(execReq("after", "1", "owner", "A")); kernelOf(t, after)["execution_count"] != 2.0 {
		t.Errorf("after completing, the execution count is %v, want 2", kernelOf(t, after)["execution_count"])
	}
}

// TestKernelsListTheirPython: the kernels listing says which interpreter
// each kernel runs on, a shim resolved.
func TestKernelsListTheirPython(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})
	exe := strings.TrimSpace(fmt.Sprint(h.call(execReq("x", "import sys; print(sys.executable)", "owner", "A"))["stdout"]))
	var listed []any
	for _, k := range h.call(line{"id": "k", "op": "kernels"})["kernels"].([]any) {
		listed = append(listed, k.(line)["python"])
	}
	if exe == "" || len(listed) != 1 || listed[0] != exe || strings.Contains(exe, "shims") {
		t.Fatalf("the kernel ran on %q, the listing says %v; want the same interpreter, no shim", exe, listed)
	}
}

// TestInput: an execute with "input" gets an input_request line when its
// cell calls input() or getpass(), and an input_reply naming the execute
// answers it; without "input", input() raises EOFError saying why.
func TestInput(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})
	req := execReq("ask", "name = input('name? ')\nimport getpass\nprint(name.upper(), len(getpass.getpass('pin: ')))", "owner", "A")
	req["input"] = true
	h.send(req)
	for i, want := range []line{{"id": "ask", "op": "input_request", "prompt": "name? ", "password": false},
		{"id": "ask", "op": "input_request", "prompt": "pin: ", "password": true}} {
		got := h.next()
		wantKeys(t, "input request", got, "id", "op", "cell", "prompt", "password")
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("input request %d: %v, want %v", i, got, want)
			}
		}
		value := "ada"
		if i == 1 {
			value = "1234"
		}
		if ok := h.call(line{"id": fmt.Sprint("reply", i), "op": "input_reply", "to": "ask", "value": value}); ok["op"] != "ok" {
			t.Fatalf("input_reply: %v", ok)
		}
	}
	if res := h.await("ask")["ask"]; res["stdout"] != "ADA 4\n" {
		t.Fatalf("the cell after its answers: %v, want ADA 4", res)
	}
	if got := h.call(line{"id": "stray", "op": "input_reply", "to": "ask", "value": "x"}); got["op"] != "error" ||
		!strings.Contains(fmt.Sprint(got["error"]), `no input() waits on execute "ask"`) {
		t.Errorf("a reply no input() waits for: %v, want an error", got)
	}
	req = execReq("eof", "try:\n    input()\nexcept EOFError:\n    print('eof')", "owner", "A")
	req["input"] = true
	h.send(req)
	if got := h.next(); got["op"] != "input_request" {
		t.Fatalf("want an input request, got %v", got)
	}
	h.send(line{"id": "end", "op": "input_reply", "to": "eof", "eof": true})
	if got := h.await("end", "eof"); got["eof"]["stdout"] != "eof\n" {
		t.Errorf("an input_reply with eof: %v, want EOFError in the cell", got)
	}
	if got := h.call(execReq("none", "input('x? ')", "owner", "A")); got["status"] != "error" ||
		!strings.Contains(fmt.Sprint(got["traceback"]), "EOFError: input() has no one to answer it here") {
		t.Errorf("input() in an execute without \"input\": %v, want an EOFError that says why", got)
	}
}
