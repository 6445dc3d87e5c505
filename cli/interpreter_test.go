package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
