package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/english"
)

// Hibernation: a kernel idle for hibernate_after is parked and its runner
// ended, as an eviction would, but it is listed as hibernated, not gone:
// its key's next call restores it (parking.go). Its session still ends at
// idle_exit, counted from its last use: from then on its parked state is
// listed as a reaped kernel's, kept for park_retention like any other.

// DefaultHibernateAfter is how long a kernel sits idle before it hibernates
// where the operator says nothing (the settings table gives it).
const DefaultHibernateAfter = 10 * time.Minute

// MinHibernateAfter is the least hibernate_after other than 0 (never).
const MinHibernateAfter = time.Second

// hibernatingLocked tells whether idle kernels hibernate before idle_exit
// reaps them.
func (e *Engine) hibernatingLocked() bool {
	return e.parks != nil && e.hibernateAfter > 0 && e.hibernateAfter < e.idleExit
}

// errIncomplete: a runner refused to park all of its kernel, for what
// would not survive it (a thread, a name that does not pickle).
var errIncomplete = errors.New("not all of it would survive")

// hibernateLocked starts hibernating k, idle for idle: the engine holds it
// (no call runs in it meanwhile; a call that comes waits) while its runner
// parks all of its namespace, then ends it, or, where something would not
// survive or a call came meanwhile, gives it back as it was.
func (e *Engine) hibernateLocked(k *Kernel, idle time.Duration) {
	k.holding, k.hibernating = true, true
	reason := "hibernated after idle " + english.Duration(idle)
	detail := fmt.Sprintf("idle %s > hibernate_after %s; its next call restores it", english.Duration(idle), english.Duration(e.hibernateAfter))
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.hibernate(e.base, k, reason, detail)
	}()
}

// hibernate parks k whole and ends its runner (see hibernateLocked).
func (e *Engine) hibernate(ctx context.Context, k *Kernel, reason, detail string) {
	start := time.Now()
	h, err := e.park(ctx, k, parkAsk{hibernate: true, reason: reason})
	e.mu.Lock()
	k.hibernating = false
	empty := errors.Is(err, errEmptyNamespace) // nothing to keep: its runner just ends
	switch {
	case err != nil && !empty:
		k.awake = err.Error()
		e.emit(kernelEvent(EventNotice, k, fmt.Sprintf("not hibernated: %v; it stays awake until its next call", err)))
		e.passTurnLocked(k) // not used: it stays idle for as long as it was
		e.mu.Unlock()
		return
	case k.state == phaseGone || len(k.waiters) > 0 || e.kernels[k.key] != k:
		// Killed, or called, meanwhile: the call gets this kernel as it is.
		e.parks.drop(k.key)
		e.passTurnLocked(k)
		e.mu.Unlock()
		return
	}
	k.holding = false
	e.removeLocked(k, reason)
	delete(e.lost, k.key) // its state is parked
	if empty {
		e.emit(kernelEvent(EventHibernated, k, detail+"; its namespace was empty, so nothing was parked"))
	} else {
		e.hibernated[k.key] = k.lastUsed
		e.emit(kernelEvent(EventHibernated, k, detail))
		e.emit(kernelEvent(EventParked, k, h.parkedDetail(time.Since(start))))
	}
	e.retiring[k.id] = k
	e.mu.Unlock()
	e.pruneParked(false)
	e.killRetired(k)
}

// endHibernated ends the sessions of the kernels this engine hibernated
// that have now been idle for idle_exit, and says so; their parked states
// stay, as a reaped kernel's do.
func (e *Engine) endHibernated() {
	if e.parks == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.cfg.Now()
	for key, used := range e.hibernated {
		idle := now.Sub(used)
		if idle <= e.idleExit {
			continue
		}
		delete(e.hibernated, key)
		if e.kernels[key] != nil || e.parking[key] != nil || !e.parks.has(key) {
			continue // restored, dropped, or failed to park: nothing sleeps
		}
		e.emit(Event{Type: EventReapedIdle, Owner: key.Owner, Key: key.String(),
			Detail: fmt.Sprintf("hibernated session ended: idle %s > idle_exit %s; its parked state is kept for park_retention",
				english.Duration(idle), english.Duration(e.idleExit))})
	}
}

// HibernateAfter reports hibernate_after in force (0: never).
func (e *Engine) HibernateAfter() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.parks == nil {
		return 0
	}
	return e.hibernateAfter
}

// SetHibernateAfter changes hibernate_after (0: never) and applies it at
// once.
func (e *Engine) SetHibernateAfter(d time.Duration) error {
	if d != 0 && d < MinHibernateAfter {
		return fmt.Errorf("%w: hibernate_after must be at least %v (0: never), got %v", ErrBadLimit, MinHibernateAfter, d)
	}
	e.mu.Lock()
	if d > 0 && e.parks == nil {
		e.mu.Unlock()
		return fmt.Errorf("%w: hibernate_after needs parking, and this engine has no state dir to park in", ErrBadLimit)
	}
	e.hibernateAfter = d
	e.idleSince = time.Time{} // a shorter one may be due now
	e.emit(Event{Type: EventLimits, Detail: "hibernate_after " + hibernateText(d)})
	e.mu.Unlock()
	e.reapIdle()
	return nil
}

// hibernateText says hibernate_after as the events do.
func hibernateText(d time.Duration) string {
	if d == 0 {
		return "never"
	}
	return english.Duration(d)
}

// sleeping tells whether parked state h is a hibernated kernel whose
// session idle_exit has not yet ended.
func (h parkHeader) sleeping(now time.Time, idleExit time.Duration) bool {
	return h.Hibernated && now.Sub(h.LastUsed) <= idleExit
}
