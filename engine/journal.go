package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
)

// The journal is how kernels outlive an engine that dies without closing
// (SIGKILL, the OOM killer, a crash): while an engine runs, it keeps the
// records a later engine needs to take its kernels back (KeptKernel, with
// their RPC secrets) in a 0600 file of its own in a 0700 dir, rewritten
// atomically whenever a kernel or a spare comes or goes, beside a lock
// file the engine holds (flock) for as long as its process lives. A lock
// that can be taken is an engine that is gone; Close removes both files.
// A journal is sealed (sealed.go) under journal.key in the same dir: its
// records say which processes a later engine kills and which dirs it
// removes, so one that anyone else wrote is reported and left alone.

// journalKeyFile is the journal dir's key; journalKind is what a journal's
// seal says it is.
const (
	journalKeyFile = "journal.key"
	journalKind    = "kerneldeck journal"
)

// journalFile is one engine's journal as it is on disk (sealed).
type journalFile struct {
	PID     int          `json:"pid"`
	Started time.Time    `json:"started"`
	Kernels []KeptKernel `json:"kernels"`
}

// journal is the running engine's own journal.
type journal struct {
	dir, name string
	key       []byte
	lock      *os.File
	kick      chan struct{}
	stop      chan struct{}
	stopped   chan struct{}
	started   time.Time
}

// openJournal creates this engine's journal in dir and takes its lock.
func openJournal(dir string) (*journal, error) {
	if err := EnsurePrivateDir(dir); err != nil {
		return nil, fmt.Errorf("kernel journal: %w", err)
	}
	key, err := stateKey(filepath.Join(dir, journalKeyFile), "journal key")
	if err != nil {
		return nil, fmt.Errorf("kernel journal: %w", err)
	}
	name := fmt.Sprintf("engine-%d-%s", os.Getpid(), randomHex(4))
	lock, err := os.OpenFile(filepath.Join(dir, name+".lock"), os.O_CREATE|os.O_EXCL|os.O_RDWR|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kernel journal: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		os.Remove(lock.Name())
		return nil, fmt.Errorf("kernel journal: lock %s: %w", lock.Name(), err)
	}
	return &journal{dir: dir, name: name, key: key, lock: lock, kick: make(chan struct{}, 1),
		stop: make(chan struct{}), stopped: make(chan struct{}), started: time.Now()}, nil
}

func (j *journal) path() string { return filepath.Join(j.dir, j.name+".json") }

// run writes the journal each time it is kicked, until stop; a write that
// fails is told to fail and tried again at the next kick.
func (j *journal) run(snapshot func() []KeptKernel, fail func(error)) {
	defer close(j.stopped)
	for {
		select {
		case <-j.stop:
			return
		case <-j.kick:
		}
		if err := j.write(snapshot()); err != nil {
			fail(err)
		}
	}
}

func (j *journal) write(kernels []KeptKernel) error {
	if len(kernels) == 0 {
		if err := os.Remove(j.path()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("kernel journal: %w", err)
		}
		return nil
	}
	data, err := seal(j.key, journalKind, journalFile{PID: os.Getpid(), Started: j.started, Kernels: kernels})
	if err != nil {
		return fmt.Errorf("kernel journal: %w", err)
	}
	return WritePrivateFile(j.path(), data)
}

