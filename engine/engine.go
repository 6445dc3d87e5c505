// Package engine hosts persistent Python session kernels on backends: it
// spawns, reuses, serializes, times out, reaps and evicts them, and publishes
// every lifecycle step as an event.
package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
	"github.com/kerneldeck/kerneldeck/interp"
)

// Defaults for Config fields left zero.
const (
	DefaultMaxKernels     = 4
	DefaultIdleExit       = 30 * time.Minute
	DefaultCellTimeout    = 300 * time.Second
	DefaultInterruptGrace = 3 * time.Second
	DefaultClipChars      = 50_000
	DefaultSpillMax       = 5 << 20
	DefaultWaitWindow     = 15 * time.Second
	DefaultMaxToolCalls   = 50
	defaultSweepEvery     = time.Second
	spawnTimeout          = 30 * time.Second
	killTimeout           = 15 * time.Second
	killRetryMax          = 30 * time.Second
)

// The least cap, idle_exit and per-owner bound the engine takes; the
// settings table bounds them with these same values.
const (
	MinMaxKernels         = 1
	MinIdleExit           = time.Second
	MinMaxKernelsPerOwner = 0
)

// ErrBadLimit is a limit below what the engine takes.
var ErrBadLimit = errors.New("limit out of range")

// runnerIdleMargin is the slack the runner adds to idle_exit before it exits
// by itself (runner.py: min(30 s, max(1 s, idle_exit/4))).
func runnerIdleMargin(idle time.Duration) time.Duration {
	return min(30*time.Second, max(time.Second, idle/4))
}

// Config configures an Engine. Zero fields take the defaults above.
type Config struct {
	// Backends are the hosts kernels may run on, addressed by URI; the first
	// one is the default.
	Backends   []backends.Env
	MaxKernels int
	// MaxKernelsPerOwner bounds each owner's kernels (0: no bound, but
	// for members, see Request.Member): an owner at it gives up its own
	// least recently used idle kernel for a new one, never another
	// owner's.
	MaxKernelsPerOwner int
	IdleExit           time.Duration
	CellTimeout        time.Duration
	InterruptGrace     time.Duration
	// StateDir receives spill files (0700 dirs, 0600 files).
	StateDir string
	// JournalDir, when set, is where the engine keeps its kernels' records
	// while it runs, so that an engine started later on the same dir takes
	// them back (TakeBack) if this one dies without closing.
	JournalDir string
	Tracer     *backends.Tracer
	ClipChars  int
	SpillMax   int
	// WaitWindow is the longest one host-side wait over plain Execute.
	WaitWindow time.Duration
	// SweepEvery is how often idle kernels are reaped in the background.
	SweepEvery time.Duration
	// Now is the clock; tests inject a fake one.
	Now func() time.Time
	// NoConfine asks runners not to confine themselves with Landlock (the
	// other layers still hold); for hosts where Landlock gets in the way.
	NoConfine bool
	// Python is the interpreter kernels run with: an absolute path, or a
	// name looked up on each host's PATH ("": python3); Pythons, by
	// backend URI, overrides it for a backend. The path a host's first
	// runner reports (a shim resolved) is used from then on, per host.
	Python  string
	Pythons map[string]string
	// KernelLimits bound every kernel's runner on its host (zero: none).
	KernelLimits KernelLimits
	// KeepToolOutput keeps a kernel's stored tool output after the kernel
	// is gone; by default it goes with the kernel.
	KeepToolOutput bool
	// SpareKernels is how many runners to keep started and idle on each
	// backend (by URI), not yet anyone's kernel: a new kernel takes one
	// instead of starting a runner (one with tools writes its stubs into
	// it first). Spares count toward
	// MaxKernels, go first when over it, and are killed with the engine.
	SpareKernels map[string]int

	// Tools serves kernels' tool calls; nil means no host tools (every call
	// gets an error answer).
	Tools *hosttools.Registry
	// ToolOutput keeps tool output too large to return inline; nil returns
	// it inline whatever its size.
	ToolOutput *hosttools.Storage
	// MaxToolCalls is how many tool calls one cell may make (default 50);
	// a negative value allows none.
	MaxToolCalls int
	// Approvals decides which tool calls run, ask the operator or are refused.
	Approvals Approvals
	// ApprovalTimeout is how long an "ask" waits before denying.
	ApprovalTimeout time.Duration

	// History is how many events the engine remembers for replay
	// (SubscribeOptions.Since; default DefaultHistory). Earlier, when set,
	// gives up to n events said before this engine started (the event log
	// of earlier engines), oldest first: it is asked once, by the first
	// subscription that wants history, never at the start, so a one-shot's
	// first result does not wait on the history it keeps.
	History int
	Earlier func(n int) ([]Event, error)

	// ParkDir, when set, is where evicted and reaped kernels park their
	// state for their key's next call (0700; see parking.go). ParkMaxBytes
	// bounds one kernel's parked state, ParkTimeout how long a park or a
	// restore may take, ParkRetention how long a parked state is kept and
	// ParkTotalBytes all of them (the oldest go first).
	ParkDir        string
	ParkMaxBytes   int64
	ParkTimeout    time.Duration
	ParkRetention  time.Duration
	ParkTotalBytes int64
	// HibernateAfter is how long a kernel may sit idle before it is parked
	// and its runner ended, to be restored by its key's next call (0:
	// never; it needs ParkDir, and acts only below IdleExit).
	HibernateAfter time.Duration

	// KernelUIDs, on a root engine, is the range of OS user ids its
	// owners' kernels run as on this machine, one uid per owner (see
	// uids.go); KernelHomes is where their homes are made (default
	// DefaultKernelHomes). Zero: kernels run as the engine's user.
	KernelUIDs  UIDRange
	KernelHomes string

	// HidePaths are more paths of this machine that local runners must
	// not see, besides the state dir: the engine's socket, or its dir.
	HidePaths []string

	// LandlockOnly has runners hide the engine's files and other kernels'
	// dirs with Landlock alone, as they do where the host gives them no
	// mount namespace: for tests of that fallback.
	LandlockOnly bool

	// firstSpawnWait overrides firstSpawnWait (tests whose first spawn
	// must begin before the spares start, however loaded the machine).
	firstSpawnWait time.Duration
}

