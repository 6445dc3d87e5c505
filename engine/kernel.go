package engine

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine/runner"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
	"github.com/kerneldeck/kerneldeck/interp"
)

// phase is where a registry entry is in its life.
type phase int

const (
	phaseStarting phase = iota
	phaseReady
	phaseGone
)

// Kernel is one registry entry: a persistent runner on a backend for one Key.
// A respawn (reset, death) replaces the runner in place under a new id.
type Kernel struct {
	key Key
	// env is the host the kernel's commands run on: its backend, or (for a
	// backend that is a Provisioner) the kernel's own host, set by spawn
	// under Engine.mu while the kernel is held.
	env backends.Env
	// backend is the backend the key names (env, unless provisioned).
	backend backends.Env
	tools   []string // key.ToolList(), made once (toolList)

	// Guarded by Engine.mu.
	id         string
	pid        int
	dir        string
	token      string
	state      phase
	goneReason string
	// awake says why the kernel did not hibernate ("": it may); its next
	// call clears it (hibernate.go).
	awake string
	// hibernating: the engine holds it while its park to hibernate runs.
	hibernating bool
	holding     bool // a call owns the kernel (spawning or running a cell)
	// waiters are the calls queued behind the holder, first come first
	// served; release hands the kernel to the head by closing its channel.
	waiters      []chan struct{}
	runningCell  string
	runningSince time.Time
	lastUsed     time.Time
	execCount    int
	conn         *runnerConn
	// dialed is a connection to the runner's socket made before the kernel
	// had it (a warm pool's spare: a relay through the Docker daemon costs
	// tens of ms), for its stream to authenticate over.
	dialed net.Conn
	// rpcSeen holds every authenticated tool-call seq of the current runner,
	// so a replayed request is refused.
	rpcSeen map[int64]struct{}
	// transient marks a per-call kernel: never in the registry, killed
	// after its one cell.
	transient bool
	// confinement is how the runner confined itself: "landlock:ABI" or
	// "none:reason".
	confinement string
	// python is the interpreter the runner said it runs on ("": not told).
	python string
	// place is where the request that made the kernel works (placeFor);
	// placePending: the runner has yet to apply it (firstPlaceLocked).
	place        Place
	placePending bool
	// lostNote, on a kernel just created for a key whose previous kernel
	// left the registry, says why; only the creating call reads it.
	lostNote string
	// spare marks the record of a spare runner being killed (spares.go).
	spare bool
	// earlier are the cells the runner of a kernel taken over had, sent by
	// the engine before (its latest result, the one it ran): asked for
	// again, such a cell may have run even if the runner dies before it
	// says it has it.
	earlier []string
}

// killRetry paces the retries of one failed kill: each waits twice as long
// as the one before (at most killRetryMax), and they stop at giveUp, when
// the runner has exited by itself at its idle_exit.
type killRetry struct {
	tries  int
	next   time.Time
	giveUp time.Time
}

func (k *Kernel) attachedLocked() bool { return k.holding || len(k.waiters) > 0 }

func (k *Kernel) goneReasonSafe() string {
	if k.goneReason == "" {
		return "killed"
	}
	return k.goneReason
}

// KernelInfo is a snapshot of one kernel for listings and the dashboard.
type KernelInfo struct {
	ID             string        `json:"id"`
	Owner          string        `json:"owner"`
	Task           string        `json:"task"`
	Backend        string        `json:"backend"`
	Child          string        `json:"child"`
	Tools          []string      `json:"tools"` // shared between snapshots: do not modify
	PID            int           `json:"pid"`
	Dir            string        `json:"dir"`
	State          KernelState   `json:"state"`
	Attached       bool          `json:"attached"`
	Queued         int           `json:"queued"`
	RunningCell    string        `json:"running_cell,omitempty"`
	RunningSince   time.Time     `json:"running_since,omitzero"`
	LastUsed       time.Time     `json:"last_used"`
	Idle           time.Duration `json:"-"`
	ExecutionCount int           `json:"execution_count"`
	// NextEvict marks the kernel the cap would evict next.
	NextEvict bool `json:"next_evict"`
	// Confinement is how the runner confined itself: "landlock:ABI", or
	// "none:reason" when it could not.
	Confinement string `json:"confinement,omitempty"`
	// Python is the interpreter the kernel runs on, as its runner said
	// ("" where it did not: a kernel taken over).
	Python string `json:"python,omitempty"`
	// Cwd is the directory the kernel started in, its client's on this
	// machine ("" where the backend's default applies: another host).
	Cwd string `json:"cwd,omitempty"`
	// Host is where the kernel's own host is (its pod, its container);
	// zero for a kernel on a shared host.
	Host backends.Place `json:"host,omitzero"`
}