// touch asks for the journal to be written again soon.
func (j *journal) touch() {
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// close stops the writer and removes the journal: its kernels are killed
// or recorded as kept by now.
func (j *journal) close() {
	close(j.stop)
	<-j.stopped
	os.Remove(j.path())
	os.Remove(j.lock.Name())
	j.lock.Close()
}

// orphanJournal is the journal of an engine that is gone, locked by the
// engine that takes its kernels.
type orphanJournal struct {
	path string
	lock *os.File
	file journalFile
}

// claimJournals locks and reads the journals in dir whose engines are gone
// (their lock can be taken); mine is this engine's own, skipped.
func claimJournals(dir, mine string, key []byte) ([]orphanJournal, []error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, []error{fmt.Errorf("kernel journals: %w", err)}
	}
	var out []orphanJournal
	var errs []error
	for _, ent := range entries {
		base, ok := strings.CutSuffix(ent.Name(), ".lock")
		if !ok || base == mine || !strings.HasPrefix(base, "engine-") {
			continue
		}
		lockPath := filepath.Join(dir, ent.Name())
		lock, err := os.OpenFile(lockPath, os.O_RDWR|syscall.O_NOFOLLOW, 0)
		if err != nil {
			continue // another engine took it meanwhile
		}
		if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			lock.Close() // its engine lives
			continue
		}
		oj := orphanJournal{path: filepath.Join(dir, base+".json"), lock: lock}
		f, err := readJournal(oj.path, key)
		if errors.Is(err, ErrUnsealed) {
			// Not this state dir's engines' to act on, nor to remove.
			lock.Close()
			errs = append(errs, err)
			continue
		}
		if err != nil {
			errs = append(errs, err)
		}
		oj.file = f
		out = append(out, oj)
	}
	return out, errs
}

// readJournal reads a journal file, which must be private (it holds
// secrets) and sealed under key; a missing one has no kernels.
func readJournal(path string, key []byte) (journalFile, error) {
	var f journalFile
	data, err := readSecretFile(path, "kernel journal", "its kernels are not taken back")
	if data == nil || err != nil {
		return f, err
	}
	if err := unseal(key, journalKind, data, &f); err != nil {
		if errors.Is(err, ErrUnsealed) {
			return journalFile{}, fmt.Errorf("kernel journal %s was left alone: %w; nothing it names is killed or removed, and its kernels exit by themselves after idle_exit", path, err)
		}
		return journalFile{}, fmt.Errorf("kernel journal %s does not parse (%v); its kernels exit by themselves after idle_exit", path, err)
	}
	return f, nil
}

// release removes a claimed journal once its kernels are dealt with.
func (oj orphanJournal) release() {
	os.Remove(oj.path)
	os.Remove(oj.lock.Name())
	oj.lock.Close()
}

// TakenBack says what TakeBack did with the kernels of engines that died.
type TakenBack struct {
	// Kernels is how many kernels were taken back.
	Kernels int
	// Collecting is how many of them were running a cell, now collected.
	Collecting int
	// Failed says, for each kernel that could not be taken back (and was
	// killed, if it still ran), why.
	Failed []string
	// SparesKilled counts the spare runners of those engines, killed.
	SparesKilled int
}

// TakeBack takes over the kernels of every engine that kept its journal in
// the same dir and died without closing: each one that still lives is
// registered with its state and execution count, and a cell it was
// running is collected once (its result goes to Cells, and to a caller
// that asks for it by its id); the rest are killed and reported. It is a
// no-op without a journal dir.
func (e *Engine) TakeBack(ctx context.Context) (TakenBack, error) {
	var tb TakenBack
	if e.journal == nil {
		return tb, nil
	}
	orphans, errs := claimJournals(e.journal.dir, e.journal.name, e.journal.key)
	e.mu.Lock()
	for _, oj := range orphans {
		// Their parked states are this engine's now, to drop at its clean stop.
		e.parkEngines[strings.TrimSuffix(filepath.Base(oj.path), ".json")] = true
	}
	e.mu.Unlock()
	// A few at a time: each costs a command on its host and a dial.
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, takeBackAtOnce)
	for _, oj := range orphans {
		for _, kk := range oj.file.Kernels {
			wg.Add(1)
			slots <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				e.takeBackOne(ctx, oj.file, kk, &tb, &mu)
			}()
		}
	}
	wg.Wait()
	for _, oj := range orphans {
		oj.release()
	}
	e.enforceCap("")
	return tb, errors.Join(errs...)
}

// spawnID is the shape of the ids newKernelID makes: a journal's id goes
// into a kill script's patterns.
var spawnID = regexp.MustCompile(`^k[0-9a-f]{12}$`)

// takeBackAtOnce bounds the kernels taken back at the same time.
const takeBackAtOnce = 8

