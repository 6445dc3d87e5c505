package headless

// The ops and rules of protocol 2: hello, execute with stream, subscribe,
// cells, owners held to their own kernels, and clients that go away.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/wire"
)

// until returns every line up to and including the answer to id (output
// lines of id are not answers).
func (h *harness) until(id string) (answer line, before []line) {
	h.t.Helper()
	for {
		l := h.next()
		if l["id"] == id && l["op"] != "output" {
			return l, before
		}
		before = append(before, l)
	}
}

func TestHello(t *testing.T) {
	eng := newEngine(t, engine.Config{MaxKernels: 3})
	h := start(t, eng, Options{Version: "v9.9"})
	got := h.call(line{"id": "h", "op": "hello"})
	wantKeys(t, "hello", got, "id", "op", "engine", "version", "protocol", "pid", "backends", "max_kernels", "idle_exit",
		"cell_timeout", "you", "ops", "python", "cwd")
	you, _ := got["you"].(line)
	if got["op"] != "hello" || got["engine"] != "kerneldeck" || got["version"] != "v9.9" || got["protocol"] != float64(wire.Protocol) ||
		got["max_kernels"] != float64(3) || got["pid"] != float64(os.Getpid()) || you["uid"] != float64(os.Geteuid()) || you["owner"] != "" {
		t.Fatalf("hello: %v", got)
	}
	if ops := fmt.Sprint(got["ops"]); !strings.Contains(ops, "subscribe") || !strings.Contains(ops, "cells") {
		t.Fatalf("hello ops %s", ops)
	}
	r := start(t, eng, Options{Peer: &Peer{UID: 4242, Login: "bob", Owner: "bob"}})
	you, _ = r.call(line{"id": "h", "op": "hello"})["you"].(line)
	if you["uid"] != float64(4242) || you["login"] != "bob" || you["owner"] != "bob" {
		t.Fatalf("hello to a restricted peer: you %v", you)
	}
}

// An execute with stream gets its output as it comes, then its result.
func TestExecuteStream(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})
	mark := filepath.Join(t.TempDir(), "go")
	h.send(execReq("s", fmt.Sprintf("import os, time\nprint('first', flush=True)\nwhile not os.path.exists(%q):\n    time.sleep(0.02)\nprint('second')", mark), "stream", true))
	started := h.next()
	if started["op"] != "started" || started["id"] != "s" || !strings.HasPrefix(fmt.Sprint(started["cell"]), "c") {
		t.Fatalf("first line of a streamed execute: %v, want started with the cell id", started)
	}
	wantKeys(t, "started line", started, "id", "op", "cell")
	first := h.next()
	if first["op"] != "output" || first["id"] != "s" || first["stream"] != "stdout" || first["text"] != "first\n" {
		t.Fatalf("first line while the cell runs: %v, want its output", first)
	}
	wantKeys(t, "output line", first, "id", "op", "stream", "text")
	os.WriteFile(mark, nil, 0o600)
	res, before := h.until("s")
	text := "first\n"
	for _, l := range before {
		text += l["text"].(string)
	}
	if res["op"] != "result" || res["stdout"] != "first\nsecond\n" || text != res["stdout"] || res["cell"] != started["cell"] {
		t.Fatalf("result %v after output %q", res, text)
	}
	// Without stream, no output lines.
	res, before = h.until(h.sendID(execReq("n", "print('quiet')")))
	if len(before) != 0 || res["stdout"] != "quiet\n" {
		t.Fatalf("a cell without stream: %v after %v", res, before)
	}
}

func (h *harness) sendID(req line) string {
	h.send(req)
	return req["id"].(string)
}

