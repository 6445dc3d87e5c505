package hosttools

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// ListResult is list_files' value.
type ListResult struct {
	Path      string      `json:"path"`
	Entries   []FileEntry `json:"entries"`
	Total     int         `json:"total"` // entries that matched, before the cap
	Truncated bool        `json:"truncated,omitempty"`
}

// FileEntry is one directory entry; Size is set for regular files.
type FileEntry struct {
	Name string `json:"name"`
	Type string `json:"type"` // file, dir, symlink, fifo, socket, device or other
	Size int64  `json:"size"`
}

// WriteResult is write_file's value.
type WriteResult struct {
	Path         string `json:"path"`
	BytesWritten int    `json:"bytes_written"`
}

// readFile returns up to the read cap of a regular file as text, with bytes
// that are not UTF-8 replaced by U+FFFD.
func (b *Builtins) readFile(_ context.Context, call Call) (Result, error) {
	path, err := call.Args.Str("path", "")
	if err != nil {
		return Result{}, err
	}
	offset, err := call.Args.Int("offset", 0)
	if err != nil {
		return Result{}, err
	}
	if offset < 0 {
		return Result{}, fmt.Errorf("offset %d is negative; send a byte offset from the start of the file (0 or more): %w", offset, ErrInvalidArgs)
	}
	maxRead := orDefault(b.ReadLimit, DefaultReadLimit)
	want, err := call.Args.Int("limit", maxRead)
	if err != nil {
		return Result{}, err
	}
	if want < 1 {
		return Result{}, fmt.Errorf("limit %d is too small; send a byte count of at least 1, or leave it out to read up to %d bytes: %w", want, maxRead, ErrInvalidArgs)
	}
	// The cap, not the caller, clipped the read if the caller asked for more
	// or for everything.
	capped := want > maxRead || call.Args.get("limit") == nil
	want = min(want, maxRead)

	f, st, abs, err := b.openRegular(path, os.O_RDONLY)
	if err != nil {
		return Result{}, err
	}
	defer f.Close()
	// Read one byte past what is returned to learn whether more follows
	// (the file may be growing, so its size is only a hint).
	data, err := io.ReadAll(io.NewSectionReader(f, offset, want+1))
	if err != nil {
		return Result{}, fmt.Errorf("read %s: %w", abs, err)
	}
	more := int64(len(data)) > want
	if more {
		data = data[:want]
	}
	n := len(data)
	res := Result{Text: strings.ToValidUTF8(string(data), "\uFFFD")}
	switch {
	case more && capped:
		res.addNote(fmt.Sprintf("clipped at the %d-byte read cap (the file is %d bytes); call read_file again with offset=%d to read on", maxRead, st.Size(), offset+int64(n)))
	case more:
		res.addNote(fmt.Sprintf("returned bytes %d to %d of %d; call read_file with offset=%d to read on", offset, offset+int64(n), st.Size(), offset+int64(n)))
	case n == 0 && offset > 0 && offset >= st.Size():
		res.addNote(fmt.Sprintf("offset %d is at or past the end of the file (%d bytes)", offset, st.Size()))
	}
	return res, nil
}

// openRegular opens path through the workspace root and refuses anything
// but a regular file. O_NONBLOCK keeps a FIFO planted in the workspace from
// blocking the open; the mode check then refuses it.
func (b *Builtins) openRegular(path string, flag int) (*os.File, fs.FileInfo, string, error) {
	rel, abs, err := b.Workspace.rel(path)
	if err != nil {
		return nil, nil, "", err
	}
	f, err := b.Workspace.fs.OpenFile(rel, flag|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		return nil, nil, "", b.openError(path, abs, flag&os.O_CREATE != 0, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, "", fmt.Errorf("stat %s: %w", abs, err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		if st.IsDir() {
			return nil, nil, "", fmt.Errorf("%s is a directory; use list_files for directories", abs)
		}
		return nil, nil, "", fmt.Errorf("%s is not a regular file (it is a %s)", abs, entryType(st.Mode().Type()))
	}
	return f, st, abs, nil
}

// openError words a failed open for the agent. When creating, a missing
// path means a missing directory, which the agent must create
// deliberately. os.Root refusing a path that Resolve accepted means the
// tree changed in between: it failed closed, and the message says so (its
// escape error is unexported, hence the string match, which only affects
// the wording).
func (b *Builtins) openError(path, abs string, creating bool, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist) && creating:
		// Wrap the sentinel, not err: its text names the internal temporary file.
		return fmt.Errorf("directory %s does not exist in the workspace %s; create it first (e.g. terminal: mkdir -p %s): %w",
			filepath.Dir(abs), b.Workspace.root, filepath.Dir(abs), fs.ErrNotExist)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s does not exist (workspace %s): %w", abs, b.Workspace.root, err)
	case strings.Contains(err.Error(), "escapes"):
		return &OutsideError{Path: path, Resolved: abs, Root: b.Workspace.root, Why: "a symlink on the way changed while it was being opened and now leads out: " + err.Error()}
	}
	return fmt.Errorf("open %s: %w", abs, err)
}

