package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/internal/termtext"
)

// Parking: an idle kernel that the cap evicts or idle_exit reaps first
// sends the engine its namespace (its runner pickles it name by name), and
// the key's next kernel loads it before its first cell. The engine keeps
// the bytes itself, whatever the backend, so that where they rest is the
// engine's state dir and nothing a kernel can write (parkstore.go).

// The parking defaults (the settings table bounds them).
const (
	DefaultParkMaxBytes   = 256 << 20
	DefaultParkTimeout    = 10 * time.Second
	DefaultParkRetention  = 24 * time.Hour
	DefaultParkTotalBytes = 2 << 30
	// parkPruneEvery is how often the sweep drops parked states past
	// their retention.
	parkPruneEvery = time.Minute
	// parkNamesMax bounds the names a parked state may list.
	parkNamesMax = 100_000
)

// ParkedKernel is one parked state, for listings.
type ParkedKernel struct {
	Owner   string `json:"owner"`
	Task    string `json:"task"`
	Backend string `json:"backend"`
	Child   string `json:"child,omitempty"`
	Key     string `json:"key"`
	// Kernel is the id of the kernel that was parked.
	Kernel string    `json:"kernel"`
	Parked time.Time `json:"parked"`
	// Reason says why it was parked ("evicted by the cap").
	Reason         string     `json:"reason"`
	Bytes          int64      `json:"bytes"`
	Names          []string   `json:"names"`
	NotSaved       []NotSaved `json:"not_saved"`
	ExecutionCount int        `json:"execution_count"`
	// Hibernated: the kernel sat idle for hibernate_after and sleeps here
	// until its next call, or until idle_exit after LastUsed ends its
	// session (then it is listed as any reaped kernel's state).
	Hibernated bool      `json:"hibernated,omitempty"`
	LastUsed   time.Time `json:"last_used,omitzero"`
}

// Parked lists the parked states, oldest first; nil where parking is off.
func (e *Engine) Parked() []ParkedKernel {
	if e.parks == nil {
		return nil
	}
	all := e.parks.list()
	e.mu.Lock()
	now, idleExit := e.cfg.Now(), e.idleExit
	e.mu.Unlock()
	out := make([]ParkedKernel, 0, len(all))
	for _, h := range all {
		p := h.listing()
		p.Hibernated = h.sleeping(now, idleExit)
		out = append(out, p)
	}
	return out
}

// listing is the parked state as Parked lists it: its names those of the
// modules too.
func (h parkHeader) listing() ParkedKernel {
	names := make([]string, 0, len(h.Names)+len(h.Modules))
	names = append(names, h.Names...)
	for _, m := range h.Modules {
		names = append(names, m[0])
	}
	return ParkedKernel{Owner: h.Key.Owner, Task: h.Key.Task, Backend: h.Key.Backend, Child: h.Key.Child,
		Key: h.Key.String(), Kernel: h.Kernel, Parked: h.Parked, Reason: h.Reason, Bytes: h.Bytes,
		Names: names, NotSaved: h.NotSaved, ExecutionCount: h.ExecutionCount, LastUsed: h.LastUsed}
}

// ErrNoParking: the engine keeps no parked states (no state dir).
var ErrNoParking = errors.New("parking is off: the engine has no state dir")

// DropParked discards the parked state of owner's task (on backend, "":
// the default; child and tools as the key has them) and tells whether
// there was one.
func (e *Engine) DropParked(owner, backend, task, child string, tools []string) (bool, error) {
	if e.parks == nil {
		return false, ErrNoParking
	}
	backend, err := e.ownerBackend(owner, cmp.Or(backend, e.DefaultBackend()), false)
	if err != nil {
		return false, err
	}
	key, err := NewKey(owner, backend, cmp.Or(task, "default"), child, tools)
	if err != nil {
		return false, err
	}
	if !e.parks.drop(key) {
		return false, nil
	}
	e.emit(Event{Type: EventParkDropped, Owner: key.Owner, Key: key.String(), Detail: "dropped on request"})
	return true, nil
}

