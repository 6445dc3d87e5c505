package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kerneldeck/kerneldeck/internal/tmuxtest"
)

// parkedOwners lists the owners of a kernels answer's parked states.
func parkedOwners(l map[string]any) []string {
	var out []string
	ps, _ := l["parked"].([]any)
	for _, p := range ps {
		if m, ok := p.(map[string]any); ok {
			out = append(out, fmt.Sprint(m["owner"]))
		}
	}
	return out
}

// Parking through the real binary: serve with a cap of one, an agent whose
// kernel the cap evicts gets its state back on its next call; park and
// drop_parked over the protocol; the parked state in the kernels listing
// and in MCP's python_sessions, and back through python_exec.
func TestParkingThroughTheBinary(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	se := startServe(t, bin, dirs, "--max-kernels", "1", "--spare-kernels", "0", "--python", "/usr/bin/python3")
	env := dirs.env()
	a := startAgent(t, bin, env, "--connect", se.sock)
	n := 0
	call := func(req map[string]any) map[string]any {
		t.Helper()
		n++
		id := fmt.Sprint("r", n)
		req["id"] = id
		a.send(req)
		return a.answer(id)
	}
	listing := func(owners ...string) map[string]any {
		t.Helper()
		var l map[string]any
		waitUntil(t, fmt.Sprintf("parked states of %v", owners), func() bool {
			l = call(map[string]any{"op": "kernels"})
			return fmt.Sprint(parkedOwners(l)) == fmt.Sprint(owners)
		})
		return l
	}

	call(map[string]any{"op": "execute", "owner": "alice", "code": "x = 41\nsq = lambda v: v * v\nf = open(__import__('os').devnull)"})
	call(map[string]any{"op": "execute", "owner": "bob", "code": "y = 1"})
	l := listing("alice")
	p := l["parked"].([]any)[0].(map[string]any)
	if p["reason"] != "evicted by the cap" || p["task"] != "default" || p["bytes"].(float64) <= 0 {
		t.Fatalf("parked state: %v", p)
	}

	res := call(map[string]any{"op": "execute", "owner": "alice", "code": "print(x + 1, sq(3))"})
	k, _ := res["kernel"].(map[string]any)
	if res["stdout"] != "42 9\n" || k["state_restored"] != true || k["state_lost"] != false ||
		!strings.Contains(fmt.Sprint(k["note"]), "not restored: f (open file)") {
		t.Fatalf("alice after the eviction: %v", res)
	}
	listing("bob") // its kernel went for alice's

	// park by hand, then drop bob's.
	parked := call(map[string]any{"op": "park", "kernel": k["id"]})
	if parked["op"] != "ok" || parked["parked"].(map[string]any)["owner"] != "alice" {
		t.Fatalf("park: %v", parked)
	}
	listing("bob", "alice")
	if d := call(map[string]any{"op": "drop_parked", "owner": "bob"}); d["dropped"] != true {
		t.Fatalf("drop_parked: %v", d)
	}
	if d := call(map[string]any{"op": "drop_parked", "owner": "bob"}); d["dropped"] != false {
		t.Fatalf("drop_parked again: %v", d)
	}
	if bad := call(map[string]any{"op": "park", "kernel": "k000000000000"}); bad["op"] != "error" {
		t.Fatalf("park of no kernel: %v", bad)
	}
	listing("alice")
	// The files: 0600 in a 0700 dir of the state dir.
	dir := filepath.Join(dirs.state, "parked")
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("park dir %s: %v %v", dir, st.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if info, _ := e.Info(); info.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v", e.Name(), info.Mode())
		}
	}

	// An MCP client of alice's sees the parked session and gets it back.
	mc := startMCP(t, bin, env, "alice", "", nil, "--connect", se.sock)
	_, m := mc.must("python_sessions", nil)
	ps, _ := m["parked"].([]any)
	if len(ps) != 1 || ps[0].(map[string]any)["session"] != "default" {
		t.Fatalf("python_sessions: %v", m)
	}
	r, m := mc.must("python_exec", map[string]any{"code": "print(x)"})
	if m["stdout"] != "41\n" || kernelField(m, "state_restored") != true || !strings.Contains(resultText(r), "state restored") {
		t.Fatalf("python_exec after the park: %v %s", m, resultText(r))
	}
	// python_close of a parked session drops its state.
	parked = call(map[string]any{"op": "park", "kernel": kernelField(m, "id")})
	if parked["op"] != "ok" {
		t.Fatalf("park: %v", parked)
	}
	if _, m = mc.must("python_close", nil); m["done"] != true || !strings.Contains(fmt.Sprint(m["message"]), "parked state was dropped") {
		t.Fatalf("python_close of a parked session: %v", m)
	}
	if _, m = mc.must("python_exec", map[string]any{"code": `print("x" in globals())`}); m["stdout"] != "False\n" || kernelField(m, "state_restored") == true {
		t.Fatalf("python_exec after python_close: %v", m)
	}
}

// The dashboard, the real binary in tmux: an agent's kernel the cap
// evicts is a greyed parked row under its owner; d shows what was parked
// and what was not; the agent's next call restores it and the row goes.
func TestDashboardShowsParkedKernels(t *testing.T) {
	tmuxtest.Require(t)
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	s := startDashboardIn(t, bin, dirs, 200, 40, "--max-kernels", "1", "--spare-kernels", "0", "--python", "/usr/bin/python3")
	a := startAgent(t, bin, dirs.env(), "--connect", "--state-dir", dirs.state)
	a.send(map[string]any{"id": "1", "op": "execute", "owner": "alice", "code": "x = 41\nf = open(__import__('os').devnull)"})
	a.answer("1")
	a.send(map[string]any{"id": "2", "op": "execute", "owner": "bob", "code": "y = 1"})
	a.answer("2")
	s.WaitScreen("alice's parked row", tmuxWait, func(screen string) bool {
		return strings.Contains(screen, "alice  0 kernels, 1 parked") && regexp.MustCompile(`default\s+k\w+\s+parked\s+\S+ ago\s+\d+ (bytes|KB), 1 name \(1 not saved\)`).MatchString(screen)
	})
	// The cursor to the top (alice's group), down to her parked row, then
	// its detail.
	for range 6 {
		s.Keys("k")
	}
	s.Keys("j")
	s.Keys("d")
	s.WaitScreen("the parked detail", tmuxWait, func(screen string) bool {
		return strings.Contains(screen, "evicted by the cap") && strings.Contains(screen, "f (TextIOWrapper): open file")
	})
	s.Keys("Escape")
	a.send(map[string]any{"id": "3", "op": "execute", "owner": "alice", "code": "print(x + 1)"})
	if r := a.answer("3"); r["stdout"] != "42\n" {
		t.Fatalf("alice after the eviction: %v", r)
	}
	s.WaitScreen("the restore in the events, alice's row live", tmuxWait, func(screen string) bool {
		return strings.Contains(screen, "restored") && strings.Contains(screen, "alice  1 kernel") && strings.Contains(screen, "bob  0 kernels, 1 parked")
	})
	a.in.Close()
	<-a.ended
	quitKillingKernels(s)
	wantExitKilled(t, s, "killed 1 kernel")
	wantNoProcessesUnder(t, dirs.kernels)
}
