package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine/runner"
)

// A fresh engine's first result waited for the host's interpreter to be
// found (through a pyenv shim, some 60 ms a time) and for the runner to be
// compiled (30-100 ms) before its spawn. So what the first spawn learns,
// the interpreter it ran, and the runner that interpreter compiled are
// kept in the state dir (runners/, 0700; a 0600 file per backend and
// configured interpreter, for this runner's source) for the next engine,
// which spawns with them at once and checks in the background that the
// host's interpreter is still the one kept.
//
// The file is code every later kernel runs, so it is believed only with
// proof: it is sealed (sealed.go) under runners/runners.key, which no
// kernel can see (runners hide the state dir, runnerConfig.Deny). Without
// Landlock here, or with confinement off, the local backend keeps nothing
// on disk all the same; a local runner that says it is not confined
// removes its backend's file.

// cachedRunner is what a runners/ file holds.
type cachedRunner struct {
	URI  string `json:"uri"`
	Want string `json:"want"`
	Exe  string `json:"exe"`
	// Lookup is what PATH gave for Want when Exe was found: the next
	// engine's first spawn runs Exe only while PATH still gives it.
	Lookup string `json:"lookup,omitempty"`
	Code   []byte `json:"code"`
	// Root is the host's kernel root, so that the next engine's first
	// spawn need not ask id(1) for the login (a fork and an exec, 10-25 ms
	// on a slow host); the spawn checks it as it checks a new one.
	Root string `json:"root,omitempty"`
}

// maxCachedRunner bounds a runners/ file: the code, in base64, and a little.
const maxCachedRunner = maxRunnerCode*4/3 + 4096

// The runners dir's key, and what a kept runner's seal says it is.
const (
	runnerKeyFile = "runners.key"
	runnerKind    = "kerneldeck kept runner"
)

// runnerKey is the key kept runners are sealed with (made at the first
// use).
func (e *Engine) runnerKey() ([]byte, error) {
	return stateKey(filepath.Join(e.runnerCacheDir(), runnerKeyFile), "runner key")
}

// runnerCacheDir is where the runners are kept, or "".
func (e *Engine) runnerCacheDir() string {
	if e.cfg.StateDir == "" {
		return ""
	}
	return filepath.Join(e.cfg.StateDir, "runners")
}

// runnerCachePath is env's file for the interpreter configured for it, or
// "" where nothing is kept for env (any more).
func (e *Engine) runnerCachePath(env backends.Env) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runnerFiles[env.URI()]
}

// runnerCacheFile is the file a configured backend's runner is kept in, or
// "" where nothing is kept for it; New finds it once per backend.
func (e *Engine) runnerCacheFile(env backends.Env) string {
	dir := e.runnerCacheDir()
	if dir == "" {
		return ""
	}
	if _, own := backends.Find[backends.Provisioner](env); own {
		return "" // a container made for one kernel: nothing to reuse
	}
	if _, local := backends.Find[*backends.Local](env); local && (e.cfg.NoConfine || landlockABI() < 1) {
		return ""
	}
	sum := sha256.New()
	// The interpreter python3 resolves to here now is part of the key: a
	// venv activated, or another pyenv version, has a runner of its own.
	for _, s := range []string{env.URI(), e.wantPython(env), herePython(env, e.wantPython(env)), string(runner.Source)} {
		sum.Write([]byte(s))
		sum.Write([]byte{0})
	}
	return filepath.Join(dir, "runner-"+hex.EncodeToString(sum.Sum(nil))[:24]+".json")
}

// landlockABI is the Landlock ABI of this machine's kernel, 0 without it.
func landlockABI() int {
	const sysLandlockCreateRuleset, versionFlag = 444, 1
	abi, _, errno := syscall.Syscall(sysLandlockCreateRuleset, 0, 0, versionFlag)
	if errno != 0 {
		return 0
	}
	return int(abi)
}

