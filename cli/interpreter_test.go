package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kerneldeck/kerneldeck/engine"
)

// executableIn runs a one-shot headless in dir with the test's environment
// changed by vars (an empty value unsets), on stateDir, and returns the
// interpreter its kernel ran.
func executableIn(t *testing.T, bin, stateDir, dir string, vars map[string]string) string {
	t.Helper()
	cmd := exec.Command(bin, "headless", "--state-dir", stateDir, "--spare-kernels", "0")
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); vars[k] == "" {
			if _, changed := vars[k]; !changed {
				cmd.Env = append(cmd.Env, kv)
			}
		}
	}
	for k, v := range vars {
		if v != "" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Stdin = strings.NewReader(`{"id":"1","op":"execute","code":"import sys; print(sys.executable, end='')"}` + "\n")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("headless in %s with %v: %v\n%s%s", dir, vars, err, out, stderr.String())
	}
	for line := range strings.Lines(string(out)) {
		var res struct {
			ID     string `json:"id"`
			Output string `json:"stdout"`
			Error  string `json:"error"`
		}
		if json.Unmarshal([]byte(line), &res) == nil && res.ID == "1" {
			if res.Error != "" {
				t.Fatalf("headless in %s with %v: %s", dir, vars, res.Error)
			}
			return res.Output
		}
	}
	t.Fatalf("headless in %s with %v gave no result:\n%s", dir, vars, out)
	return ""
}

// interpreterStep is a one-shot run with vars, in dir, whose kernel must run want.
type interpreterStep struct {
	name string
	vars map[string]string
	dir  string
	want string
}

// The first kernel of a fresh engine runs what python3 resolves to where
// it was asked for, now: a venv activated or deactivated, a pyenv version
// picked by PYENV_VERSION or `pyenv local`, /usr/bin first on PATH. It once
// ran the interpreter an earlier engine kept in the state dir, for its
// whole life (issue 55, point 3).
func TestTheFirstKernelRunsTheInterpreterOfThisMoment(t *testing.T) {
	bin := buildBinary(t)
	isolate(t)
	state, work := filepath.Join(t.TempDir(), "state"), t.TempDir()
	venv := filepath.Join(work, "venv")
	if out, err := exec.Command("/usr/bin/python3", "-m", "venv", "--without-pip", venv).CombinedOutput(); err != nil {
		t.Fatalf("venv: %v: %s", err, out)
	}
	path := os.Getenv("PATH")
	first := executableIn(t, bin, state, work, nil)
	steps := []interpreterStep{
		{"a venv activated", map[string]string{"PATH": venv + "/bin:" + path, "VIRTUAL_ENV": venv}, work, venv + "/bin/python3"},
		{"the venv deactivated", nil, work, first},
		{"/usr/bin first on PATH", map[string]string{"PATH": "/usr/bin:" + path}, work, "/usr/bin/python3"},
	}
	if shim, err := exec.LookPath("python3"); err == nil && filepath.Base(filepath.Dir(shim)) == "shims" {
		root := filepath.Dir(filepath.Dir(shim))
		var others []string
		entries, _ := os.ReadDir(filepath.Join(root, "versions"))
		for _, v := range entries {
			if p := filepath.Join(root, "versions", v.Name(), "bin", "python3"); p != first {
				if _, err := os.Stat(p); err == nil {
					others = append(others, p)
				}
			}
		}
		if len(others) >= 2 {
			version := func(p string) string { return filepath.Base(filepath.Dir(filepath.Dir(p))) }
			project := filepath.Join(work, "project")
			os.Mkdir(project, 0o755)
			if err := os.WriteFile(filepath.Join(project, ".python-version"), []byte(version(others[1])+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			steps = append(steps,
				interpreterStep{"PYENV_VERSION", map[string]string{"PYENV_VERSION": version(others[0])}, work, others[0]},
				interpreterStep{"pyenv local", map[string]string{"PYENV_VERSION": ""}, project, others[1]},
				interpreterStep{"back where it began", nil, work, first})
		} else {
			t.Log("pyenv here has too few versions: its steps are left out")
		}
	} else {
		t.Log("python3 on PATH is no pyenv shim here: pyenv's steps are left out")
	}
	for _, s := range steps {
		if got := executableIn(t, bin, state, s.dir, s.vars); got != s.want {
			t.Fatalf("%s: the first kernel ran %s, want %s", s.name, got, s.want)
		}
	}
	kept, _ := filepath.Glob(filepath.Join(state, "runners", "runner-*.json"))
	if len(kept) < 2 {
		t.Fatalf("the state dir keeps %d runners; each interpreter should have its own, for the next engine's fast start", len(kept))
	}
}

// replIn runs `kerneldeck repl --connect sock` as owner in dir with umask
// and env, feeding it code, and returns what it printed.
func replIn(t *testing.T, bin, sock, owner, dir, umask string, env []string, code string) string {
	t.Helper()
	cmd := exec.Command("sh", "-c", `umask "$1"; shift; exec "$@"`, "sh", umask, bin, "repl", "--connect", sock, "--owner", owner)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, env, strings.NewReader(code)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("repl --connect in %s: %v\n%s", dir, err, out)
	}
	return string(out)
}

// A client of a shared engine gets kernels that work where it does: its
// directory, the interpreter its PATH (here a venv) resolves to and its
// umask; a kernel it runs from a spare runner too. They once ran in the
// serve's directory, on its interpreter, with its umask (issue 55, point 4).
func TestAConnectedClientsKernelWorksWhereItDoes(t *testing.T) {
	bin := buildBinary(t)
	dirs := newDashboardDirs(t)
	se := startServe(t, bin, dirs, "--spare-kernels", "1")
	watcher := startAgent(t, bin, dirs.env(), "--connect", se.sock)
	watcher.send(map[string]any{"id": "sub", "op": "subscribe"})
	watcher.answer("sub", "ok")

	project := t.TempDir()
	venv := filepath.Join(project, "venv")
	if out, err := exec.Command("/usr/bin/python3", "-m", "venv", "--without-pip", venv).CombinedOutput(); err != nil {
		t.Fatalf("venv: %v: %s", err, out)
	}
	const probe = "import os, sys\nopen('made.csv', 'w').close()\nprint('where', os.getcwd(), sys.executable, oct(os.stat('made.csv').st_mode & 0o777))\n"
	activated := envWithOverrides(dirs.env(), map[string]string{"PATH": venv + "/bin:" + os.Getenv("PATH"), "VIRTUAL_ENV": venv})
	out := replIn(t, bin, se.sock, "ana", project, "027", activated, probe)
	if want := "where " + project + " " + venv + "/bin/python3 0o640"; !strings.Contains(out, want) {
		t.Fatalf("a venv's client in %s with umask 027: the kernel said\n%s\nwant %q", project, out, want)
	}
	if st, err := os.Stat(filepath.Join(project, "made.csv")); err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("the kernel's file in the client's dir: %v %v, want mode 0640", st, err)
	}

	// Without the venv, python3 resolves to what the serve's kernels run:
	// the spare runner is taken, and it too works where its client does.
	waitUntil(t, "a spare runner", func() bool {
		watcher.send(map[string]any{"id": "k", "op": "kernels"})
		n, _ := watcher.answer("k", "kernels")["spares"].(float64)
		watcher.mu.Lock()
		watcher.lines = nil
		watcher.mu.Unlock()
		return n >= 1
	})
	other := t.TempDir()
	out = replIn(t, bin, se.sock, "bo", other, "077", dirs.env(), probe)
	if want := "where " + other + " "; !strings.Contains(out, want) || !strings.Contains(out, " 0o600") {
		t.Fatalf("a client in %s with umask 077: the kernel said\n%s\nwant it there, making 0600 files", other, out)
	}
	waitUntil(t, "bo's kernel to be told spawned from the spare", func() bool {
		watcher.mu.Lock()
		defer watcher.mu.Unlock()
		for _, l := range watcher.lines {
			if l["type"] == "spawned" && l["owner"] == "bo" {
				if !strings.Contains(fmt.Sprint(l["detail"]), "a spare runner") {
					t.Fatalf("bo's kernel did not come from the spare: %v\n%v", l, watcher.lines)
				}
				return true
			}
		}
		return false
	})
}