// Engine is the in-process kernel host. All its methods are safe for
// concurrent use.
type Engine struct {
	cfg Config
	// backends are the configured backends and the ones made for members
	// (MemberBackend), by URI; read through env.
	backendsMu sync.RWMutex
	backends   map[string]backends.Env
	bus        *bus
	cells      *cellLog

	mu      sync.Mutex
	kernels map[Key]*Kernel
	byID    map[string]*Kernel
	// order is e.kernels sorted as Kernels lists them; nil when a kernel
	// came, went or changed id since (orderDirty).
	order    []*Kernel
	max      int
	perOwner int // max_kernels_per_owner, 0: none
	idleExit time.Duration
	// hibernateAfter is Config.HibernateAfter as it is now (SetHibernateAfter);
	// hibernated holds, by key, when each kernel this engine hibernated was
	// last used, until idle_exit ends its session (hibernate.go).
	hibernateAfter time.Duration
	hibernated     map[Key]time.Time
	closed         bool
	overCap        bool // an evict_skipped_busy was reported for the current overflow
	// roomFor are the new kernels that needed room, oldest first: an
	// eviction says which it made room for, now or once busy kernels settle.
	roomFor []*Kernel
	// idleSince is at or before the lastUsed of every kernel that may go
	// idle, so reapIdle need not scan the registry before idleSince +
	// hibernate_after (or idle_exit): a release only moves lastUsed later.
	// Zero forces a scan. awakeSince is the same for the kernels that
	// cannot hibernate (they stay awake), due at idle_exit only: one of
	// them must not make every call scan the registry.
	idleSince, awakeSince time.Time
	uids                  *kernelUIDs           // the owners' uids (Config.KernelUIDs), or nil
	pythons               map[string]hostPython // backend URI -> the interpreter its runners reported
	umask                 int                   // what cells create files with: this process's
	cwd                   string                // where local kernels start: this process's, unless a request says (Place)
	roots                 map[string]string     // backend URI -> the kernel root its runners were spawned in
	// unconfined holds, per backend URI, why its runners are not confined
	// ("" once one was), so the event is said once per host.
	unconfined map[string]string
	// noUserNS holds the backend URIs whose runners said they have no user
	// namespace of their own (told once).
	noUserNS map[string]bool
	// lost says, per key, why the key's last kernel left the registry with
	// its state; the call that creates the key's next kernel reports it as
	// state_lost instead of looking like a first call. Bounded by
	// maxLostNotes.
	lost map[Key]string
	// unkilled are runners whose kill did not reach their host (a transport
	// error, e.g. no free ssh session within killTimeout), by kernel id. The
	// sweep retries them and ShutdownAll kills them with the rest.
	unkilled map[string]*pendingKill
	// approvals are the tool calls waiting for the operator, and the
	// grants they made (a lock of their own).
	approvals *approvalDesk
	// codes are the runners compiled by each backend's interpreters (a
	// lock of their own).
	codes *runnerCodes
	// spareSets are the spare runners of each backend (Config.SpareKernels).
	spareSets map[string]*spareBackend
	// runnerFiles are the files the configured backends' runners are kept
	// in (see runnercache.go), by URI; none for a backend that keeps none.
	runnerFiles map[string]string
	// firstSpawns are closed, per configured backend, when its first
	// kernel's spawn has ended (read-only after New; closed once, under mu).
	firstSpawns map[string]chan struct{}
	// firstBegun are closed, per configured backend, when a kernel's
	// spawn on it begins.
	firstBegun map[string]chan struct{}
	// sparesFree are closed, per configured backend, once its first spares
	// may start (after its first spawn, see New): until then the sweep
	// starts none, which would run the python3 on PATH beside that spawn.
	sparesFree map[string]chan struct{}
	// journal records the kernels for an engine after this one (nil: no
	// Config.JournalDir).
	journal *journal
	// parks keeps parked states (nil: no Config.ParkDir); parking holds,
	// per key, the park under way, closed once it is over; parkPruned is
	// when the parked states were last pruned.
	parks *parkStore
	// parkName is what this engine's parked states say of whose they are;
	// parkEngines are the engines whose parked states it holds: itself,
	// and those it took kernels back from (guarded by mu).
	parkName    string
	parkEngines map[string]bool
	parking     map[Key]chan struct{}
	parkPruned  time.Time
	// retiring are the kernels out of the registry being parked, by id:
	// the journal keeps them until they are killed, so that an engine that
	// dies meanwhile leaves them to the next one, state and all.
	retiring map[string]*Kernel

	wg sync.WaitGroup
	// base is the context of the engine's own background work (spares,
	// the runner-code cache, the sweep); Close cancels it. Kills run on
	// contexts of their own: they must finish after it.
	base       context.Context
	cancelBase context.CancelFunc
}

