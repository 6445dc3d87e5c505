package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
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
}

// Kept lists the registered kernels that are ready, for SaveKept before
// Close(ctx, true).
func (e *Engine) Kept() []KeptKernel {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []KeptKernel
	for _, k := range e.kernels {
		if k.state != stateReady {
			continue
		}
		out = append(out, KeptKernel{ID: k.id, Owner: k.key.Owner, Task: k.key.Task, Backend: k.key.Backend,
			Child: k.key.Child, Tools: k.key.ToolList(), PID: k.pid, Dir: k.dir, Token: k.token,
			ExecutionCount: k.execCount, LastUsed: k.lastUsed})
	}
	return out
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
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read kept kernels %s: %w", path, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o077 != 0 || !ownedByMe(st) {
		return nil, fmt.Errorf("kept kernels file %s must be a regular file of yours with mode 0600 (found %v); remove it", path, st.Mode())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read kept kernels %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return nil, fmt.Errorf("remove %s: %w", path, err)
	}
	var kept []KeptKernel
	if err := json.Unmarshal(data, &kept); err != nil {
		return nil, fmt.Errorf("kept kernels file %s is malformed (%v); its kernels exit by themselves after idle_exit", path, err)
	}
	return kept, nil
}

// Adopt registers kernels a previous engine left running, after checking on
// each host that the runner still lives in its owner-only dir. Kernels that
// are gone, on a backend this engine lacks, or no longer ours are skipped,
// each with a reason; adopting never spawns or runs code. The cap applies
// as soon as they are registered.
func (e *Engine) Adopt(ctx context.Context, kept []KeptKernel) (adopted int, skipped []string) {
	for _, kk := range kept {
		if err := e.adoptOne(ctx, kk); err != nil {
			skipped = append(skipped, fmt.Sprintf("kernel %s of %s on %s: %v", kk.ID, kk.Owner, kk.Backend, err))
			continue
		}
		adopted++
	}
	e.enforceCap()
	return adopted, skipped
}

func (e *Engine) adoptOne(ctx context.Context, kk KeptKernel) error {
	env, ok := e.backends[kk.Backend]
	if !ok {
		return fmt.Errorf("backend %s is not configured here", kk.Backend)
	}
	key, err := NewKey(kk.Owner, kk.Backend, kk.Task, kk.Child, kk.Tools)
	if err != nil {
		return err
	}
	if kk.PID <= 0 || kk.Token == "" || !validKernelDir(env.TempDir(), kk.Dir, kk.ID, false) {
		return errors.New("the saved record is incomplete")
	}
	res, err := env.Execute(ctx, adoptScript(kk.Dir, kk.PID), backends.ExecOptions{Timeout: killTimeout})
	if err != nil {
		return fmt.Errorf("check the runner: %w", err)
	}
	if !hasLine(res.Output, "KD:ADOPT") {
		return fmt.Errorf("the runner is gone (%s)", hostError(res))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errEngineClosed
	}
	if old := e.kernels[key]; old != nil {
		return fmt.Errorf("this engine already has kernel %s for that key", old.id)
	}
	if e.byID[kk.ID] != nil {
		return fmt.Errorf("kernel id %s is already registered", kk.ID)
	}
	last := kk.LastUsed
	if last.IsZero() || last.After(e.cfg.Now()) {
		last = e.cfg.Now()
	}
	k := &Kernel{key: key, env: env, id: kk.ID, pid: kk.PID, dir: kk.Dir, token: kk.Token, state: stateReady,
		lastUsed: last, execCount: kk.ExecutionCount}
	e.kernels[key] = k
	e.byID[k.id] = k
	e.idleSince = time.Time{} // it may have been idle for long: scan again
	e.emit(kernelEvent(EventAdopted, k, fmt.Sprintf("pid %d in %s, left running by an earlier kerneldeck", kk.PID, kk.Dir)))
	return nil
}
