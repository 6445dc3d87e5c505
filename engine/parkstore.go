package engine

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/english"
)

// A parked state rests in the engine's park dir (0700) as one 0600 file
// per key: the runner's bytes as it sent them, then a trailer (the header
// as JSON and its length) that says whose they are and what they hold.
// A MAC under the engine's park key (park.key, 0600 beside them, never
// sent anywhere) covers both, so a file another process wrote, or one of
// another key, is never loaded: unpickling runs code.

// ErrParkRefused is a parked state whose MAC does not prove that this
// engine wrote it for the key that asks for it.
var ErrParkRefused = errors.New("parked state refused")

// errNoParked: the key has no parked state.
var errNoParked = errors.New("no parked state")

const (
	parkSuffix     = ".park"
	parkKeyFile    = "park.key"
	parkTrailerMax = 4 << 20 // bytes of a header: the names of a large namespace
	parkMACDomain  = "kerneldeck park v1\x00"
)

// NotSaved is a name a parked kernel could not save, and why.
type NotSaved struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Why  string `json:"why"`
}

// parkHeader is what a parked state says of itself.
type parkHeader struct {
	Key            Key         `json:"key"`
	Kernel         string      `json:"kernel"`
	Parked         time.Time   `json:"parked"`
	Reason         string      `json:"reason"`
	Pickler        string      `json:"pickler"`
	Names          []string    `json:"names"`
	Modules        [][2]string `json:"modules"`
	NotSaved       []NotSaved  `json:"not_saved"`
	ExecutionCount int         `json:"execution_count"`
	Bytes          int64       `json:"bytes"`
	// Hibernated: it was parked because it sat idle for hibernate_after,
	// last used at LastUsed.
	Hibernated bool      `json:"hibernated,omitempty"`
	LastUsed   time.Time `json:"last_used"`
	MAC        string    `json:"mac,omitempty"`
	// Engine names the engine that parked it (its journal's name): its
	// clean stop drops it, unless it keeps its kernels.
	Engine string `json:"engine,omitempty"`
}

// parkStore keeps parked states in dir, and their headers in memory (a
// dashboard lists them every second).
type parkStore struct {
	dir string
	key []byte
	mu  sync.Mutex // one writer or pruner at a time; guards index, loaded and mine
	// index holds the header of each parked state this store filed or
	// found, by key; loaded says the dir was read into it (at the first
	// listing, not at open: a one-shot's first result must not wait for a
	// thousand parked states).
	index  map[Key]parkHeader
	loaded bool
	// scanned is when the dir was last read into the index (prune).
	scanned time.Time
	// mine are the keys this store filed.
	mine map[Key]bool
}

// openParkStore opens (making it if need be) the park dir and its key,
// refusing either if anyone but the engine's user could reach it.
func openParkStore(dir string) (*parkStore, error) {
	if err := EnsurePrivateDir(dir); err != nil {
		return nil, fmt.Errorf("park dir: %w", err)
	}
	key, err := stateKey(filepath.Join(dir, parkKeyFile), "park key")
	if err != nil {
		return nil, err
	}
	// A park an engine did not finish (it was killed meanwhile) left its
	// temp file; another engine's on the same dir may be writing its own.
	stale, _ := filepath.Glob(filepath.Join(dir, ".tmp-park-*"))
	for _, p := range stale {
		if st, err := os.Lstat(p); err == nil && time.Since(st.ModTime()) > time.Hour {
			os.Remove(p)
		}
	}
	return &parkStore{dir: dir, key: key, index: map[Key]parkHeader{}, mine: map[Key]bool{}}, nil
}

// loadLocked reads the dir's parked states into the index, once.
func (s *parkStore) loadLocked() {
	if s.loaded {
		return
	}
	all, _ := s.scan()
	for _, h := range all {
		s.index[h.Key] = h
	}
	s.loaded, s.scanned = true, time.Now()
}

// path is where key's parked state rests: one file per key, named by a
// hash so that no owner or task name reaches the file system.
func (s *parkStore) path(key Key) string {
	b, _ := json.Marshal(key)
	sum := sha256.Sum256(b)
	return filepath.Join(s.dir, hex.EncodeToString(sum[:20])+parkSuffix)
}

func (s *parkStore) mac() hash.Hash {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(parkMACDomain))
	return m
}

// parkWriter receives one runner's parked bytes; commit files them.
type parkWriter struct {
	s   *parkStore
	f   *os.File
	mac hash.Hash
	n   int64
	max int64
}

// create starts a parked state of at most max bytes.
func (s *parkStore) create(max int64) (*parkWriter, error) {
	f, err := os.CreateTemp(s.dir, ".tmp-park-*")
	if err != nil {
		return nil, fmt.Errorf("park: %w", err)
	}
	return &parkWriter{s: s, f: f, mac: s.mac(), max: max}, nil
}