// loadRunnerCache takes what an earlier engine kept for env: its
// interpreter for the next spawns, and its compiled runner. It reports
// whether there was something to take.
func (e *Engine) loadRunnerCache(env backends.Env) bool {
	path := e.runnerCachePath(env)
	if path == "" {
		return false
	}
	data, err := readPrivateFile(path, maxCachedRunner)
	if err != nil {
		if !os.IsNotExist(err) {
			e.emit(Event{Type: EventNotice, Detail: fmt.Sprintf("%s: the kept runner is not used: %v", env.URI(), err)})
		}
		return false
	}
	var c cachedRunner
	key, err := e.runnerKey()
	if err == nil {
		err = unseal(key, runnerKind, data, &c)
	}
	if err != nil {
		e.emit(Event{Type: EventNotice, Detail: fmt.Sprintf("%s: the kept runner %s is not used: %v (it is removed)", env.URI(), path, err)})
	}
	here := herePython(env, e.wantPython(env))
	if err != nil || c.URI != env.URI() || c.Want != e.wantPython(env) || (here != "" && c.Exe != here) ||
		!strings.HasPrefix(c.Exe, "/") || strings.ContainsFunc(c.Exe, func(r rune) bool { return r <= ' ' }) ||
		len(c.Code) < 8 || len(c.Code) > maxRunnerCode {
		os.Remove(path)
		return false
	}
	e.mu.Lock()
	e.pythons[env.URI()] = hostPython{exe: c.Exe, lookup: c.Lookup}
	if validKernelRoot(env.TempDir(), c.Root) { // not if the temp dir moved since
		e.roots[env.URI()] = c.Root
	}
	e.mu.Unlock()
	e.codes.preset(codeKey(env, c.Exe), c.Code, c.Exe)
	return true
}

// saveRunnerCache keeps env's interpreter and the runner it compiled for
// the next engine; a failure only costs that engine the compile.
func (e *Engine) saveRunnerCache(env backends.Env, exe string, code []byte) {
	path := e.runnerCachePath(env)
	if path == "" || exe != e.python(env) { // a client's own interpreter is not the host's
		return
	}
	key, err := e.runnerKey()
	if err != nil {
		return
	}
	data, err := seal(key, runnerKind, cachedRunner{URI: env.URI(), Want: e.wantPython(env), Exe: exe, Lookup: e.pythonLookup(env, exe), Code: code, Root: e.kernelRoot(env)})
	if err != nil {
		return
	}
	if err := EnsurePrivateDir(filepath.Dir(path)); err != nil {
		return
	}
	WritePrivateFile(path, data)
}

// dropRunnerCacheLocked removes env's kept runner and keeps nothing more
// for it in this engine: a local runner was not confined, so kernels could
// have written the file.
func (e *Engine) dropRunnerCacheLocked(env backends.Env) {
	if path := e.runnerFiles[env.URI()]; path != "" {
		delete(e.runnerFiles, env.URI())
		os.Remove(path)
	}
}

// readPrivateFile reads path if it is a regular file of this user, mode
// 0600 or stricter, of at most max bytes, without following a link.
func readPrivateFile(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o077 != 0 || !ownedByMe(st) || st.Size() > max {
		return nil, fmt.Errorf("%s must be a regular file of yours, mode 0600, of at most %d bytes (found %v, %d bytes)", path, max, st.Mode(), st.Size())
	}
	data := make([]byte, st.Size())
	if _, err := f.ReadAt(data, 0); err != nil {
		return nil, err
	}
	return data, nil
}

// recheckPython finds the interpreter env's spawns run now (a pyenv shim
// may point elsewhere since the kept one was found) and, if it changed,
// spawns with it from now on and says so.
func (e *Engine) recheckPython(ctx context.Context, env backends.Env, kept string) {
	res, err := env.Execute(ctx, resolveScript(e.wantPython(env)), backends.ExecOptions{Timeout: spawnTimeout})
	if err != nil {
		return
	}
	exe, ok := findLine(res.Output, markExe)
	if !ok || !strings.HasPrefix(exe, "/") || exe == kept {
		return
	}
	e.mu.Lock()
	hp := e.pythons[env.URI()]
	hp.exe = exe
	e.pythons[env.URI()] = hp
	e.mu.Unlock()
	if path := e.runnerCachePath(env); path != "" {
		os.Remove(path)
	}
	e.emit(Event{Type: EventNotice, Detail: fmt.Sprintf("%s: python3 now runs %s (this engine's first kernels ran %s, as the last engine found it); new kernels run %s",
		env.URI(), exe, kept, exe)})
	e.compileRunner(env, exe)
}
