package engine

import (
	"context"
	"net"
	"slices"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
)

// spare is a runner started before anyone asked, not yet keyed to anyone:
// the next new kernel on its backend takes it, binding it at that moment
// (the secret is its own, made at its start; it never served another key).
type spare struct {
	id  string
	env backends.Env // where its runner runs: the backend, or a container of its own
	// backend is the configured backend it serves.
	backend backends.Env
	// dialed, in a warm pool, is a connection to its runner's socket made
	// ahead: the kernel that takes it skips the relay's start.
	dialed     net.Conn
	runner     spawnedRunner
	readySince time.Time
}

// spareBackend is one backend's spares and the starts under way.
type spareBackend struct {
	ready    []*spare
	starting int
	// pending are the ids of the spares starting, in the journal: an
	// engine killed mid-spawn leaves a runner no record names, which the
	// next engine finds by its id.
	pending map[string]bool
}

// takeSpare hands k a spare runner of its backend, when k can use one: a
// new kernel (not a respawn, not per-call). On a backend that makes a
// container per kernel, the spare comes in a container of its own (a warm
// pool), which becomes the kernel's. Taken or not, the backend's spares are
// then made up again in the background (not before its first spawn ended).
func (e *Engine) takeSpare(k *Kernel) (*spare, bool) {
	b := k.backendEnv()
	if k.pid != 0 || k.transient || e.cfg.SpareKernels[b.URI()] <= 0 {
		return nil, false
	}
	if _, own := backends.Find[backends.Provisioner](b); own && len(k.key.ToolList()) > 0 {
		return nil, false // its stubs could not be put in again if they failed
	}
	e.mu.Lock()
	stale := e.dropStaleSparesLocked()
	var got *spare
	if sb := e.spareSets[b.URI()]; sb != nil {
		// A client's own interpreter takes only a spare that runs it.
		if i := slices.IndexFunc(sb.ready, func(s *spare) bool { return k.place.Python == "" || s.runner.python == k.place.Python }); i >= 0 {
			got = sb.ready[i] // before Delete, which clears the slot
			sb.ready = slices.Delete(sb.ready, i, i+1)
		}
	}
	e.mu.Unlock()
	e.killAsync(stale)
	// Before the backend's first spawn has ended, its spares wait for it
	// (see New): they would only slow it down.
	if got != nil || e.firstSpawnOver(b.URI()) {
		e.refillSpares(b)
	}
	return got, got != nil
}

// dropStaleSparesLocked takes out, for the caller to kill, the spares
// older than half the idle exit: their runners would soon end by
// themselves; and those on an interpreter the backend no longer runs (see
// recheckPython).
func (e *Engine) dropStaleSparesLocked() []*Kernel {
	var stale []*Kernel
	for uri, sb := range e.spareSets {
		kept := sb.ready[:0]
		for _, s := range sb.ready {
			moved := s.runner.python != "" && e.pythons[uri].exe != "" && s.runner.python != e.pythons[uri].exe
			if moved || e.cfg.Now().Sub(s.readySince) > e.idleExit/2 {
				stale = append(stale, s.kernel())
			} else {
				kept = append(kept, s)
			}
		}
		sb.ready = kept
	}
	return stale
}

// disposeHost removes a host made for one runner, if it is one, within
// killTimeout.
func disposeHost(ctx context.Context, host backends.Env) {
	if d, ok := backends.Find[backends.Disposer](host); ok {
		ctx, cancel := context.WithTimeout(ctx, killTimeout)
		defer cancel()
		d.Dispose(ctx)
	}
}

// kernel is the spare as a kernel record, for the kill path.
func (s *spare) kernel() *Kernel {
	return &Kernel{env: s.env, backend: s.backend, dialed: s.dialed, id: s.id, pid: s.runner.pid, dir: s.runner.dir, token: s.runner.token, state: phaseGone, goneReason: "a spare runner no longer needed", spare: true}
}

// sparesLocked counts the spares ready and starting on every backend.
func (e *Engine) sparesLocked() int {
	n := 0
	for _, sb := range e.spareSets {
		n += len(sb.ready) + sb.starting
	}
	return n
}

