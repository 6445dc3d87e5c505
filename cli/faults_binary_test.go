package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/proctest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// The host process is killed with SIGKILL: it cannot kill its kernels, so
// the runners must end by themselves. The product promises that no kernel
// outlives idle_exit plus its margin, min(30 s, max(1 s, idle_exit/4)),
// counted from its last activity: an idle runner exits that long after its
// last cell, and a runner whose cell is still running when the host process
// dies lets the cell finish (its code runs to the end, exactly once), then
// idles out the same way. Each runner removes its own dir as it exits.
//
// kbIdle is the --idle-exit given to the binary; kbSlack is what a loaded
// machine may add to a runner's exit (the runner's own clock, process exit,
// this test's polling): far below the 30 s margin a broken margin rule
// could reach, and far below forever, which is what a runner that does not
// exit by itself would take.
const (
	kbIdle     = 2 * time.Second
	kbSlack    = 15 * time.Second
	kbCellRest = 4 * time.Second // how long the busy cell goes on after the kill
)

func kbMargin(idle time.Duration) time.Duration {
	return min(30*time.Second, max(time.Second, idle/4))
}

func TestBinaryKilledLeavesNoKernelPastIdleExit(t *testing.T) {
	bin := buildBinary(t)
	t.Run("local", func(t *testing.T) {
		kernels := isolate(t)
		kbScenario(t, bin, enginetest.SharedDir(t), nil)
		wantNoProcessesUnder(t, kernels)
	})
	t.Run("ssh", func(t *testing.T) {
		// Before isolate: its TMPDIR is private to this user, and the ssh
		// user must reach sshd's authorized keys and the marker dir.
		srv := sshdtest.Start(t, sshdtest.Options{})
		name := ""
		if sshdtest.CanCreateUsers() {
			name = "kdtest1"
		}
		u := srv.User(t, name, sshdtest.UserOptions{})
		cfg := srv.WriteSSHConfig(t, "kdbox", u)
		shared := enginetest.SharedDir(t)
		isolate(t)
		kbScenario(t, bin, shared, []string{"--backend", "ssh://kdbox", "--ssh-config", cfg})
	})
}

// kbKernel is one runner the scenario watches after the kill.
type kbKernel struct {
	what string
	pid  int
	dir  string
	// from is when its idle time starts: the kill for the idle kernel, the
	// end of its cell for the busy one.
	from time.Time
}