// New starts an engine and its background idle sweep.
func New(cfg Config) (*Engine, error) {
	if len(cfg.Backends) == 0 {
		return nil, errors.New("engine: no backend configured")
	}
	cfg.MaxKernels = cmp.Or(cfg.MaxKernels, DefaultMaxKernels)
	cfg.IdleExit = cmp.Or(cfg.IdleExit, DefaultIdleExit)
	cfg.CellTimeout = cmp.Or(cfg.CellTimeout, DefaultCellTimeout)
	cfg.InterruptGrace = cmp.Or(cfg.InterruptGrace, DefaultInterruptGrace)
	cfg.ClipChars = cmp.Or(cfg.ClipChars, DefaultClipChars)
	cfg.SpillMax = cmp.Or(cfg.SpillMax, DefaultSpillMax)
	cfg.WaitWindow = cmp.Or(cfg.WaitWindow, DefaultWaitWindow)
	cfg.SweepEvery = cmp.Or(cfg.SweepEvery, defaultSweepEvery)
	cfg.MaxToolCalls = cmp.Or(cfg.MaxToolCalls, DefaultMaxToolCalls)
	cfg.ApprovalTimeout = cmp.Or(cfg.ApprovalTimeout, DefaultApprovalTimeout)
	if err := cfg.Approvals.Validate(); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.ParkMaxBytes = cmp.Or(cfg.ParkMaxBytes, DefaultParkMaxBytes)
	cfg.ParkTimeout = cmp.Or(cfg.ParkTimeout, DefaultParkTimeout)
	cfg.ParkRetention = cmp.Or(cfg.ParkRetention, DefaultParkRetention)
	cfg.ParkTotalBytes = cmp.Or(cfg.ParkTotalBytes, DefaultParkTotalBytes)
	if cfg.MaxKernelsPerOwner < 0 {
		return nil, fmt.Errorf("engine: max_kernels_per_owner must be >= 0 (0: no bound), got %d", cfg.MaxKernelsPerOwner)
	}
	if cfg.HibernateAfter < 0 {
		return nil, fmt.Errorf("engine: hibernate_after must be >= 0 (0: never), got %v", cfg.HibernateAfter)
	}
	if cfg.MaxKernels < 1 || cfg.IdleExit < time.Second || cfg.CellTimeout <= 0 {
		return nil, fmt.Errorf("engine: max_kernels must be >= 1, idle_exit >= 1s and cell_timeout > 0 (got %d, %v, %v)",
			cfg.MaxKernels, cfg.IdleExit, cfg.CellTimeout)
	}
	e := &Engine{
		cfg:         cfg,
		backends:    map[string]backends.Env{},
		bus:         newBus(cmp.Or(cfg.History, DefaultHistory), cfg.Earlier, cfg.Now()),
		cells:       newCellLog(),
		kernels:     map[Key]*Kernel{},
		byID:        map[string]*Kernel{},
		pythons:     map[string]hostPython{},
		umask:       processUmask(),
		cwd:         interp.Here().Dir,
		roots:       map[string]string{},
		codes:       newRunnerCodes(),
		unconfined:  map[string]string{},
		noUserNS:    map[string]bool{},
		lost:        map[Key]string{},
		parking:     map[Key]chan struct{}{},
		retiring:    map[string]*Kernel{},
		unkilled:    map[string]*pendingKill{},
		approvals:   newApprovalDesk(),
		spareSets:   map[string]*spareBackend{},
		runnerFiles: map[string]string{},
		firstSpawns: map[string]chan struct{}{},
		firstBegun:  map[string]chan struct{}{},
		sparesFree:  sparesFreeOf(cfg.Backends),
		max:         cfg.MaxKernels,
		perOwner:    cfg.MaxKernelsPerOwner,
		idleExit:    cfg.IdleExit,
		hibernated:  map[Key]time.Time{},
	}
	e.hibernateAfter = cfg.HibernateAfter
	// A base that outlives the engine would keep spares starting and
	// compiles running after Close; Close cancels it.
	e.base, e.cancelBase = context.WithCancel(context.Background())
	for _, b := range cfg.Backends {
		if _, dup := e.backends[b.URI()]; dup {
			return nil, fmt.Errorf("engine: backend %s configured twice", b.URI())
		}
		e.backends[b.URI()] = b
		if r, ok := backends.Find[backends.OrphanReporter](b); ok {
			if gone := r.OrphansRemoved(); len(gone) > 0 {
				e.emit(Event{Type: EventNotice, Detail: fmt.Sprintf("%s: removed %d kernels' own hosts left by an engine that is gone: %s",
					b.URI(), len(gone), strings.Join(gone, ", "))})
			}
		}
	}
	if !cfg.KernelUIDs.IsZero() {
		u, err := openKernelUIDs(cfg.KernelUIDs, cfg.KernelHomes, cfg.StateDir)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		e.uids = u
		// A spare of the local backend would run as root, whoever took it.
		if n := cfg.SpareKernels["local"]; n > 0 {
			e.cfg.SpareKernels = maps.Clone(cfg.SpareKernels)
			delete(e.cfg.SpareKernels, "local")
		}
	}
	if cfg.ParkDir != "" {
		p, err := openParkStore(cfg.ParkDir)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		e.parks = p
	}
	e.parkName, e.parkEngines = "engine-"+randomHex(8), map[string]bool{}
	if cfg.JournalDir != "" {
		j, err := openJournal(cfg.JournalDir)
		if err != nil {
			return nil, err
		}
		e.parkName = j.name
		e.journal = j
		go j.run(e.journalRecords, func(err error) {
			e.emit(Event{Type: EventNotice, Detail: err.Error() + "; a later engine may not take back every kernel if this one dies"})
		})
	}
	e.wg.Add(1)
	go e.sweep()
	for _, b := range cfg.Backends {
		if path := e.runnerCacheFile(b); path != "" {
			e.runnerFiles[b.URI()] = path
		}
		kept := ""
		if e.loadRunnerCache(b) {
			kept = e.python(b)
		}
		first, begun, free := make(chan struct{}), make(chan struct{}), e.sparesFree[b.URI()]
		e.firstSpawns[b.URI()], e.firstBegun[b.URI()] = first, begun
		// Nothing that can wait runs beside the first kernel's spawn: the
		// spares start once it is done (or after firstSpawnWait), and so
		// does the check that the kept interpreter is still the host's,
		// which Close waits for (a one-shot engine's next run must not keep
		// a stale one).
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			t := time.NewTimer(cmp.Or(e.cfg.firstSpawnWait, firstSpawnWait))
			defer t.Stop()
			select {
			case <-first:
			case <-t.C:
				// A first spawn that began is let end, however slow (a
				// pyenv shim where starting a process is slow): spares and
				// checks beside it would only slow it down more.
				select {
				case <-begun:
					select {
					case <-first:
					case <-time.After(spawnTimeout):
					case <-e.base.Done():
						return
					}
				default:
				}
			case <-e.base.Done():
				return
			}
			close(free)
			e.refillSpares(b)
			if kept != "" && herePython(b, e.wantPython(b)) == "" { // else what it resolved to is the truth
				ctx, cancel := context.WithTimeout(context.WithoutCancel(e.base), spawnTimeout)
				defer cancel()
				e.recheckPython(ctx, b, kept)
			}
		}()
	}
	return e, nil
}

// sparesFreeOf makes the sparesFree channels of the configured backends,
// before the sweep that reads them starts.
func sparesFreeOf(bs []backends.Env) map[string]chan struct{} {
	m := make(map[string]chan struct{}, len(bs))
	for _, b := range bs {
		m[b.URI()] = make(chan struct{})
	}
	return m
}

// firstSpawnWait is how long spares and checks wait for the first kernel's
// spawn before they start anyway.
const firstSpawnWait = 250 * time.Millisecond