func (k *Kernel) infoLocked(now time.Time, next bool) KernelInfo {
	var info KernelInfo
	k.fillInfoLocked(&info, now, next)
	return info
}

// fillInfoLocked writes k's listing into info, which is zero: a snapshot
// fills its slice in place rather than copying each entry.
func (k *Kernel) fillInfoLocked(info *KernelInfo, now time.Time, next bool) {
	state := StateIdle
	switch {
	case k.state == phaseStarting:
		state = StateStarting
	case k.runningCell != "":
		state = StateRunning
	case k.hibernating:
		state = StateHibernating
	case len(k.waiters) > 0:
		state = StateQueued
	}
	attached := k.attachedLocked()
	if !attached {
		info.Idle = now.Sub(k.lastUsed)
	}
	info.ID, info.Owner, info.Task, info.Backend, info.Child = k.id, k.key.Owner, k.key.Task, k.key.Backend, k.key.Child
	info.Tools, info.PID, info.Dir, info.State, info.Attached = k.toolList(), k.pid, k.dir, state, attached
	info.Queued, info.RunningCell, info.RunningSince, info.LastUsed = len(k.waiters), k.runningCell, k.runningSince, k.lastUsed
	info.ExecutionCount, info.NextEvict, info.Confinement, info.Python, info.Cwd = k.execCount, next, k.confinement, k.python, k.place.Dir
	if p, ok := backends.Find[backends.Placement](k.env); ok && k.env != k.backendEnv() {
		info.Host = p.Place()
	}
}

// backendEnv is the backend the kernel's key names.
func (k *Kernel) backendEnv() backends.Env {
	if k.backend != nil {
		return k.backend
	}
	return k.env
}

// transientHost is where a per-call kernel for k's key runs: k's host,
// unless that is k's own (a provisioned container, which the per-call
// kernel's end would remove): then a host of its own.
func (k *Kernel) transientHost() backends.Env {
	if _, ok := backends.Find[backends.Provisioner](k.backendEnv()); ok {
		return k.backendEnv()
	}
	return k.env
}

// toolList is the key's tools as a list, made once: every snapshot shares
// it, so callers must not modify KernelInfo.Tools.
func (k *Kernel) toolList() []string {
	if k.tools == nil {
		k.tools = k.key.ToolList()
	}
	return k.tools
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func newKernelID() string { return "k" + randomHex(6) }

// acquire finds or creates the kernel for key and waits for its turn, at
// most until deadline. created reports a new registry entry that the caller
// must spawn. onQueued (if set) runs once the call holds its place in line,
// before any backend work, so callers can order their calls.
func (e *Engine) acquire(ctx context.Context, key Key, env backends.Env, deadline time.Time, member bool, onQueued func()) (k *Kernel, created bool, err error) {
	notify := func() {
		if onQueued != nil {
			onQueued()
			onQueued = nil
		}
	}
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return nil, false, ErrEngineClosed
		}
		k = e.kernels[key]
		if k == nil {
			victim, err := e.makeRoomForOwnerLocked(key.Owner, member)
			if err != nil {
				e.mu.Unlock()
				return nil, false, err
			}
			if victim != nil {
				e.retireLocked([]*Kernel{victim})
			}
			now := e.cfg.Now()
			k = &Kernel{key: key, env: env, backend: env, id: newKernelID(), state: phaseStarting, holding: true, lastUsed: now, lostNote: e.lost[key]}
			delete(e.lost, key)
			e.kernels[key] = k
			e.byID[k.id] = k
			e.orderDirty()
			e.mu.Unlock()
			notify()
			return k, true, nil
		}
		if !k.holding {
			k.holding = true
			e.mu.Unlock()
			notify()
			return k, false, nil
		}
		turn := make(chan struct{})
		k.waiters = append(k.waiters, turn)
		e.mu.Unlock()
		notify()
		timer := time.NewTimer(time.Until(deadline))
		select {
		case <-turn:
			timer.Stop()
		case <-timer.C:
			e.leaveQueue(k, turn)
			return nil, false, ErrQueueTimeout
		case <-ctx.Done():
			timer.Stop()
			e.leaveQueue(k, turn)
			return nil, false, ctx.Err()
		}
		e.mu.Lock()
		gone := k.state == phaseGone
		e.mu.Unlock()
		if !gone {
			return k, false, nil
		}
		// Killed while we waited: pass the turn on so every waiter learns it,
		// in order, and try again (a new kernel for the key).
		e.release(k)
	}
}