// kbScenario starts `kerneldeck headless --idle-exit 2s` with extra flags,
// gives it one idle kernel and one mid-cell, SIGKILLs it and checks that
// both runners end by themselves in time.
// Cells write their markers into shared, a dir every user may write to.
func kbScenario(t *testing.T, bin, shared string, extra []string) {
	started, finished := filepath.Join(shared, "started"), filepath.Join(shared, "finished")
	p := startPiped(t, bin, append([]string{"headless", "--idle-exit", kbIdle.String(), "--cell-timeout", "120s"}, extra...)...)
	cmd, in, outPipe, stderr := p.cmd, p.in, p.out, p.stderr
	answers := make(chan map[string]any, 16)
	go func() {
		defer close(answers)
		sc := bufio.NewScanner(outPipe)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				answers <- m
			}
		}
	}()
	send := func(req map[string]any) {
		line, _ := json.Marshal(req)
		if _, err := in.Write(append(line, '\n')); err != nil {
			t.Fatalf("write request: %v", err)
		}
	}

	// The busy kernel first: its cell reports its runner and goes on for a
	// while; the idle kernel's cell runs right before the kill, so that the
	// binary's own idle sweep (also 2 s) cannot reap it first.
	busyCode := fmt.Sprintf(`import os, sys, time
with open(%[1]q, "w") as f:
    f.write("%%d %%s\n" %% (os.getpid(), sys.modules["__main__"].RUNNER.kdir))
time.sleep(%[3]g)
with open(%[2]q, "a") as f:
    f.write("finished\n")`, started, finished, kbCellRest.Seconds())
	send(map[string]any{"id": "busy", "op": "execute", "owner": "busy", "code": busyCode})
	var busy kbKernel
	end := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(started)
		if f := strings.Fields(string(b)); len(f) == 2 && strings.HasSuffix(string(b), "\n") {
			busy.pid, _ = strconv.Atoi(f[0])
			busy.dir = f[1]
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the busy cell did not start within 60 s; stderr:\n%s", stderr.String())
		}
		select {
		case m, ok := <-answers:
			if !ok {
				t.Fatalf("kerneldeck exited before the busy cell started; stderr:\n%s", stderr.String())
			}
			t.Fatalf("an answer before the busy cell started: %v", m)
		case <-time.After(10 * time.Millisecond):
		}
	}
	busy.what = "the runner whose cell was running"

	send(map[string]any{"id": "idle", "op": "execute", "owner": "idle", "code": "x = 1"})
	idle := kbKernel{what: "the idle runner"}
	for idle.pid == 0 {
		select {
		case m, ok := <-answers:
			if !ok {
				t.Fatalf("kerneldeck exited early; stderr:\n%s", stderr.String())
			}
			if m["id"] != "idle" {
				continue
			}
			k, _ := m["kernel"].(map[string]any)
			if m["status"] != "success" || k == nil {
				t.Fatalf("the idle kernel's cell: %v", m)
			}
			idle.pid = int(k["pid"].(float64))
			idle.dir, _ = k["dir"].(string)
		case <-time.After(60 * time.Second):
			t.Fatalf("no answer for the idle kernel's cell within 60 s; stderr:\n%s", stderr.String())
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	cmd.Wait()
	idle.from = killed
	for _, k := range []kbKernel{idle, busy} {
		if !proctest.Alive(k.pid) {
			t.Fatalf("%s (pid %d) died with the host process: the test proves nothing about runners exiting by themselves", k.what, k.pid)
		}
	}
	if b, _ := os.ReadFile(finished); len(b) != 0 {
		t.Fatalf("the busy cell finished before the kill (%q): it must still run when the host process dies", b)
	}

	// Watch both at once: the busy cell finishes although nobody waits for
	// its result, then each runner must end within idle_exit + margin of its
	// last activity.
	margin := kbMargin(kbIdle)
	gone := map[int]time.Time{}
	cellEnd := killed.Add(kbCellRest + kbSlack)
	for len(gone) < 2 {
		now := time.Now()
		if busy.from.IsZero() {
			if b, _ := os.ReadFile(finished); len(b) > 0 {
				busy.from = now
				t.Logf("the busy cell finished %v after the kill", now.Sub(killed).Round(time.Millisecond))
			} else if now.After(cellEnd) {
				t.Fatalf("the busy cell did not finish within %v of the kill", kbCellRest+kbSlack)
			}
		}
		for _, k := range []kbKernel{idle, busy} {
			if _, done := gone[k.pid]; done {
				continue
			}
			if !proctest.Alive(k.pid) {
				gone[k.pid] = now
				if k.from.IsZero() {
					t.Fatalf("%s (pid %d) died %v after the host process, before its cell finished", k.what, k.pid, now.Sub(killed))
				}
				t.Logf("%s (pid %d) exited %v after its last activity (idle_exit %v + margin %v)",
					k.what, k.pid, now.Sub(k.from).Round(time.Millisecond), kbIdle, margin)
				continue
			}
			if !k.from.IsZero() && now.After(k.from.Add(kbIdle+margin+kbSlack)) {
				t.Fatalf("%s (pid %d) still runs %v after its last activity; idle_exit %v + margin %v (+ %v slack)",
					k.what, k.pid, now.Sub(k.from).Round(time.Millisecond), kbIdle, margin, kbSlack)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, k := range []kbKernel{idle, busy} {
		// The runner removes its dir as it exits, and its watcher whatever
		// was written there meanwhile, the moment the runner is gone.
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(k.dir); err != nil {
				break
			}
			if time.Now().After(end) {
				t.Errorf("%s exited but left its dir %s", k.what, k.dir)
				break
			}
		}
	}
	if b, _ := os.ReadFile(finished); string(b) != "finished\n" {
		t.Fatalf("the busy cell's end ran %d times, want once", bytes.Count(b, []byte("finished")))
	}
}