func (w *parkWriter) Write(b []byte) (int, error) {
	if w.n+int64(len(b)) > w.max {
		return 0, fmt.Errorf("the runner sent more than the %d bytes allowed", w.max)
	}
	n, err := w.f.Write(b)
	w.mac.Write(b[:n])
	w.n += int64(n)
	return n, err
}

// abort throws the state away.
func (w *parkWriter) abort() {
	w.f.Close()
	os.Remove(w.f.Name())
}

// commit seals h (the bytes written so far are its state) and files it
// for h.Key, in place of any earlier one.
func (w *parkWriter) commit(h parkHeader) error {
	h.Bytes, h.MAC = w.n, ""
	head, err := json.Marshal(h)
	if err != nil {
		w.abort()
		return err
	}
	w.mac.Write(head)
	h.MAC = hex.EncodeToString(w.mac.Sum(nil))
	trailer, _ := json.Marshal(h)
	trailer = binary.LittleEndian.AppendUint64(trailer, uint64(len(trailer)))
	if _, err := w.f.Write(trailer); err != nil {
		w.abort()
		return fmt.Errorf("park: %w", err)
	}
	if err := w.f.Close(); err != nil {
		os.Remove(w.f.Name())
		return fmt.Errorf("park: %w", err)
	}
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if err := os.Rename(w.f.Name(), w.s.path(h.Key)); err != nil {
		os.Remove(w.f.Name())
		return fmt.Errorf("park: %w", err)
	}
	h.MAC = ""
	w.s.index[h.Key] = h
	w.s.mine[h.Key] = true
	return nil
}

// readTrailer reads the header of the parked state open in f, unchecked.
func readTrailer(f *os.File) (parkHeader, error) {
	st, err := f.Stat()
	if err != nil {
		return parkHeader{}, err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o077 != 0 || !ownedByMe(st) {
		return parkHeader{}, fmt.Errorf("%w: %s is not a 0600 file of yours", ErrParkRefused, f.Name())
	}
	size := st.Size()
	var n [8]byte
	if size < 8 {
		return parkHeader{}, fmt.Errorf("%w: %s is too short", ErrParkRefused, f.Name())
	}
	if _, err := f.ReadAt(n[:], size-8); err != nil {
		return parkHeader{}, err
	}
	hl := int64(binary.LittleEndian.Uint64(n[:]))
	if hl <= 0 || hl > parkTrailerMax || hl > size-8 {
		return parkHeader{}, fmt.Errorf("%w: %s has no header", ErrParkRefused, f.Name())
	}
	raw := make([]byte, hl)
	if _, err := f.ReadAt(raw, size-8-hl); err != nil {
		return parkHeader{}, err
	}
	var h parkHeader
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return parkHeader{}, fmt.Errorf("%w: %s: bad header: %v", ErrParkRefused, f.Name(), err)
	}
	if h.Bytes != size-8-hl {
		return parkHeader{}, fmt.Errorf("%w: %s holds %d bytes, its header says %d", ErrParkRefused, f.Name(), size-8-hl, h.Bytes)
	}
	return h, nil
}

// parkedReader reads a parked state's bytes while it computes their MAC:
// what it reads may go out (to the key's new runner) at once, but nothing
// may act on it (unpickle it) before verify said yes.
type parkedReader struct {
	r    io.Reader
	f    *os.File
	mac  hash.Hash
	h    parkHeader
	want []byte
}

func (p *parkedReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.mac.Write(b[:n])
	return n, err
}

// verify tells, once every byte was read, whether the MAC proves that
// this engine wrote the state (ErrParkRefused if not).
func (p *parkedReader) verify() error {
	if _, err := io.Copy(io.Discard, p); err != nil { // what a caller left unread
		return fmt.Errorf("%w: %v", ErrParkRefused, err)
	}
	h := p.h
	h.MAC = ""
	head, _ := json.Marshal(h)
	p.mac.Write(head)
	if !hmac.Equal(p.mac.Sum(nil), p.want) {
		return fmt.Errorf("%w: its MAC does not match (changed since it was parked, or not parked by this engine)", ErrParkRefused)
	}
	return nil
}

func (p *parkedReader) Close() error { return p.f.Close() }

