package cli

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
	"github.com/kerneldeck/kerneldeck/internal/tmuxtest"
)

// takeBackKernel is one kernel of TestAKilledEngineLosesNothing: its owner,
// backend, the value its x holds and its runner's pid.
type takeBackKernel struct {
	owner, backend string
	x, pid         int
	mid            bool // a cell was running in it when the engine died
}

// TestAKilledEngineLosesNothing: a serve with 20 kernels across local, ssh
// and docker is killed with SIGKILL while one cell runs on each backend. The
// next serve on the same state dir takes every kernel back with its state;
// each cell that was running is collected, and ran exactly once. Then the
// same across a clean stop with --keep-kernels, and at the end nothing is
// left running anywhere.
func TestAKilledEngineLosesNothing(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	sshCfg := srv.WriteSSHConfig(t, "box", u)
	ctr := dockertest.Container(t, dockertest.ContainerOptions{TmpfsTmp: true})
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	t.Cleanup(func() { killProcessesUnder(t, dirs.kernels) })
	onHosts := []string{"local", "ssh://box", "docker://" + ctr}
	args := []string{"--max-kernels", "24", "--idle-exit", "10m", "--ssh-config", sshCfg}
	for _, b := range onHosts {
		args = append(args, "--backend", b)
	}

	se := startServe(t, bin, dirs, args...)
	a := startAgent(t, bin, dirs.env(), "--connect", se.sock)
	var kernels []*takeBackKernel
	for i := range 20 {
		k := &takeBackKernel{owner: fmt.Sprintf("o%d", i), backend: onHosts[i%3], x: i, mid: i < 3}
		kernels = append(kernels, k)
		a.send(map[string]any{"id": "set" + k.owner, "op": "execute", "owner": k.owner, "backend": k.backend,
			"code": fmt.Sprintf("x = %d", i)})
	}
	for _, k := range kernels {
		r := a.answer("set" + k.owner)
		kr, _ := r["kernel"].(map[string]any)
		if r["status"] != "success" || kr == nil {
			t.Fatalf("kernel of %s on %s: %v", k.owner, k.backend, r)
		}
		k.pid = int(kr["pid"].(float64))
	}
	for _, k := range kernels[:3] {
		a.send(map[string]any{"id": "mid" + k.owner, "op": "execute", "owner": k.owner, "backend": k.backend,
			"code": "import time; time.sleep(8); x += 100; print('mid', x)"})
	}
	waitUntil(t, "a cell to run on every backend", func() bool {
		a.send(map[string]any{"id": "list", "op": "kernels"})
		time.Sleep(100 * time.Millisecond)
		return runningKernels(a) == 3
	})
	// The listing says running once the engine sends a cell; its runner
	// has it a moment later (on a loaded machine, more than a moment).
	time.Sleep(time.Second)
	se.cmd.Process.Kill()
	se.cmd.Wait()

	se = startServe(t, bin, dirs, append(args, "--keep-kernels")...)
	if want := "took back 20 kernels of an engine that stopped without closing; 3 had a cell running"; !strings.Contains(se.stderr.String(), want) {
		t.Fatalf("the new engine's stderr does not say %q:\n%s", want, se.stderr.String())
	}
	b := startAgent(t, bin, dirs.env(), "--connect", se.sock)
	wantKernelsAsTheyWere(t, b, "after SIGKILL", kernels)
	for _, k := range kernels[:3] {
		b.send(map[string]any{"id": "cells" + k.owner, "op": "cells", "kernel": kernelIDOf(t, b, k)})
		cells := b.answer("cells" + k.owner)["cells"].([]any)
		ran := 0
		for _, c := range cells {
			c := c.(map[string]any)
			if out := c["stdout"].(map[string]any)["head"]; out == fmt.Sprintf("mid %d\n", k.x+100) && c["status"] == "success" {
				ran++
				// Its code is known: its runner says it (it was once "not
				// known here").
				if code := fmt.Sprint(c["code"]); !strings.Contains(code, "time.sleep(8)") {
					t.Errorf("the cell taken back running in %s's kernel on %s shows code %q", k.owner, k.backend, code)
				}
			}
		}
		if ran != 1 {
			t.Errorf("the cell running in %s's kernel on %s when the engine died: %d results in cells, want 1: %v", k.owner, k.backend, ran, cells)
		}
	}

	// A clean stop that keeps the kernels, and an engine that adopts them.
	se.cmd.Process.Signal(syscall.SIGTERM)
	se.cmd.Wait()
	if want := "left 20 kernels running (--keep-kernels)"; !strings.Contains(se.stderr.String(), want) {
		t.Fatalf("serve --keep-kernels at SIGTERM does not say %q:\n%s", want, se.stderr.String())
	}
	se = startServe(t, bin, dirs, append(args, "--adopt")...)
	if want := "adopted 20 kernels"; !strings.Contains(se.stderr.String(), want) {
		t.Fatalf("serve --adopt does not say %q:\n%s", want, se.stderr.String())
	}
	c := startAgent(t, bin, dirs.env(), "--connect", se.sock)
	wantKernelsAsTheyWere(t, c, "after a clean stop with --keep-kernels", kernels)

	// Without --keep-kernels, a stop kills them all, on every host.
	se.cmd.Process.Signal(syscall.SIGTERM)
	se.cmd.Wait()
	wantNoProcessesUnder(t, dirs.kernels)
	for _, k := range kernels {
		if k.backend == "ssh://box" && tmuxtest.Alive(k.pid) {
			t.Errorf("the runner of %s's kernel over ssh (pid %d) outlived the engine", k.owner, k.pid)
		}
	}
	if out, err := exec.Command("docker", "exec", ctr, "sh", "-c", "grep -l 'runner[.]py' /proc/[0-9]*/cmdline 2>/dev/null | wc -l").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Errorf("runners left in the container: %s (%v)", out, err)
	}
}

