package runner

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// configLine is the config line a spawn ends the runner's stdin with.
func configLine(secret string) string {
	return `{"secret": "` + secret + `", "idle_exit": 60}` + "\n"
}

// Started as a spawn starts it, the runner's bootstrap writes runner.py
// (0600) and the runner makes its private dirs (0700) and FIFOs (0600),
// then lets go of the ready pipe: after READY the pipe ends, so nothing a
// cell starts can hold it. The bootstrap marks the dir as made by it
// (<root>/.made-<id>, 0600), for the spawn's watcher. A cell sees sys.argv
// as under "python3 <dir>/runner.py", its dir first on sys.path and the cwd
// last.
func TestRunnerSetsUpItsDir(t *testing.T) {
	secret := strings.Repeat("ab", 32)
	line, _, kd, ready := startShippedPipe(t, shipment{script: Source}, configLine(secret))
	if !strings.HasPrefix(line, "READY ") {
		t.Fatalf("ready pipe: %q, want READY ...", line)
	}
	if more, err := ready.ReadString('\n'); !errors.Is(err, io.EOF) || more != "" {
		t.Fatalf("after READY the ready pipe gave %q, %v; want its end", more, err)
	}
	for name, want := range map[string]os.FileMode{
		"runner.py": 0o600, "cells": os.ModeDir | 0o700, "rpc": os.ModeDir | 0o700,
		"wake": os.ModeNamedPipe | 0o600, "done": os.ModeNamedPipe | 0o600,
	} {
		if st, err := os.Lstat(filepath.Join(kd, name)); err != nil || st.Mode() != want {
			t.Errorf("%s: %v %v, want %v", name, st.Mode(), err, want)
		}
	}
	mark := filepath.Join(filepath.Dir(kd), ".made-"+filepath.Base(kd))
	if st, err := os.Lstat(mark); err != nil || st.Mode() != 0o600 {
		t.Errorf("the mark %s: %v %v, want a 0600 file", mark, st, err)
	}
	if got, err := os.ReadFile(filepath.Join(kd, "runner.py")); err != nil || string(got) != string(Source) {
		t.Errorf("runner.py is not what was shipped (%d bytes, %v)", len(got), err)
	}
	c, br := dialAuthed(t, kd, secret)
	e := &engineSide{t: t, c: c, br: br, kd: kd, secret: secret}
	e.write(cellFrame("argv", "import sys\nprint(sys.argv)\nprint(sys.path[0], sys.path[-1] == '', sys.path.count(''))"))
	want := "['" + filepath.Join(kd, "runner.py") + "']\n" + kd + " True 1\n"
	if f, _ := e.result(); f.Status != "ok" || f.Stdout != want {
		t.Fatalf("a cell's argv and path: %s %q %s; want %q", f.Status, f.Stdout, f.Traceback, want)
	}
}

// What a runner cannot set up fails its start with the cause, told on the
// ready pipe, and it exits 2: runner.py cut short or without a size, a
// planted private dir (never written through), a kernel root of another
// user. A kernel dir already there (planted, or a link) is never used: the
// bootstrap says NODIR and exits 75, and does not mark it as made, so that
// the spawn's watcher leaves it alone. A root open to others is put right
// (mode 700).
func TestRunnerRefusesADirItCannotMakePrivate(t *testing.T) {
	config := configLine(strings.Repeat("ab", 32))
	elsewhere := t.TempDir()
	link := func(name string) func(kd string) {
		return func(kd string) {
			if err := os.Symlink(elsewhere, filepath.Join(kd, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		s      shipment
		want   string
		root   bool // needs root (chown)
		status int
	}{
		{"runner.py cut short", shipment{script: Source, scriptSize: strconv.Itoa(len(Source) + 100)},
			"FAILED runner.py was cut short: ", false, 2},
		{"no size for runner.py", shipment{script: Source, scriptSize: "x"}, "FAILED no size for runner.py in KERNELDECK_STDIN", false, 2},
		{"a kernel dir already there", shipment{script: Source, plant: func(kd string) {
			if err := os.Mkdir(kd, 0o700); err != nil {
				t.Fatal(err)
			}
		}}, "NODIR cannot create kernel dir ", false, 75},
		{"a planted kernel dir", shipment{script: Source, plant: func(kd string) {
			if err := os.Symlink(elsewhere, kd); err != nil {
				t.Fatal(err)
			}
		}}, "NODIR cannot create kernel dir ", false, 75},
		{"a planted private dir", shipment{script: Source, inDir: true, plant: link("cells")}, "FAILED cannot create private dirs under ", false, 2},
		{"a root of another user", shipment{script: Source, plant: func(kd string) {
			if err := os.Chown(filepath.Dir(kd), 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}}, "FAILED ", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("needs root to give a dir away")
			}
			line, cmd, kd := startShipped(t, tc.s, config)
			if !strings.HasPrefix(line, tc.want) {
				t.Fatalf("ready pipe: %q, want %q...", line, tc.want)
			}
			if err := cmd.Wait(); !isExit(err, tc.status) {
				t.Fatalf("the runner ended with %v, want exit status %d", err, tc.status)
			}
			if tc.status == 75 { // the dir, or where its link leads, stays as it was: empty
				if entries, err := os.ReadDir(kd); err != nil || len(entries) != 0 {
					t.Fatalf("the runner used a kernel dir that was already there: %v %v", entries, err)
				}
				if _, err := os.Lstat(filepath.Join(filepath.Dir(kd), ".made-"+filepath.Base(kd))); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("a kernel dir already there was marked as made by the spawn: %v", err)
				}
			}
		})
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("the runner wrote through a planted link: %v", entries)
	}
	// A root open to its group is made owner-only, and the runner starts.
	line, _, kd := startShipped(t, shipment{script: Source, plant: func(kd string) {
		if err := os.Chmod(filepath.Dir(kd), 0o750); err != nil {
			t.Fatal(err)
		}
	}}, config)
	if st, err := os.Stat(filepath.Dir(kd)); !strings.HasPrefix(line, "READY ") || err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("a root open to its group: %q, root %v %v; want READY and 0700", line, st.Mode(), err)
	}
}