// dropOwnerParked discards owner's parked states, once its parks under
// way are over: an owner that shut down wants none of them back.
func (e *Engine) dropOwnerParked(ctx context.Context, owner string) {
	if e.parks == nil {
		return
	}
	e.mu.Lock()
	var under []chan struct{}
	for key, done := range e.parking {
		if key.Owner == owner {
			under = append(under, done)
		}
	}
	e.mu.Unlock()
	for _, done := range under {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	for _, h := range e.parks.list() {
		if h.Key.Owner == owner && e.parks.drop(h.Key) {
			e.emit(Event{Type: EventParkDropped, Owner: owner, Key: h.Key.String(), Kernel: h.Kernel,
				Detail: fmt.Sprintf("parked state of %s dropped: its owner shut down", h.Kernel)})
		}
	}
}

// dropForReset discards key's parked state before a reset's new kernel.
func (e *Engine) dropForReset(k *Kernel) {
	if e.parks != nil && e.parks.drop(k.key) {
		e.emit(kernelEvent(EventParkDropped, k, "parked state dropped: a reset was asked"))
	}
}

// Park parks kernel id now, as an eviction would, and removes it: its
// owner's next call restores it. A kernel with a running or queued cell is
// not parked (ErrKernelBusy).
func (e *Engine) Park(ctx context.Context, id string) (ParkedKernel, error) {
	if e.parks == nil {
		return ParkedKernel{}, ErrNoParking
	}
	e.mu.Lock()
	k := e.byID[id]
	switch {
	case k == nil || e.kernels[k.key] != k:
		e.mu.Unlock()
		return ParkedKernel{}, fmt.Errorf("%w %q", ErrUnknownKernel, id)
	case k.attachedLocked() || k.state != phaseReady:
		e.mu.Unlock()
		return ParkedKernel{}, fmt.Errorf("%w: kernel %s has a cell running or queued; park it once it is idle", ErrKernelBusy, id)
	}
	if why := e.unparkableLocked(k); why != "" {
		e.mu.Unlock()
		return ParkedKernel{}, fmt.Errorf("kernel %s cannot be parked: %s", id, why)
	}
	e.removeLocked(k, "parked by request")
	done := make(chan struct{})
	e.parking[k.key] = done
	e.retiring[k.id] = k
	e.mu.Unlock()
	h, err := e.parkThenKill(ctx, k, done)
	if err != nil {
		return ParkedKernel{}, err
	}
	return h.listing(), nil
}

// unparkableLocked says why k's state cannot be parked, or "".
func (e *Engine) unparkableLocked(k *Kernel) string {
	switch {
	case e.parks == nil:
		return "parking is off"
	case k.pid <= 0 || k.execCount == 0:
		return "it ran no cell"
	case backends.StreamsOf(k.env) == nil || len(k.dir+"/sock") >= sockPathMax:
		return "its backend gives no stream to its runner"
	}
	return ""
}

// retireLocked kills the kernels the cap evicted or idle_exit reaped
// (already out of the registry), each parked first where it has state and
// can be: until its park is over, its key's next call waits (waitParked).
func (e *Engine) retireLocked(victims []*Kernel) {
	for _, k := range victims {
		why := e.unparkableLocked(k)
		if why != "" {
			if e.parks != nil && k.execCount > 0 {
				e.emit(kernelEvent(EventParkFailed, k, "not parked: "+why+"; its state was lost"))
			}
			e.killAsync([]*Kernel{k})
			continue
		}
		done := make(chan struct{})
		e.parking[k.key] = done
		e.retiring[k.id] = k
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.parkThenKill(context.Background(), k, done)
		}()
	}
}

// errEmptyNamespace: a kernel had nothing in its namespace to park, and so
// nothing to lose.
var errEmptyNamespace = errors.New("its namespace is empty")