// A subscriber gets the recent history (marked), then everything live,
// with the output of another client's cells when it asks.
func TestSubscribeReplaysThenStreams(t *testing.T) {
	eng := newEngine(t, engine.Config{})
	agent := start(t, eng, Options{})
	first := agent.call(execReq("1", "x = 1", "owner", "agent"))
	watcher := start(t, eng, Options{})
	ok, _ := watcher.until(watcher.sendID(line{"id": "sub", "op": "subscribe", "since": 3600, "output": true}))
	wantKeys(t, "subscribe answer", ok, "id", "op", "replayed", "output")
	n := int(ok["replayed"].(float64))
	if ok["op"] != "ok" || n < 3 || ok["output"] != true {
		t.Fatalf("subscribe: %v, want ok with the earlier events replayed", ok)
	}
	// The replay comes right after the answer, marked history.
	for range n {
		ev := watcher.nextEvent()
		if ev["history"] != true {
			t.Fatalf("replayed event %v is not marked history", ev)
		}
	}
	mark := filepath.Join(t.TempDir(), "go")
	agent.send(execReq("2", fmt.Sprintf("import os, time\nprint('live', flush=True)\nwhile not os.path.exists(%q):\n    time.sleep(0.02)", mark), "owner", "agent"))
	var cell string
	for {
		ev := watcher.nextEvent()
		if ev["history"] == true {
			t.Fatalf("live event %v is marked history", ev)
		}
		if ev["type"] == "cell_output" {
			if ev["text"] != "live\n" || ev["kernel"] != kernelOf(t, first)["id"] || ev["owner"] != "agent" || ev["cell"] == "" {
				t.Fatalf("cell_output event %v", ev)
			}
			cell = ev["cell"].(string)
			break
		}
	}
	os.WriteFile(mark, nil, 0o600)
	for {
		ev := watcher.nextEvent()
		if ev["type"] == "cell_finished" {
			if ev["cell"] != cell {
				t.Fatalf("cell_finished %v, want cell %s", ev, cell)
			}
			break
		}
	}
	agent.until("2")
}

// nextEvent waits for the next event line.
func (h *harness) nextEvent() line {
	h.t.Helper()
	timeout := time.After(60 * time.Second)
	for len(h.events) == 0 {
		select {
		case l, ok := <-h.lines:
			if !ok {
				h.t.Fatal("output ended while waiting for an event")
			}
			if l["op"] == "event" {
				h.events = append(h.events, l)
			} else {
				h.t.Fatalf("an answer %v while waiting for an event", l)
			}
		case <-timeout:
			h.t.Fatal("no event within 60s")
		}
	}
	ev := h.events[0]
	h.events = h.events[1:]
	return ev
}

// cells shows another client's cells: code, status, output.
func TestCellsOfAnotherClient(t *testing.T) {
	eng := newEngine(t, engine.Config{})
	agent := start(t, eng, Options{})
	res := agent.call(execReq("1", "print('hello from the agent')", "owner", "alice"))
	agent.call(execReq("2", "1/0", "owner", "alice"))
	kid := kernelOf(t, res)["id"].(string)
	viewer := start(t, eng, Options{})
	got := viewer.call(line{"id": "c", "op": "cells", "kernel": kid})
	wantKeys(t, "cells answer", got, "id", "op", "kernel", "cells")
	cells, _ := got["cells"].([]any)
	if got["op"] != "cells" || got["kernel"] != kid || len(cells) != 2 {
		t.Fatalf("cells: %v", got)
	}
	c0, c1 := cells[0].(line), cells[1].(line)
	out, _ := c0["stdout"].(line)
	if c0["code"] != "print('hello from the agent')" || c0["status"] != "success" || out["head"] != "hello from the agent\n" ||
		c0["running"] != false || c0["owner"] != "alice" || c0["duration_ms"].(float64) <= 0 {
		t.Fatalf("first cell record %v", c0)
	}
	if c1["status"] != "error" || !strings.Contains(c1["traceback"].(string), "ZeroDivisionError") {
		t.Fatalf("second cell record %v", c1)
	}
	if got := viewer.call(line{"id": "c2", "op": "cells", "kernel": "knope"}); got["op"] != "cells" || len(got["cells"].([]any)) != 0 {
		t.Fatalf("cells of an unknown kernel: %v, want an empty list", got)
	}
}

// ownHost is the local backend posing as one that gives each kernel a host
// of its own, for the access rules alone: the OS isolation itself is
// docker-image's, tested with a real member in server's TestSecondUser.
type ownHost struct{ *backends.Local }

func (o ownHost) URI() string { return "own-host" }

func (o ownHost) Provision(context.Context, string) (backends.Env, error) { return o, nil }

