package engine

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine/runner"
)

// A runner that cannot write the tool stubs it was shipped (here: stdin
// ends before them, as when the engine dies mid-spawn) fails the spawn at
// with its reason (not the 20 s wait for READY, whose message is another),
// and nothing of the kernel is left on the host.
func TestSpawnNamesWhyTheRunnerCouldNotWriteItsStubs(t *testing.T) {
	env := backends.NewLocal(t.TempDir())
	res := runSpawn(t, env, spawnRun{id: "kstubs", stubs: []byte("abc"), stubsSize: 100, config: []byte{}})
	want := "KD:ERR kerneldeck_tools.py was cut short: 3 of 100 bytes"
	if !strings.Contains(res.Output, want) || res.ReturnCode == 0 {
		t.Fatalf("spawn with stubs cut short: rc %d output %q, want %q", res.ReturnCode, res.Output, want)
	}
	matches, _ := filepath.Glob(filepath.Join(env.TempDir(), "kerneldeck-*", "kstubs"))
	if len(matches) != 0 {
		t.Fatalf("the failed spawn left %v", matches)
	}
}

// A runner that dies before READY (here: runner.py that is not Python)
// ends the spawn at once with what it wrote to runner.log: its watcher
// lets go of the ready pipe, so the death is the pipe's end, not the 20 s
// wait for READY (whose message is another). Nothing is left.
func TestSpawnSaysTheRunnerExitedBeforeItWasReady(t *testing.T) {
	env := backends.NewLocal(t.TempDir())
	res := runSpawn(t, env, spawnRun{id: "kdied", script: []byte("def (\n")})
	if !strings.Contains(res.Output, "KD:ERR runner exited before it was ready: ") || !strings.Contains(res.Output, "SyntaxError") || res.ReturnCode == 0 {
		t.Fatalf("spawn of a runner that dies: rc %d output %q, want its exit and the SyntaxError", res.ReturnCode, res.Output)
	}
	matches, _ := filepath.Glob(filepath.Join(env.TempDir(), "kerneldeck-*", "kdied"))
	if len(matches) != 0 {
		t.Fatalf("the failed spawn left %v", matches)
	}
}

// spawnRun is one run of the spawn script: the kernel id, the
// interpreter learnt and the PATH lookup it came through, the one
// configured (want) and kernel root (spawnScript's defaults when empty),
// runner.py (the runner's source when nil), the tool stubs and the size
// the script is told they have (their own when 0), and the config line
// (one with a secret when nil).
type spawnRun struct {
	id, python, lookup, want, root string
	script, stubs, config          []byte
	stubsSize                      int
}

