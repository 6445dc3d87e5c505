package enginetest

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kerneldeck/kerneldeck/engine"
)

// Invariants replays an engine's event stream, in the order one
// subscription received it, and checks what events alone can show (Observe
// each, then Finish): no missed event; no eviction or reap of a kernel a
// call holds (between its spawned/reused/cell_started and its
// cell_finished/state_lost); every eviction names a registered kernel, with
// the configured cap, and evict_skipped_busy lists exactly cap+left busy
// kernels; ids keep their key; after Close every spawned runner was killed.
// The registry size itself lags events by the kernels calls hold, so it is
// checked from Kernels() snapshots instead (CheckSnapshot).
type Invariants struct {
	max        int
	kernels    map[string]*modelKernel
	registered int
	Counts     map[engine.EventType]int
	// MaxModelRegistered is the largest registry the events showed: an
	// approximation (kernels still starting are missing from it, kernels
	// whose removal is reported after the fact linger in it).
	MaxModelRegistered int
	violations         []string
	dropped            int
}

type modelKernel struct {
	key        string
	owner      string
	transient  bool
	spawned    bool // announced by spawned or adopted: it had a runner
	registered bool
	held       bool   // inside a call's interval (see above)
	running    bool   // between cell_started and its end
	gone       string // why it left the registry, "" while registered or unknown
	killed     bool
	replaced   bool
	foundDead  bool // its runner was found dead, so a respawn needs no kill
}

// maxViolations bounds the messages kept; the rest are only counted.
const maxViolations = 50

// NewInvariants starts a replay for an engine whose cap is maxKernels.
func NewInvariants(maxKernels int) *Invariants {
	return &Invariants{max: maxKernels, kernels: map[string]*modelKernel{}, Counts: map[engine.EventType]int{}}
}

var (
	replacesRE    = regexp.MustCompile(` \(replaces (k[0-9a-f]+)\)$`)
	evictedCapRE  = regexp.MustCompile(`^cap (\d+) exceeded by (\d+): (the only idle kernel|the least recently used of \d+ idle kernels)`)
	skippedBusyRE = regexp.MustCompile(`^(\d+) kernel\(s\) over cap (\d+); busy kernels are never evicted: (.*)$`)
	// namedIDRE finds the ids in a list of kernels named owner/task (id).
	namedIDRE = regexp.MustCompile(`\((k[0-9a-f]+)\)`)
)

func (v *Invariants) fail(ev engine.Event, format string, args ...any) {
	if len(v.violations) >= maxViolations {
		v.dropped++
		return
	}
	v.violations = append(v.violations, fmt.Sprintf("%s %s %s (%q): %s",
		ev.Time.Format("15:04:05.000"), ev.Type, ev.Kernel, ev.Detail, fmt.Sprintf(format, args...)))
}

// kernel returns the model of id, creating it (unregistered) if unknown,
// and checks that id keeps its key.
func (v *Invariants) kernel(ev engine.Event) *modelKernel {
	k := v.kernels[ev.Kernel]
	if k == nil {
		k = &modelKernel{key: ev.Key, owner: ev.Owner}
		v.kernels[ev.Kernel] = k
	}
	if ev.Key != "" && k.key != "" && ev.Key != k.key {
		v.fail(ev, "kernel changed key from %s to %s", k.key, ev.Key)
	}
	return k
}

func (v *Invariants) register(k *modelKernel) {
	if !k.registered {
		k.registered = true
		v.registered++
		v.MaxModelRegistered = max(v.MaxModelRegistered, v.registered)
	}
}

func (v *Invariants) unregister(k *modelKernel, why string) {
	if k.registered {
		k.registered = false
		v.registered--
	}
	if k.gone == "" {
		k.gone = why
	}
	k.held, k.running = false, false
}