// leaveQueue gives up a place in k's line; if the turn was handed to us in
// the meantime, it passes it on.
func (e *Engine) leaveQueue(k *Kernel, turn chan struct{}) {
	e.mu.Lock()
	for i, w := range k.waiters {
		if w == turn {
			k.waiters = append(k.waiters[:i], k.waiters[i+1:]...)
			e.mu.Unlock()
			return
		}
	}
	e.mu.Unlock()
	e.release(k) // already granted
}

// release ends a call's turn: the next call in line gets the kernel, or it
// becomes idle (and evictable) when nobody waits.
func (e *Engine) release(k *Kernel) {
	e.mu.Lock()
	defer e.mu.Unlock()
	k.runningCell = ""
	if k.state != phaseGone {
		k.lastUsed = e.cfg.Now()
		k.awake = ""
	}
	e.passTurnLocked(k)
}

// passTurnLocked hands the holder's turn to the next call in line, or
// leaves k idle when nobody waits.
func (e *Engine) passTurnLocked(k *Kernel) {
	if len(k.waiters) > 0 {
		next := k.waiters[0]
		k.waiters = k.waiters[1:]
		close(next) // holding passes to it
		return
	}
	k.holding = false
}

// provisionError is a spawn whose own host (its container, its pod) could
// not be made: a per-call run would need a host made the same way.
type provisionError struct{ err error }

func (p *provisionError) Error() string { return p.err.Error() }
func (p *provisionError) Unwrap() error { return p.err }

// spawn starts a fresh runner for k in one backend round trip (setup dirs,
// ship files on stdin, start detached, wait for READY) and installs it in
// place, under a new id.
func (e *Engine) spawn(ctx context.Context, k *Kernel) (err error) {
	id := k.id
	if k.pid != 0 {
		id = newKernelID() // a respawn is a new kernel
	}
	// A spare runner, when one is ready, is this kernel at once: it was
	// started the same way, with a secret of its own and no tools (on a
	// backend that makes a container per kernel, in a container of its
	// own, which becomes the kernel's); a kernel with tools gives it their
	// stubs first (one command, no spawn).
	spare, fromSpare := e.takeSpare(k)
	if p, ok := backends.Find[backends.Provisioner](k.backendEnv()); ok && fromSpare {
		e.mu.Lock()
		k.env = spare.env
		e.mu.Unlock()
	} else if ok {
		// A host of its own: the old one (a respawn) goes, a new one comes.
		e.mu.Lock()
		old := k.env
		e.mu.Unlock()
		if d, ok := backends.Find[backends.Disposer](old); ok && old != k.backendEnv() {
			d.Dispose(ctx)
		}
		env, perr := p.Provision(ctx, k.key.String())
		if perr != nil {
			return &provisionError{fmt.Errorf("spawn kernel %s on %s: %w", id, k.backendEnv().URI(), perr)}
		}
		e.mu.Lock()
		k.env = env
		e.mu.Unlock()
		defer func() {
			if err != nil {
				disposeHost(context.WithoutCancel(ctx), env)
			}
		}()
	}
	var r spawnedRunner
	if tools := k.key.ToolList(); fromSpare && len(tools) > 0 {
		if serr := e.installStubs(ctx, k.env, spare.runner.dir, toolModule(tools, e.cfg.Tools)); serr != nil {
			e.killAsync([]*Kernel{spare.kernel()})
			fromSpare = false
		}
	}
	if fromSpare {
		r = spare.runner
		id = spare.id
		e.mu.Lock()
		k.dialed = spare.dialed
		e.mu.Unlock()
	} else {
		e.firstSpawnBegun(k.backendEnv().URI())
		role := roleKernel
		if k.transient {
			role = roleTransient
		}
		r, err = e.startRunner(ctx, k.env, id, k.key.ToolList(), role, k.place.Python)
		e.firstSpawnEnded(k.backendEnv().URI())
		if err != nil {
			e.abandonSpawn(k.env, k.key, id, err)
			return err
		}
	}
	pid, dir, token := r.pid, r.dir, r.token
	e.mu.Lock()
	e.noteConfinementLocked(k, r.confinement)
	k.python = r.python
	if e.byID[k.id] == k {
		delete(e.byID, k.id)
	}
	old := k.id
	if id != old {
		e.orderDirty()
	}
	k.id, k.pid, k.dir, k.token = id, pid, dir, token
	k.execCount = 0
	k.placePending = k.place.Dir != "" || k.place.Umask != nil
	k.rpcSeen = nil
	k.earlier = nil
	k.lastUsed = e.cfg.Now()
	if k.conn != nil {
		k.conn.close()
		k.conn = nil
	}
	gone := k.state == phaseGone
	if !gone {
		k.state = phaseReady
		if !k.transient {
			e.byID[id] = k
			e.journalTouch()
		}
	}
	e.mu.Unlock()
	if gone {
		// Killed by the operator while it was starting: do not leave it running.
		e.killOnHost(ctx, k)
		return fmt.Errorf("spawn kernel %s on %s: %s while starting", id, k.env.URI(), k.goneReasonSafe())
	}
	detail := fmt.Sprintf("pid %d in %s", pid, dir)
	switch {
	case fromSpare:
		detail += fmt.Sprintf(" (a spare runner, ready for %s)", english.Duration(e.cfg.Now().Sub(spare.readySince)))
	case old != id:
		detail += " (replaces " + old + ")"
	}
	e.emit(kernelEvent(EventSpawned, k, detail))
	return nil
}