// firstSpawnBegun tells that a kernel's spawn on uri has begun.
func (e *Engine) firstSpawnBegun(uri string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ch, ok := e.firstBegun[uri]; ok {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
}

// firstSpawnEnded tells that a kernel's spawn on uri has ended.
func (e *Engine) firstSpawnEnded(uri string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ch, ok := e.firstSpawns[uri]; ok {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
}

// firstSpawnOver tells whether a kernel's spawn on uri has ended (true for
// a backend that is not configured).
func (e *Engine) firstSpawnOver(uri string) bool {
	e.mu.Lock()
	ch, ok := e.firstSpawns[uri]
	e.mu.Unlock()
	if !ok {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Subscribe returns a subscription to lifecycle events with the given buffer.
func (e *Engine) Subscribe(buffer int) *Subscription {
	return e.bus.subscribe(SubscribeOptions{Buffer: buffer})
}

// SubscribeWith returns a subscription as o asks: with cell output, with
// the remembered events since a time replayed first, gap-free.
func (e *Engine) SubscribeWith(o SubscribeOptions) *Subscription {
	s := e.bus.subscribe(o)
	if o.Output {
		e.watchRunning()
	}
	return s
}

// watchRunning asks every runner whose cell runs over its socket without
// streaming to stream it from now on: a subscriber that takes output has
// come, and a cell started before it came would stay silent to it.
func (e *Engine) watchRunning() {
	e.mu.Lock()
	type watch struct {
		conn *runnerConn
		cell string
	}
	var ws []watch
	for _, k := range e.kernels {
		if k.runningCell != "" && k.conn != nil {
			ws = append(ws, watch{k.conn, k.runningCell})
		}
	}
	e.mu.Unlock()
	for _, w := range ws {
		w.conn.send(map[string]string{"op": "watch", "id": w.cell})
	}
}

// Publish puts an event of the parts around the engine (the server, the
// event log) on the engine's bus, stamped with the engine's clock. Only
// EventNotice may be published this way.
func (e *Engine) Publish(ev Event) {
	if ev.Type != EventNotice {
		return
	}
	e.emit(ev)
}

// KernelLimits are the per-kernel resource limits a runner sets on itself
// at start (rlimits, which every backend's host has): a cell that allocates
// past Memory gets MemoryError and the kernel keeps its state.
type KernelLimits struct {
	Memory   int64         // address space, bytes
	CPUTime  time.Duration // CPU time of the runner and what it starts
	MaxProcs int           // processes of the kernel's login on its host
}

// DefaultBackend is the URI of the first configured backend.
func (e *Engine) DefaultBackend() string { return e.cfg.Backends[0].URI() }

// Backends lists the configured backend URIs in order.
func (e *Engine) Backends() []string {
	out := make([]string, len(e.cfg.Backends))
	for i, b := range e.cfg.Backends {
		out[i] = b.URI()
	}
	return out
}

// env is the backend of uri, configured or made for a member.
func (e *Engine) env(uri string) (backends.Env, bool) {
	e.backendsMu.RLock()
	defer e.backendsMu.RUnlock()
	env, ok := e.backends[uri]
	return env, ok
}

// MemberBackend is the backend URI on which a member of the engine's group
// (OS user uid) runs kernels it asks for on uri: uri itself where each
// kernel gets a host of its own; where the engine can run commands as the
// member's own OS user (it is root, on this machine), that host as that
// user ("local?user=bob"). Elsewhere its kernels would run as the engine's
// user, and it is refused: the error says where members may run kernels.
func (e *Engine) MemberBackend(uri string, uid int) (string, error) {
	env, ok := e.env(uri)
	if !ok {
		return "", fmt.Errorf("%w %q; configured backends: %s", ErrUnknownBackend, uri, strings.Join(e.Backends(), ", "))
	}
	own, sw := memberHost(env)
	switch {
	case own:
		return uri, nil
	case sw == nil:
		return "", fmt.Errorf("%w: on %s a kernel would run as the engine's user", ErrMemberBackend, uri)
	}
	mine, err := sw.AsUser(uid)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrMemberBackend, err)
	}
	return e.addBackend(mine).URI(), nil
}

// MemberBackends lists the configured backends where members of the
// engine's group may run kernels (memberHost).
func (e *Engine) MemberBackends() []string {
	var out []string
	for _, b := range e.cfg.Backends {
		if own, sw := memberHost(b); own || sw != nil {
			out = append(out, b.URI())
		}
	}
	return out
}

// memberHost says how a member's kernels may run on env: each in a host of
// its own (own), or as the member's own OS user (sw, on a root engine); or
// neither, as there they would run as the engine's user.
func memberHost(env backends.Env) (own bool, sw backends.UserSwitcher) {
	if _, ok := backends.Find[backends.Provisioner](env); ok {
		return true, nil
	}
	if s, ok := backends.Find[backends.UserSwitcher](env); ok && os.Geteuid() == 0 {
		return false, s
	}
	return false, nil
}

// CellTimeout is the timeout of a cell whose request gives none.
func (e *Engine) CellTimeout() time.Duration { return e.cfg.CellTimeout }

// SetOwnerQuota changes max_kernels_per_owner (0: no bound); it applies to
// the next kernel an owner starts.
func (e *Engine) SetOwnerQuota(n int) error {
	if n < MinMaxKernelsPerOwner {
		return fmt.Errorf("%w: max_kernels_per_owner must be at least %d (0: no bound), got %d", ErrBadLimit, MinMaxKernelsPerOwner, n)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.perOwner = n
	e.emit(Event{Type: EventLimits, Detail: fmt.Sprintf("max_kernels_per_owner %d (members: %d)", n, e.quotaLocked(true))})
	return nil
}

// quotaLocked is how many kernels an owner may have (0: no bound): the
// configured bound, or, for a member's owner, a quarter of the cap.
func (e *Engine) quotaLocked(member bool) int {
	if e.perOwner > 0 || !member {
		return e.perOwner
	}
	return max(1, e.max/4)
}

// Limits reports the cap and idle_exit in force.
func (e *Engine) Limits() (maxKernels int, idleExit time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.max, e.idleExit
}

// SetLimits changes the cap and/or idle_exit (nil leaves one unchanged) and
// applies them at once: idle kernels are reaped and the cap enforced now.
func (e *Engine) SetLimits(maxKernels *int, idleExit *time.Duration) error {
	if maxKernels != nil && *maxKernels < MinMaxKernels {
		return fmt.Errorf("%w: max_kernels must be at least %d, got %d", ErrBadLimit, MinMaxKernels, *maxKernels)
	}
	if idleExit != nil && *idleExit < MinIdleExit {
		return fmt.Errorf("%w: idle_exit must be at least %v, got %v", ErrBadLimit, MinIdleExit, *idleExit)
	}
	e.mu.Lock()
	if maxKernels != nil {
		e.max = *maxKernels
	}
	var push []*Kernel
	if idleExit != nil && *idleExit != e.idleExit {
		e.idleExit = *idleExit
		for _, k := range e.kernels {
			if k.state == phaseReady {
				push = append(push, k)
			}
		}
	}
	e.emit(Event{Type: EventLimits, Detail: fmt.Sprintf("max_kernels %d, idle_exit %s", e.max, english.Duration(e.idleExit))})
	idle := e.idleExit
	e.mu.Unlock()
	// Runners exit by themselves after their own idle_exit: tell them the new one.
	for _, k := range push {
		e.goAsync(func(ctx context.Context) { e.configureRunner(ctx, k, idle) })
	}
	e.reapIdle()
	cause := ""
	if maxKernels != nil {
		cause = fmt.Sprintf("the cap was set to %d", *maxKernels)
	}
	e.enforceCap(cause)
	return nil
}

// Close stops the engine. Unless keep is set, every kernel is killed on its
// host; Close waits for that and for every goroutine the engine started.
func (e *Engine) Close(ctx context.Context, keep bool) error {
	e.mu.Lock()
	e.closed = true
	spares := e.dropSparesLocked(-1)
	e.mu.Unlock()
	// Spares still starting and compiles give up now, and the sweep stops.
	e.cancelBase()
	// Spares are nobody's: they go even when the kernels are kept.
	e.killAll(ctx, spares)
	var err error
	if !keep {
		e.ShutdownAll(ctx)
	} else {
		e.mu.Lock()
		for _, k := range e.kernels {
			if k.conn != nil {
				k.conn.close()
			}
		}
		e.mu.Unlock()
	}
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
		// Kills retried by the sweep may have failed again meanwhile.
		e.killPending(ctx, e.takeUnkilled(true))
	case <-ctx.Done():
		err = errors.Join(err, fmt.Errorf("engine close: %w", ctx.Err()))
	}
	if !keep {
		e.dropOwnParks()
	}
	if e.journal != nil {
		e.journal.close()
	}
	e.bus.close()
	return err
}

func (e *Engine) sweep() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-e.base.Done():
			return
		case <-t.C:
			e.reapIdle()
			e.endHibernated()
			e.enforceCap("")
			e.refreshSpares()
			e.pruneParked(true)
			if due := e.takeUnkilled(false); len(due) > 0 { // a retry that fails puts it back
				e.goAsync(func(ctx context.Context) { e.killBatches(ctx, due) })
			}
		}
	}
}

