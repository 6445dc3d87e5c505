package eventlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/english"
)

// The log is the operator's record of every owner, and the cap drops the
// oldest segment whole, whoever wrote it: one owner's burst would take the
// others' history with it. So each segment has an index beside it
// ("<segment>.owners", 0600) of how many of its bytes each owner's events
// take, and an owner holding a quarter of the log or more may not write an
// event that would make the cap drop the next segment while that segment
// holds other owners' events. An owner alone still fills the whole log.

// ErrOverShare is returned (wrapped) by Append for an event of an owner
// that holds its share of the log, when writing it would push out other
// owners' events.
var ErrOverShare = errors.New("its owner holds its share of the event log")

// unknownOwner holds the bytes of a segment that no index accounts for
// (written by a kerneldeck before indexes, or before a crash): they are
// nobody's to push out.
const unknownOwner = "\x00unknown"

const indexSuffix = ".owners"

// shares counts, per segment and in all, the bytes of each owner's events.
type shares struct {
	bySeg map[string]map[string]int64
	held  map[string]int64
}

func newShares() *shares {
	return &shares{bySeg: map[string]map[string]int64{}, held: map[string]int64{}}
}

func (s *shares) add(seg, owner string, n int64) {
	m := s.bySeg[seg]
	if m == nil {
		m = map[string]int64{}
		s.bySeg[seg] = m
	}
	m[owner] += n
	s.held[owner] += n
}

// drop forgets seg, removed from the log.
func (s *shares) drop(seg string) {
	for owner, n := range s.bySeg[seg] {
		if s.held[owner] -= n; s.held[owner] <= 0 {
			delete(s.held, owner)
		}
	}
	delete(s.bySeg, seg)
}

// othersIn reports whether seg holds events of an owner other than owner.
func (s *shares) othersIn(seg, owner string) bool {
	for o, n := range s.bySeg[seg] {
		if o != owner && n > 0 {
			return true
		}
	}
	return false
}

// load reads the index of seg (size bytes); what it does not account for
// is unknownOwner's.
func (s *shares) load(dir, seg string, size int64) {
	var counted int64
	if b, err := readIndex(filepath.Join(dir, seg+indexSuffix)); err == nil {
		var m map[string]int64
		if json.Unmarshal(b, &m) == nil {
			for owner, n := range m {
				if n > 0 && counted+n <= size {
					s.add(seg, owner, n)
					counted += n
				}
			}
		}
	}
	if size > counted {
		s.add(seg, unknownOwner, size-counted)
	}
}

// readIndex reads an index file of ours, never through a link.
func readIndex(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() > 1<<20 {
		return nil, fmt.Errorf("%s is not an index", path)
	}
	b := make([]byte, st.Size())
	_, err = f.ReadAt(b, 0)
	return b, err
}

// save writes seg's index (0600, atomically).
func (s *shares) save(dir, seg string) error {
	b, err := json.Marshal(s.bySeg[seg])
	if err != nil {
		return err
	}
	return engine.WritePrivateFile(filepath.Join(dir, seg+indexSuffix), b)
}

// overShareLocked says why an event of owner of n bytes may not be written
// now, or nil.
func (l *Log) overShareLocked(owner string, n int64) error {
	share := l.opts.MaxBytes / 4
	if l.total+n <= l.opts.MaxBytes || l.shares.held[owner]+n <= share || l.oldest == "" || l.oldest == l.name ||
		!l.shares.othersIn(l.oldest, owner) {
		return nil
	}
	who := owner
	if who == "" {
		who = "(none)"
	}
	return fmt.Errorf("event log: %w: owner %s holds %s of the log's %s, and writing more would drop other owners' events",
		ErrOverShare, strings.ToValidUTF8(who, "?"), english.Count(int(l.shares.held[owner]), "byte"), english.Count(int(l.opts.MaxBytes), "byte"))
}