// A restricted peer acts only as its own owner, sees only its own kernels
// and events, runs kernels only where each has a host of its own, and each
// refusal is an error answer and an event.
func TestRestrictedPeer(t *testing.T) {
	eng := newEngine(t, engine.Config{Backends: []backends.Env{backends.NewLocal(t.TempDir()), ownHost{backends.NewLocal(t.TempDir())}}})
	watch := eng.Subscribe(1 << 12)
	defer watch.Close()
	op := start(t, eng, Options{})
	alice := op.call(execReq("a", "secret = 42", "owner", "alice"))
	aliceK := kernelOf(t, alice)["id"].(string)
	bob := start(t, eng, Options{Peer: &Peer{UID: 4242, Login: "bob", Owner: "bob"}})
	mine := bob.call(execReq("b", "print('bob here')", "backend", "own-host"))
	if mine["op"] != "result" || mine["stdout"] != "bob here\n" {
		t.Fatalf("bob's own cell: %v", mine)
	}
	// On the local backend his kernel would run as the engine's user (or,
	// on a root engine, as his own OS user, and there is none).
	local := bob.call(execReq("b-local", "print('bob here')"))
	if local["op"] != "error" || !strings.Contains(local["error"].(string), "run a kernel on local: members of the group get no kernels there") ||
		!strings.Contains(local["error"].(string), "own-host") {
		t.Fatalf("bob's cell on the local backend: %v, want a refusal naming where he may run kernels", local)
	}
	if ks := bob.call(line{"id": "k", "op": "kernels"}); ks["count"] != float64(1) || ks["kernels"].([]any)[0].(line)["owner"] != "bob" {
		t.Fatalf("bob's kernels listing: %v, want his kernel only", ks)
	}
	refusals := []line{
		execReq("r1", "print(secret)", "owner", "alice", "backend", "own-host"),
		{"id": "r2", "op": "kill", "kernel": aliceK},
		{"id": "r3", "op": "interrupt", "kernel": aliceK},
		{"id": "r4", "op": "cells", "kernel": aliceK},
		{"id": "r5", "op": "shutdown_owner", "owner": "alice"},
		{"id": "r6", "op": "shutdown_all"},
		{"id": "r7", "op": "limits", "max_kernels": 1},
		{"id": "r8", "op": "approve", "request": "a1", "decision": "once"},
	}
	for _, req := range refusals {
		got := bob.call(req)
		if got["op"] != "error" || !strings.Contains(got["error"].(string), "not allowed") || !strings.Contains(got["error"].(string), `owner "bob"`) {
			t.Errorf("bob's %v: %v, want a refusal", req, got)
		}
	}
	// Each refusal is a notice, or counted in one past the first few.
	notices := 0
	deadline := time.After(10 * time.Second)
	for notices < len(refusals)+1 {
		select {
		case ev := <-watch.C:
			if ev.Type == engine.EventNotice && strings.Contains(ev.Detail, "refused user bob (uid 4242)") {
				notices += refusalsIn(ev)
			}
		case <-deadline:
			t.Fatalf("%d refusals told, want %d", notices, len(refusals)+1)
		}
	}
	// Alice's kernel is untouched and her state kept.
	if again := op.call(execReq("a2", "print(secret)", "owner", "alice")); again["stdout"] != "42\n" || !kernelOf(t, again)["reused"].(bool) {
		t.Fatalf("alice after bob's attempts: %v", again)
	}
	// Bob's subscription shows only his owner's events.
	bob.until(bob.sendID(line{"id": "s", "op": "subscribe", "since": 3600, "output": true}))
	op.call(execReq("a3", "print('alice again')", "owner", "alice"))
	bob.call(execReq("b2", "print('bob again')", "backend", "own-host"))
	bob.finish()
	for _, ev := range bob.events {
		if ev["owner"] != "bob" && ev["type"] != "missed" {
			t.Errorf("bob saw an event of another owner: %v", ev)
		}
	}
}

