package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// runHeadless pipes requests into the binary's headless mode and returns
// its stdout.
func runHeadless(t *testing.T, bin string, env []string, requests string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"headless"}, args...)...)
	cmd.Env = env
	cmd.Stdin = strings.NewReader(requests)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("headless: %v\n%s", err, errOut.String())
	}
	return out.String()
}

// The event log outlives the engine: after two runs, `kerneldeck events`
// answers why alice's kernel was evicted, filtered by owner, kernel, type
// and time, in words or JSON.
func TestEventLogAcrossRestarts(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	env := dirs.env()
	state := []string{"--state-dir", dirs.state}
	// Headless runs requests concurrently: bob's goes in only after alice's
	// answer, so it is alice's kernel that the cap of 1 evicts.
	first := startPipedEnv(t, env, bin, append(append([]string{"headless"}, state...), "--max-kernels", "1")...)
	answers := bufio.NewScanner(first.out)
	ask := func(line string) string {
		t.Helper()
		io.WriteString(first.in, line+"\n")
		if !answers.Scan() {
			t.Fatalf("first run ended before answering %s: %s", line, first.stderr.String())
		}
		return answers.Text()
	}
	var alice struct {
		Kernel struct{ ID string } `json:"kernel"`
	}
	out := ask(`{"id":"a","op":"execute","owner":"alice","code":"1"}`)
	json.Unmarshal([]byte(out), &alice)
	if alice.Kernel.ID == "" {
		t.Fatalf("first run: %s", out)
	}
	ask(`{"id":"b","op":"execute","owner":"bob","code":"1"}`)
	first.in.Close()
	if err := first.cmd.Wait(); err != nil {
		t.Fatalf("first run: %v\n%s", err, first.stderr.String())
	}
	runHeadless(t, bin, env, `{"id":"c","op":"execute","owner":"carol","code":"1"}`+"\n", state...)

	events := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append(append([]string{"events"}, state...), args...)...)
		cmd.Env = env
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("events %v: %v\n%s", args, err, b)
		}
		return string(b)
	}
	why := events("--owner", "alice", "--type", "evicted_cap")
	if lines := strings.Split(strings.TrimSpace(why), "\n"); len(lines) != 1 || !strings.Contains(why, alice.Kernel.ID) || !strings.Contains(why, "evicted_cap") {
		t.Fatalf("why alice's kernel went:\n%s", why)
	}
	all := events("--since", "1h")
	for _, owner := range []string{"alice", "bob", "carol"} {
		if !strings.Contains(all, owner) {
			t.Errorf("the log across two runs lacks %s:\n%s", owner, all)
		}
	}
	for _, l := range strings.Split(strings.TrimSpace(events("--kernel", alice.Kernel.ID, "--json")), "\n") {
		var ev struct {
			Kernel string
			Time   time.Time
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.Kernel != alice.Kernel.ID || ev.Time.IsZero() {
			t.Fatalf("--json --kernel line %q: %v", l, err)
		}
	}
	// Nothing matching is said (on stderr), not silence.
	if old := events("--until", "2000-01-01"); !strings.HasPrefix(old, "kerneldeck events: no event in ") || strings.Count(old, "\n") != 1 {
		t.Fatalf("--until 2000-01-01 printed %q, want that no event matches", old)
	}
	// The log is private.
	for _, p := range []string{filepath.Join(dirs.state, "events")} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v, want a 0700 dir", p, st.Mode(), err)
		}
	}
	cmd := exec.Command(bin, append(append([]string{"events"}, state...), "--type", "evicted")...)
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(b), `"evicted" is not an event type`) || !strings.Contains(string(b), "evicted_cap") {
		t.Fatalf("a bad --type: %v %s", err, b)
	}
}

// A full disk does not stop the engine: cells run, and the log's failure
// is an event.
func TestEventLogOnAFullDisk(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	mnt := enginetest.MountTmpfs(t, "1m")
	state := filepath.Join(mnt, "state")
	// Leave room for the state dir's own files, not for many events.
	out := runHeadless(t, bin, dirs.env(), `{"id":"fill","op":"execute","code":"pass"}`+"\n", "--state-dir", state)
	if !strings.Contains(out, `"status":"success"`) {
		t.Fatalf("first run: %s", out)
	}
	filler := filepath.Join(mnt, "filler")
	f, _ := os.Create(filler)
	f.Write(make([]byte, 2<<20)) // fails when the disk is full: that is the point
	f.Close()
	var reqs strings.Builder
	for i := range 20 {
		reqs.WriteString(`{"id":"c` + string(rune('a'+i)) + `","op":"execute","owner":"o` + string(rune('a'+i%5)) + `","code":"print('x' * 200)"}` + "\n")
	}
	out = runHeadless(t, bin, dirs.env(), reqs.String(), "--state-dir", state, "--events")
	if n := strings.Count(out, `"op":"result"`); n != 20 {
		t.Fatalf("%d of 20 cells ran on a full disk:\n%s", n, out)
	}
	if !strings.Contains(out, "events could not be written") {
		t.Fatalf("no event said the log could not be written:\n%s", out)
	}
}

// A kernel cannot forge a line of `kerneldeck events`: a tool call's error
// names a path the kernel chose, newline and all, and the event is still
// one line.
func TestEventsCannotBeForged(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	env := dirs.env()
	state := []string{"--state-dir", dirs.state}
	forged := `2026-12-05 19:00:00  owner_shutdown     kdalice      forged: 3 kernels (by uid 0)`
	code := "import kerneldeck_tools as kt\ntry:\n    kt.read_file(" + pyString("nope\n"+forged) + ")\nexcept kt.ToolError as e:\n    print('refused')"
	req, _ := json.Marshal(map[string]any{"id": "1", "op": "execute", "owner": "bob", "tools": []string{"read_file"}, "code": code})
	if out := runHeadless(t, bin, env, string(req)+"\n", state...); !strings.Contains(out, `"stdout":"refused\n"`) {
		t.Fatalf("bob's cell: %s", out)
	}
	cmd := exec.Command(bin, append([]string{"events", "--since", "1h"}, state...)...)
	cmd.Env = env
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("events: %v\n%s", err, b)
	}
	sawCall := false
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, "2026-12-05 19:00:00") || strings.Contains(l, "forged") && !strings.Contains(l, "nope␊") {
			t.Errorf("a line of its own from what the kernel chose: %q", l)
		}
		sawCall = sawCall || strings.Contains(l, "nope␊2026-12-05 19:00:00")
	}
	if !sawCall {
		t.Fatalf("no event line shows the tool call's path with its newline escaped:\n%s", b)
	}
}

// pyString is s as a Python string literal (JSON's is one).
func pyString(s string) string { b, _ := json.Marshal(s); return string(b) }
