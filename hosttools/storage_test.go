package hosttools

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func newTestStorage(t *testing.T, limit, preview int) (*Storage, string) {
	t.Helper()
	state := filepath.Join(t.TempDir(), "state")
	s, err := NewStorage(state, limit, preview)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, state
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func TestStorageTreeIsPrivate(t *testing.T) {
	// A umask that strips the owner's own bits must not leave dirs or files
	// the owner cannot use: the modes are pinned, not left to the umask.
	old := syscall.Umask(0o277)
	s, state := newTestStorage(t, 0, 0)
	first, err := s.Store("alice", "k1", "one")
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Store("alice", "k1", "two")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(state, "tool-output", "alice", "k1")
	if first.Path != filepath.Join(dir, "1.txt") || second.Path != filepath.Join(dir, "2.txt") || first.Bytes != 3 {
		t.Errorf("stored at %+v and %+v, want %s/1.txt and 2.txt", first, second, dir)
	}
	for _, d := range []string{state, filepath.Join(state, "tool-output"), filepath.Join(state, "tool-output", "alice"), dir} {
		if m := mode(t, d); m != 0o700 {
			t.Errorf("%s has mode %v, want 0700", d, m)
		}
	}
	for p, want := range map[string]string{first.Path: "one", second.Path: "two"} {
		if m := mode(t, p); m != 0o600 {
			t.Errorf("%s has mode %v, want 0600", p, m)
		}
		if b, _ := os.ReadFile(p); string(b) != want {
			t.Errorf("%s = %q, want %q", p, b, want)
		}
	}
	noTempFiles(t, dir)
}

// A new Storage (a restarted dashboard) never overwrites earlier output.
func TestStorageNeverOverwrites(t *testing.T) {
	s, state := newTestStorage(t, 0, 0)
	if _, err := s.Store("bob", "k", "earlier run"); err != nil {
		t.Fatal(err)
	}
	again, err := NewStorage(state, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	out, err := again.Store("bob", "k", "later run")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(out.Path) != "2.txt" {
		t.Errorf("second run stored at %s, want 2.txt", out.Path)
	}
	if b, _ := os.ReadFile(filepath.Join(filepath.Dir(out.Path), "1.txt")); string(b) != "earlier run" {
		t.Errorf("1.txt = %q: earlier output was overwritten", b)
	}
}

func TestStorageFailsClosed(t *testing.T) {
	tests := []struct {
		name  string
		plant func(t *testing.T, ownerDir string) // ownerDir: <state>/tool-output/alice
		want  string
	}{
		{"group-readable owner dir", func(t *testing.T, d string) {
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(d, 0o750); err != nil {
				t.Fatal(err)
			}
		}, "has mode -rwxr-x---; it must be 0700"},
		{"world-writable kernel dir", func(t *testing.T, d string) {
			if err := os.MkdirAll(filepath.Join(d, "k1"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(d, "k1"), 0o777); err != nil {
				t.Fatal(err)
			}
		}, "k1 has mode -rwxrwxrwx"},
		{"symlink planted as the owner dir", func(t *testing.T, d string) {
			if err := os.MkdirAll(filepath.Dir(d), 0o700); err != nil {
				t.Fatal(err)
			}
			symlink(t, t.TempDir(), d)
		}, "must be a directory"},
		{"owner dir of another user", func(t *testing.T, d string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to chown a directory to another user")
			}
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(d, 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}, "is owned by another user"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, state := newTestStorage(t, 0, 0)
			ownerDir := filepath.Join(state, "tool-output", "alice")
			tc.plant(t, ownerDir)
			out, err := s.Store("alice", "k1", "private")
			if err == nil {
				t.Fatalf("Store succeeded (%s) in a tree that is not private", out.Path)
			}
			mustContain(t, "error", err.Error(), ownerDir, tc.want)
			if _, err := os.Stat(filepath.Join(ownerDir, "k1", "1.txt")); err == nil {
				t.Error("output was written anyway")
			}
		})
	}
	t.Run("loose state dir", func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "state")
		if err := os.Mkdir(state, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(state, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := NewStorage(state, 0, 0); err == nil {
			t.Fatal("NewStorage accepted a 0755 state dir")
		} else {
			mustContain(t, "error", err.Error(), state, "it must be 0700")
		}
	})
}

func TestStorageHostileOwnerNames(t *testing.T) {
	s, state := newTestStorage(t, 0, 0)
	base := filepath.Join(state, "tool-output")
	owners := []string{
		"alice", "Alice", "../../etc", "..", ".", "/abs/path", "a/b", "a%2Fb", "a_b", "a\x00b", "a\nb",
		".hidden", "héllo", strings.Repeat("x", 300), strings.Repeat("x", 299) + "y", "~", "%",
	}
	seen := map[string]string{}
	for _, owner := range owners {
		out, err := s.Store(owner, "../kernel/../id", "data")
		if err != nil {
			t.Errorf("Store(%q): %v", owner, err)
			continue
		}
		rel, err := filepath.Rel(base, out.Path)
		parts := strings.Split(rel, string(filepath.Separator))
		if err != nil || len(parts) != 3 || parts[2] != "1.txt" {
			t.Errorf("owner %q stored at %s, want tool-output/<owner>/<kernel>/1.txt", owner, out.Path)
			continue
		}
		for _, p := range parts[:2] {
			if p == "" || p == "." || p == ".." || strings.HasPrefix(p, ".") || strings.ContainsAny(p, "/\x00\n") || len(p) > 255 {
				t.Errorf("owner %q gave the unsafe component %q", owner, p)
			}
		}
		if other, dup := seen[parts[0]]; dup {
			t.Errorf("owners %q and %q share the directory %q", other, owner, parts[0])
		}
		seen[parts[0]] = owner
	}
	// Every stored file stayed under tool-output: nothing else appeared in the state dir.
	if entries, _ := os.ReadDir(state); len(entries) != 1 {
		t.Errorf("the state dir holds %d entries, want only tool-output", len(entries))
	}
	if _, err := s.Store("", "k", "x"); err == nil {
		t.Error("an empty owner was accepted")
	}
}

func TestOffload(t *testing.T) {
	s, _ := newTestStorage(t, 20, 5)
	call := Call{Owner: "alice", KernelID: "k1", Tool: "read_file"}

	small := Result{Text: "short", Note: "n"}
	if got, err := s.Offload(call, small); err != nil || got.Stored != nil || got.Text != "short" {
		t.Errorf("small result = %+v, %v; want it unchanged", got, err)
	}

	big := Result{Text: "héllo wörld, this is more than twenty bytes", Dropped: []string{"background"}}
	got, err := s.Offload(call, big)
	if err != nil {
		t.Fatal(err)
	}
	if got.Stored == nil || got.Text != "héllo" || got.Stored.Bytes != len(big.Text) || len(got.Dropped) != 1 {
		t.Fatalf("offloaded = %+v", got)
	}
	mustContain(t, "note", got.Note, "stored on the host at "+got.Stored.Path, "first 5 characters")
	if b, _ := os.ReadFile(got.Stored.Path); string(b) != big.Text {
		t.Errorf("stored %q, want the full text", b)
	}

	value := Result{Value: ListResult{Path: "/w", Entries: []FileEntry{{Name: "a-long-file-name", Type: "file"}}}}
	got, err = s.Offload(call, value)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(got.Stored.Path)
	var back ListResult
	if got.Value != nil || json.Unmarshal(b, &back) != nil || back.Entries[0].Name != "a-long-file-name" {
		t.Errorf("a large value was stored as %q (result %+v), want its JSON", b, got)
	}
}

func TestPathComponent(t *testing.T) {
	for in, want := range map[string]string{
		"alice": "alice", "Alice": "%41lice", "a/b": "a%2Fb", "..": "%2E.", ".x": "%2Ex", "a.b": "a.b",
		"a\x00": "a%00", "%": "%25", "k-1_2": "k-1_2",
	} {
		if got, err := PathComponent(in); err != nil || got != want {
			t.Errorf("PathComponent(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestStorageQuotaRetentionForget: stored output is bounded in bytes (the
// oldest goes first) and in age, output larger than the whole quota is
// returned as a preview only, and a kernel's output goes with the kernel.
func TestStorageQuotaRetentionForget(t *testing.T) {
	s, _ := newTestStorage(t, 10, 5)
	now := time.Now()
	s.now = func() time.Time { return now }
	s.SetQuota(100_000, time.Hour)
	big := strings.Repeat("x", 40_000)
	var paths []string
	for i := range 3 {
		res, err := s.Offload(Call{Owner: "o", KernelID: "k1", Tool: "t"}, Result{Text: big + fmt.Sprint(i)})
		if err != nil || res.Stored == nil {
			t.Fatalf("store %d: %+v, %v", i, res, err)
		}
		paths = append(paths, res.Stored.Path)
	}
	if _, err := os.Stat(paths[0]); !os.IsNotExist(err) {
		t.Errorf("the oldest output is still there over the quota: %v", err)
	}
	for _, p := range paths[1:] {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	// Too large for the whole quota: a preview, stored nowhere.
	res, err := s.Offload(Call{Owner: "o", KernelID: "k1", Tool: "t"}, Result{Text: strings.Repeat("y", 200_000)})
	if err != nil || res.Stored != nil || res.Text != "yyyyy" || !strings.Contains(res.Note, "too large to store") {
		t.Fatalf("over the quota: %+v, %v", res, err)
	}
	// Past the retention, stored output goes at the next store.
	now = now.Add(2 * time.Hour)
	for _, p := range paths[1:] {
		os.Chtimes(p, now.Add(-90*time.Minute), now.Add(-90*time.Minute))
	}
	res, err = s.Offload(Call{Owner: "o", KernelID: "k2", Tool: "t"}, Result{Text: big})
	if err != nil || res.Stored == nil {
		t.Fatal(err)
	}
	for _, p := range paths[1:] {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s outlived the retention: %v", p, err)
		}
	}
	if err := s.Forget("o", "k2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(res.Stored.Path)); !os.IsNotExist(err) {
		t.Errorf("the kernel's output dir outlived Forget: %v", err)
	}
}
