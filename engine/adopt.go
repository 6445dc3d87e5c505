package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
)

// KeptKernel is what a later engine needs to adopt a kernel that was left
// running (Close with keep): where it runs, whose it is and its RPC token.
// It is saved only in the operator's private state dir (SaveKept).
type KeptKernel struct {
	ID             string    `json:"id"`
	Owner          string    `json:"owner"`
	Task           string    `json:"task"`
	Backend        string    `json:"backend"`
	Child          string    `json:"child,omitempty"`
	Tools          []string  `json:"tools,omitempty"`
	PID            int       `json:"pid"`
	Dir            string    `json:"dir"`
	Token          string    `json:"token"`
	ExecutionCount int       `json:"execution_count"`
	LastUsed       time.Time `json:"last_used"`
	// Confinement is how the runner confined itself, as it said at start.
	Confinement string `json:"confinement,omitempty"`
	// Spare marks a spare runner, nobody's kernel (journals only): a later
	// engine kills it.
	Spare bool `json:"spare,omitempty"`
	// Engine names the engine that kept it, whose parked states the
	// engine that takes it holds from then on.
	Engine string `json:"engine,omitempty"`
}

// Kept lists the registered kernels that are ready, for SaveKept before
// Close(ctx, true).
func (e *Engine) Kept() []KeptKernel {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []KeptKernel
	for _, k := range e.kernels {
		if k.state == phaseReady {
			out = append(out, keptOf(k, e.parkName))
		}
	}
	return out
}

func keptOf(k *Kernel, engine string) KeptKernel {
	return KeptKernel{Engine: engine, ID: k.id, Owner: k.key.Owner, Task: k.key.Task, Backend: k.key.Backend,
		Child: k.key.Child, Tools: k.key.ToolList(), PID: k.pid, Dir: k.dir, Token: k.token,
		ExecutionCount: k.execCount, LastUsed: k.lastUsed, Confinement: k.confinement}
}

// SaveKept writes kept to path (0600, atomically); an empty list removes
// the file.
func SaveKept(path string, kept []KeptKernel) error {
	if len(kept) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", path, err)
		}
		return nil
	}
	data, err := json.MarshalIndent(kept, "", "  ")
	if err != nil {
		return fmt.Errorf("save kept kernels: %w", err)
	}
	return WritePrivateFile(path, data)
}

// LoadKept reads a file written by SaveKept and removes it: its kernels now
// belong to the caller, adopted or not. A missing file is no kernels. The
// file must be private (it holds tokens); a loose one is refused.
func LoadKept(path string) ([]KeptKernel, error) {
	kept, err := readKept(path)
	if errors.Is(err, errKeptMalformed) {
		os.Remove(path) // nothing in it can be used again
		return nil, err
	}
	if err != nil || kept == nil {
		return kept, err
	}
	if err := os.Remove(path); err != nil {
		return nil, fmt.Errorf("remove %s: %w", path, err)
	}
	return kept, nil
}

// errKeptMalformed marks a kept-kernels file that does not parse.
var errKeptMalformed = errors.New("malformed")

// readKept reads a file written by SaveKept; nil means there is none.
func readKept(path string) ([]KeptKernel, error) {
	data, err := readSecretFile(path, "kept kernels file", "remove it")
	if data == nil || err != nil {
		return nil, err
	}
	kept := []KeptKernel{}
	if err := json.Unmarshal(data, &kept); err != nil {
		return nil, fmt.Errorf("kept kernels file %s is %w (%v); its kernels exit by themselves after idle_exit", path, errKeptMalformed, err)
	}
	return kept, nil
}

// readSecretFile reads path, a file of secrets (what names it), which must
// be a regular file of this user's with mode 0600, else it is refused and
// the error says fix; nil and no error: there is none.
func readSecretFile(path, what, fix string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w; %s", what, path, err, fix)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o077 != 0 || !ownedByMe(st) {
		return nil, fmt.Errorf("%s %s must be a regular file of yours with mode 0600 (found %v); %s", what, path, st.Mode(), fix)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	return data, nil
}

// KeptStore is where an operator's state dir records the kernels an engine
// left running (Close with keep), for a later engine to adopt. Records are
// kept per backend: an engine takes only those of its own backends.
type KeptStore struct {
	// Path is the 0600 file of records (it holds RPC tokens).
	Path string
}

// KeptStoreIn is the store of the state dir stateDir.
func KeptStoreIn(stateDir string) KeptStore {
	return KeptStore{Path: filepath.Join(stateDir, "kept-kernels.json")}
}

