package hosttools

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

func TestReadFile(t *testing.T) {
	w := newTestWorkspace(t)
	root := w.Root()
	writeFile(t, filepath.Join(root, "hello.txt"), "hello, world")
	writeFile(t, filepath.Join(root, "bad.txt"), "ok\xff\xfe")
	writeFile(t, filepath.Join(root, "ten.txt"), "0123456789")
	if err := os.Mkdir(filepath.Join(root, "dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := newBuiltins(t, &Builtins{Workspace: w, ReadLimit: 4})
	tests := []struct {
		name    string
		args    map[string]any
		text    string
		note    string // substring of the note; "" means no note
		errWant string
	}{
		{name: "whole small file", args: map[string]any{"path": "ten.txt", "limit": 4}, text: "0123", note: "returned bytes 0 to 4 of 10; call read_file with offset=4"},
		{name: "offset and limit", args: map[string]any{"path": "ten.txt", "offset": 8, "limit": 2}, text: "89"},
		{name: "clipped at the cap", args: map[string]any{"path": "hello.txt", "limit": 100}, text: "hell", note: "clipped at the 4-byte read cap (the file is 12 bytes); call read_file again with offset=4"},
		{name: "cap without a limit", args: map[string]any{"path": "hello.txt", "offset": 2}, text: "llo,", note: "clipped at the 4-byte read cap (the file is 12 bytes); call read_file again with offset=6"},
		{name: "rest of the file", args: map[string]any{"path": "hello.txt", "offset": 8}, text: "orld"},
		{name: "past the end", args: map[string]any{"path": "ten.txt", "offset": 99}, text: "", note: "past the end of the file (10 bytes)"},
		{name: "invalid utf-8 replaced", args: map[string]any{"path": "bad.txt"}, text: "ok\uFFFD"},
		{name: "directory", args: map[string]any{"path": "dir"}, errWant: "is a directory; use list_files"},
		{name: "fifo does not block", args: map[string]any{"path": "fifo"}, errWant: "not a regular file (it is a fifo)"},
		{name: "missing", args: map[string]any{"path": "nope.txt"}, errWant: "nope.txt does not exist"},
		{name: "negative offset", args: map[string]any{"path": "ten.txt", "offset": -1}, errWant: "offset -1 is negative"},
		{name: "zero limit", args: map[string]any{"path": "ten.txt", "limit": 0}, errWant: "limit 0 is too small"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := dispatch(t, r, "read_file", tc.args)
			if tc.errWant != "" {
				if err == nil {
					t.Fatalf("read_file %v = %+v, want an error", tc.args, res)
				}
				mustContain(t, "error", err.Error(), tc.errWant)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Text != tc.text {
				t.Errorf("text = %q, want %q", res.Text, tc.text)
			}
			if tc.note == "" && res.Note != "" {
				t.Errorf("unexpected note %q", res.Note)
			}
			mustContain(t, "note", res.Note, tc.note)
		})
	}
}

func TestReadFileDefaultCap(t *testing.T) {
	w := newTestWorkspace(t)
	writeFile(t, filepath.Join(w.Root(), "big"), strings.Repeat("x", DefaultReadLimit+10))
	r := newBuiltins(t, &Builtins{Workspace: w})
	res, err := dispatch(t, r, "read_file", map[string]any{"path": "big"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Text) != 1<<20 {
		t.Errorf("read %d bytes, want the 1 MiB cap", len(res.Text))
	}
	mustContain(t, "note", res.Note, "clipped at the 1048576-byte read cap", fmt.Sprintf("offset=%d", 1<<20))
}

func TestWriteFile(t *testing.T) {
	w := newTestWorkspace(t)
	root := w.Root()
	r := newBuiltins(t, &Builtins{Workspace: w})
	writeFile(t, filepath.Join(root, "old.txt"), "old contents")
	writeFile(t, filepath.Join(root, "target.txt"), "T")
	symlink(t, "target.txt", filepath.Join(root, "link"))

	// A restrictive umask must not leave a new file unreadable by its owner:
	// the tool pins 0600 rather than trusting the umask.
	old := syscall.Umask(0o277)
	res, err := dispatch(t, r, "write_file", map[string]any{"path": "new.txt", "content": "héllo"})
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	if wr, ok := res.Value.(WriteResult); !ok || wr.BytesWritten != len("héllo") || wr.Path != filepath.Join(root, "new.txt") {
		t.Errorf("value = %+v", res.Value)
	}

	for _, c := range []map[string]any{
		{"path": "old.txt", "content": "new contents"}, // replacing a 0644 file makes it private too
		{"path": "app.txt", "content": "a", "append": true},
		{"path": "app.txt", "content": "b", "append": true},
		{"path": "link", "content": "through the link"},
	} {
		if _, err := dispatch(t, r, "write_file", c); err != nil {
			t.Fatalf("write_file %v: %v", c, err)
		}
	}
	for name, want := range map[string]string{"new.txt": "héllo", "old.txt": "new contents", "app.txt": "ab", "target.txt": "through the link"} {
		p := filepath.Join(root, name)
		b, err := os.ReadFile(p)
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", name, b, err, want)
		}
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %v, %v; want 0600", name, st.Mode().Perm(), err)
		}
	}
	if st, err := os.Lstat(filepath.Join(root, "link")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Error("writing through a symlink replaced the symlink")
	}
	noTempFiles(t, root)

	_, err = dispatch(t, r, "write_file", map[string]any{"path": "no/such/dir/f.txt", "content": "x"})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("write into a missing dir: err = %v, want ErrNotExist", err)
	}
	mustContain(t, "error", err.Error(), "directory "+root+"/no/such/dir does not exist", "create it first")
	if _, err := os.Stat(filepath.Join(root, "no")); !errors.Is(err, os.ErrNotExist) {
		t.Error("write_file created a directory")
	}
	if _, err := dispatch(t, r, "write_file", map[string]any{"path": ".", "content": "x"}); err == nil {
		t.Error("writing over the workspace root succeeded")
	}
	noTempFiles(t, root)
}