// parkThenKill parks k (out of the registry), says how it went, and kills
// it; done closes once the outcome is known to the key's next call.
func (e *Engine) parkThenKill(ctx context.Context, k *Kernel, done chan struct{}) (parkHeader, error) {
	start := time.Now()
	h, err := e.park(ctx, k, parkAsk{})
	e.mu.Lock()
	if e.parking[k.key] == done {
		delete(e.parking, k.key)
	}
	if err == nil || errors.Is(err, errEmptyNamespace) {
		delete(e.lost, k.key)
	} else if e.kernels[k.key] == nil {
		e.noteLostLocked(k.key, fmt.Sprintf("kernel %s was %s and could not be parked (%v); state from earlier calls was lost", k.id, k.goneReason, err))
	}
	e.mu.Unlock()
	close(done)
	switch {
	case errors.Is(err, errEmptyNamespace):
	case err != nil:
		e.emit(kernelEvent(EventParkFailed, k, fmt.Sprintf("not parked: %v; its state was lost", err)))
	default:
		e.emit(kernelEvent(EventParked, k, h.parkedDetail(time.Since(start))))
		e.pruneParked(false)
	}
	e.killRetired(k)
	return h, err
}

// parkedDetail is what the parked event says of h, filed in took.
func (h parkHeader) parkedDetail(took time.Duration) string {
	return fmt.Sprintf("parked %s (%s) in %s%s", english.Count(len(h.Names)+len(h.Modules), "name"), english.Bytes(h.Bytes),
		english.Duration(took), notSavedSuffix("; not saved: ", h.NotSaved))
}

// killRetired kills k, out of the registry and in e.retiring, on its host;
// the journal keeps it until then, so that an engine that dies meanwhile
// leaves it to the next one.
func (e *Engine) killRetired(k *Kernel) {
	kctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	e.killOnHost(kctx, k)
	e.mu.Lock()
	delete(e.retiring, k.id)
	e.journalTouch()
	e.mu.Unlock()
}

// notSavedSuffix lists names that did not come through, after prefix; ""
// for none.
func notSavedSuffix(prefix string, ns []NotSaved) string {
	if len(ns) == 0 {
		return ""
	}
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = n.Name + " (" + n.Why + ")"
	}
	return prefix + listSome(parts, 8)
}

// parkAsk says how a park is asked for; the zero value is an eviction's
// or a reap's, whose reason the kernel's end gives.
type parkAsk struct {
	// hibernate: the kernel is parked to hibernate, for reason; the
	// runner parks all of it, or nothing (errIncomplete).
	hibernate bool
	reason    string
}

// park asks k's runner for its namespace and files it.
func (e *Engine) park(ctx context.Context, k *Kernel, ask parkAsk) (parkHeader, error) {
	e.mu.Lock()
	env, dir, token, id, key, count := k.env, k.dir, k.token, k.id, k.key, k.execCount
	reason, used := cmp.Or(ask.reason, k.goneReasonSafe()), k.lastUsed
	e.mu.Unlock()
	d := backends.StreamsOf(env)
	if d == nil {
		return parkHeader{}, errors.New("its backend gives no stream to its runner")
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.ParkTimeout)
	defer cancel()
	nc, err := d.DialUnix(ctx, dir+"/sock")
	if err != nil {
		return parkHeader{}, fmt.Errorf("reach its runner: %w", err)
	}
	conn, err := dialRunner(ctx, nc, token, nil)
	if err != nil {
		return parkHeader{}, fmt.Errorf("reach its runner: %w", err)
	}
	defer conn.close()
	deadline, _ := ctx.Deadline()
	defer conn.begin(ctx, deadline)()
	pid := "park-" + randomHex(8)
	if err := conn.send(map[string]any{"op": "park", "id": pid, "max_bytes": e.cfg.ParkMaxBytes, "whole": ask.hibernate}); err != nil {
		return parkHeader{}, fmt.Errorf("ask its runner: %w", err)
	}
	w, err := e.parks.create(e.cfg.ParkMaxBytes)
	if err != nil {
		return parkHeader{}, err
	}
	for {
		f, err := conn.next(pid)
		if timedOut(ctx, err) {
			w.abort()
			return parkHeader{}, fmt.Errorf("its runner took longer than the park timeout of %s", english.Duration(e.cfg.ParkTimeout))
		}
		if err != nil {
			w.abort()
			return parkHeader{}, fmt.Errorf("read its runner: %w", err)
		}
		switch f.Op {
		case "park_data":
			if f.N <= 0 || w.n+f.N > e.cfg.ParkMaxBytes {
				w.abort()
				return parkHeader{}, fmt.Errorf("its namespace is over park_max_mb (%s)", english.Bytes(e.cfg.ParkMaxBytes))
			}
			if err := conn.raw(w, f.N); err != nil {
				w.abort()
				if timedOut(ctx, err) {
					return parkHeader{}, fmt.Errorf("its runner took longer than the park timeout of %s", english.Duration(e.cfg.ParkTimeout))
				}
				return parkHeader{}, fmt.Errorf("read its runner: %w", err)
			}
		case "error":
			w.abort()
			if f.Incomplete {
				return parkHeader{}, fmt.Errorf("%w: %s", errIncomplete, termtext.Line(clip(f.Error, 300)))
			}
			if f.Bytes > 0 {
				return parkHeader{}, fmt.Errorf("its namespace is over park_max_mb (%s)", english.Bytes(e.cfg.ParkMaxBytes))
			}
			return parkHeader{}, fmt.Errorf("its runner: %s", termtext.Line(clip(f.Error, 300)))
		case "parked":
			h, err := parkedHeader(f, key, id, reason, max(count, f.ExecutionCount), e.cfg.Now())
			if err == nil && len(h.Names)+len(h.Modules) == 0 {
				// Nothing to bring back: no parked state, which would only
				// be restored as nothing (and listed until then).
				err = errEmptyNamespace
				if len(h.NotSaved) > 0 {
					err = fmt.Errorf("nothing in its namespace could be saved%s", notSavedSuffix(": ", h.NotSaved))
				}
			}
			if err != nil {
				w.abort()
				return parkHeader{}, err
			}
			h.Engine, h.Hibernated, h.LastUsed = e.parkName, ask.hibernate, used
			if err := w.commit(h); err != nil {
				return parkHeader{}, err
			}
			h.Bytes = w.n
			return h, nil
		}
	}
}

