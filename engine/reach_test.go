package engine

import "testing"

// Whether a cell may have run in a runner found gone: by how far its
// request may have got, and whether the host showed its record absent.
func TestMayHaveRun(t *testing.T) {
	for _, tc := range []struct {
		reach        reach
		recordAbsent bool
		want         bool
	}{
		{reachNone, false, false},
		{reachNone, true, false},
		{reachRecord, false, true},
		{reachRecord, true, false}, // the record's absence proves it never arrived
		{reachSocket, false, true},
		{reachSocket, true, true}, // the socket leaves no record to miss
	} {
		c := &cellRun{}
		c.reached(tc.reach)
		c.reached(reachNone) // reach never goes back
		if got := c.mayHaveRun(tc.recordAbsent); got != tc.want {
			t.Errorf("reach %d, record absent %v: may have run = %v, want %v", tc.reach, tc.recordAbsent, got, tc.want)
		}
	}
}