// TestWriteFileAtomic overwrites a file over and over while a reader keeps
// reading it: every read must see one whole version, never an empty,
// partial or mixed file.
func TestWriteFileAtomic(t *testing.T) {
	w := newTestWorkspace(t)
	r := newBuiltins(t, &Builtins{Workspace: w})
	path := filepath.Join(w.Root(), "f")
	versions := []string{strings.Repeat("a", 64<<10), strings.Repeat("b", 64<<10)}
	writeFile(t, path, versions[0])

	stop := make(chan struct{})
	var bad []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			b, err := os.ReadFile(path)
			if err != nil || (!bytes.Equal(b, []byte(versions[0])) && !bytes.Equal(b, []byte(versions[1]))) {
				bad = append(bad, fmt.Sprintf("read %d bytes (err %v)", len(b), err))
				return
			}
		}
	}()
	for i := range 50 {
		if _, err := dispatch(t, r, "write_file", map[string]any{"path": "f", "content": versions[i%2]}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("a reader saw a partial file: %v", bad)
	}
	noTempFiles(t, w.Root())
}

func TestListFiles(t *testing.T) {
	w := newTestWorkspace(t)
	root := w.Root()
	writeFile(t, filepath.Join(root, "b.py"), "12345")
	writeFile(t, filepath.Join(root, "a.txt"), "1")
	writeFile(t, filepath.Join(root, "sub", "c.py"), "")
	symlink(t, "a.txt", filepath.Join(root, "link"))
	r := newBuiltins(t, &Builtins{Workspace: w})

	res, err := dispatch(t, r, "list_files", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := res.Value.(ListResult)
	want := []FileEntry{{"a.txt", "file", 1}, {"b.py", "file", 5}, {"link", "symlink", 0}, {"sub", "dir", 0}}
	if fmt.Sprint(got.Entries) != fmt.Sprint(want) || got.Total != 4 || got.Truncated || got.Path != root {
		t.Errorf("list_files = %+v, want entries %v", got, want)
	}

	res, err = dispatch(t, r, "list_files", map[string]any{"pattern": "*.py"})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Value.(ListResult).Entries; len(got) != 1 || got[0].Name != "b.py" {
		t.Errorf("pattern *.py = %v", got)
	}
	res, err = dispatch(t, r, "list_files", map[string]any{"path": "sub"})
	if err != nil || res.Value.(ListResult).Entries[0].Name != "c.py" {
		t.Errorf("list sub = %+v, %v", res, err)
	}
	if _, err := dispatch(t, r, "list_files", map[string]any{"pattern": "[a"}); !errors.Is(err, ErrInvalidArgs) {
		t.Errorf("bad pattern: err = %v", err)
	}
	if _, err := dispatch(t, r, "list_files", map[string]any{"path": "a.txt"}); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("listing a file: err = %v", err)
	}
}

func TestListFilesCap(t *testing.T) {
	w := newTestWorkspace(t)
	for i := range 12 {
		writeFile(t, filepath.Join(w.Root(), fmt.Sprintf("f%02d", i)), "")
	}
	r := newBuiltins(t, &Builtins{Workspace: w, ListLimit: 5})
	res, err := dispatch(t, r, "list_files", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := res.Value.(ListResult)
	if len(got.Entries) != 5 || got.Entries[4].Name != "f04" || got.Total != 12 || !got.Truncated {
		t.Errorf("capped list = %+v", got)
	}
	mustContain(t, "note", res.Note, "showing the first 5 of 12 entries", "pattern")
}

func TestListFilesDefaultCap(t *testing.T) {
	w := newTestWorkspace(t)
	// Hard links of one file: creating 10,001 files is slow on some disks.
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, "x")
	for i := range DefaultListLimit + 1 {
		if err := os.Link(src, filepath.Join(w.Root(), fmt.Sprintf("f%05d", i))); err != nil {
			t.Fatal(err)
		}
	}
	r := newBuiltins(t, &Builtins{Workspace: w})
	res, err := dispatch(t, r, "list_files", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Value.(ListResult); len(got.Entries) != 10000 || got.Total != 10001 || !got.Truncated {
		t.Errorf("default cap: %d entries of %d, truncated %v; want 10000 of 10001", len(got.Entries), got.Total, got.Truncated)
	}
}

// TestAppendRefusesHardLinks: a hard link planted in the workspace names a
// file outside it; appending through it is refused and the outside file
// stays as it was, while replacing the link makes a file of its own.
func TestAppendRefusesHardLinks(t *testing.T) {
	w := newTestWorkspace(t)
	root := w.Root()
	r := newBuiltins(t, &Builtins{Workspace: w})
	outside := filepath.Join(t.TempDir(), "outside.txt")
	writeFile(t, outside, "outside")
	if err := os.Link(outside, filepath.Join(root, "planted")); err != nil {
		t.Skipf("cannot make a hard link across these dirs: %v", err)
	}
	_, err := dispatch(t, r, "write_file", map[string]any{"path": "planted", "content": " pwned", "append": true})
	if err == nil || !strings.Contains(err.Error(), "2 hard links") {
		t.Fatalf("append through a hard link: %v, want a refusal naming the links", err)
	}
	if _, err := dispatch(t, r, "write_file", map[string]any{"path": "planted", "content": "mine"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "outside" {
		t.Errorf("the outside file was changed through the link: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "planted")); string(b) != "mine" {
		t.Errorf("the replaced file holds %q", b)
	}
}