// spawnedRunner is a runner started on a host, not yet anyone's kernel.
type spawnedRunner struct {
	pid         int
	dir, token  string
	confinement string
	python      string // the interpreter, as the runner said
}

// installStubs writes a spare runner's tool stubs, before its first cell.
func (e *Engine) installStubs(ctx context.Context, env backends.Env, dir string, stubs []byte) error {
	res, err := env.Execute(ctx, stubsScript(dir), backends.ExecOptions{Stdin: stubs, Timeout: spawnTimeout})
	if err != nil {
		return fmt.Errorf("tool stubs for the spare runner in %s on %s: %w", dir, env.URI(), err)
	}
	if !hasLine(res.Output, markOK) {
		return fmt.Errorf("tool stubs for the spare runner in %s on %s: %s", dir, env.URI(), hostError(res))
	}
	return nil
}

// startRunner starts a runner on env as kernel id, with tool stubs for
// tools, on the interpreter python ("": env's, Engine.python), and returns
// it once it answered READY.
func (e *Engine) startRunner(ctx context.Context, env backends.Env, id string, tools []string, role runnerRole, python string) (spawnedRunner, error) {
	r, err := e.startRunnerShipping(ctx, env, id, tools, role, python, true)
	if errors.Is(err, errNoCode) {
		// The interpreter at that path changed since it compiled the
		// runner: start from source (it compiles again for the next spawns).
		return e.startRunnerShipping(ctx, env, id, tools, role, python, false)
	}
	return r, err
}

// runnerRole is what a runner is started as.
type runnerRole int

const (
	roleKernel    runnerRole = iota // a key's kernel
	roleTransient                   // a per-call kernel, gone with its call
	roleSpare                       // a spare, keyed to no one yet
)