// runSpawn runs the spawn script on env and kills a runner it started when
// the test ends.
func runSpawn(t *testing.T, env *backends.Local, r spawnRun) backends.Result {
	t.Helper()
	if r.script == nil {
		r.script = runner.Source
	}
	if r.stubsSize == 0 {
		r.stubsSize = len(r.stubs)
	}
	script := spawnScript(env.TempDir(), r.id, r.python, r.lookup, r.want, r.root, [3]int{len(r.script), 0, r.stubsSize}, 20, false)
	if r.config == nil {
		r.config = []byte(`{"secret": "` + strings.Repeat("ab", 32) + `"}` + "\n")
	}
	res, err := env.Execute(context.Background(), script, backends.ExecOptions{Stdin: spawnStdin(r.script, nil, r.stubs, r.config), Timeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(res.Output); len(f) > 1 && f[0] == "KD:SPAWNED" {
		if pid, err := strconv.Atoi(f[1]); err == nil {
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
		}
	}
	return res
}

// wrapper writes an executable shell script standing in for the
// interpreter, which runs body before it execs python3 with its arguments
// (-c <start> <kernel dir>/runner.py).
func wrapper(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "python3")
	if err := os.WriteFile(p, []byte("#!/bin/bash\n"+body+"\nexec python3 \"$@\"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// What the interpreter says before the runner's bootstrap runs (a warning
// of its own, or why it cannot start) comes on the ready pipe: a warning
// does not fail the spawn, and a death names its cause.
func TestSpawnReadsWhatTheInterpreterSaysFirst(t *testing.T) {
	env := backends.NewLocal(t.TempDir())
	res := runSpawn(t, env, spawnRun{id: "kwarns", python: wrapper(t, "echo 'a warning from the interpreter' >&2")})
	if !strings.HasPrefix(res.Output, "KD:SPAWNED ") {
		t.Fatalf("spawn by an interpreter that warns first: rc %d output %q, want KD:SPAWNED", res.ReturnCode, res.Output)
	}
	res = runSpawn(t, env, spawnRun{id: "kbroken", python: wrapper(t, "echo 'Fatal Python error: init_fs_encoding' >&2; exit 1")})
	if !strings.Contains(res.Output, "KD:ERR runner exited before it was ready: Fatal Python error: init_fs_encoding") {
		t.Fatalf("spawn by an interpreter that cannot start: rc %d output %q, want its words", res.ReturnCode, res.Output)
	}
}

// A kernel dir already there is never used nor removed: found by the
// script, or (made in the moment between) by the bootstrap's mkdir, when
// the watcher must leave it alone too, whichever of it and the script
// learns first; or made after a runner died before its own mkdir.
func TestSpawnLeavesAKernelDirAlreadyThere(t *testing.T) {
	env := backends.NewLocal(t.TempDir())
	root := filepath.Join(env.TempDir(), "kerneldeck-test")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	there := filepath.Join(root, "kthere")
	if err := os.Mkdir(there, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(there, "theirs"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	res := runSpawn(t, env, spawnRun{id: "kthere", root: root})
	if !strings.Contains(res.Output, "KD:ERR cannot create kernel dir "+there+" (it already exists)") {
		t.Fatalf("spawn into a dir already there: rc %d output %q", res.ReturnCode, res.Output)
	}
	raced := filepath.Join(root, "kraced")
	res = runSpawn(t, env, spawnRun{id: "kraced", python: wrapper(t, `p=${!#}; d=${p%/runner.py}; mkdir "$d" && : >"$d/theirs"`), root: root})
	if !strings.Contains(res.Output, "KD:ERR cannot create kernel dir "+raced+" (it may already exist): File exists") {
		t.Fatalf("spawn racing a dir made in between: rc %d output %q", res.ReturnCode, res.Output)
	}
	// The same, where the watcher sees the runner's 75 long before the
	// script reads its NODIR (which would kill the watcher): the watcher
	// itself must leave the dir.
	late := filepath.Join(root, "klate")
	res = runSpawn(t, env, spawnRun{id: "klate", root: root, python: wrapper(t, `p=${!#}; d=${p%/runner.py}; mkdir "$d" && : >"$d/theirs"
{ sleep 0.5; echo "NODIR cannot create kernel dir $d (it may already exist): File exists" >&3; } &
exit 75`)})
	if !strings.Contains(res.Output, "KD:ERR cannot create kernel dir "+late+" (it may already exist): File exists") {
		t.Fatalf("spawn whose runner says NODIR late: rc %d output %q", res.ReturnCode, res.Output)
	}
	// A runner that died before its mkdir, the dir made meanwhile by
	// someone else: no answer, and no mark, so neither the script nor the
	// watcher removes it.
	died := filepath.Join(root, "kdied")
	res = runSpawn(t, env, spawnRun{id: "kdied", root: root, python: wrapper(t, `p=${!#}; d=${p%/runner.py}; mkdir "$d" && : >"$d/theirs"; exit 1`)})
	if !strings.Contains(res.Output, "KD:ERR runner exited before it was ready") {
		t.Fatalf("spawn whose runner died before its mkdir: rc %d output %q", res.ReturnCode, res.Output)
	}
	// The watcher has seen its runner end by now, or soon: give it the time
	// a wrong rm -rf would take.
	time.Sleep(500 * time.Millisecond)
	for _, kd := range []string{there, raced, late, died} {
		if _, err := os.Stat(filepath.Join(kd, "theirs")); err != nil {
			t.Errorf("%s was removed or used: %v", kd, err)
		}
	}
}

// A configured interpreter that a host does not have is a spawn error that
// names it; a configured name is looked up on PATH.
func TestSpawnScriptConfiguredPython(t *testing.T) {
	env := backends.NewLocal(t.TempDir())
	res := runSpawn(t, env, spawnRun{id: "kbadpy", want: "python3.nosuch"})
	if !strings.Contains(res.Output, "KD:ERR python3.nosuch was not found on this host") || res.ReturnCode == 0 {
		t.Fatalf("spawn with a missing --python: rc %d output %q, want an error naming it", res.ReturnCode, res.Output)
	}
	res = runSpawn(t, env, spawnRun{id: "kgoodpy", want: "/usr/bin/python3"})
	// KD:SPAWNED pid dir interpreter confinement: the one configured.
	if f := strings.Fields(res.Output); len(f) < 4 || f[0] != "KD:SPAWNED" || !strings.HasPrefix(f[3], "/usr/bin/python3") {
		t.Fatalf("spawn with --python /usr/bin/python3: rc %d output %q", res.ReturnCode, res.Output)
	}
}

// An interpreter learnt on a host runs only while PATH still gives the
// name what it gave when it was learnt (a venv activated or left, PATH
// reordered since): the spawn checks in its own round trip, and says what
// PATH gives now, for the next spawns.
func TestSpawnScriptChecksTheLearntInterpreterAgainstPATH(t *testing.T) {
	env := backends.NewLocal(t.TempDir())
	bin := t.TempDir()
	if err := os.Symlink("/usr/bin/python3", filepath.Join(bin, "python3")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	spawned := func(r spawnRun) (exe, lookup string) {
		t.Helper()
		res := runSpawn(t, env, r)
		f := strings.Fields(res.Output)
		if len(f) < 6 || f[0] != "KD:SPAWNED" {
			t.Fatalf("spawn %s: rc %d output %q, want KD:SPAWNED with the PATH lookup", r.id, res.ReturnCode, res.Output)
		}
		return f[3], f[5]
	}
	// Learnt through the PATH as it is: kept.
	learnt := filepath.Join(t.TempDir(), "python-learnt")
	if err := os.Symlink("/usr/bin/python3", learnt); err != nil {
		t.Fatal(err)
	}
	if exe, lookup := spawned(spawnRun{id: "ksamepath", python: learnt, lookup: filepath.Join(bin, "python3")}); exe != learnt || lookup != filepath.Join(bin, "python3") {
		t.Errorf("the PATH unchanged: ran %s (lookup %s), want the learnt %s", exe, lookup, learnt)
	}
	// Learnt when PATH gave another python3: the name runs.
	if exe, _ := spawned(spawnRun{id: "kmoved", python: learnt, lookup: "/opt/venv/bin/python3"}); exe == learnt {
		t.Errorf("PATH gives %s/python3 now, not the lookup the learnt interpreter came through: the spawn still ran %s", bin, exe)
	}
}

// A runner told no umask (one on another host) gives its cells the
// login's, as the spawn found it before it set its own 077.
func TestSpawnScriptGivesCellsTheLoginsUmask(t *testing.T) {
	old := syscall.Umask(0o002)
	defer syscall.Umask(old)
	env := backends.NewLocal(t.TempDir())
	res := runSpawn(t, env, spawnRun{id: "kumask"})
	f := strings.Fields(res.Output)
	if len(f) < 3 || f[0] != "KD:SPAWNED" {
		t.Fatalf("spawn: rc %d output %q", res.ReturnCode, res.Output)
	}
	umask := ""
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		status, _ := os.ReadFile("/proc/" + f[1] + "/status")
		for line := range strings.Lines(string(status)) {
			if v, ok := strings.CutPrefix(line, "Umask:"); ok {
				umask = strings.TrimSpace(v)
			}
		}
		if umask == "0002" {
			return
		}
	}
	t.Fatalf("the runner's umask is %q, want the login's 0002", umask)
}
