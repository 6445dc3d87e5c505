// Package interp tells which Python interpreter a name runs in an
// environment (its PATH, an activated venv, a pyenv shim and the version
// pyenv would pick from the cwd), as the shell and pyenv would, without
// starting a process: a pyenv shim costs some 60 ms to ask.
package interp

import (
	"bufio"
	"cmp"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrNotFound means the name is on no PATH entry.
var ErrNotFound = errors.New("not found on PATH")

// ErrUnknown means the answer needs a process: a wrapper of a kind this
// package does not read, or a pyenv version it cannot place.
var ErrUnknown = errors.New("cannot tell without running it")

// Env is where a name is resolved: the environment's variables and the
// working directory.
type Env struct {
	Getenv func(string) string
	Dir    string
}

// Here is this process's environment.
func Here() Env {
	dir, _ := os.Getwd()
	return Env{Getenv: os.Getenv, Dir: dir}
}

// Resolve is the interpreter that running want ("" is python3) in env
// executes: a path as it is (made absolute), a name looked up on PATH as
// bash does, and a pyenv shim followed to its version's interpreter. The
// path is not resolved through links: a venv's python is a link whose
// place is what makes it the venv's.
func Resolve(want string, env Env) (string, error) {
	want = cmp.Or(want, "python3")
	if strings.Contains(want, "/") {
		p := want
		if !filepath.IsAbs(p) {
			p = filepath.Join(env.Dir, p)
		}
		return filepath.Clean(p), nil
	}
	found, err := lookPath(want, env.Getenv("PATH"), env.Dir, "")
	if err != nil {
		return "", err
	}
	root, shim, err := pyenvShim(found)
	if err != nil || !shim {
		return found, err
	}
	return pyenvWhich(want, root, filepath.Dir(found), env)
}

// lookPath finds name on path as bash does (an empty entry is the cwd),
// skipping the dir skip.
func lookPath(name, path, cwd, skip string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		if skip != "" && filepath.Clean(dir) == skip {
			continue
		}
		p := filepath.Join(dir, name)
		if executable(p) {
			return p, nil
		}
	}
	return "", ErrNotFound
}

// executable says whether p is a regular file (through links) someone
// may execute.
func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// pyenvShim says whether p is a pyenv shim, and gives pyenv's root from
// it: the script sets PYENV_ROOT and execs that root's libexec/pyenv.
func pyenvShim(p string) (root string, shim bool, err error) {
	if filepath.Base(filepath.Dir(p)) != "shims" {
		return "", false, nil
	}
	f, err := os.Open(p)
	if err != nil {
		return "", false, nil
	}
	defer f.Close()
	head, _ := io.ReadAll(io.LimitReader(f, 2048))
	if !strings.HasPrefix(string(head), "#!") || !strings.Contains(string(head), "libexec/pyenv") {
		return "", false, nil
	}
	sc := bufio.NewScanner(strings.NewReader(string(head)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(line, "export PYENV_ROOT="); ok {
			if v, err := strconv.Unquote(v); err == nil && filepath.IsAbs(v) {
				return filepath.Clean(v), true, nil
			}
		}
	}
	return "", true, ErrUnknown // a shim, but of a pyenv this package does not read
}

// pyenvWhich is what `pyenv which name` says: the first of the selected
// versions that has name, "system" being the PATH without the shims.
func pyenvWhich(name, root, shims string, env Env) (string, error) {
	if env.Getenv("PYENV_ROOT") != "" && filepath.Clean(env.Getenv("PYENV_ROOT")) != root {
		return "", ErrUnknown // the shim hands over to another root's pyenv
	}
	if hooked(root, env) {
		return "", ErrUnknown
	}
	versions, err := pyenvVersions(root, env)
	if err != nil {
		return "", err
	}
	for _, v := range append(versions, "system") {
		if v == "system" {
			if p, err := lookPath(name, env.Getenv("PATH"), env.Dir, shims); err == nil {
				return p, nil
			}
			continue
		}
		dir, ok := installed(root, v)
		if !ok {
			return "", ErrUnknown // pyenv says so in its own words
		}
		if p := filepath.Join(dir, "bin", name); executable(p) {
			return p, nil
		}
	}
	return "", ErrUnknown
}

// hooked says whether a pyenv plugin or setting may change which version
// is picked (version-name hooks), or where the shims hand over.
func hooked(root string, env Env) bool {
	if env.Getenv("PYENV_HOOK_PATH") != "" || env.Getenv("_PYENV_SHIM_PATH") != "" {
		return true
	}
	dirs := []string{filepath.Join(root, "pyenv.d"), "/usr/local/etc/pyenv.d", "/etc/pyenv.d", "/usr/lib/pyenv/hooks"}
	plugins, _ := filepath.Glob(filepath.Join(root, "plugins", "*", "etc", "pyenv.d"))
	for _, d := range append(dirs, plugins...) {
		if _, err := os.Stat(filepath.Join(d, "version-name")); err == nil {
			return true
		}
	}
	return false
}

// pyenvVersions are the versions pyenv selects: PYENV_VERSION, else the
// nearest .python-version from PYENV_DIR (the cwd) up, else the global
// version file; none is "system".
func pyenvVersions(root string, env Env) ([]string, error) {
	if v := env.Getenv("PYENV_VERSION"); v != "" {
		return strings.Split(v, ":"), nil
	}
	file := ""
	for _, start := range slices.Compact([]string{cmp.Or(env.Getenv("PYENV_DIR"), env.Dir), env.Dir}) {
		if file = versionFile(start); file != "" {
			break
		}
	}
	if file == "" {
		file = filepath.Join(root, "version")
	}
	data, err := os.ReadFile(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return []string{"system"}, nil
		}
		return nil, ErrUnknown
	}
	var versions []string
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if f[0] == ".." || strings.Contains(f[0], "/") {
			return nil, ErrUnknown // pyenv checks these against its versions dir
		}
		versions = append(versions, f[0])
	}
	if len(versions) == 0 {
		return []string{"system"}, nil
	}
	return versions, nil
}

// versionFile is the nearest .python-version from dir up, or "".
func versionFile(dir string) string {
	if !filepath.IsAbs(dir) {
		return ""
	}
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		p := filepath.Join(d, ".python-version")
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
		if d == "/" {
			return ""
		}
	}
}

// installed is version's dir under root's versions, as pyenv names it:
// the version, without a "python-" prefix, or the latest release whose
// number it begins ("3.11" is the newest 3.11.x).
func installed(root, v string) (string, bool) {
	versions := filepath.Join(root, "versions")
	for _, name := range []string{v, strings.TrimPrefix(v, "python-")} {
		if st, err := os.Stat(filepath.Join(versions, name)); err == nil && st.IsDir() && name != "" && !strings.Contains(name, "/") {
			return filepath.Join(versions, name), true
		}
	}
	entries, err := os.ReadDir(versions)
	if err != nil {
		return "", false
	}
	prefix := strings.TrimPrefix(v, "python-")
	best, bestNums := "", []int(nil)
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix+".")
		if !ok || !e.IsDir() {
			continue
		}
		nums, ok := release(rest)
		if ok && slices.Compare(nums, bestNums) > 0 {
			best, bestNums = e.Name(), nums
		}
	}
	if best == "" {
		return "", false
	}
	return filepath.Join(versions, best), true
}

// release reads "11.7" as [11 7]; a name with anything but numbers and
// dots (a pre-release, -dev, a free-threaded t) is not a release.
func release(s string) ([]int, bool) {
	var nums []int
	for part := range strings.SplitSeq(s, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil, false
		}
		nums = append(nums, n)
	}
	return nums, true
}