// startRunnerShipping is startRunner, shipping the compiled runner when
// useCode is set and the engine has it for the host's interpreter.
func (e *Engine) startRunnerShipping(ctx context.Context, env backends.Env, id string, tools []string, role runnerRole, chosen string, useCode bool) (spawnedRunner, error) {
	transient := role == roleTransient
	token := kernelauth.NewSecret()
	e.mu.Lock()
	idle := e.idleExit
	e.mu.Unlock()
	stubs := toolModule(tools, e.cfg.Tools)
	if transient {
		// A per-call kernel outlives a lost engine by a minute at most.
		idle = time.Minute
	}
	// The runner's own stdin: its secret never touches a file, an
	// environment or a command line.
	lim := e.cfg.KernelLimits
	_, alone := backends.Find[backends.Disposer](env)
	config, _ := json.Marshal(runnerConfig{Alone: alone, Secret: token, IdleExit: idle.Seconds(), Clip: e.cfg.ClipChars,
		SpillMax: e.cfg.SpillMax, Confine: !e.cfg.NoConfine, Deny: e.hiddenPaths(env), NoHide: e.cfg.LandlockOnly, Umask: e.umaskFor(env),
		MemoryLimit: lim.Memory, CPULimit: int64(lim.CPUTime.Seconds()), ProcsLimit: lim.MaxProcs,
		// A spare has time to get the unpickler ready (5 to 30 ms here,
		// 1 MB) before a hibernated kernel's wake needs it.
		ParkReady: role == roleSpare && e.parks != nil})
	config = append(config, '\n')
	python := cmp.Or(chosen, e.python(env))
	script, code := runner.Source, []byte(nil)
	if useCode {
		script, code = e.shippedRunner(ctx, env, python)
	}
	stdin := spawnStdin(script, code, stubs, config)
	cmd := spawnScript(env.TempDir(), id, python, e.pythonLookup(env, python), e.wantPython(env), e.kernelRoot(env), [3]int{len(script), len(code), len(stubs)}, 20, transient)
	res, err := env.Execute(ctx, cmd, backends.ExecOptions{Stdin: stdin, Timeout: spawnTimeout})
	if err != nil {
		return spawnedRunner{}, &transportError{fmt.Errorf("spawn kernel %s on %s: %w", id, env.URI(), err)}
	}
	line, ok := findLine(res.Output, markSpawned)
	if !ok && code != nil && hasLine(res.Output, markNoCode) {
		e.forgetRunnerCode(env, python)
		return spawnedRunner{}, fmt.Errorf("spawn kernel %s on %s: %w", id, env.URI(), errNoCode)
	}
	if !ok {
		return spawnedRunner{}, fmt.Errorf("spawn kernel %s on %s: %s", id, env.URI(), hostError(res))
	}
	fields := strings.Fields(line)
	if len(fields) < 2 {
		return spawnedRunner{}, fmt.Errorf("spawn kernel %s on %s: unexpected answer %q", id, env.URI(), line)
	}
	pid, err := strconv.Atoi(fields[0])
	dir := fields[1]
	// The dir goes into rm -rf later: accept only the shape spawnScript makes.
	if err != nil || pid <= 0 || !validKernelDir(env.TempDir(), dir, id, transient) {
		return spawnedRunner{}, fmt.Errorf("spawn kernel %s on %s: unexpected answer %q", id, env.URI(), line)
	}
	r := spawnedRunner{pid: pid, dir: dir, token: token, confinement: "none:unknown"}
	// What the host told, for its next spawns (a spare's included).
	e.mu.Lock()
	learnt := ""
	if len(fields) > 2 && strings.HasPrefix(fields[2], "/") {
		learnt = fields[2]
		if chosen == "" { // not a client's own: the host's, for its next spawns
			e.pythons[env.URI()] = hostPython{exe: learnt, lookup: cmp.Or(fields[4:]...)}
		}
	}
	if !transient {
		e.roots[env.URI()] = path.Dir(dir)
	}
	e.mu.Unlock()
	if learnt != "" {
		e.compileRunner(env, learnt)
	}
	if len(fields) > 3 {
		r.confinement = fields[3]
	}
	r.python = learnt
	return r, nil
}