// runningKernels counts the kernels the agent's latest listing shows running.
func runningKernels(a *agent) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := len(a.lines) - 1; i >= 0; i-- {
		if a.lines[i]["op"] != "kernels" {
			continue
		}
		n := 0
		for _, k := range a.lines[i]["kernels"].([]any) {
			if k.(map[string]any)["state"] == "running" {
				n++
			}
		}
		a.lines = nil
		return n
	}
	return 0
}

// kernelIDOf is the id of k's kernel in the agent's engine.
func kernelIDOf(t *testing.T, a *agent, k *takeBackKernel) string {
	t.Helper()
	id := "who" + k.owner
	a.send(map[string]any{"id": id, "op": "execute", "owner": k.owner, "backend": k.backend, "code": ""})
	return a.answer(id)["kernel"].(map[string]any)["id"].(string)
}

// wantKernelsAsTheyWere asks every kernel for its x: the same runner, the
// same state (x plus 100 where a cell was running, run once).
func wantKernelsAsTheyWere(t *testing.T, a *agent, when string, kernels []*takeBackKernel) {
	t.Helper()
	for _, k := range kernels {
		a.send(map[string]any{"id": "get" + k.owner, "op": "execute", "owner": k.owner, "backend": k.backend, "code": "print(x)"})
	}
	for _, k := range kernels {
		r := a.answer("get" + k.owner)
		want := k.x
		if k.mid {
			want += 100
		}
		kr, _ := r["kernel"].(map[string]any)
		if r["stdout"] != fmt.Sprintf("%d\n", want) || kr == nil || int(kr["pid"].(float64)) != k.pid || kr["state_lost"] != false {
			t.Errorf("%s: %s's kernel on %s (pid %d, x = %d): %v", when, k.owner, k.backend, k.pid, want, r)
		}
	}
}