// Spares is how many spare runners are ready, across the backends.
func (e *Engine) Spares() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, sb := range e.spareSets {
		n += len(sb.ready)
	}
	return n
}

// refillSpares starts, in the background, the spares env lacks, while the
// kernels and spares together stay within max_kernels.
func (e *Engine) refillSpares(env backends.Env) {
	want := e.cfg.SpareKernels[env.URI()]
	if want <= 0 {
		return
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	sb := e.spareSets[env.URI()]
	if sb == nil {
		sb = &spareBackend{}
		e.spareSets[env.URI()] = sb
	}
	n := min(want-len(sb.ready)-sb.starting, e.max-len(e.kernels)-e.sparesLocked())
	sb.starting += max(0, n)
	ids := make([]string, max(0, n))
	for i := range ids {
		ids[i] = newKernelID()
		if sb.pending == nil {
			sb.pending = map[string]bool{}
		}
		sb.pending[ids[i]] = true
	}
	if n > 0 {
		e.journalTouch()
	}
	// Counted while closed is known false: Close's wait may begin as soon
	// as the lock is let go, and a spawn counted after it would outlive
	// the engine (the runner compile below can take seconds).
	e.wg.Add(max(0, n))
	e.mu.Unlock()
	prov, own := backends.Find[backends.Provisioner](env)
	if n > 0 && !own {
		// The first spares: the interpreter (the python3 on PATH, where no
		// spawn has told which it runs) compiles the runner (the spawns
		// wait for it), or they and the kernels of the first moments would
		// run from source (about 4.7 MB more each, for their whole life).
		// Once per interpreter: a compile claimed already is left be.
		e.compileRunner(env, e.python(env))
	}
	for _, id := range ids {
		go func() {
			defer e.wg.Done()
			ctx, cancel := context.WithTimeout(e.base, spawnTimeout+10*time.Second)
			host, err := env, error(nil)
			if own {
				// A warm pool: the container is made, started and holds a
				// runner before anyone asks; a kernel then costs a hand-over.
				host, err = prov.Provision(ctx, "spare-"+id)
			}
			var r spawnedRunner
			var dialed net.Conn
			if err == nil {
				r, err = e.startRunner(ctx, host, id, nil, roleSpare, "")
				if err != nil && own {
					disposeHost(context.WithoutCancel(ctx), host)
				}
			}
			if d := backends.StreamsOf(host); err == nil && own && d != nil {
				dialed, _ = d.DialUnix(ctx, r.dir+"/sock") // without it, the kernel dials as any does
			}
			cancel()
			if err != nil {
				e.abandonSpawn(host, Key{}, id, err)
			}
			e.mu.Lock()
			sb.starting--
			delete(sb.pending, id)
			s := &spare{id: id, env: host, backend: env, runner: r, dialed: dialed, readySince: e.cfg.Now()}
			keep := err == nil && !e.closed && len(e.kernels)+e.sparesLocked() < e.max
			if keep {
				sb.ready = append(sb.ready, s)
				e.journalTouch()
			}
			e.mu.Unlock()
			if err == nil && !keep {
				e.killAsync([]*Kernel{s.kernel()})
			}
		}()
	}
}

// dropSparesLocked takes up to n spares out (all with n < 0), for the
// caller to kill: the cap needs room, or the engine closes.
func (e *Engine) dropSparesLocked(n int) []*Kernel {
	var out []*Kernel
	for _, sb := range e.spareSets {
		for len(sb.ready) > 0 && (n < 0 || len(out) < n) {
			out = append(out, sb.ready[0].kernel())
			sb.ready = sb.ready[1:]
		}
	}
	return out
}

// refreshSpares replaces the spares older than half the idle exit (their
// runners would end by themselves) and starts the ones missing.
func (e *Engine) refreshSpares() {
	e.mu.Lock()
	stale := e.dropStaleSparesLocked()
	e.mu.Unlock()
	e.killAsync(stale)
	for _, b := range e.cfg.Backends {
		select {
		case <-e.sparesFree[b.URI()]: // not written after New: no lock
			e.refillSpares(b)
		default: // the first spawn first (a slow one can take seconds)
		}
	}
}