// hiddenPaths are the paths a runner on env must not see: on this machine,
// the engine's state dir (its journal holds every kernel's secret, its
// parked states and kept runners are trusted), its socket, and the login's
// control sockets, through which a kernel would act as the login outside
// its namespaces. The runner covers them with empty mounts (Landlock
// denies them where it cannot mount).
func (e *Engine) hiddenPaths(env backends.Env) []string {
	if _, local := backends.Find[*backends.Local](env); !local {
		return nil
	}
	var paths []string
	add := func(p string) {
		if !filepath.IsAbs(p) {
			return
		}
		if p = filepath.Clean(p); !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	for _, d := range append([]string{e.cfg.StateDir, e.cfg.JournalDir, e.cfg.ParkDir}, e.cfg.HidePaths...) {
		if abs, err := filepath.Abs(d); err == nil && d != "" {
			add(abs)
		}
	}
	for _, p := range controlSockets(os.Getenv) {
		add(p)
	}
	return paths
}

// controlSockets are where the login's services listen on this machine:
// its runtime dir (the user's systemd, D-Bus, an agent), the Docker
// Engine's socket, tmux's socket dir and the ssh agent's socket.
func controlSockets(getenv func(string) string) []string {
	paths := []string{getenv("XDG_RUNTIME_DIR"), "/var/run/docker.sock", "/run/docker.sock",
		filepath.Join(cmp.Or(getenv("TMUX_TMPDIR"), "/tmp"), fmt.Sprintf("tmux-%d", os.Geteuid())), getenv("SSH_AUTH_SOCK")}
	if h, ok := strings.CutPrefix(getenv("DOCKER_HOST"), "unix://"); ok {
		paths = append(paths, h)
	}
	return paths
}

// runnerConfig is the line a runner reads on its stdin at start.
type runnerConfig struct {
	Secret   string  `json:"secret"`
	IdleExit float64 `json:"idle_exit"`
	// ParkReady: once ready, import what a restore needs.
	ParkReady bool `json:"park_ready,omitempty"`
	Clip      int  `json:"clip"`
	SpillMax  int  `json:"spill_max"`
	Confine   bool `json:"confine"`
	// Deny lists the paths of the runner's host it must not see, besides
	// other kernels' dirs (hiddenPaths).
	Deny []string `json:"deny,omitempty"`
	// NoHide leaves the hiding to Landlock alone (tests of that fallback).
	NoHide bool `json:"no_hide,omitempty"`
	// Alone says the runner's host was made for its kernel alone (a
	// container or pod of its own): nothing there is anyone else's.
	Alone bool `json:"alone,omitempty"`
	// Umask is what cells create files with: the engine's own on this
	// machine; nil on another host, where the login's applies.
	Umask *int `json:"umask,omitempty"`
	// Resource limits the runner sets on itself (0: none).
	MemoryLimit int64 `json:"memory_limit,omitempty"`
	CPULimit    int64 `json:"cpu_limit,omitempty"`
	ProcsLimit  int   `json:"procs_limit,omitempty"`
}

// noteConfinementLocked records how k's runner is confined and says once
// per host when runners there are not.
func (e *Engine) noteConfinementLocked(k *Kernel, confinement string) {
	uri := k.env.URI()
	k.confinement = confinement
	if _, own := backends.Find[backends.Provisioner](k.backend); !own && !strings.HasSuffix(confinement, "+userns") && !e.noUserNS[uri] {
		e.noUserNS[uri] = true
		e.emit(kernelEvent(EventUnconfined, k, fmt.Sprintf(
			"runners on %s have no user namespace of their own (the host allows none): what their kernels start can use an engine socket there as their user", uri)))
	}
	if strings.HasPrefix(confinement, "landlock:") {
		e.unconfined[uri] = ""
		return
	}
	if _, local := backends.Find[*backends.Local](k.env); local {
		e.dropRunnerCacheLocked(k.env)
	}
	why := strings.TrimPrefix(confinement, "none:")
	if old, seen := e.unconfined[uri]; seen && old != "" {
		return
	}
	e.unconfined[uri] = why
	e.emit(Event{Type: EventUnconfined, Kernel: k.id, Owner: k.key.Owner, Key: k.key.String(), Detail: fmt.Sprintf(
		"runners on %s are not confined by Landlock (%s): kernels of one login there are kept apart only by their secrets and by being non-dumpable",
		uri, why)})
}

// transportError marks a failure to reach the host at all, as opposed to a
// host that answered with a refusal.
type transportError struct{ err error }

func (t *transportError) Error() string { return t.err.Error() }
func (t *transportError) Unwrap() error { return t.err }

// kernelRoot returns the kernel root learnt on env's host, or "".
func (e *Engine) kernelRoot(env backends.Env) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.roots[env.URI()]
}

