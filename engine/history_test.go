package engine

import (
	"math/rand/v2"
	"testing"
	"time"
)

func historyOf(h *history) []Event {
	var out []Event
	h.each(func(ev Event) { out = append(out, ev) })
	return out
}

// One owner alone fills the whole history; a flood by one owner never
// pushes out another's events, which stay in order.
func TestHistoryShares(t *testing.T) {
	h := newHistory(100)
	seq := uint64(0)
	add := func(owner string) {
		seq++
		h.add(Event{Seq: seq, Owner: owner})
	}
	for range 150 {
		add("alice")
	}
	if got := historyOf(h); len(got) != 100 || got[0].Seq != 51 {
		t.Fatalf("alice alone: %d events from seq %d, want the last 100", len(got), got[0].Seq)
	}
	for range 10 {
		add("carol")
	}
	for range 50_000 {
		add("bob")
	}
	count := map[string]int{}
	last := uint64(0)
	for _, ev := range historyOf(h) {
		count[ev.Owner]++
		if ev.Seq <= last {
			t.Fatalf("events out of order: %d after %d", ev.Seq, last)
		}
		last = ev.Seq
	}
	// Bob's events took the place of the oldest (alice's) until he held
	// his share of 25, then only of his own.
	if count["carol"] != 10 || count["alice"] != 65 || count["bob"] != 25 {
		t.Fatalf("after bob's flood: %v, want carol's 10, alice's 65 and bob's share of 25", count)
	}
	if len(h.events) >= 2*h.limit {
		t.Fatalf("%d slots for %d events: holes are not compacted", len(h.events), h.limit)
	}
}

// Whatever the owners do, the history keeps at most its limit, in order,
// and an owner below its share loses events only to the oldest-first rule
// of owners below their share too.
func TestHistoryInvariants(t *testing.T) {
	for round := range 50 {
		r := rand.New(rand.NewPCG(uint64(round), 7))
		h := newHistory(1 + r.IntN(64))
		owners := []string{"", "a", "b", "c", "d"}
		for i := range 2000 {
			h.add(Event{Seq: uint64(i + 1), Owner: owners[r.IntN(len(owners))]})
			got := historyOf(h)
			if len(got) > h.limit || len(got) != h.live {
				t.Fatalf("round %d: %d events, live %d, limit %d", round, len(got), h.live, h.limit)
			}
			if got[len(got)-1].Seq != uint64(i+1) {
				t.Fatalf("round %d: the newest event is missing", round)
			}
			for j := 1; j < len(got); j++ {
				if got[j].Seq <= got[j-1].Seq {
					t.Fatalf("round %d: out of order", round)
				}
			}
		}
		n := 0
		for _, idx := range h.byOwner {
			n += len(idx)
		}
		if n != h.live {
			t.Fatalf("round %d: owners index %d events, live %d", round, n, h.live)
		}
	}
}

// The events of earlier engines are read once, by the first subscription
// that wants history, never at the start or for a cell: a one-shot's first
// result once waited for the whole event log (28 ms a MB). They come
// before this engine's own, which are not given twice.
func TestEarlierEventsAreReadOnlyWhenAskedFor(t *testing.T) {
	started := time.Now()
	calls := 0
	earlier := func(n int) ([]Event, error) {
		calls++
		return []Event{
			{Type: EventSpawned, Time: started.Add(-time.Hour), Kernel: "before"},
			// What the log holds of this engine's own, by the time it is read.
			{Type: EventSpawned, Time: started.Add(time.Second), Kernel: "mine"},
		}, nil
	}
	b := newBus(100, earlier, started)
	b.publish(Event{Type: EventSpawned, Time: started.Add(time.Second), Kernel: "mine"})
	b.subscribe(SubscribeOptions{}).Close()
	if calls != 0 {
		t.Fatalf("a subscription without history read the log %d times", calls)
	}
	for range 2 {
		s := b.subscribe(SubscribeOptions{Since: started.Add(-2 * time.Hour)})
		var got []string
		for _, ev := range s.History {
			got = append(got, ev.Kernel)
		}
		s.Close()
		if len(got) != 2 || got[0] != "before" || got[1] != "mine" {
			t.Fatalf("history %v, want the earlier engine's event, then this one's, once", got)
		}
	}
	if calls != 1 {
		t.Fatalf("the log was read %d times, want once", calls)
	}
}
