package engine

import (
	"fmt"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/english"
)

// A peer that is refused can ask again as fast as it likes; each refusal
// is worth telling the operator, but not one event each: 20,000 of them
// would push every owner's events out of the history. A Refusals says the
// first few of each window and counts the rest into one notice.
const (
	refusalBurst  = 5
	refusalWindow = time.Second
)

// Refusals publishes the notices of one source's refused requests (a
// connection, a user): at most refusalBurst in a refusalWindow, the rest
// counted and said in one notice when the window ends. Safe for
// concurrent use; Close says what is still counted.
type Refusals struct {
	e     *Engine
	who   string // "user bob (uid 4242)"
	owner string

	mu     sync.Mutex
	start  time.Time // of the current window
	said   int       // notices said in it
	more   int       // refusals counted, not said
	timer  *time.Timer
	closed bool
}

// NewRefusals returns the notices of refusals of who (shown in the
// aggregate), of owner ("" for none).
func (e *Engine) NewRefusals(who, owner string) *Refusals {
	return &Refusals{e: e, who: who, owner: owner}
}

// Refused says detail as a notice, or counts it once the window's burst
// is spent.
func (r *Refusals) Refused(detail string) {
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.start) >= refusalWindow {
		r.flushLocked(now)
		r.start, r.said = now, 0
	}
	if r.said >= refusalBurst || r.closed {
		r.more++
		if r.timer == nil && !r.closed {
			r.timer = time.AfterFunc(refusalWindow-now.Sub(r.start), func() {
				r.mu.Lock()
				defer r.mu.Unlock()
				r.timer = nil
				r.flushLocked(time.Now())
			})
		}
		r.mu.Unlock()
		return
	}
	r.said++
	r.mu.Unlock()
	r.e.Publish(Event{Type: EventNotice, Owner: r.owner, Detail: detail})
}

// flushLocked says the refusals counted since the window began.
func (r *Refusals) flushLocked(now time.Time) {
	if r.more == 0 {
		return
	}
	n := r.more
	r.more = 0
	r.e.Publish(Event{Type: EventNotice, Owner: r.owner, Detail: fmt.Sprintf("refused %s: %d more %s in %s",
		r.who, n, english.Plural(n, "request"), english.Duration(now.Sub(r.start)))})
}

// Close stops the window's timer and says what is still counted.
func (r *Refusals) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.closed = true
	r.flushLocked(time.Now())
}