// goAsync runs f in a goroutine the engine waits for on Close.
func (e *Engine) goAsync(f func(ctx context.Context)) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
		defer cancel()
		f(ctx)
	}()
}

// emit publishes ev; it never blocks, so it is safe under e.mu.
func (e *Engine) emit(ev Event) {
	ev.Time = e.cfg.Now()
	e.bus.publish(ev)
}

func kernelEvent(t EventType, k *Kernel, detail string) Event {
	return Event{Type: t, Kernel: k.id, Owner: k.key.Owner, Key: k.key.String(), Detail: detail}
}

func cellEvent(t EventType, k *Kernel, cell, detail string) Event {
	ev := kernelEvent(t, k, detail)
	ev.Cell = cell
	return ev
}

// maxLostNotes bounds Engine.lost: past it, an arbitrary older note is
// dropped (its key's next kernel then looks like a first one).
const maxLostNotes = 4096

// removeLocked takes k out of the registry; the caller kills it on its host.
func (e *Engine) removeLocked(k *Kernel, reason string) {
	if e.kernels[k.key] == k {
		delete(e.kernels, k.key)
		e.orderDirty()
		switch {
		case k.pid > 0: // it ran, so it had state
			e.noteLostLocked(k.key, fmt.Sprintf("kernel %s was %s; state from earlier calls was lost", k.id, reason))
		case k.lostNote != "":
			// Its spawn failed before any result could say that the key's
			// earlier kernel and its state were gone: the next one says it.
			e.noteLostLocked(k.key, k.lostNote)
		}
	}
	if e.byID[k.id] == k {
		delete(e.byID, k.id)
	}
	k.state = phaseGone
	k.goneReason = reason
	e.journalTouch()
}

// noteLostLocked keeps note for key's next kernel, within maxLostNotes.
func (e *Engine) noteLostLocked(key Key, note string) {
	if _, ok := e.lost[key]; !ok && len(e.lost) >= maxLostNotes {
		for old := range e.lost {
			delete(e.lost, old)
			break
		}
	}
	e.lost[key] = note
}

// reapIdle removes kernels idle longer than idle_exit, and hibernates those
// idle longer than hibernate_after; it kills them (parked first, where they
// can be) and returns them.
func (e *Engine) reapIdle() []*Kernel {
	e.mu.Lock()
	now := e.cfg.Now()
	hibernating := e.hibernatingLocked()
	first := e.idleExit
	if hibernating {
		first = e.hibernateAfter
	}
	if !e.idleSince.IsZero() && now.Sub(e.idleSince) <= first && now.Sub(e.awakeSince) <= e.idleExit {
		e.mu.Unlock()
		return nil // nothing can have been idle that long yet
	}
	var victims []*Kernel
	oldest, oldestAwake := now, now
	for _, k := range e.kernels {
		idle := now.Sub(k.lastUsed)
		ready := k.state == phaseReady && !k.attachedLocked()
		if ready && idle > e.idleExit {
			e.removeLocked(k, "reaped after idle "+english.Duration(idle))
			e.emit(kernelEvent(EventReapedIdle, k, fmt.Sprintf("idle %s > idle_exit %s", english.Duration(idle), english.Duration(e.idleExit))))
			victims = append(victims, k)
			continue
		}
		if ready && hibernating && (k.awake != "" || e.closed || e.unparkableLocked(k) != "") {
			if k.lastUsed.Before(oldestAwake) {
				oldestAwake = k.lastUsed
			}
			continue
		}
		if ready && idle > first && hibernating {
			e.hibernateLocked(k, idle)
		}
		if k.lastUsed.Before(oldest) {
			oldest = k.lastUsed
		}
	}
	e.idleSince, e.awakeSince = oldest, oldestAwake
	e.retireLocked(victims)
	e.mu.Unlock()
	return victims
}