// Observe replays one event.
func (v *Invariants) Observe(ev engine.Event) {
	v.Counts[ev.Type]++
	switch ev.Type {
	case engine.EventMissed:
		v.fail(ev, "the subscriber missed %d events: the stream is incomplete, nothing after this is proven", ev.Missed)
	case engine.EventSpawned:
		k := v.kernel(ev)
		k.spawned = true
		if strings.Contains(ev.Detail, "/kerneldeck-once-") {
			k.transient = true // a per-call kernel, never in the registry
			return
		}
		if k.gone != "" {
			v.fail(ev, "a kernel id that already left the registry (%s) was spawned again", k.gone)
		}
		if m := replacesRE.FindStringSubmatch(ev.Detail); m != nil {
			old := v.kernels[m[1]]
			switch {
			case old == nil || !old.registered:
				v.fail(ev, "replaces %s, which is not in the registry", m[1])
			case old.key != k.key:
				v.fail(ev, "respawn changed the key from %s to %s", old.key, k.key)
			}
			if old != nil {
				old.replaced = true
				v.unregister(old, "replaced by "+ev.Kernel)
			}
		}
		v.register(k)
		k.held = true
	case engine.EventAdopted:
		k := v.kernel(ev)
		k.spawned = true
		v.register(k)
	case engine.EventReused, engine.EventReset, engine.EventCellStarted:
		k := v.kernel(ev)
		if k.gone != "" && !k.transient {
			v.fail(ev, "a kernel that left the registry (%s) was used again", k.gone)
		}
		k.held = true
		if ev.Type == engine.EventCellStarted {
			k.running = true
		}
	case engine.EventKilled:
		k := v.kernel(ev)
		k.killed = true
		if k.registered {
			// Killed while registered: a reset (the caller holds it and
			// respawns it next) or a removal whose own event follows.
			k.held = true
		}
	case engine.EventCellFinished:
		k := v.kernel(ev)
		k.held, k.running = false, false
	case engine.EventStateLost:
		k := v.kernel(ev)
		if ev.Detail == "runner found dead before the cell" {
			k.running = false // respawned in place by the same call
			k.foundDead = true
			return
		}
		v.unregister(k, "lost")
	case engine.EventSpawnFailed:
		v.unregister(v.kernel(ev), "spawn failed")
	case engine.EventEvictedCap, engine.EventReapedIdle, engine.EventHibernated:
		if ev.Kernel == "" {
			return // a hibernated session's end: no kernel left the registry
		}
		k := v.kernel(ev)
		switch {
		case k.running:
			v.fail(ev, "BUSY GUARD: the kernel has a running cell")
		case k.held:
			v.fail(ev, "BUSY GUARD: a call holds the kernel")
		case !k.registered && k.gone != "":
			v.fail(ev, "the kernel already left the registry (%s)", k.gone)
		case !k.registered:
			v.fail(ev, "the kernel was never announced by spawned")
		}
		if ev.Type == engine.EventEvictedCap {
			m := evictedCapRE.FindStringSubmatch(ev.Detail)
			if m == nil {
				v.fail(ev, "unexpected evicted_cap detail")
			} else if c, _ := strconv.Atoi(m[1]); c != v.max {
				v.fail(ev, "reports cap %d, configured %d", c, v.max)
			} else if by, _ := strconv.Atoi(m[2]); by < 1 {
				v.fail(ev, "evicted while not over the cap")
			}
		}
		v.unregister(k, string(ev.Type))
	case engine.EventEvictSkippedBusy:
		m := skippedBusyRE.FindStringSubmatch(ev.Detail)
		if m == nil {
			v.fail(ev, "unexpected evict_skipped_busy detail")
			return
		}
		left, _ := strconv.Atoi(m[1])
		c, _ := strconv.Atoi(m[2])
		var busy []string
		for _, id := range namedIDRE.FindAllStringSubmatch(m[3], -1) {
			busy = append(busy, id[1])
		}
		if c != v.max {
			v.fail(ev, "reports cap %d, configured %d", c, v.max)
		}
		if left < 1 || len(busy) != c+left {
			v.fail(ev, "CAP: %d over cap %d but %d busy kernels: an idle kernel was left over the cap", left, c, len(busy))
		}
		for _, id := range busy {
			if k := v.kernels[id]; k != nil && k.gone != "" && !k.replaced {
				v.fail(ev, "lists %s as registered, but it left the registry (%s)", id, k.gone)
			}
		}
	case engine.EventOwnerShutdown:
		for _, k := range v.kernels {
			if k.registered && k.owner == ev.Owner {
				v.unregister(k, "owner shutdown")
			}
		}
	}
}

