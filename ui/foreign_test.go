package ui

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

func cellEv(typ engine.EventType, kernel, key, cell string) engine.Event {
	return engine.Event{Type: typ, Time: t0, Kernel: kernel, Owner: strings.Split(key, "/")[0], Key: key, Cell: cell, Detail: "cell " + cell}
}

// A cell another client runs in the target shows in the output pane as it
// streams, then with its code and result from the engine's records.
func TestForeignCellShowsInItsTarget(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.m.retarget(Target{Owner: "alice", Task: "default", Backend: "local", Tools: []string{"read_file"}})
	key := "alice/default@local[read_file]"
	if cmd := f.update(eventBatchMsg{cellEv(engine.EventCellStarted, "k-a1", key, "c-9")}); cmd == nil {
		t.Fatal("a foreign cell's start asked for no record")
	}
	out := engine.Event{Type: engine.EventCellOutput, Time: t0, Kernel: "k-a1", Owner: "alice", Key: key, Cell: "c-9", Stream: "stdout", Text: "step 1 of 3\n"}
	f.update(eventBatchMsg{out})
	v := f.m.View()
	mustContain(t, v, "running (another client)")
	mustContain(t, v, "step 1 of 3")
	if strings.Contains(v, "cell_output") {
		t.Fatal("cell output went to the events pane")
	}
	// The record arrives: the code is shown, then the result.
	f.eng.SetCells("k-a1", []engine.CellRecord{{ID: "c-9", Kernel: "k-a1", Owner: "alice", Key: key, Code: "run_etl(steps=3)",
		Running: true, Started: t0, Stdout: engine.Excerpt{Head: "step 1 of 3\n", Bytes: 12}}})
	delete(f.m.cellsAsked, "k-a1")
	f.run(t, f.m.fetchCells("k-a1"))
	mustContain(t, f.m.View(), "run_etl(steps=3)")
	f.eng.SetCells("k-a1", []engine.CellRecord{{ID: "c-9", Kernel: "k-a1", Owner: "alice", Key: key, Code: "run_etl(steps=3)",
		Status: engine.StatusSuccess, Started: t0, Duration: 1500 * time.Millisecond,
		Stdout: engine.Excerpt{Head: "step 1 of 3\nstep 2", Tail: "step 3 of 3\n", Bytes: 10000}}})
	f.update(eventBatchMsg{cellEv(engine.EventCellFinished, "k-a1", key, "c-9")})
	delete(f.m.cellsAsked, "k-a1")
	f.run(t, f.m.fetchCells("k-a1"))
	v = f.m.View()
	mustContain(t, v, "success 1.50s (another client) run_etl")
	mustNotContain(t, v, "#0")
	mustContain(t, v, "step 3 of 3")
	mustContain(t, v, "not kept by the engine")
	if strings.Contains(v, "running (another client)") {
		t.Fatal("the finished cell still shows as running")
	}
}

// The dashboard's own cells are not shown twice, whatever events come.
func TestOwnCellsNotDoubled(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.m.retarget(Target{Owner: "me", Task: "default", Backend: "local"})
	f.keys(keyEdit)
	f.m.editor.area.SetValue("print('mine')")
	f.run(t, f.update(keyCtrlR))
	f.keys(keyEsc) // back to the kernels
	f.drainInbox(t)
	key := "me/default@local[]"
	f.update(eventBatchMsg{cellEv(engine.EventCellStarted, "k-me", key, "c-own-1"),
		{Type: engine.EventCellOutput, Time: t0, Kernel: "k-me", Owner: "me", Key: key, Cell: "c-own-1", Stream: "stdout", Text: "mine\n"},
		cellEv(engine.EventCellFinished, "k-me", key, "c-own-1")})
	if n := strings.Count(f.m.View(), "print('mine')"); n != 1 {
		t.Fatalf("the own cell is shown %d times, want once:\n%s", n, f.m.View())
	}
	if strings.Contains(f.m.View(), "another client") {
		t.Fatal("the own cell is shown as another client's")
	}
}

// Selecting a kernel shows the cells others ran in it before we looked.
func TestSelectingAKernelShowsItsCells(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.eng.SetCells("k-b1", []engine.CellRecord{
		{ID: "c-1", Kernel: "k-b1", Owner: "bob", Key: "bob/default@ssh://gpu1[read_file,terminal]", Code: "train()", Status: engine.StatusError,
			Started: t0.Add(-time.Hour), Duration: time.Minute, Traceback: "Traceback...\nOOMError: out of memory\n"},
	})
	f.m.retarget(Target{Owner: "bob", Task: "default", Backend: "ssh://gpu1", Tools: []string{"read_file", "terminal"}})
	cmd := f.update(refreshNowMsg{})
	if cmd == nil {
		t.Fatal("retargeting asked for no records")
	}
	f.run(t, cmd)
	if asked := f.eng.CellsAsked(); !slices.Contains(asked, "k-b1") {
		t.Fatalf("cells asked for %v, want k-b1", asked)
	}
	v := f.m.View()
	mustContain(t, v, "train()")
	mustContain(t, v, "OOMError: out of memory")
	if strings.Contains(v, "no cells run in this target yet") {
		t.Fatal("the target's cells are not shown")
	}
}

// History comes first, marked, with a rule before the live events.
func TestHistoryIsMarked(t *testing.T) {
	f := sized(t, fixtureOpts{kernels: twoOwnerKernels()})
	f.update(eventBatchMsg{
		{Type: engine.EventEvictedCap, Time: t0.Add(-9 * time.Hour), Kernel: "k-old", Owner: "alice", Detail: "evicted by the cap", History: true},
	})
	v := f.m.View()
	mustContain(t, v, "(history) k-old: evicted by the cap")
	mustContain(t, v, "history above · live below")
	f.update(eventBatchMsg{{Type: engine.EventSpawned, Time: t0, Kernel: "k-new", Owner: "bob", Detail: "pid 1"}})
	v = f.m.View()
	rule, live := strings.Index(v, "history above · live below"), strings.Index(v, "k-new: pid 1")
	if rule < 0 || live < rule {
		t.Fatalf("the live event is not below the rule:\n%s", v)
	}
	// History never moves the dashboard: no reasons taken from it.
	if _, ok := f.m.reasons["k-old"]; ok {
		t.Fatal("a history event was acted on")
	}
}