// enforceCap evicts least recently used kernels while over the cap, never one
// with an attached (running or queued) cell; cause, if any, says what needed
// the room ("made room for bob/default"; "": nothing said), for the events.
func (e *Engine) enforceCap(cause string) {
	e.mu.Lock()
	now := e.cfg.Now()
	var victims []*Kernel
	if over := len(e.kernels) + e.sparesLocked() - e.max; over > 0 {
		// Spares go first: they hold nobody's state.
		victims = e.dropSparesLocked(over)
	}
	if over := len(e.kernels) - e.max; over > 0 {
		idle := e.lruLocked()
		busy := e.busyNamesLocked()
		for i, k := range idle {
			if i >= over {
				break
			}
			e.removeLocked(k, "evicted by the cap")
			// The reason names kernels by owner and task, so an operator
			// can read it without looking up ids.
			why := fmt.Sprintf("the least recently used of %d idle kernels", len(idle)-i)
			if left := len(idle) - i; left == 1 {
				why = "the only idle kernel"
			} else if i+1 < len(idle) {
				why += fmt.Sprintf(" (next: %s)", keyName(idle[i+1]))
			}
			detail := fmt.Sprintf("cap %d exceeded by %d: %s, %s", e.max, over-i, why, idleFor(now.Sub(k.lastUsed)))
			others := busy
			if cause != "" {
				detail += "; " + cause
			} else if n := e.takeRoomForLocked(k); n != nil {
				// The new kernel is busy too: named once, as the one made room for.
				detail += "; made room for " + keyName(n)
				others = slices.DeleteFunc(slices.Clone(busy), func(b string) bool { return b == keyName(n) })
			}
			if len(others) > 0 {
				detail += "; busy, never evicted: " + listSome(others, 5)
			}
			e.emit(kernelEvent(EventEvictedCap, k, detail))
			victims = append(victims, k)
		}
		if left := len(e.kernels) - e.max; left > 0 && !e.overCap {
			e.overCap = true
			e.emit(Event{Type: EventEvictSkippedBusy, Detail: fmt.Sprintf(
				"%d kernel(s) over cap %d; busy kernels are never evicted: %s", left, e.max, strings.Join(e.busyNamesLocked(), ", "))})
		}
	}
	if len(e.kernels) <= e.max {
		e.overCap, e.roomFor = false, nil
	}
	e.retireLocked(victims)
	e.mu.Unlock()
}

// enforceCapFor is enforceCap for new kernel k: the evictions it causes,
// now or once busy kernels settle, say they made room for it.
func (e *Engine) enforceCapFor(k *Kernel) {
	e.mu.Lock()
	e.roomFor = append(e.roomFor, k)
	e.mu.Unlock()
	e.enforceCap("")
}

// takeRoomForLocked is the oldest new kernel still waiting for room that
// is not victim itself (a newcomer that settles first is evicted for
// nobody), or nil.
func (e *Engine) takeRoomForLocked(victim *Kernel) *Kernel {
	for i, n := range e.roomFor {
		if n != victim && e.byID[n.id] == n {
			e.roomFor = append(e.roomFor[:i:i], e.roomFor[i+1:]...)
			return n
		}
	}
	return nil
}

// idleFor says how long a kernel has been idle, in words: "idle 5m00s",
// "used just now" under a second.
func idleFor(d time.Duration) string {
	if d < time.Second {
		return "used just now"
	}
	return "idle " + english.Duration(d)
}

// keyName names a kernel for people: owner/task[/child], and its id.
func keyName(k *Kernel) string {
	n := k.key.Owner + "/" + k.key.Task
	if k.key.Child != "" {
		n += "/" + k.key.Child
	}
	return n + " (" + k.id + ")"
}