// TestAnAgentRidesThroughAnEngineRestart: an agent on `headless --connect`
// whose engine is killed mid-cell and started again notices only a pause:
// its connection is dialed again, the request in flight gets its one
// answer (the cell ran once), its kernel keeps its state, a request that
// may have been done is answered with an error that says so, and at the end
// of its input it exits 0.
func TestAnAgentRidesThroughAnEngineRestart(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	t.Cleanup(func() { killProcessesUnder(t, dirs.kernels) })
	se := startServe(t, bin, dirs)
	a := startAgent(t, bin, dirs.env(), "--connect", se.sock)
	a.send(map[string]any{"id": "1", "op": "execute", "owner": "agent", "code": "x = 1"})
	a.answer("1")
	a.send(map[string]any{"id": "2", "op": "execute", "owner": "agent", "code": "import time; time.sleep(3); x += 10; print('x is', x)"})
	// Each listing is waited for: one still in flight when the engine is
	// killed would be sent again too (under load it was, and the count of
	// requests sent again below was 2).
	lists := 0
	waitUntil(t, "the cell to run", func() bool {
		lists++
		id := fmt.Sprintf("list%d", lists)
		a.send(map[string]any{"id": id, "op": "kernels"})
		a.answer(id)
		return runningKernels(a) == 1
	})
	se.cmd.Process.Kill()
	se.cmd.Wait()
	a.send(map[string]any{"id": "3", "op": "kill", "kernel": "k000000000000"})
	waitUntil(t, "the agent to see the engine gone", func() bool { return strings.Contains(a.err.String(), "reconnecting") })

	se = startServe(t, bin, dirs)
	if r := a.answer("2"); r["stdout"] != "x is 11\n" {
		t.Fatalf("the cell in flight across the restart: %v\nagent's stderr: %s", r, a.err.String())
	}
	if r := a.answer("3"); r["op"] != "error" || !strings.Contains(r["error"].(string), "may or may not have been done") {
		t.Errorf("a kill in flight across the restart: %v", r)
	}
	a.send(map[string]any{"id": "4", "op": "execute", "owner": "agent", "code": "print(x)"})
	if r := a.answer("4"); r["stdout"] != "11\n" {
		t.Errorf("the kernel after the restart (the cell in flight ran once: x is 11): %v", r)
	}
	a.mu.Lock()
	twice := 0
	for _, l := range a.lines {
		if l["id"] == "2" && l["op"] == "result" {
			twice++
		}
	}
	a.mu.Unlock()
	if twice != 1 {
		t.Errorf("%d answers to the request in flight, want 1", twice)
	}
	a.in.Close()
	select {
	case <-a.ended:
	case <-time.After(tmuxWait):
		t.Fatal("the agent did not end at the end of its input")
	}
	// The kill (3) went after the engine died: on the dead connection, and so
	// sent again with the cell, or once the agent saw it gone.
	if err := a.cmd.Wait(); err != nil || !regexp.MustCompile(`reconnected to the engine at `+regexp.QuoteMeta(se.sock)+`; sent (1 request|2 requests) again`).MatchString(a.err.String()) {
		t.Errorf("the agent's exit: %v; stderr: %s", err, a.err.String())
	}
}

