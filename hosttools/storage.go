package hosttools

import (
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Storage defaults: the result limit matches the cell streams' clip.
const (
	DefaultStoreLimit     = 50000              // bytes of output returned inline
	DefaultPreviewChars   = 2000               // characters of stored output returned as preview
	DefaultStoreMaxBytes  = 256 << 20          // bytes of stored output kept in all
	DefaultStoreRetention = 7 * 24 * time.Hour // how long stored output is kept
)

// StoredOutput says where Storage kept a tool's full output.
type StoredOutput struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

// Storage keeps tool output too large to return inline under
// <state>/tool-output/<owner>/<kernel>/<seq>.txt, in directories that only
// the host user can enter (0700, checked) and files only it can read
// (0600), because tool output is as private as the tool arguments: a
// co-tenant must not read another owner's results.
type Storage struct {
	stateDir string
	root     *os.Root // the state dir, checked once; every later step goes through it
	limit    int
	preview  int

	mu        sync.Mutex
	next      map[string]int // per output dir: the next seq to try
	maxBytes  int64
	retention time.Duration
	now       func() time.Time
}

// SetQuota changes how much stored output is kept in all (maxBytes) and for
// how long (retention); zero keeps the default. The oldest output goes first.
func (s *Storage) SetQuota(maxBytes int64, retention time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxBytes = cmp.Or(maxBytes, DefaultStoreMaxBytes)
	s.retention = cmp.Or(retention, DefaultStoreRetention)
}

// Forget removes what was stored for one kernel (its kernel is gone).
func (s *Storage) Forget(owner, kernelID string) error {
	o, err := PathComponent(owner)
	if err != nil {
		return err
	}
	k, err := PathComponent(kernelID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := filepath.Join("tool-output", o, k)
	delete(s.next, dir)
	if err := s.root.RemoveAll(dir); err != nil {
		return fmt.Errorf("forget tool output of %s: %w", filepath.Join(s.stateDir, dir), err)
	}
	return nil
}

// pruneLocked removes stored files past the retention, then the oldest ones
// until room bytes more fit the quota. It reports whether they do.
func (s *Storage) pruneLocked(room int64) bool {
	type file struct {
		rel  string
		size int64
		mod  time.Time
	}
	var files []file
	var total int64
	now := s.now()
	fs.WalkDir(s.root.FS(), "tool-output", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		st, err := d.Info()
		if err != nil || !st.Mode().IsRegular() {
			return nil
		}
		if now.Sub(st.ModTime()) > s.retention {
			s.root.Remove(p)
			return nil
		}
		files = append(files, file{p, st.Size(), st.ModTime()})
		total += st.Size()
		return nil
	})
	if room > s.maxBytes {
		return false
	}
	slices.SortFunc(files, func(a, b file) int { return a.mod.Compare(b.mod) })
	for _, f := range files {
		if total+room <= s.maxBytes {
			break
		}
		if s.root.Remove(f.rel) == nil {
			total -= f.size
		}
	}
	return total+room <= s.maxBytes
}

// NewStorage checks (or creates, 0700) stateDir and returns a Storage that
// keeps outputs longer than limit bytes and previews their first preview
// characters; zero means the default. It fails closed if stateDir is not a
// directory owned by this user without group or other access.
func NewStorage(stateDir string, limit, preview int) (*Storage, error) {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, fmt.Errorf("tool output storage %s: %w", stateDir, err)
	}
	if _, err := os.Lstat(abs); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return nil, fmt.Errorf("tool output storage: create %s: %w", abs, err)
		}
		if err := os.Chmod(abs, 0o700); err != nil { // the umask may have narrowed it
			return nil, fmt.Errorf("tool output storage: chmod %s: %w", abs, err)
		}
	}
	st, err := os.Lstat(abs)
	if err != nil {
		return nil, fmt.Errorf("tool output storage: check %s: %w", abs, err)
	}
	if err := checkPrivate(abs, st); err != nil {
		return nil, fmt.Errorf("tool output storage: %w", err)
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("tool output storage: open %s: %w", abs, err)
	}
	return &Storage{
		stateDir: abs, root: root,
		limit: orDefault(limit, DefaultStoreLimit), preview: orDefault(preview, DefaultPreviewChars),
		next: make(map[string]int), maxBytes: DefaultStoreMaxBytes, retention: DefaultStoreRetention, now: time.Now,
	}, nil
}

// Close releases the state dir handle.
func (s *Storage) Close() error { return s.root.Close() }

// checkPrivate fails unless st is a real directory (not a symlink) owned by
// this user with no group or other permission bits.
func checkPrivate(path string, st fs.FileInfo) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case st.Mode()&fs.ModeSymlink != 0 || !st.IsDir():
		return fmt.Errorf("%s must be a directory, found a %s; remove it", path, entryType(st.Mode().Type()))
	case !ok || int(sys.Uid) != os.Geteuid():
		return fmt.Errorf("%s is owned by another user; it must be yours with mode 0700", path)
	case st.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("%s has mode %v; it must be 0700 (fix it with chmod 700 or remove it)", path, st.Mode().Perm())
	}
	return nil
}

// ensurePrivateDir creates rel under the state dir with mode 0700 if it is
// missing and checks it either way; an existing directory that is looser
// or someone else's fails closed.
func (s *Storage) ensurePrivateDir(rel string) error {
	err := s.root.Mkdir(rel, 0o700)
	switch {
	case err == nil:
		if err := s.root.Chmod(rel, 0o700); err != nil { // the umask may have narrowed it
			return fmt.Errorf("chmod %s: %w", filepath.Join(s.stateDir, rel), err)
		}
	case !errors.Is(err, fs.ErrExist):
		return fmt.Errorf("create %s: %w", filepath.Join(s.stateDir, rel), err)
	}
	st, err := s.root.Lstat(rel)
	if err != nil {
		return fmt.Errorf("check %s: %w", filepath.Join(s.stateDir, rel), err)
	}
	return checkPrivate(filepath.Join(s.stateDir, rel), st)
}