// A client that goes away mid-cell kills nothing: the cell finishes once
// and its result stays in the cell records.
func TestClientGoneMidCell(t *testing.T) {
	eng := newEngine(t, engine.Config{})
	mark := filepath.Join(t.TempDir(), "go")
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), eng, inR, outW, Options{}) }()
	io.WriteString(inW, `{"id":"x","op":"execute","owner":"agent","code":`+fmt.Sprintf("%q", fmt.Sprintf("import os, time\nwhile not os.path.exists(%q):\n    time.sleep(0.02)\nprint('done')", mark))+"}\n")
	var k engine.KernelInfo
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if ks := eng.Kernels(); len(ks) == 1 && ks[0].RunningCell != "" {
			k = ks[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cell never started")
		}
	}
	// The client is gone: its input ends and its output is closed.
	outR.Close()
	inW.Close()
	os.WriteFile(mark, nil, 0o600)
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, io.ErrClosedPipe) {
			t.Fatalf("Serve after the client left: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Serve did not return after the client left and its cell ended")
	}
	recs := eng.Cells(k.ID)
	if len(recs) != 1 || recs[0].Running || recs[0].Status != engine.StatusSuccess || recs[0].Stdout.Head != "done\n" {
		t.Fatalf("the cell records after the client left: %+v, want the one cell, finished", recs)
	}
	if ks := eng.Kernels(); len(ks) != 1 || ks[0].ID != k.ID || !alive(k.PID) || ks[0].ExecutionCount != 1 {
		t.Fatalf("kernels after the client left: %+v, want %s alive with one cell run", ks, k.ID)
	}
}

// A kernels request that names the last listing's version is told when
// nothing changed, without the listing.
func TestKernelsUnlessVersion(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})
	h.call(execReq("1", "x = 1", "owner", "a"))
	first := h.call(line{"id": "k1", "op": "kernels"})
	v, _ := first["version"].(string)
	if v == "" || first["unchanged"] != nil || len(first["kernels"].([]any)) != 1 {
		t.Fatalf("first listing %v", first)
	}
	same := h.call(line{"id": "k2", "op": "kernels", "unless_version": v})
	if same["unchanged"] != true || same["version"] != v || len(same["kernels"].([]any)) != 0 || same["count"] != float64(1) {
		t.Fatalf("listing with nothing changed: %v", same)
	}
	h.call(execReq("2", "x += 1", "owner", "a")) // last_used and the count change
	changed := h.call(line{"id": "k3", "op": "kernels", "unless_version": v})
	if changed["unchanged"] != nil || changed["version"] == v || len(changed["kernels"].([]any)) != 1 {
		t.Fatalf("listing after a cell: %v", changed)
	}
}

// A display made while a streamed cell runs comes as it is made: an output
// line of stream "display" with its label as text and the display itself.
func TestExecuteStreamDisplay(t *testing.T) {
	h := start(t, newEngine(t, engine.Config{}), Options{})
	mark := filepath.Join(t.TempDir(), "go")
	h.send(execReq("s", fmt.Sprintf("import os, time\nclass H:\n    def _repr_html_(self):\n        return '<b>h</b>'\n    def __repr__(self):\n        return 'H()'\n"+
		"display(H())\nwhile not os.path.exists(%q):\n    time.sleep(0.02)", mark), "stream", true))
	h.next() // started
	d := h.next()
	wantKeys(t, "display line", d, "id", "op", "stream", "text", "display")
	disp, _ := d["display"].(line)
	data, _ := disp["data"].(line)
	if d["op"] != "output" || d["stream"] != "display" || d["text"] != "H()\n" || data["text/html"] != "<b>h</b>" {
		t.Fatalf("while the cell runs: %v, want the display", d)
	}
	os.WriteFile(mark, nil, 0o600)
	res, _ := h.until("s")
	if ds, _ := res["displays"].([]any); res["op"] != "result" || len(ds) != 1 {
		t.Fatalf("result %v, want it to list the display again", res)
	}
}