// open returns key's parked state, to be read (and its MAC checked) from
// its first byte; the caller closes it. A state whose header names another
// key is refused at once.
func (s *parkStore) open(key Key) (*parkedReader, error) {
	f, err := os.OpenFile(s.path(key), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errNoParked
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrParkRefused, err)
	}
	h, err := readTrailer(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	if h.Key != key {
		f.Close()
		return nil, fmt.Errorf("%w: it was parked for another kernel", ErrParkRefused)
	}
	want, err := hex.DecodeString(h.MAC)
	if err != nil || len(want) != sha256.Size {
		f.Close()
		return nil, fmt.Errorf("%w: it has no MAC", ErrParkRefused)
	}
	return &parkedReader{r: io.NewSectionReader(f, 0, h.Bytes), f: f, mac: s.mac(), h: h, want: want}, nil
}

// has tells whether key has a parked state, unchecked.
func (s *parkStore) has(key Key) bool {
	_, err := os.Lstat(s.path(key))
	return err == nil
}

// drop removes key's parked state; false if there was none.
func (s *parkStore) drop(key Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.index, key)
	delete(s.mine, key)
	return os.Remove(s.path(key)) == nil
}

// list returns the headers of the parked states, oldest first, from
// memory (read from the dir the first time).
func (s *parkStore) list() []parkHeader {
	s.mu.Lock()
	s.loadLocked()
	out := make([]parkHeader, 0, len(s.index))
	for _, h := range s.index {
		out = append(out, h)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b parkHeader) int { return a.Parked.Compare(b.Parked) })
	return out
}

// filedHere returns the headers of the parked states this store filed
// that are still there, without reading the dir.
func (s *parkStore) filedHere() []parkHeader {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []parkHeader
	for key := range s.mine {
		if h, ok := s.index[key]; ok {
			out = append(out, h)
		}
	}
	return out
}

// scan reads the headers of every parked state in the dir, oldest first;
// the names of files that are not one (no trailer) come second.
func (s *parkStore) scan() ([]parkHeader, []string) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, []string{err.Error()}
	}
	var out []parkHeader
	var bad []string
	for _, d := range ents {
		if !strings.HasSuffix(d.Name(), parkSuffix) {
			continue
		}
		f, err := os.OpenFile(filepath.Join(s.dir, d.Name()), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			continue
		}
		h, err := readTrailer(f)
		f.Close()
		if err != nil {
			bad = append(bad, d.Name())
			continue
		}
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b parkHeader) int { return a.Parked.Compare(b.Parked) })
	return out, bad
}

// parkRescanEvery is how often a sweep's prune reads the park dir again
// (another engine on the dir may have filed or dropped states meanwhile):
// reading ten thousand trailers costs a fraction of a second.
const parkRescanEvery = 10 * time.Minute

// prune drops parked states over the total cap, the oldest first, and,
// in a sweep, those older than retention too, and files that are no
// parked state; it returns what it dropped and why. It works on the
// headers in memory: a sweep reads the dir again once a parkRescanEvery,
// a park (sweep unset) never, so that filing one of ten thousand states
// costs no scan of the others.
func (s *parkStore) prune(now time.Time, retention time.Duration, total int64, sweep bool) []prunedPark {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.loaded || (sweep && now.Sub(s.scanned) >= parkRescanEvery) {
		all, bad := s.scan()
		for _, name := range bad {
			os.Remove(filepath.Join(s.dir, name))
		}
		clear(s.index)
		for _, h := range all {
			s.index[h.Key] = h
		}
		for key := range s.mine {
			if _, ok := s.index[key]; !ok {
				delete(s.mine, key)
			}
		}
		s.loaded, s.scanned = true, now
	}
	var sum int64
	oldest := now
	for _, h := range s.index {
		sum += h.Bytes
		if h.Parked.Before(oldest) {
			oldest = h.Parked
		}
	}
	if sum <= total && (!sweep || now.Sub(oldest) <= retention) {
		return nil // nothing to drop: no sort of them all
	}
	all := make([]parkHeader, 0, len(s.index))
	for _, h := range s.index {
		all = append(all, h)
	}
	slices.SortFunc(all, func(a, b parkHeader) int { return a.Parked.Compare(b.Parked) })
	var out []prunedPark
	for _, h := range all {
		why := ""
		switch {
		case sweep && now.Sub(h.Parked) > retention:
			why = fmt.Sprintf("kept longer than park_retention %s", retention)
		case sum > total:
			why = fmt.Sprintf("parked states held %s, over park_total_mb (%s); the oldest goes first", english.Bytes(sum), english.Bytes(total))
		default:
			return out // the rest are younger and within the cap
		}
		err := os.Remove(s.path(h.Key))
		if err == nil || errors.Is(err, os.ErrNotExist) {
			sum -= h.Bytes
			delete(s.index, h.Key)
			delete(s.mine, h.Key)
		}
		if err == nil {
			out = append(out, prunedPark{h, why})
		}
	}
	return out
}

// prunedPark is a parked state prune dropped.
type prunedPark struct {
	h   parkHeader
	why string
}