// python returns the interpreter env's next kernel runs: on the engine's
// own local backend, what python3 (or Config.Python) resolves to in this
// process's environment now (its PATH, venv, pyenv version); elsewhere the
// interpreter path learnt on env's host, else the one configured, else ""
// (python3 on PATH).
func (e *Engine) python(env backends.Env) string {
	here := herePython(env, e.wantPython(env))
	e.mu.Lock()
	defer e.mu.Unlock()
	if here != "" {
		e.pythons[env.URI()] = hostPython{exe: here} // spares of another are stale (dropStaleSparesLocked)
		return here
	}
	return cmp.Or(e.pythons[env.URI()].exe, e.wantPython(env))
}

// hostPython is the interpreter a host's runners run: exe, as a runner
// said, which the configured name's PATH lookup gave as lookup then ("":
// not known, or a path was configured). A spawn runs exe only while PATH
// still gives lookup (a venv, a reordered PATH); a pyenv shim's version is
// checked in the background (recheckPython).
type hostPython struct{ exe, lookup string }

// pythonLookup is the lookup a spawn of python on env checks first, or "".
func (e *Engine) pythonLookup(env backends.Env, python string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if hp := e.pythons[env.URI()]; hp.exe == python {
		return hp.lookup
	}
	return ""
}

// herePython is what want resolves to for env, the engine's own local
// backend, in this process's environment, found without a process
// (interp); "" for other backends, or where only a process could tell.
func herePython(env backends.Env, want string) string {
	if env.URI() != "local" {
		return ""
	}
	if _, local := backends.Find[*backends.Local](env); !local {
		return ""
	}
	exe, err := interp.Resolve(want, interp.Here())
	if err != nil || !filepath.IsAbs(exe) || strings.ContainsFunc(exe, func(r rune) bool { return r <= ' ' }) {
		return ""
	}
	return exe
}

// wantPython is the interpreter configured for env's kernels, or "".
func (e *Engine) wantPython(env backends.Env) string {
	return cmp.Or(e.cfg.Pythons[env.URI()], e.cfg.Python)
}

func validKernelDir(tempDir, dir, id string, transient bool) bool {
	if transient {
		return path.Clean(dir) == dir && dir == path.Join(tempDir, "kerneldeck-once-"+id)
	}
	if path.Clean(dir) != dir || path.Base(dir) != id {
		return false
	}
	return validKernelRoot(tempDir, path.Dir(dir))
}

// killableDir says whether dir is one a spawn of kernel id makes on a host
// with tempDir, a kernel's or a per-call kernel's: a kill removes it.
func killableDir(tempDir, dir, id string) bool {
	return validKernelDir(tempDir, dir, id, false) || validKernelDir(tempDir, dir, id, true)
}

// validKernelRoot reports whether root has the shape of a kernel root,
// <temp dir>/kerneldeck-<login>.
func validKernelRoot(tempDir, root string) bool {
	return path.Clean(root) == root && path.Dir(root) == path.Clean(tempDir) && strings.HasPrefix(path.Base(root), "kerneldeck-") &&
		path.Base(root) != "kerneldeck-"
}

// redactRPC drops forwarded tool requests from host output, trimmed: they
// carry the kernel's token, so messages never quote them.
func redactRPC(output string) string {
	var kept []string
	for line := range strings.SplitSeq(output, "\n") {
		if !strings.HasPrefix(line, string(markRPC)) {
			kept = append(kept, line)
		}
	}
	return strings.TrimSpace(strings.Join(kept, "\n"))
}

// hostError turns a failed script's output into a message: the KD:ERR
// reason when there is one, else the output itself.
func hostError(res backends.Result) string {
	if reason, ok := findLine(res.Output, markErr); ok {
		return reason
	}
	out := redactRPC(res.Output)
	if len(out) > 500 {
		out = out[:500] + "..."
	}
	return fmt.Sprintf("exit status %d: %s", res.ReturnCode, out)
}

// processUmask is this process's umask, read without changing it (umask(2)
// would, for a moment, for every goroutine's files); 022 where /proc does
// not say.
func processUmask() int {
	data, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "Umask:"); ok {
				if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil && m <= 0o777 {
					return int(m)
				}
			}
		}
	}
	return 0o022
}