// A restricted peer refused 20,000 times in a burst leaves a few notices
// and one count, not 20,000 events: the operator's history of the other
// owners stays.
func TestRefusalFloodKeepsTheHistory(t *testing.T) {
	eng := newEngine(t, engine.Config{})
	op := start(t, eng, Options{})
	if r := op.call(execReq("a", "1", "owner", "alice")); r["status"] != "success" {
		t.Fatalf("alice: %v", r)
	}
	watch := eng.Subscribe(1 << 16)
	defer watch.Close()
	bob := start(t, eng, Options{Peer: &Peer{UID: 4242, Login: "bob", Owner: "bob"}})
	const n = 20000
	var flood strings.Builder
	for i := range n {
		fmt.Fprintf(&flood, `{"id":"r%d","op":"limits","max_kernels":1}`+"\n", i)
	}
	bob.sendRaw(flood.String())
	for got := 0; got < n; {
		if l := bob.next(); l["op"] == "error" {
			got++
		}
	}
	bob.finish() // its connection ends: what is still counted is said
	said, counted, notices := 0, 0, 0
	deadline := time.After(10 * time.Second)
	for said+counted < n {
		select {
		case ev := <-watch.C:
			if ev.Type != engine.EventNotice || ev.Owner != "bob" {
				continue
			}
			notices++
			if n := refusalsIn(ev); n > 1 || strings.Contains(ev.Detail, " more request") {
				counted += n
			} else {
				said++
			}
		case <-deadline:
			t.Fatalf("after the flood: %d notices said and %d refusals counted, want %d in all", said, counted, n)
		}
	}
	// A few notices and a count for each second the flood lasted: however
	// slow the host reads it, far fewer than one per refusal.
	if notices > n/100 {
		t.Errorf("%d notices (%d said one by one) for one peer's %d refusals, want at most %d", notices, said, n, n/100)
	}
	// Alice's cell is still in the engine's history.
	sub := eng.SubscribeWith(engine.SubscribeOptions{Buffer: 16, Since: time.Now().Add(-time.Hour)})
	defer sub.Close()
	found := false
	for _, ev := range sub.History {
		found = found || ev.Owner == "alice" && ev.Type == engine.EventCellFinished
	}
	if !found {
		t.Error("alice's cell_finished is gone from the history after bob's flood")
	}
}

// refusalsIn is how many refusals a notice tells: one, or the count of
// one that sums them up ("refused user bob (uid 4242): 19995 more requests
// in 1.00s").
func refusalsIn(ev engine.Event) int {
	var n int
	if i := strings.Index(ev.Detail, "): "); i >= 0 {
		if _, err := fmt.Sscanf(ev.Detail[i+3:], "%d more request", &n); err == nil {
			return n
		}
	}
	return 1
}

// A restricted peer sees no other owner's parked state, and may neither
// drop one nor park another owner's kernel.
func TestRestrictedPeerAndParkedStates(t *testing.T) {
	eng := newEngine(t, engine.Config{ParkDir: filepath.Join(t.TempDir(), "parked")})
	op := start(t, eng, Options{})
	alice := kernelOf(t, op.call(execReq("a", "secret = 42", "owner", "alice")))["id"].(string)
	if p := op.call(line{"id": "p", "op": "park", "kernel": alice}); p["op"] != "ok" {
		t.Fatalf("parking alice's kernel: %v", p)
	}
	carol := kernelOf(t, op.call(execReq("c", "x = 1", "owner", "carol")))["id"].(string)
	bob := start(t, eng, Options{Peer: &Peer{UID: 4242, Login: "bob", Owner: "bob"}})
	if ks := bob.call(line{"id": "k", "op": "kernels"}); len(ks["parked"].([]any)) != 0 {
		t.Fatalf("bob's listing shows parked states of others: %v", ks["parked"])
	}
	for _, req := range []line{
		{"id": "d", "op": "drop_parked", "owner": "alice"},
		{"id": "pk", "op": "park", "kernel": carol},
	} {
		if got := bob.call(req); got["op"] != "error" || !strings.Contains(got["error"].(string), "not allowed") {
			t.Errorf("bob's %v: %v, want a refusal", req, got)
		}
	}
	ks := op.call(line{"id": "k2", "op": "kernels"})
	if ps := ks["parked"].([]any); len(ps) != 1 || ps[0].(line)["owner"] != "alice" || ks["count"] != float64(1) {
		t.Fatalf("after bob's tries: parked %v, %v kernels; want alice's state and carol's kernel untouched", ks["parked"], ks["count"])
	}
}