// listSome joins the first n names and counts the rest.
func listSome(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

// busyNamesLocked names the kernels with a running or queued cell, sorted.
func (e *Engine) busyNamesLocked() []string {
	var busy []string
	for _, k := range e.kernels {
		if k.attachedLocked() {
			busy = append(busy, keyName(k))
		}
	}
	slices.Sort(busy)
	return busy
}

// makeRoomForOwnerLocked keeps owner within its quota before it gets a new
// kernel: at the quota, its own least recently used idle kernel goes
// (removed here; the caller kills it), never another owner's. With every
// one of its kernels busy, the new one is refused (ErrOwnerQuota).
func (e *Engine) makeRoomForOwnerLocked(owner string, member bool) (*Kernel, error) {
	quota := e.quotaLocked(member)
	if quota == 0 {
		return nil, nil
	}
	var mine []*Kernel
	for _, k := range e.kernels {
		if k.key.Owner == owner {
			mine = append(mine, k)
		}
	}
	if len(mine) < quota {
		return nil, nil
	}
	for _, k := range e.lruLocked() {
		if k.key.Owner != owner {
			continue
		}
		e.removeLocked(k, "evicted by its owner's quota")
		e.emit(kernelEvent(EventEvictedCap, k, fmt.Sprintf("owner %s at its quota of %s (max_kernels_per_owner): its least recently used idle kernel, %s, made room for a new one",
			owner, english.Count(quota, "kernel"), idleFor(e.cfg.Now().Sub(k.lastUsed)))))
		return k, nil
	}
	return nil, fmt.Errorf("%w: owner %q has %s, its quota (max_kernels_per_owner), each running or queueing a cell; wait for one to finish, or close one",
		ErrOwnerQuota, owner, english.Count(len(mine), "kernel"))
}

// lruLocked lists the evictable kernels, least recently used first.
func (e *Engine) lruLocked() []*Kernel {
	var idle []*Kernel
	for _, k := range e.kernels {
		if k.state == phaseReady && !k.attachedLocked() {
			idle = append(idle, k)
		}
	}
	slices.SortFunc(idle, func(a, b *Kernel) int {
		return cmp.Or(a.lastUsed.Compare(b.lastUsed), cmp.Compare(a.id, b.id))
	})
	return idle
}

// runnerRef is what killing a runner needs, taken from its kernel at the
// time of the kill: a reset may respawn the kernel in place meanwhile.
type runnerRef struct {
	key    Key
	env    backends.Env
	id     string
	dir    string
	pid    int
	reason string
	spare  bool // nobody's kernel: its kill is not an event
	// abandoned is a spawn the engine gave up on: no pid was learnt, so
	// the kill finds its processes by id (abandonScript), and is no event.
	abandoned bool
}

// killable says whether a kill knows enough to find r's processes.
func (r runnerRef) killable() bool { return r.abandoned || (r.dir != "" && r.pid > 0) }

func (r runnerRef) event(t EventType, detail string) Event {
	return Event{Type: t, Kernel: r.id, Owner: r.key.Owner, Key: r.key.String(), Detail: detail}
}

// pendingKill is a runner whose kill did not reach its host, and when to
// try again.
type pendingKill struct {
	runner runnerRef
	retry  *killRetry
}

// takeUnkilled returns the kills that failed and whose retry is due (all of
// them when all is set), and forgets them.
func (e *Engine) takeUnkilled(all bool) []*pendingKill {
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*pendingKill
	for id, p := range e.unkilled {
		if all || !now.Before(p.retry.next) {
			out = append(out, p)
			delete(e.unkilled, id)
		}
	}
	return out
}

// killFailed reports a kill that failed with err and keeps r for a retry
// after a backoff, or gives up once its runner must have exited by itself
// (idle_exit plus its margin, after a cell's timeout at most). prev is the
// retry record of the failed attempt. The report and the record are made
// under one lock, so whoever sees the report sees the retry scheduled.
func (e *Engine) killFailed(r runnerRef, prev *killRetry, err error) {
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.emit(r.event(EventTransportError, "kill: "+err.Error()))
	if prev == nil {
		idle := e.idleExit
		prev = &killRetry{giveUp: now.Add(e.cfg.CellTimeout + idle + runnerIdleMargin(idle))}
	}
	next := &killRetry{tries: prev.tries + 1, giveUp: prev.giveUp}
	if !now.Before(next.giveUp) {
		e.emit(r.event(EventTransportError, fmt.Sprintf(
			"kill: gave up after %d tries: the host stayed unreachable, and the runner exits by itself once idle for its idle_exit", next.tries)))
		return
	}
	next.next = now.Add(min(time.Second<<min(next.tries-1, 10), killRetryMax))
	e.unkilled[r.id] = &pendingKill{runner: r, retry: next}
}

func (e *Engine) killAsync(victims []*Kernel) {
	for _, k := range victims {
		e.goAsync(func(ctx context.Context) { e.killOnHost(ctx, k) })
	}
}

// killOnHost kills k's runner and removes its dir; errors only become events,
// because the kernel is already out of the registry.
func (e *Engine) killOnHost(ctx context.Context, k *Kernel) {
	e.killAll(ctx, []*Kernel{k})
}

// detach takes k's connection away (closing it) and returns what a kill
// needs to know about k's runner.
func (e *Engine) detach(k *Kernel) *pendingKill {
	e.mu.Lock()
	r := runnerRef{key: k.key, env: k.env, id: k.id, dir: k.dir, pid: k.pid, reason: k.goneReasonSafe(), spare: k.spare}
	conn, dialed := k.conn, k.dialed
	k.conn, k.dialed = nil, nil
	e.mu.Unlock()
	if conn != nil {
		conn.close()
	}
	if dialed != nil {
		dialed.Close()
	}
	return &pendingKill{runner: r}
}

// killRunner kills one runner on its host; a kill that cannot reach the
// host is kept for a retry (retry is the record of earlier attempts).
func (e *Engine) killRunner(ctx context.Context, r runnerRef, retry *killRetry) {
	e.killBatch(ctx, []*pendingKill{{runner: r, retry: retry}})
}

// killBatchMax bounds the runners one kill script names.
const killBatchMax = 64

// killBatches kills runners in one kill script per host (and per
// killBatchMax runners), the hosts at once.
func (e *Engine) killBatches(ctx context.Context, kills []*pendingKill) {
	byHost := map[string][]*pendingKill{}
	var hosts []string
	for _, p := range kills {
		if !p.runner.killable() {
			continue
		}
		uri := p.runner.env.URI()
		if _, seen := byHost[uri]; !seen {
			hosts = append(hosts, uri)
		}
		byHost[uri] = append(byHost[uri], p)
	}
	var wg sync.WaitGroup
	for _, uri := range hosts {
		for batch := range slices.Chunk(byHost[uri], killBatchMax) {
			wg.Go(func() { e.killBatch(ctx, batch) })
		}
	}
	wg.Wait()
}

// killBatch kills runners of one host in one round trip; if the host cannot
// be reached, each is kept for a retry.
func (e *Engine) killBatch(ctx context.Context, batch []*pendingKill) {
	var targets []killTarget
	for _, p := range batch {
		if p.runner.abandoned {
			e.killAbandoned(ctx, p)
			continue
		}
		if p.runner.dir == "" || p.runner.pid <= 0 {
			continue
		}
		if !killableDir(p.runner.env.TempDir(), p.runner.dir, p.runner.id) {
			// Its record (a journal) names a dir no spawn makes: nothing
			// there is removed, nobody is killed.
			e.emit(p.runner.event(EventNotice, fmt.Sprintf("did not kill pid %d nor remove %s: not the dir of kernel %s under a kernel root", p.runner.pid, p.runner.dir, p.runner.id)))
			continue
		}
		if e.cfg.ToolOutput != nil && !e.cfg.KeepToolOutput && p.retry == nil {
			e.cfg.ToolOutput.Forget(p.runner.key.Owner, p.runner.id)
		}
		targets = append(targets, killTarget{dir: p.runner.dir, pid: p.runner.pid})
	}
	if len(targets) == 0 {
		return
	}
	if d, ok := backends.Find[backends.Disposer](batch[0].runner.env); ok {
		// A kernel's own host: removing it kills everything in it.
		what := "its own host"
		if pl, ok := backends.Find[backends.Placement](batch[0].runner.env); ok && pl.Place().Kind != "" {
			what = "its " + pl.Place().String()
		}
		err := d.Dispose(ctx)
		for _, p := range batch {
			if err != nil {
				e.killFailed(p.runner, p.retry, err)
				continue
			}
			if !p.runner.spare {
				e.emit(p.runner.event(EventKilled, fmt.Sprintf("%s (pid %d; %s removed)", p.runner.reason, p.runner.pid, what)))
			}
		}
		return
	}
	res, err := batch[0].runner.env.Execute(ctx, killScript(targets), backends.ExecOptions{Timeout: killTimeout})
	for _, p := range batch {
		if p.runner.dir == "" || p.runner.pid <= 0 {
			continue
		}
		if err != nil {
			e.killFailed(p.runner, p.retry, err)
			continue
		}
		if !p.runner.spare {
			e.emit(p.runner.event(EventKilled, fmt.Sprintf("%s (pid %d, rc %d)", p.runner.reason, p.runner.pid, res.ReturnCode)))
		}
	}
}

// killAbandoned kills what an abandoned spawn left on its host, in a
// command of its own (rare: no batching); a kill that cannot reach the host
// is kept for a retry.
func (e *Engine) killAbandoned(ctx context.Context, p *pendingKill) {
	res, err := p.runner.env.Execute(ctx, abandonScript(p.runner.env.TempDir(), p.runner.id), backends.ExecOptions{Timeout: killTimeout})
	if err == nil && !hasLine(res.Output, markKilled) {
		err = fmt.Errorf("kill of abandoned spawn %s: %s", p.runner.id, hostError(res))
	}
	if err != nil {
		e.killFailed(p.runner, p.retry, err)
	}
}

// abandonSpawn has what a spawn given up on after it reached the host may
// have left there killed, in the background (and retried like any kill,
// Close included). A host of the kernel's own goes with its kernel instead.
func (e *Engine) abandonSpawn(env backends.Env, key Key, id string, cause error) {
	// Only a transport failure leaves a spawn unfinished on the host: one
	// that answered cleaned up after itself.
	if te := (*transportError)(nil); !errors.As(cause, &te) || errors.Is(cause, backends.ErrNotStarted) {
		return
	}
	if _, ok := backends.Find[backends.Disposer](env); ok {
		return
	}
	r := runnerRef{key: key, env: env, id: id, reason: "spawn abandoned", abandoned: true}
	e.goAsync(func(ctx context.Context) { e.killRunner(ctx, r, nil) })
}

// killPending retries every pending kill at once.
func (e *Engine) killPending(ctx context.Context, pending []*pendingKill) {
	e.killBatches(ctx, pending)
}

// Kill kills one kernel by id, even mid-cell; its cell reports state_lost.
func (e *Engine) Kill(ctx context.Context, id string) error {
	e.mu.Lock()
	k := e.byID[id]
	if k == nil {
		e.mu.Unlock()
		return fmt.Errorf("%w %q", ErrUnknownKernel, id)
	}
	e.removeLocked(k, "killed by the operator")
	e.mu.Unlock()
	e.killOnHost(ctx, k)
	return nil
}

// ShutdownOwner kills every kernel of owner and returns how many there were.
func (e *Engine) ShutdownOwner(ctx context.Context, owner string) int {
	e.mu.Lock()
	var victims []*Kernel
	for _, k := range e.kernels {
		if k.key.Owner == owner {
			e.removeLocked(k, "owner shutdown")
			victims = append(victims, k)
		}
	}
	e.emit(Event{Type: EventOwnerShutdown, Owner: owner, Detail: fmt.Sprintf("%d kernels", len(victims))})
	e.mu.Unlock()
	e.killAll(ctx, victims)
	e.dropOwnerParked(ctx, owner)
	return len(victims)
}

// ShutdownAll kills every kernel on its host and returns how many there were.
func (e *Engine) ShutdownAll(ctx context.Context) int {
	e.mu.Lock()
	var victims []*Kernel
	for _, k := range e.kernels {
		e.removeLocked(k, "shutdown")
		victims = append(victims, k)
	}
	n := len(victims)
	pending := slices.Collect(maps.Values(e.unkilled))
	clear(e.unkilled)
	e.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { e.killPending(ctx, pending) })
	e.killAll(ctx, victims)
	wg.Wait()
	return n
}