func (e *Engine) takeBackOne(ctx context.Context, from journalFile, kk KeptKernel, tb *TakenBack, mu *sync.Mutex) {
	count := func(f func()) { mu.Lock(); f(); mu.Unlock() }
	env, ok := e.rebuiltEnv(kk.Backend)
	gone := &Kernel{env: env, backend: env, id: kk.ID, pid: kk.PID, dir: kk.Dir, token: kk.Token, state: phaseGone, spare: kk.Spare}
	if kk.Spare {
		gone.goneReason = "a spare runner of an engine that is gone"
		switch {
		case ok && kk.PID == 0 && kk.Dir == "" && spawnID.MatchString(kk.ID):
			// Still starting when its engine died: found by its id (a host
			// of its own is the backend's sweep's to remove).
			if _, own := backends.Find[backends.Provisioner](env); own {
				return
			}
			e.killRunner(ctx, runnerRef{env: env, id: kk.ID, reason: gone.goneReason, abandoned: true, spare: true}, nil)
			count(func() { tb.SparesKilled++ })
		case ok:
			e.killOnHost(ctx, gone)
			count(func() { tb.SparesKilled++ })
		}
		return
	}
	e.mu.Lock()
	known := e.byID[kk.ID] != nil
	e.mu.Unlock()
	if known {
		return // also kept at a clean exit, and adopted already
	}
	detail := fmt.Sprintf("pid %d in %s, taken back from an engine that stopped without closing (pid %d)", kk.PID, kk.Dir, from.PID)
	k, err := e.adoptOne(ctx, kk, detail)
	if err != nil {
		fate := "killed where it still ran"
		if !ok {
			fate = "left running: it exits by itself after idle_exit"
		}
		why := fmt.Sprintf("kernel %s of %s on %s: %v; %s", kk.ID, kk.Owner, kk.Backend, err, fate)
		count(func() { tb.Failed = append(tb.Failed, why) })
		e.emit(Event{Type: EventKilled, Kernel: kk.ID, Owner: kk.Owner, Detail: "not taken back from an engine that is gone: " + err.Error() + "; " + fate})
		if ok && kk.PID > 0 && validKernelDir(env.TempDir(), kk.Dir, kk.ID, false) {
			gone.goneReason = "not taken back"
			e.killOnHost(ctx, gone)
		}
		return
	}
	cell := e.resume(ctx, k)
	count(func() {
		tb.Kernels++
		if cell != "" {
			tb.Collecting++
		}
	})
}

// journalTouch has the journal written again (no-op without one); safe
// with e.mu held.
func (e *Engine) journalTouch() {
	if e.journal != nil {
		e.journal.touch()
	}
}

// journalRecords is what the journal holds: every ready kernel and spare,
// and the kernels being parked (until they are killed).
func (e *Engine) journalRecords() []KeptKernel {
	out := e.Kept()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range e.retiring {
		out = append(out, keptOf(k, e.parkName))
	}
	for uri, sb := range e.spareSets {
		for _, s := range sb.ready {
			out = append(out, KeptKernel{ID: s.id, Backend: s.env.URI(), PID: s.runner.pid, Dir: s.runner.dir,
				Token: s.runner.token, Spare: true})
		}
		for id := range sb.pending {
			out = append(out, KeptKernel{ID: id, Backend: uri, Spare: true})
		}
	}
	return out
}

// Orphaned counts the kernels in the journals of engines that died without
// closing, without taking them (TakeBack does).
func (e *Engine) Orphaned() (int, error) {
	if e.journal == nil {
		return 0, nil
	}
	orphans, errs := claimJournals(e.journal.dir, e.journal.name, e.journal.key)
	e.mu.Lock()
	for _, oj := range orphans {
		// Their parked states are this engine's now, to drop at its clean stop.
		e.parkEngines[strings.TrimSuffix(filepath.Base(oj.path), ".json")] = true
	}
	e.mu.Unlock()
	n := 0
	for _, oj := range orphans {
		for _, kk := range oj.file.Kernels {
			if !kk.Spare {
				n++
			}
		}
		oj.lock.Close() // unclaimed: the files stay for an engine that takes them
	}
	return n, errors.Join(errs...)
}
