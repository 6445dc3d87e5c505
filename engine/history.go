package engine

// history is the engine's memory of its last events, for subscribers
// that ask for them (an attaching dashboard). It holds at most limit
// events, and no owner can push the others' out: once it is full, a new
// event of an owner holding its share (a quarter) or more takes the place
// of that owner's own oldest event, and only others' take the oldest of
// all. Removal in the middle leaves a hole that a compaction, once the
// holes fill the slack as large as the history, takes out.
type history struct {
	limit  int
	share  int
	events []Event // oldest first, holes included
	holes  []bool  // parallel to events
	first  int     // index of the oldest event that is no hole
	live   int
	// byOwner lists each owner's events by index, oldest first.
	byOwner map[string][]int
}

func newHistory(limit int) *history {
	limit = max(1, limit)
	return &history{limit: limit, share: max(1, limit/4), byOwner: map[string][]int{}}
}

// add remembers ev, making room as the type's comment says.
func (h *history) add(ev Event) {
	if h.live >= h.limit {
		if mine := h.byOwner[ev.Owner]; len(mine) >= h.share {
			h.drop(ev.Owner)
		} else {
			h.drop(h.events[h.first].Owner)
		}
	}
	h.events = append(h.events, ev)
	h.holes = append(h.holes, false)
	h.byOwner[ev.Owner] = append(h.byOwner[ev.Owner], len(h.events)-1)
	h.live++
	if len(h.events) >= 2*h.limit {
		h.compact()
	}
}

// drop removes owner's oldest event.
func (h *history) drop(owner string) {
	mine := h.byOwner[owner]
	i := mine[0]
	if len(mine) == 1 {
		delete(h.byOwner, owner)
	} else {
		h.byOwner[owner] = mine[1:]
	}
	h.holes[i] = true
	h.events[i] = Event{}
	h.live--
	for h.first < len(h.events) && h.holes[h.first] {
		h.first++
	}
}

// compact takes the holes out.
func (h *history) compact() {
	events := make([]Event, 0, 2*h.limit)
	clear(h.byOwner)
	for i, ev := range h.events {
		if !h.holes[i] {
			h.byOwner[ev.Owner] = append(h.byOwner[ev.Owner], len(events))
			events = append(events, ev)
		}
	}
	h.events, h.holes, h.first = events, make([]bool, len(events), 2*h.limit), 0
}

// each calls f with every remembered event, oldest first.
func (h *history) each(f func(Event)) {
	for i := h.first; i < len(h.events); i++ {
		if !h.holes[i] {
			f(h.events[i])
		}
	}
}