// TestAREPLRidesThroughAnEngineRestart: `repl --connect` reading a script
// whose engine is killed while a block runs, and started again: the block's
// output comes once, the kernel keeps its state, and the script ends well.
func TestAREPLRidesThroughAnEngineRestart(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	t.Cleanup(func() { killProcessesUnder(t, dirs.kernels) })
	se := startServe(t, bin, dirs)
	cmd := exec.Command(bin, "repl", "--connect", se.sock, "--owner", "me")
	cmd.Env = dirs.env()
	in, _ := cmd.StdinPipe()
	var out, errOut syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	io.WriteString(in, "x = 1\nimport time; time.sleep(3); x += 10; print('x is', x)\n")
	waitUntil(t, "the block to run", func() bool {
		return strings.Contains(runHeadless(t, bin, dirs.env(), `{"id":"k","op":"kernels"}`+"\n", "--connect", se.sock), `"state":"running"`)
	})
	se.cmd.Process.Kill()
	se.cmd.Wait()
	se = startServe(t, bin, dirs)
	io.WriteString(in, "print('then', x)\n")
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("repl --connect across the restart: %v\nstdout: %s\nstderr: %s", err, out.String(), errOut.String())
	}
	if got := out.String(); got != "x is 11\nthen 11\n" {
		t.Errorf("stdout %q, want the block's line once and the kept x\nstderr: %s", got, errOut.String())
	}
	if !strings.Contains(errOut.String(), "reconnected to the engine at "+se.sock) {
		t.Errorf("stderr does not say it reconnected: %s", errOut.String())
	}
}

// A kernel that claims another owner's cell id (its cell adds the id to its
// runner's pending set) gets nothing of that cell when the engine dies and
// the next one takes both kernels back: a cell id is its key's. The victim
// gets its own result, once; the claimant, asking with the id, gets no
// word of it. Once, the claim dropped the victim's record, and what was
// collected went by the id alone.
func TestATakenBackKernelCannotClaimAnotherOwnersCell(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	t.Cleanup(func() { killProcessesUnder(t, dirs.kernels) })
	args := []string{"--cell-timeout", "30s"}
	se := startServe(t, bin, dirs, args...)
	a := startAgent(t, bin, dirs.env(), "--connect", se.sock)
	a.send(map[string]any{"id": "claim", "op": "execute", "owner": "mallory",
		"code": "import gc\nr = [o for o in gc.get_objects() if type(o).__name__ == 'Runner'][0]\nr.pending.add('oy-cell')\nprint('claimed')"})
	if r := a.answer("claim"); r["stdout"] != "claimed\n" {
		t.Fatalf("mallory's claim: %v", r)
	}
	a.send(map[string]any{"id": "oy", "op": "execute", "owner": "oy", "cell": "oy-cell",
		"code": "import time; time.sleep(4); print('oy secret')"})
	waitUntil(t, "oy's cell to run", func() bool { return kernelsRunning(t, bin, se) == 1 })
	time.Sleep(time.Second) // the runner has the cell a moment after the listing says running
	se.cmd.Process.Kill()
	se.cmd.Wait()

	se = startServe(t, bin, dirs, args...)
	if r := a.answer("oy"); r["stdout"] != "oy secret\n" {
		t.Fatalf("oy's cell across the engine's death: %v\nagent's stderr: %s\nserve's: %s", r, a.err.String(), se.stderr.String())
	}
	a.send(map[string]any{"id": "steal", "op": "execute", "owner": "mallory", "cell": "oy-cell", "timeout": 2, "code": "print('mine')"})
	r := a.answer("steal")
	if s := fmt.Sprint(r); strings.Contains(s, "oy secret") || strings.Contains(s, "another kernel") {
		t.Errorf("mallory asking with oy's cell id got: %v", r)
	}
}

