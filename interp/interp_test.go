package interp_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kerneldeck/kerneldeck/interp"
)

// asked is what python3 says its executable is when bash runs it in env:
// the truth Resolve must tell without a process.
func asked(t *testing.T, want string, vars map[string]string, dir string) string {
	t.Helper()
	cmd := exec.Command("bash", "-c", `exec "${1:-python3}" -I -S -c 'import sys; print(sys.executable)'`, "bash", want)
	cmd.Dir = dir
	cmd.Env = os.Environ()
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 in %s with %v: %v: %s", dir, vars, err, out)
	}
	return strings.TrimSpace(string(out))
}

func envOf(vars map[string]string, dir string) interp.Env {
	return interp.Env{Dir: dir, Getenv: func(k string) string {
		if v, ok := vars[k]; ok {
			return v
		}
		return os.Getenv(k)
	}}
}

// pyenvRoot is this machine's pyenv root when python3 on PATH is its shim.
func pyenvRoot(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil || filepath.Base(filepath.Dir(p)) != "shims" {
		t.Skip("python3 on PATH is not a pyenv shim here")
	}
	return filepath.Dir(filepath.Dir(p))
}

func TestResolveSaysWhatPythonRuns(t *testing.T) {
	venv := t.TempDir()
	if out, err := exec.Command("/usr/bin/python3", "-m", "venv", "--without-pip", venv).CombinedOutput(); err != nil {
		t.Fatalf("venv: %v: %s", err, out)
	}
	cases := map[string]map[string]string{
		"the PATH as it is":             {},
		"a venv activated":              {"PATH": venv + "/bin:" + os.Getenv("PATH"), "VIRTUAL_ENV": venv},
		"the system's python3 first":    {"PATH": "/usr/bin:" + os.Getenv("PATH")},
		"a relative PATH entry":         {"PATH": "bin:" + os.Getenv("PATH")},
		"an empty PATH entry (the cwd)": {"PATH": ":" + os.Getenv("PATH")},
	}
	for name, vars := range cases {
		t.Run(name, func(t *testing.T) {
			dir := venv // the relative entries find the venv's bin
			got, err := interp.Resolve("", envOf(vars, dir))
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			want := asked(t, "", vars, dir)
			if !filepath.IsAbs(want) {
				want = filepath.Join(dir, want) // python3 tells a relative PATH entry's as it is
			}
			if got != want {
				t.Fatalf("Resolve says %s, python3 runs %s", got, want)
			}
		})
	}
	t.Run("a path", func(t *testing.T) {
		got, err := interp.Resolve("bin/python3", envOf(nil, venv))
		if err != nil || got != filepath.Join(venv, "bin/python3") {
			t.Fatalf("Resolve(bin/python3) = %q, %v", got, err)
		}
	})
	t.Run("a name on no PATH entry", func(t *testing.T) {
		if _, err := interp.Resolve("python-nosuch", envOf(nil, venv)); !errors.Is(err, interp.ErrNotFound) {
			t.Fatalf("Resolve(python-nosuch): %v, want ErrNotFound", err)
		}
	})
}

func TestResolveFollowsPyenvAsPyenvDoes(t *testing.T) {
	root := pyenvRoot(t)
	versions, _ := os.ReadDir(filepath.Join(root, "versions"))
	var names []string
	for _, v := range versions {
		if _, err := os.Stat(filepath.Join(root, "versions", v.Name(), "bin", "python3")); err == nil {
			names = append(names, v.Name())
		}
	}
	if len(names) < 2 {
		t.Skip("pyenv here has fewer than two versions with a python3")
	}
	first, other := names[0], names[len(names)-1]
	dir := t.TempDir()
	project := filepath.Join(dir, "project", "src")
	if err := os.MkdirAll(project, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "project", ".python-version"), []byte("# pinned\n"+other+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	prefix := other[:strings.LastIndex(other, ".")] // 3.12.1 -> 3.12
	cases := []struct {
		name string
		vars map[string]string
		dir  string
	}{
		{"the global version", map[string]string{"PYENV_VERSION": ""}, dir},
		{"PYENV_VERSION", map[string]string{"PYENV_VERSION": first}, dir},
		{"PYENV_VERSION, a prefix", map[string]string{"PYENV_VERSION": prefix}, dir},
		{"PYENV_VERSION=system", map[string]string{"PYENV_VERSION": "system"}, dir},
		{"a .python-version above the cwd", map[string]string{"PYENV_VERSION": ""}, project},
		{"PYENV_VERSION over .python-version", map[string]string{"PYENV_VERSION": first}, project},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := interp.Resolve("", envOf(c.vars, c.dir))
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			want := asked(t, "", c.vars, c.dir)
			if got != want {
				t.Fatalf("Resolve says %s, the shim runs %s", got, want)
			}
			seen[got] = true
		})
	}
	if len(seen) < 3 {
		t.Fatalf("the cases ran only %d interpreters (%v): the test does not tell versions apart", len(seen), seen)
	}
	t.Run("a version not installed", func(t *testing.T) {
		if got, err := interp.Resolve("", envOf(map[string]string{"PYENV_VERSION": "2.1.nosuch"}, dir)); !errors.Is(err, interp.ErrUnknown) {
			t.Fatalf("Resolve = %q, %v; want ErrUnknown (pyenv fails it in its own words)", got, err)
		}
	})
}