// Store writes text to the next free <seq>.txt for owner and kernelID (seq
// counts from 1 and never reuses an existing file) and returns its path.
// The file is written privately under a temporary name and then hard-linked
// into place, so a reader never sees a partial file and an existing one is
// never overwritten.
func (s *Storage) Store(owner, kernelID, text string) (StoredOutput, error) {
	o, err := PathComponent(owner)
	if err != nil {
		return StoredOutput{}, fmt.Errorf("store tool output: owner: %w", err)
	}
	k, err := PathComponent(kernelID)
	if err != nil {
		return StoredOutput{}, fmt.Errorf("store tool output: kernel id: %w", err)
	}
	dir := filepath.Join("tool-output", o, k)
	for _, d := range []string{"tool-output", filepath.Join("tool-output", o), dir} {
		if err := s.ensurePrivateDir(d); err != nil {
			return StoredOutput{}, fmt.Errorf("store tool output: %w", err)
		}
	}
	s.mu.Lock()
	fits := s.pruneLocked(int64(len(text)))
	s.mu.Unlock()
	if !fits {
		return StoredOutput{}, fmt.Errorf("store tool output: %d bytes are more than the storage quota of %d bytes: %w", len(text), s.maxBytes, ErrOverQuota)
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return StoredOutput{}, fmt.Errorf("store tool output: temporary name: %w", err)
	}
	tmp := filepath.Join(dir, ".tmp-"+hex.EncodeToString(nonce[:]))
	if err := s.writePrivate(tmp, text); err != nil {
		return StoredOutput{}, err
	}
	defer s.root.Remove(tmp) // the link below is the published copy

	s.mu.Lock()
	defer s.mu.Unlock()
	seq := max(s.next[dir], 1)
	for {
		name := filepath.Join(dir, strconv.Itoa(seq)+".txt")
		err := s.root.Link(tmp, name)
		if errors.Is(err, fs.ErrExist) {
			seq++ // left by an earlier run of the dashboard
			continue
		}
		if err != nil {
			return StoredOutput{}, fmt.Errorf("store tool output: publish %s: %w", filepath.Join(s.stateDir, name), err)
		}
		s.next[dir] = seq + 1
		return StoredOutput{Path: filepath.Join(s.stateDir, name), Bytes: len(text)}, nil
	}
}

func (s *Storage) writePrivate(rel, text string) error {
	path := filepath.Join(s.stateDir, rel)
	f, err := s.root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("store tool output: create %s: %w", path, err)
	}
	_, err = f.WriteString(text)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		s.root.Remove(rel)
		return fmt.Errorf("store tool output: write %s: %w", path, err)
	}
	return nil
}

// Offload returns res unchanged if its output (Text, or Value as JSON) fits
// the limit. Otherwise it stores the full output for the call's owner and
// kernel and returns a result whose Text is a preview, with Stored set and
// a note saying where the rest is.
func (s *Storage) Offload(call Call, res Result) (Result, error) {
	text := res.Text
	if res.Value != nil {
		b, err := json.Marshal(res.Value)
		if err != nil {
			return Result{}, fmt.Errorf("store %s output: encode: %w", call.Tool, err)
		}
		text = string(b)
	}
	if len(text) <= s.limit {
		return res, nil
	}
	stored, err := s.Store(call.Owner, call.KernelID, text)
	if errors.Is(err, ErrOverQuota) {
		out := Result{Text: preview(text, s.preview), Note: res.Note, Dropped: res.Dropped}
		out.addNote(fmt.Sprintf("the output was %d bytes, over the %d-byte limit and too large to store (quota %d bytes): this is its first %d characters; ask for less",
			len(text), s.limit, s.maxBytes, len([]rune(out.Text))))
		return out, nil
	}
	if err != nil {
		return Result{}, err
	}
	head := preview(text, s.preview)
	out := Result{Text: head, Note: res.Note, Dropped: res.Dropped, Stored: &stored}
	out.addNote(fmt.Sprintf("the output was %d bytes, over the %d-byte limit: the full output is stored on the host at %s and this is its first %d characters",
		len(text), s.limit, stored.Path, len([]rune(head))))
	return out, nil
}

// ErrOverQuota: tool output larger than the whole storage quota.
var ErrOverQuota = errors.New("over the storage quota")

// preview is the first n characters of text.
func preview(text string, n int) string {
	if r := []rune(text); len(r) > n {
		return string(r[:n])
	}
	return text
}

// PathComponent maps an owner name or kernel id to a single directory name.
// Letters are kept only in lower case, digits, '-' and '_' are kept, '.' is
// kept except first, and every other byte (including '/', NUL, upper case
// and '%' itself) becomes %XX. The mapping is injective, so two owners
// never share a directory, even on a case-insensitive filesystem; it never
// yields "", "." or "..". Very long names are cut and suffixed with a hash
// ('~' marks it; the escaping never produces '~') to fit NAME_MAX.
func PathComponent(s string) (string, error) {
	if s == "" {
		return "", errors.New("empty name")
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if ('a' <= c && c <= 'z') || ('0' <= c && c <= '9') || c == '-' || c == '_' || (c == '.' && i > 0) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	name := b.String()
	if len(name) > 128 {
		sum := sha256.Sum256([]byte(s))
		name = name[:64] + "~" + hex.EncodeToString(sum[:16])
	}
	return name, nil
}