func (e *Engine) killAll(ctx context.Context, victims []*Kernel) {
	kills := make([]*pendingKill, len(victims))
	for i, k := range victims {
		kills[i] = e.detach(k)
	}
	e.killBatches(ctx, kills)
}

// Interrupt interrupts the running cell of kernel id (KeyboardInterrupt in
// the cell); the kernel and its state stay.
func (e *Engine) Interrupt(ctx context.Context, id string) error {
	e.mu.Lock()
	k := e.byID[id]
	if k == nil {
		e.mu.Unlock()
		return fmt.Errorf("%w %q", ErrUnknownKernel, id)
	}
	cell, conn, dir, token := k.runningCell, k.conn, k.dir, k.token
	e.mu.Unlock()
	if cell == "" {
		return fmt.Errorf("kernel %s %w", id, ErrNoRunningCell)
	}
	return e.sendInterrupt(ctx, k, conn, dir, token, cell)
}

func (e *Engine) sendInterrupt(ctx context.Context, k *Kernel, conn *runnerConn, dir, token, cell string) error {
	e.emit(kernelEvent(EventInterrupted, k, "cell "+cell))
	if conn != nil && !conn.closed() {
		if err := conn.send(map[string]string{"op": "interrupt", "id": cell}); err == nil {
			return nil
		}
	}
	res, err := k.env.Execute(ctx, ringScript(dir, signedLine(token, kernelauth.Interrupt, cell)), backends.ExecOptions{Timeout: killTimeout})
	if err != nil {
		return fmt.Errorf("interrupt kernel %s: %w", k.id, err)
	}
	if _, ok := findLine(res.Output, markOK); !ok {
		return fmt.Errorf("interrupt kernel %s: runner is gone", k.id)
	}
	return nil
}

func (e *Engine) configureRunner(ctx context.Context, k *Kernel, idle time.Duration) {
	e.mu.Lock()
	conn, dir, state, token := k.conn, k.dir, k.state, k.token
	e.mu.Unlock()
	if state != phaseReady {
		return
	}
	secs := fmt.Sprintf("%g", idle.Seconds())
	if conn != nil && !conn.closed() {
		if conn.send(map[string]any{"op": "config", "idle_exit": idle.Seconds()}) == nil {
			return
		}
	}
	k.env.Execute(ctx, ringScript(dir, signedLine(token, kernelauth.Config, secs)), backends.ExecOptions{Timeout: killTimeout})
}

// signedLine is a control line for k's wake FIFO: "int CELL MAC" or "cfg
// SECONDS MAC".
func signedLine(token string, kind kernelauth.Kind, arg string) string {
	return string(kind) + " " + arg + " " + kernelauth.MAC(token, kind, arg)
}

// Kernels returns a snapshot of every registered kernel, ordered by owner,
// then task.
func (e *Engine) Kernels() []KernelInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.cfg.Now()
	order := e.orderLocked()
	var next *Kernel
	if len(order) >= e.max {
		next = lruFirst(order)
	}
	out := make([]KernelInfo, len(order))
	for i, k := range order {
		k.fillInfoLocked(&out[i], now, k == next)
	}
	return out
}

// orderDirty drops the sorted order after a kernel came, went or changed id.
func (e *Engine) orderDirty() { e.order = nil }

// orderLocked is the registry sorted by owner, task, child, backend and
// id, sorted again only after it changed: a dashboard lists it every second.
func (e *Engine) orderLocked() []*Kernel {
	if e.order == nil {
		e.order = make([]*Kernel, 0, len(e.kernels))
		for _, k := range e.kernels {
			e.order = append(e.order, k)
		}
		slices.SortFunc(e.order, func(a, b *Kernel) int {
			return cmp.Or(cmp.Compare(a.key.Owner, b.key.Owner), cmp.Compare(a.key.Task, b.key.Task),
				cmp.Compare(a.key.Child, b.key.Child), cmp.Compare(a.key.Backend, b.key.Backend), cmp.Compare(a.id, b.id))
		})
	}
	return e.order
}

// lruFirst is the first of lruLocked among ks, found without sorting
// (under Engine.mu).
func lruFirst(ks []*Kernel) *Kernel {
	var first *Kernel
	for _, k := range ks {
		if k.state == phaseReady && !k.attachedLocked() &&
			(first == nil || cmp.Or(k.lastUsed.Compare(first.lastUsed), cmp.Compare(k.id, first.id)) < 0) {
			first = k
		}
	}
	return first
}