// Peek lists the records of kernels on backends without taking them.
func (s KeptStore) Peek(backends []string) ([]KeptKernel, error) {
	kept, err := readKept(s.Path)
	here, _ := splitKept(kept, backends)
	return here, err
}

// Take removes and returns the records of kernels on backends; the records
// of other backends stay for an engine that has them.
func (s KeptStore) Take(backends []string) ([]KeptKernel, error) {
	kept, err := LoadKept(s.Path)
	if err != nil {
		return nil, err
	}
	here, elsewhere := splitKept(kept, backends)
	return here, SaveKept(s.Path, elsewhere)
}

func splitKept(kept []KeptKernel, backends []string) (here, elsewhere []KeptKernel) {
	for _, k := range kept {
		if slices.Contains(backends, k.Backend) {
			here = append(here, k)
		} else {
			elsewhere = append(elsewhere, k)
		}
	}
	return here, elsewhere
}

// Record adds kept to the records already in the store.
func (s KeptStore) Record(kept []KeptKernel) error {
	old, err := LoadKept(s.Path)
	if err != nil {
		return err
	}
	return SaveKept(s.Path, append(old, kept...))
}

// AdoptFrom takes the store's records of this engine's backends and adopts
// those kernels (see Adopt).
func (e *Engine) AdoptFrom(ctx context.Context, store KeptStore) (adopted int, skipped []string, err error) {
	kept, err := store.Take(e.Backends())
	if err != nil {
		return 0, nil, err
	}
	adopted, skipped = e.Adopt(ctx, kept)
	return adopted, skipped, nil
}

// Adopt registers kernels a previous engine left running, after checking on
// each host that the runner still lives in its owner-only dir, with the
// execution count their runners report. Kernels that
// are gone, on a backend this engine lacks, or no longer ours are skipped,
// each with a reason; adopting never spawns or runs code. The cap applies
// as soon as they are registered.
func (e *Engine) Adopt(ctx context.Context, kept []KeptKernel) (adopted int, skipped []string) {
	for _, kk := range kept {
		k, err := e.adoptOne(ctx, kk, fmt.Sprintf("pid %d in %s, left running by an earlier kerneldeck", kk.PID, kk.Dir))
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("kernel %s of %s on %s: %v", kk.ID, kk.Owner, kk.Backend, err))
			continue
		}
		e.resume(ctx, k)
		adopted++
	}
	e.enforceCap("")
	return adopted, skipped
}

func (e *Engine) adoptOne(ctx context.Context, kk KeptKernel, detail string) (*Kernel, error) {
	env, ok := e.rebuiltEnv(kk.Backend)
	if !ok {
		return nil, fmt.Errorf("backend %s is not configured here", kk.Backend)
	}
	key, err := NewKey(kk.Owner, kk.Backend, kk.Task, kk.Child, kk.Tools)
	if err != nil {
		return nil, err
	}
	if kk.PID <= 0 || kk.Token == "" || !validKernelDir(env.TempDir(), kk.Dir, kk.ID, false) {
		return nil, errors.New("the saved record is incomplete")
	}
	res, err := env.Execute(ctx, adoptScript(kk.Dir, kk.PID), backends.ExecOptions{Timeout: killTimeout})
	if err != nil {
		return nil, fmt.Errorf("check the runner: %w", err)
	}
	if !hasLine(res.Output, markAdopt) {
		return nil, fmt.Errorf("the runner is gone (%s)", hostError(res))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrEngineClosed
	}
	if old := e.kernels[key]; old != nil {
		return nil, fmt.Errorf("this engine already has kernel %s for that key", old.id)
	}
	if e.byID[kk.ID] != nil {
		return nil, fmt.Errorf("kernel id %s is already registered", kk.ID)
	}
	last := kk.LastUsed
	if last.IsZero() || last.After(e.cfg.Now()) {
		last = e.cfg.Now()
	}
	// A record from before the runner's own word was kept says so.
	confinement := cmp.Or(kk.Confinement, "none:not-recorded")
	// Held until resume has asked the runner what it is doing.
	k := &Kernel{key: key, env: env, id: kk.ID, pid: kk.PID, dir: kk.Dir, token: kk.Token, state: phaseReady,
		lastUsed: last, execCount: kk.ExecutionCount, confinement: confinement, holding: true}
	e.kernels[key] = k
	e.byID[k.id] = k
	if kk.Engine != "" {
		e.parkEngines[kk.Engine] = true // its engine's parked states come along
	}
	e.orderDirty()
	e.idleSince = time.Time{} // it may have been idle for long: scan again
	e.journalTouch()
	e.emit(kernelEvent(EventAdopted, k, detail))
	return k, nil
}