// parkedHeader checks what a runner says it parked (it is untrusted) and
// makes it the state's header.
func parkedHeader(f runnerFrame, key Key, id, reason string, count int, now time.Time) (parkHeader, error) {
	if len(f.Names)+len(f.Skipped)+len(f.Modules) > parkNamesMax {
		return parkHeader{}, fmt.Errorf("its runner listed more than %d names", parkNamesMax)
	}
	h := parkHeader{Key: key, Kernel: id, Parked: now, Reason: reason, Pickler: f.Pickler, ExecutionCount: count}
	switch f.Pickler {
	case "cloudpickle", "dill", "pickle":
	default:
		return parkHeader{}, fmt.Errorf("its runner named an unknown pickler %q", clip(f.Pickler, 40))
	}
	for _, n := range f.Names {
		h.Names = append(h.Names, termtext.Line(clip(n, 200)))
	}
	for _, m := range f.Modules {
		if len(m) != 2 {
			return parkHeader{}, errors.New("its runner sent a module entry that is not a name and a module")
		}
		// The name is shown (a listing's names); the module goes back to
		// the key's runner only, to import.
		h.Modules = append(h.Modules, [2]string{termtext.Line(clip(m[0], 200)), clip(m[1], 200)})
	}
	for _, s := range f.Skipped {
		if len(s) != 3 {
			return parkHeader{}, errors.New("its runner sent a not-saved entry that is not a name, a type and a reason")
		}
		h.NotSaved = append(h.NotSaved, NotSaved{Name: termtext.Line(clip(s[0], 200)), Type: termtext.Line(clip(s[1], 100)), Why: termtext.Line(clip(s[2], 200))})
	}
	return h, nil
}