// Finish ends the replay. With closed, the stream ran until the engine
// closed (its channel was closed), and every spawned kernel must have been
// killed on its host, unless it was found dead and respawned.
func (v *Invariants) Finish(closed bool) {
	if !closed {
		return
	}
	var left []string
	for id, k := range v.kernels {
		if k.spawned && !k.killed && !(k.replaced && k.foundDead) {
			left = append(left, id+" ("+k.key+")")
		}
	}
	slices.Sort(left)
	if len(left) > 0 {
		v.violations = append(v.violations, fmt.Sprintf("after Close, %d kernel(s) were never killed on their host: %s",
			len(left), strings.Join(left[:min(len(left), 10)], ", ")))
	}
}

// Violations lists what went wrong, with a count of what was not kept.
func (v *Invariants) Violations() []string {
	out := slices.Clone(v.violations)
	if v.dropped > 0 {
		out = append(out, fmt.Sprintf("... and %d more", v.dropped))
	}
	return out
}

// SnapshotWindows tells CheckSnapshot where the engine may legitimately be
// over the cap with an evictable kernel: the cap is enforced right after a
// call creates or releases a kernel, so only a call between those points
// (its spawn not issued yet, or its release not yet followed by enforceCap)
// can leave the registry over the cap with a kernel it could evict.
type SnapshotWindows struct {
	// SpawnIssued reports whether the spawn command of kernel id was issued
	// before the snapshot was taken.
	SpawnIssued func(id string) bool
	// KeyActive reports whether a call for the key (engine.Key.String()) may
	// have been in flight when the snapshot was taken, or timed out in its
	// queue with no enforced cap since.
	KeyActive func(key string) bool
}

// SnapshotStats describes one snapshot.
type SnapshotStats struct {
	Count, Starting, Evictable, Over int
	// Excused is the number of evictable kernels over the cap that an open
	// window explained (0 when the registry is within the cap).
	Excused int
}

// CheckSnapshot checks one engine.Kernels() snapshot against the cap (see
// SnapshotWindows) and the busy guard's bookkeeping: a kernel with a running
// cell is attached, and each key has at most one kernel.
func CheckSnapshot(snap []engine.KernelInfo, maxKernels int, w SnapshotWindows) (SnapshotStats, error) {
	st := SnapshotStats{Count: len(snap), Over: len(snap) - maxKernels}
	keys := map[string]string{}
	unissued := 0
	var unexplained []string
	for _, k := range snap {
		key, err := engine.NewKey(k.Owner, k.Backend, k.Task, k.Child, k.Tools)
		if err != nil {
			return st, fmt.Errorf("kernel %s: %v", k.ID, err)
		}
		ks := key.String()
		if other, dup := keys[ks]; dup {
			return st, fmt.Errorf("two kernels for %s: %s and %s", ks, other, k.ID)
		}
		keys[ks] = k.ID
		if (k.RunningCell != "" || k.Queued > 0) && !k.Attached {
			return st, fmt.Errorf("kernel %s has a running or queued cell but is not attached: %+v", k.ID, k)
		}
		switch {
		case k.State == "starting":
			st.Starting++
			if !w.SpawnIssued(k.ID) {
				unissued++
			}
		case !k.Attached:
			st.Evictable++
			if !w.KeyActive(ks) {
				unexplained = append(unexplained, fmt.Sprintf("%s (%s, idle %v)", k.ID, ks, k.Idle))
			}
		}
	}
	if st.Over <= 0 || st.Evictable == 0 {
		return st, nil
	}
	if st.Over > unissued && len(unexplained) > 0 {
		return st, fmt.Errorf("CAP: %d kernels, cap %d, %d starting (%d before their enforceCap), %d evictable; "+
			"no call can still evict these: %s", st.Count, maxKernels, st.Starting, unissued, st.Evictable,
			strings.Join(unexplained, ", "))
	}
	st.Excused = min(st.Over, st.Evictable)
	return st, nil
}
