package hosttools

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Workspace is the directory tree the file tools and terminal are confined
// to. Resolve checks a path (for a clear message); the tools then open it
// through an os.Root held since construction, so a directory swapped for a
// symlink between the check and the open makes the open fail instead of
// leading out.
type Workspace struct {
	root string   // absolute, symlink-free
	fs   *os.Root // opened at construction; confines every file operation
}

// ErrOutsideWorkspace is matched (errors.Is) by every refusal of a path
// that leads out of the workspace.
var ErrOutsideWorkspace = errors.New("path is outside the workspace")

// OutsideError says which path was refused, where it led and why.
type OutsideError struct {
	Path     string // as the caller sent it
	Resolved string // where it leads, "" if the refusal was lexical
	Root     string
	Why      string
}

func (e *OutsideError) Error() string {
	where := ""
	if e.Resolved != "" && e.Resolved != e.Path {
		where = fmt.Sprintf(" (it leads to %s)", e.Resolved)
	}
	return fmt.Sprintf("path %q is outside the workspace %s%s: %s; use a path relative to the workspace or an absolute path inside it",
		e.Path, e.Root, where, e.Why)
}

// Unwrap makes errors.Is(err, ErrOutsideWorkspace) true.
func (e *OutsideError) Unwrap() error { return ErrOutsideWorkspace }

// NewWorkspace opens dir as the workspace root, resolved to an absolute,
// symlink-free path. It fails if dir does not exist or is not a directory.
func NewWorkspace(dir string) (*Workspace, error) {
	if dir == "" {
		return nil, errors.New("workspace: no directory given")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("workspace %s: make the path absolute: %w", dir, err)
	}
	root, err := filepath.EvalSymlinks(abs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("workspace %s does not exist; create it or pass an existing directory: %w", abs, err)
		}
		return nil, fmt.Errorf("workspace %s: resolve symlinks: %w", abs, err)
	}
	st, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("workspace %s: %w", root, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("workspace %s is not a directory", root)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("workspace %s: open: %w", root, err)
	}
	return &Workspace{root: root, fs: r}, nil
}

// Root returns the workspace's absolute, symlink-free path.
func (w *Workspace) Root() string { return w.root }

// Close releases the workspace's directory handle.
func (w *Workspace) Close() error { return w.fs.Close() }

// Resolve maps a path argument to an absolute, symlink-free path inside
// the workspace. Relative paths are relative to the root; absolute paths
// must lead inside it (possibly through a symlink, e.g. the path the
// operator gave before resolution). A ".." that climbs out of the root, an
// absolute path elsewhere and a symlink leading out are refused with an
// *OutsideError. The path need not exist.
func (w *Workspace) Resolve(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("path is empty; send a path relative to the workspace %s: %w", w.root, ErrInvalidArgs)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path %q contains a NUL byte: %w", p, ErrInvalidArgs)
	}
	abs := filepath.Clean(p)
	if !filepath.IsAbs(p) {
		abs = filepath.Join(w.root, p)
		if !within(w.root, abs) {
			return "", &OutsideError{Path: p, Root: w.root, Why: `".." climbs out of it`}
		}
	}
	real, err := evalExisting(abs, 0)
	if err != nil {
		return "", fmt.Errorf("resolve path %q in the workspace %s: %w", p, w.root, err)
	}
	if !within(w.root, real) {
		why := "it is not under the workspace root"
		if real != abs {
			why = "a symlink on the way leads out of the workspace"
		}
		return "", &OutsideError{Path: p, Resolved: real, Root: w.root, Why: why}
	}
	return real, nil
}

// rel resolves p and returns it relative to the root, for the os.Root
// methods, together with the absolute path for messages and results.
func (w *Workspace) rel(p string) (rel, abs string, err error) {
	abs, err = w.Resolve(p)
	if err != nil {
		return "", "", err
	}
	rel, err = filepath.Rel(w.root, abs)
	if err != nil {
		return "", "", fmt.Errorf("path %q relative to the workspace %s: %w", p, w.root, err)
	}
	return rel, abs, nil
}

func within(root, p string) bool {
	return p == root || root == "/" || strings.HasPrefix(p, root+string(filepath.Separator))
}

// maxSymlinkHops matches Linux's limit on symlinks followed in one lookup.
const maxSymlinkHops = 40

// evalExisting is filepath.EvalSymlinks for a path whose tail may not exist
// yet (a file about to be written): it resolves the longest existing prefix
// and appends the rest. A dangling symlink is followed to where it points,
// because creating a file through it would create the target.
func evalExisting(p string, hops int) (string, error) {
	real, err := filepath.EvalSymlinks(p)
	if err == nil {
		return real, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if fi, lerr := os.Lstat(p); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if hops >= maxSymlinkHops {
			return "", fmt.Errorf("%s: %w", p, syscall.ELOOP)
		}
		target, err := os.Readlink(p)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		return evalExisting(filepath.Clean(target), hops+1)
	}
	dir := filepath.Dir(p)
	if dir == p {
		return p, nil
	}
	parent, err := evalExisting(dir, hops)
	if err != nil {
		return "", err
	}
	return filepath.Join(parent, filepath.Base(p)), nil
}