// clip cuts s to at most n bytes, on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// waitParked waits until no park of key is under way, at most until ctx
// ends: its outcome decides what the key's next kernel starts from.
func (e *Engine) waitParked(ctx context.Context, key Key) {
	e.mu.Lock()
	done := e.parking[key]
	e.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// restoreOutcome is what restoring a parked state into a new kernel did.
type restoreOutcome struct {
	restored bool
	note     string
	// later: the restore did not get through in time (an overloaded
	// host); the parked state is kept for the key's next call, and this
	// one fails with it.
	later error
}

// ErrRestoreLater: a parked state could not be brought back within
// park_timeout; it is kept, and the call that needed it failed.
var ErrRestoreLater = errors.New("the kernel's parked state could not be restored in time")

// restoreFailure is a restore that failed on what the state holds, or
// where it was to go, not on the way there (a timeout, a broken stream):
// it would fail again.
type restoreFailure string

func (f restoreFailure) Error() string { return string(f) }

// restore loads key's parked state, if any, into k (just spawned, no cell
// run yet). The parked state is dropped once used, or once it failed for
// good (refused, or the runner could not load it), so that it is not tried
// again; one that did not get through in time is kept (restoreOutcome.later).
func (e *Engine) restore(ctx context.Context, k *Kernel) restoreOutcome {
	if e.parks == nil || !e.parks.has(k.key) {
		return restoreOutcome{}
	}
	pr, err := e.parks.open(k.key)
	if errors.Is(err, errNoParked) {
		return restoreOutcome{}
	}
	keep := false
	defer func() {
		if !keep {
			e.parks.drop(k.key)
		}
	}()
	refused := func(err error) restoreOutcome {
		e.emit(kernelEvent(EventRestoreRefused, k, err.Error()))
		return restoreOutcome{note: fmt.Sprintf("the parked state of %s was refused (%v); state from earlier calls was lost", k.key, err)}
	}
	if err != nil {
		return refused(err)
	}
	defer pr.Close()
	h := pr.h
	start := time.Now()
	names, failed, err := e.sendParked(ctx, k, pr)
	if errors.Is(err, ErrParkRefused) {
		return refused(err)
	}
	if failure := restoreFailure(""); errors.As(err, &failure) {
		e.emit(kernelEvent(EventRestoreRefused, k, "could not restore: "+err.Error()))
		return restoreOutcome{note: fmt.Sprintf("the parked state of kernel %s could not be restored (%v); state from earlier calls was lost", h.Kernel, err)}
	}
	if err != nil {
		keep = true
		e.emit(kernelEvent(EventRestoreRefused, k, "could not restore it yet: "+err.Error()+"; it is kept for the next call"))
		return restoreOutcome{later: fmt.Errorf("%w (%v): it is kept; call again, or drop it (drop_parked, the dashboard's D) to start afresh", ErrRestoreLater, err)}
	}
	lost := append(append([]NotSaved(nil), h.NotSaved...), failed...)
	restored := fmt.Sprintf("restored %s parked from kernel %s", english.Count(len(names), "name"), h.Kernel)
	if h.Hibernated {
		restored = fmt.Sprintf("woke from hibernation: restored %s of kernel %s", english.Count(len(names), "name"), h.Kernel)
	}
	notRestored := ""
	if len(lost) > 0 {
		parts := make([]string, len(lost))
		for i, n := range lost {
			parts[i] = n.Name + " (" + n.Why + ")"
		}
		notRestored = "; not restored: " + listSome(parts, 8)
	}
	note := restored + notRestored
	e.mu.Lock()
	k.execCount = max(k.execCount, h.ExecutionCount)
	e.mu.Unlock()
	// The size is the parked state's, said before what did not come back.
	e.emit(kernelEvent(EventRestored, k, fmt.Sprintf("%s, %s, in %s%s", restored, english.Bytes(h.Bytes), english.Duration(time.Since(start)), notRestored)))
	return restoreOutcome{restored: true, note: note}
}

// sendParked streams a parked state to k's runner, and once its MAC proved
// it, has the runner load it; it returns the names the runner restored and
// those it could not. A state whose MAC fails is never loaded: the runner
// drops the bytes with the connection.
func (e *Engine) sendParked(ctx context.Context, k *Kernel, pr *parkedReader) ([]string, []NotSaved, error) {
	h := pr.h
	e.mu.Lock()
	env, dir, token := k.env, k.dir, k.token
	e.mu.Unlock()
	d := backends.StreamsOf(env)
	if d == nil || len(dir+"/sock") >= sockPathMax {
		return nil, nil, restoreFailure("its backend gives no stream to its runner")
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.ParkTimeout)
	defer cancel()
	// What fails on the way may get through on the next call.
	onTheWay := func(what string, err error) error {
		if timedOut(ctx, err) {
			return fmt.Errorf("the new runner took longer than the park timeout of %s", english.Duration(e.cfg.ParkTimeout))
		}
		return fmt.Errorf("%s the new runner: %w", what, err)
	}
	nc, err := d.DialUnix(ctx, dir+"/sock")
	if err != nil {
		return nil, nil, onTheWay("reach", err)
	}
	conn, err := dialRunner(ctx, nc, token, nil)
	if err != nil {
		return nil, nil, onTheWay("reach", err)
	}
	defer conn.close()
	deadline, _ := ctx.Deadline()
	defer conn.begin(ctx, deadline)()
	ask := "restore-" + randomHex(8)
	if err := conn.sendRaw(map[string]any{"op": "restore_data", "id": ask, "n": h.Bytes}, pr, h.Bytes, deadline); err != nil {
		return nil, nil, onTheWay("send to", err)
	}
	if err := pr.verify(); err != nil {
		return nil, nil, err
	}
	if err := conn.send(map[string]any{"op": "restore", "id": ask, "pickler": h.Pickler, "modules": h.Modules,
		"execution_count": h.ExecutionCount}); err != nil {
		return nil, nil, onTheWay("send to", err)
	}
	for {
		fr, err := conn.next(ask)
		if err != nil {
			return nil, nil, onTheWay("read", err)
		}
		switch fr.Op {
		case "error":
			return nil, nil, restoreFailure("the new runner: " + termtext.Line(clip(fr.Error, 300)))
		case "restored":
			var failed []NotSaved
			for _, s := range fr.Failed {
				if len(s) == 2 {
					failed = append(failed, NotSaved{Name: termtext.Line(clip(s[0], 200)), Why: termtext.Line(clip(s[1], 200))})
				}
			}
			return fr.Names, failed, nil
		}
	}
}

// pruneParked drops parked states past their retention or over the total
// cap, and says so; unless now, at most once a parkPruneEvery.
func (e *Engine) pruneParked(sweep bool) {
	if e.parks == nil {
		return
	}
	e.mu.Lock()
	now := e.cfg.Now()
	if sweep && now.Sub(e.parkPruned) < parkPruneEvery {
		e.mu.Unlock()
		return
	}
	e.parkPruned = now
	e.mu.Unlock()
	for _, p := range e.parks.prune(now, e.cfg.ParkRetention, e.cfg.ParkTotalBytes, sweep) {
		e.emit(Event{Type: EventParkDropped, Owner: p.h.Key.Owner, Key: p.h.Key.String(), Kernel: p.h.Kernel,
			Detail: fmt.Sprintf("parked state of %s (%s) dropped: %s", p.h.Kernel, english.Bytes(p.h.Bytes), p.why)})
	}
}

// timedOut tells whether err ended a read at ctx's deadline.
func timedOut(ctx context.Context, err error) bool {
	return err != nil && (errors.Is(err, errReadCanceled) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil)
}

// dropOwnParks drops, at a clean stop that does not keep its kernels, the
// parked states of this engine and of those it took kernels back from:
// they belong to the session that made them, and a later, unrelated one
// must not restore them. They survive a crash, and --keep-kernels.
func (e *Engine) dropOwnParks() {
	if e.parks == nil {
		return
	}
	e.mu.Lock()
	owners := maps.Clone(e.parkEngines)
	e.mu.Unlock()
	owners[e.parkName] = true
	n := 0
	// Only its own: what it filed (no need to read a dir of a thousand).
	hs := e.parks.filedHere()
	if len(owners) > 1 {
		hs = e.parks.list() // and those of engines it took kernels over from
	}
	for _, h := range hs {
		if h.Engine != "" && owners[h.Engine] && e.parks.drop(h.Key) {
			n++
		}
	}
	if n > 0 {
		e.emit(Event{Type: EventParkDropped, Detail: fmt.Sprintf("dropped %s parked in this session: the engine stopped without keeping its kernels", english.Count(n, "state"))})
	}
}