// writeFile replaces a file atomically (a private temporary file in the
// same directory, renamed over the target) so no reader ever sees half a
// file, or appends to it. Files are created 0600: kernel code writes into
// the operator's tree and has no business choosing wider permissions. A
// replaced file is a new file, so it is 0600 too. The parent directory must
// exist: the tool never creates directories.
func (b *Builtins) writeFile(_ context.Context, call Call) (Result, error) {
	path, err := call.Args.Str("path", "")
	if err != nil {
		return Result{}, err
	}
	content, err := call.Args.Str("content", "")
	if err != nil {
		return Result{}, err
	}
	appendMode, err := call.Args.Bool("append", false)
	if err != nil {
		return Result{}, err
	}
	if appendMode {
		f, st, abs, err := b.openRegular(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE)
		if err != nil {
			return Result{}, err
		}
		// A hard link planted in the workspace can name a file outside it;
		// appending writes into that file, so a file with another name is
		// refused (replacing it is fine: the rename makes a new file).
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 {
			f.Close()
			return Result{}, fmt.Errorf("%s has %d hard links, and another of them may name a file outside the workspace %s, so appending is refused; write the whole file instead (append false makes a file of its own)",
				abs, sys.Nlink, b.Workspace.root)
		}
		n, werr := f.WriteString(content)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return Result{}, fmt.Errorf("append to %s: %w", abs, werr)
		}
		return Result{Value: WriteResult{Path: abs, BytesWritten: n}}, nil
	}

	rel, abs, err := b.Workspace.rel(path)
	if err != nil {
		return Result{}, err
	}
	if st, err := b.Workspace.fs.Lstat(rel); err == nil && st.IsDir() {
		return Result{}, fmt.Errorf("%s is a directory; send a file path", abs)
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return Result{}, fmt.Errorf("write %s: temporary name: %w", abs, err)
	}
	tmp := filepath.Join(filepath.Dir(rel), ".kerneldeck-tmp-"+hex.EncodeToString(nonce[:]))
	f, err := b.Workspace.fs.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Result{}, b.openError(path, abs, true, err)
	}
	published := false
	defer func() {
		if !published {
			b.Workspace.fs.Remove(tmp) // best effort; the write already failed
		}
	}()
	n, err := f.WriteString(content)
	if err == nil {
		err = f.Chmod(0o600) // the umask can only narrow 0600; this pins it exactly
	}
	if err == nil {
		err = f.Sync() // the rename must not publish a file whose data is still in flight
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Result{}, fmt.Errorf("write %s: %w", abs, err)
	}
	if err := b.Workspace.fs.Rename(tmp, rel); err != nil {
		return Result{}, fmt.Errorf("write %s: publish: %w", abs, err)
	}
	published = true
	return Result{Value: WriteResult{Path: abs, BytesWritten: n}}, nil
}

// listFiles lists one directory, sorted by name and capped.
func (b *Builtins) listFiles(_ context.Context, call Call) (Result, error) {
	path, err := call.Args.Str("path", ".")
	if err != nil {
		return Result{}, err
	}
	pattern, err := call.Args.Str("pattern", "")
	if err != nil {
		return Result{}, err
	}
	if _, err := filepath.Match(pattern, ""); err != nil {
		return Result{}, fmt.Errorf("pattern %q is not a valid glob (%v); send e.g. \"*.py\": %w", pattern, err, ErrInvalidArgs)
	}
	rel, abs, err := b.Workspace.rel(path)
	if err != nil {
		return Result{}, err
	}
	d, err := b.Workspace.fs.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return Result{}, b.openError(path, abs, false, err)
	}
	defer d.Close()
	if st, err := d.Stat(); err != nil {
		return Result{}, fmt.Errorf("stat %s: %w", abs, err)
	} else if !st.IsDir() {
		return Result{}, fmt.Errorf("%s is not a directory; use read_file for files", abs)
	}
	var matched []fs.DirEntry
	for {
		batch, err := d.ReadDir(1024)
		for _, e := range batch {
			if ok, _ := filepath.Match(pattern, e.Name()); pattern == "" || ok {
				matched = append(matched, e)
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(batch) == 0) {
			break
		}
		if err != nil {
			return Result{}, fmt.Errorf("list %s: %w", abs, err)
		}
	}
	slices.SortFunc(matched, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	limit := orDefault(b.ListLimit, DefaultListLimit)
	out := ListResult{Path: abs, Total: len(matched), Entries: make([]FileEntry, 0, min(len(matched), limit))}
	if len(matched) > limit {
		matched, out.Truncated = matched[:limit], true
	}
	for _, e := range matched {
		fe := FileEntry{Name: e.Name(), Type: entryType(e.Type())}
		if fe.Type == "file" {
			// Through the root, not DirEntry.Info, which stats by path string.
			if st, err := b.Workspace.fs.Lstat(filepath.Join(rel, e.Name())); err == nil {
				fe.Size = st.Size()
			}
		}
		out.Entries = append(out.Entries, fe)
	}
	res := Result{Value: out}
	if out.Truncated {
		res.addNote(fmt.Sprintf("showing the first %d of %d entries (sorted by name); narrow the listing with pattern, e.g. \"*.py\", or list a subdirectory", limit, out.Total))
	}
	return res, nil
}

func entryType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m.IsRegular():
		return "file"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "other"
}