// headless --connect's relay adds where its agent works to the executes
// that do not say, and leaves alone those that do and every other op.
func TestTheRelaySaysWhereItsAgentWorks(t *testing.T) {
	umask := 0o027
	place := engine.Place{Dir: "/home/ana/project", Python: "/home/ana/project/venv/bin/python3", Umask: &umask}
	decode := func(line []byte) map[string]any {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		return m
	}
	got := decode(mustTrack(t, `{"id":"1","op":"execute","code":"1"}`, place))
	if got["cwd"] != place.Dir || got["python"] != place.Python || got["umask"] != float64(umask) || got["code"] != "1" || got["cell"] == nil {
		t.Errorf("an execute that says nothing became %v", got)
	}
	got = decode(mustTrack(t, `{"id":"2","op":"execute","code":"1","cwd":"/srv/other"}`, place))
	if got["cwd"] != "/srv/other" || got["python"] != nil || got["umask"] != nil {
		t.Errorf("an execute that says where it works became %v", got)
	}
	got = decode(mustTrack(t, `{"id":"3","op":"kernels"}`, place))
	if len(got) != 2 {
		t.Errorf("a kernels request became %v", got)
	}
	if got := decode(mustTrack(t, `{"id":"4","op":"execute","code":"1"}`, engine.Place{})); got["cwd"] != nil {
		t.Errorf("a relay over ssh added a place: %v", got)
	}
}

func mustTrack(t *testing.T, line string, place engine.Place) []byte {
	t.Helper()
	out, p := track([]byte(line), placeFields(place))
	if p == nil {
		t.Fatalf("%s was not tracked", line)
	}
	return out
}