// compiledFor is the runner compiled by python (CompileProgram's code).
func compiledFor(t *testing.T, python string) []byte {
	t.Helper()
	compile := exec.Command(python, "-I", "-S", "-c", CompileProgram, strconv.Itoa(len(Source)))
	compile.Stdin = bytes.NewReader(Source)
	out, err := compile.Output()
	first, _, _ := strings.Cut(string(out), "\n")
	line, ok := strings.CutPrefix(first, "KD:CODE ")
	code, derr := base64.StdEncoding.DecodeString(line)
	if err != nil || !ok || derr != nil {
		t.Fatalf("compile with %s: %v %v: %.200q", python, err, derr, out)
	}
	return code
}

// The start leaves the interpreter as lean as a bare one: compile() would set
// up the AST's 119 Python types (~0.2 MB) in every kernel, so the loader
// is run without it and the source compiled through the C API. Checked on
// python3 from PATH and on /usr/bin/python3 where it exists (pyenv's 3.11
// makes the types at start, so only an interpreter that does not can tell).
func TestRunnerStartLeavesTheASTAlone(t *testing.T) {
	const probe = "import gc, sys\nprint(sum(isinstance(o, type) and o.__module__ == 'ast' for o in gc.get_objects()), '_ast' in sys.modules)"
	pythons := []string{"python3"}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		pythons = append(pythons, "/usr/bin/python3")
	}
	secret := strings.Repeat("ab", 32)
	for _, python := range pythons {
		bare, err := exec.Command(python, "-I", "-c", probe).Output()
		if err != nil {
			t.Fatalf("a bare %s: %v", python, err)
		}
		for _, s := range []shipment{
			{script: Source, python: python},
			{script: Loader, code: compiledFor(t, python), python: python},
		} {
			line, _, kd := startShipped(t, s, configLine(secret))
			if !strings.HasPrefix(line, "READY ") {
				t.Fatalf("%s: ready pipe: %q, want READY ...", python, line)
			}
			c, br := dialAuthed(t, kd, secret)
			e := &engineSide{t: t, c: c, br: br, kd: kd, secret: secret}
			e.write(cellFrame("probe", probe))
			f, _ := e.result()
			types, ast := astProbe(t, f.Stdout)
			bareTypes, bareAST := astProbe(t, string(bare))
			if types > bareTypes || (ast && !bareAST) {
				t.Errorf("%s, shipped compiled %v: AST types and _ast %q, more than a bare interpreter's %q", python, s.code != nil, f.Stdout, bare)
			}
		}
	}
}

// astProbe reads what the AST probe printed: how many of the AST's types
// exist, and whether _ast is loaded.
func astProbe(t *testing.T, out string) (types int, loaded bool) {
	t.Helper()
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("the AST probe printed %q", out)
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatalf("the AST probe printed %q", out)
	}
	return n, f[1] == "True"
}