// A member's kernel outlives a SIGKILL of a root engine: the next serve
// takes it back (its local?user= backend made again), and the member's
// relay, sending its execute again, gets the cell's one result: it ran
// once, and the old runner does not outlive the next clean stop. Once the
// kernel was left running, "not configured here", and the execute sent
// again ran a second time in a new kernel.
func TestAMembersKernelOutlivesTheEngine(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only a root engine runs a member's kernels as the member")
	}
	const nobody, users = 65534, 100
	shared, bin := nonRootBinary(t)
	dirs := newDashboardDirs(t)
	os.Chmod(filepath.Dir(dirs.state), 0o755) // the socket's dir is in it
	t.Cleanup(func() { killProcessesUnder(t, "/tmp/kerneldeck-nobody") })
	args := []string{"--allow-group", "users", "--cell-timeout", "30s"}
	se := startServe(t, bin, dirs, args...)
	count := filepath.Join(shared, "count")
	os.WriteFile(count, nil, 0o666)
	os.Chmod(count, 0o666)
	memberEnv := []string{"HOME=" + shared, "PATH=/usr/bin:/bin", "XDG_RUNTIME_DIR=", "XDG_STATE_HOME=" + filepath.Join(shared, "state-nobody")}
	m := startAgentAs(t, &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{users}}, bin, memberEnv, "--connect", se.sock)
	m.send(map[string]any{"id": "set", "op": "execute", "code": "x = 1"})
	if r := m.answer("set"); r["status"] != "success" {
		t.Fatalf("the member's first cell: %v\n%s", r, m.err.String())
	}
	m.send(map[string]any{"id": "mid", "op": "execute",
		"code": fmt.Sprintf("import os, time\ntime.sleep(4)\nx += 1\nopen(%q, 'a').write('ran %%d\\n' %% os.getuid())\nprint(x)", count)})
	waitUntil(t, "the member's cell to run", func() bool { return kernelsRunning(t, bin, se) == 1 })
	time.Sleep(time.Second) // the runner has the cell a moment after the listing says running
	se.cmd.Process.Kill()
	se.cmd.Wait()

	se = startServe(t, bin, dirs, args...)
	if r := m.answer("mid"); r["stdout"] != "2\n" {
		t.Fatalf("the member's cell across the engine's death: %v\nrelay: %s\nserve: %s", r, m.err.String(), se.stderr.String())
	}
	if got, _ := os.ReadFile(count); string(got) != fmt.Sprintf("ran %d\n", nobody) {
		t.Errorf("the member's cell ran %q; want once, as nobody", got)
	}
	m.send(map[string]any{"id": "after", "op": "execute", "code": "print(x)"})
	if r := m.answer("after"); r["stdout"] != "2\n" {
		t.Errorf("the member's kernel after the take-back: %v", r)
	}
	se.cmd.Process.Signal(syscall.SIGTERM)
	se.cmd.Wait()
	wantNoProcessesUnder(t, "/tmp/kerneldeck-nobody")
}

// kernelsRunning is how many kernels of se's engine run a cell, as its
// owner sees them.
func kernelsRunning(t *testing.T, bin string, se *servedEngine) int {
	a := startAgent(t, bin, se.dirs.env(), "--connect", se.sock)
	a.send(map[string]any{"id": "list", "op": "kernels"})
	a.answer("list")
	n := runningKernels(a)
	a.in.Close()
	return n
}

// An agent whose engine went away with nothing unanswered, given a request
// while it reconnects, says it sent that one, not that it sent it "again".
func TestAnAgentSaysWhatItSentAfterAReconnect(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	t.Cleanup(func() { killProcessesUnder(t, dirs.kernels) })
	se := startServe(t, bin, dirs)
	a := startAgent(t, bin, dirs.env(), "--connect", se.sock)
	a.send(map[string]any{"id": "1", "op": "execute", "owner": "agent", "code": "x = 1"})
	a.answer("1")
	se.cmd.Process.Kill()
	se.cmd.Wait()
	waitUntil(t, "the agent to see the engine gone", func() bool { return strings.Contains(a.err.String(), "with 0 requests unanswered; reconnecting") })
	a.send(map[string]any{"id": "2", "op": "execute", "owner": "agent", "code": "print(x)"})
	se = startServe(t, bin, dirs)
	if r := a.answer("2"); r["stdout"] != "1\n" {
		t.Fatalf("the request sent while the engine was away: %v\n%s", r, a.err.String())
	}
	if want := "; sent the 1 request that came meanwhile"; !strings.Contains(a.err.String(), want) {
		t.Errorf("the agent's stderr does not say %q:\n%s", want, a.err.String())
	}
}
