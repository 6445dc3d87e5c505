package hosttools

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestNewWorkspace(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "file"), "x")
	if err := os.Mkdir(filepath.Join(dir, "real"), 0o700); err != nil {
		t.Fatal(err)
	}
	symlink(t, "real", filepath.Join(dir, "alias"))

	if _, err := NewWorkspace(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing dir was accepted")
	} else {
		mustContain(t, "error", err.Error(), "does not exist", "missing")
	}
	if _, err := NewWorkspace(filepath.Join(dir, "file")); err == nil {
		t.Error("a file was accepted")
	} else {
		mustContain(t, "error", err.Error(), "is not a directory")
	}
	if _, err := NewWorkspace(""); err == nil {
		t.Error("an empty dir was accepted")
	}
	w, err := NewWorkspace(filepath.Join(dir, "alias"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	real, _ := filepath.EvalSymlinks(filepath.Join(dir, "real"))
	if w.Root() != real {
		t.Errorf("Root = %s, want the resolved %s", w.Root(), real)
	}
}

// confinedTree builds a workspace with symlinks in and out of it:
//
//	ws/a.txt, ws/sub/b.txt
//	ws/in_link     -> a.txt          (relative, inside)
//	ws/in_abs      -> <ws>/sub       (absolute, inside)
//	ws/etc_link    -> /etc
//	ws/passwd_link -> /etc/passwd
//	ws/out_dir     -> <outside>      (a directory outside)
//	ws/dangling    -> <outside>/new  (dangling, outside)
//	outside/secret.txt
func confinedTree(t *testing.T) (w *Workspace, alias, outside string) {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws, outside := filepath.Join(base, "ws"), filepath.Join(base, "outside")
	writeFile(t, filepath.Join(ws, "a.txt"), "A")
	writeFile(t, filepath.Join(ws, "sub", "b.txt"), "B")
	writeFile(t, filepath.Join(outside, "secret.txt"), "SECRET")
	symlink(t, "a.txt", filepath.Join(ws, "in_link"))
	symlink(t, filepath.Join(ws, "sub"), filepath.Join(ws, "in_abs"))
	symlink(t, "/etc", filepath.Join(ws, "etc_link"))
	symlink(t, "/etc/passwd", filepath.Join(ws, "passwd_link"))
	symlink(t, outside, filepath.Join(ws, "out_dir"))
	symlink(t, filepath.Join(outside, "new"), filepath.Join(ws, "dangling"))
	alias = filepath.Join(base, "alias")
	symlink(t, "ws", alias)
	w, err = NewWorkspace(ws)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, alias, outside
}

func TestResolveConfinement(t *testing.T) {
	w, alias, outside := confinedTree(t)
	root := w.Root()
	tests := []struct {
		path    string
		want    string // resolved path when allowed
		outside bool   // refused as outside the workspace
		invalid bool   // refused as a malformed argument
		why     string // part of the refusal's reason
	}{
		{path: "a.txt", want: root + "/a.txt"},
		{path: "sub/../a.txt", want: root + "/a.txt"},
		{path: ".", want: root},
		{path: root + "/sub/b.txt", want: root + "/sub/b.txt"},
		{path: alias + "/a.txt", want: root + "/a.txt"}, // absolute via the unresolved root
		{path: "in_link", want: root + "/a.txt"},
		{path: "in_abs/b.txt", want: root + "/sub/b.txt"},
		{path: "new/dir/file.txt", want: root + "/new/dir/file.txt"},
		{path: "../x", outside: true, why: `".." climbs out of it`},
		{path: "sub/../../x", outside: true, why: `".." climbs out of it`},
		{path: "/etc/passwd", outside: true, why: "it is not under the workspace root"},
		{path: root + "/../outside/secret.txt", outside: true},
		{path: "etc_link", outside: true},
		{path: "etc_link/passwd", outside: true, why: "(it leads to /etc/passwd): a symlink on the way leads out"},
		{path: "passwd_link", outside: true},
		{path: "out_dir", outside: true},
		{path: "out_dir/secret.txt", outside: true},
		{path: "out_dir/not_yet", outside: true},
		{path: "dangling", outside: true, why: "(it leads to " + outside + "/new)"},
		{path: "", invalid: true},
		{path: "a\x00b", invalid: true},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			got, err := w.Resolve(tc.path)
			switch {
			case tc.outside:
				if !errors.Is(err, ErrOutsideWorkspace) {
					t.Fatalf("Resolve(%q) = %q, %v; want it refused as outside", tc.path, got, err)
				}
				mustContain(t, "error", err.Error(), `"`+tc.path+`"`, "outside the workspace "+root, tc.why)
			case tc.invalid:
				if !errors.Is(err, ErrInvalidArgs) {
					t.Fatalf("Resolve(%q) = %q, %v; want ErrInvalidArgs", tc.path, got, err)
				}
			case err != nil:
				t.Fatalf("Resolve(%q): %v", tc.path, err)
			case got != tc.want:
				t.Fatalf("Resolve(%q) = %q, want %q", tc.path, got, tc.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Error("resolving created something outside")
	}
}

// The tools refuse what Resolve refuses, and nothing outside is read,
// created or listed through a symlink.
func TestToolsStayInWorkspace(t *testing.T) {
	w, _, outside := confinedTree(t)
	r := newBuiltins(t, &Builtins{Workspace: w})
	calls := []struct {
		tool string
		args map[string]any
	}{
		{"read_file", map[string]any{"path": "etc_link/passwd"}},
		{"read_file", map[string]any{"path": "out_dir/secret.txt"}},
		{"read_file", map[string]any{"path": "/etc/passwd"}},
		{"read_file", map[string]any{"path": "../outside/secret.txt"}},
		{"write_file", map[string]any{"path": "out_dir/planted", "content": "x"}},
		{"write_file", map[string]any{"path": "dangling", "content": "x"}},
		{"write_file", map[string]any{"path": "dangling", "content": "x", "append": true}},
		{"write_file", map[string]any{"path": "out_dir/secret.txt", "content": "x", "append": true}},
		{"list_files", map[string]any{"path": "out_dir"}},
		{"list_files", map[string]any{"path": "etc_link"}},
		{"terminal", map[string]any{"command": "pwd", "cwd": "out_dir"}},
		{"terminal", map[string]any{"command": "pwd", "cwd": "../"}},
	}
	for _, c := range calls {
		res, err := dispatch(t, r, c.tool, c.args)
		if !errors.Is(err, ErrOutsideWorkspace) {
			t.Errorf("%s %v = %+v, %v; want refused as outside the workspace", c.tool, c.args, res, err)
		}
	}
	entries, _ := os.ReadDir(outside)
	if len(entries) != 1 {
		t.Errorf("the outside dir now holds %d entries, want only secret.txt", len(entries))
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(b) != "SECRET" {
		t.Errorf("secret.txt was changed to %q", b)
	}
}
