package enginetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
)

// Watching checks what an onlooker sees of a cell somebody else runs: its
// output live (a subscription with Output, while the caller asked for no
// output), its record in Engine.Cells while it runs and after, and the
// history a late subscriber gets replayed. The backend must offer streams.
func Watching(t *testing.T, env backends.Env) {
	h := New(t, env, nil)
	warm := h.Run("agent", "x = 1", 0)
	expectOK(t, warm, "")
	since := time.Now().Add(-time.Minute)

	watch := h.Eng.SubscribeWith(engine.SubscribeOptions{Buffer: 1 << 12, Output: true})
	defer watch.Close()
	done := make(chan *engine.Result, 1)
	go func() {
		res, err := h.Eng.Execute(context.Background(), engine.Request{Owner: "agent",
			Code: "import time\nprint('first', flush=True)\nwhile not __import__('os').path.exists(" +
				fmt.Sprintf("%q", warm.Kernel.Dir+"/go") + "):\n    time.sleep(0.02)\nprint('second')"})
		if err != nil {
			t.Errorf("agent's cell: %v", err)
		}
		done <- res
	}()

	// The first line arrives while the cell still runs (it waits for us).
	var cell string
	deadline := time.After(30 * time.Second)
	for cell == "" {
		select {
		case ev := <-watch.C:
			if ev.Type == engine.EventCellOutput && ev.Stream == "stdout" && strings.Contains(ev.Text, "first") {
				if ev.Kernel != warm.Kernel.ID || ev.Owner != "agent" || ev.Cell == "" {
					t.Fatalf("output event %+v, want kernel %s of agent with its cell", ev, warm.Kernel.ID)
				}
				cell = ev.Cell
			}
		case <-deadline:
			t.Fatal("the watcher saw no output of the running cell")
		}
	}
	recs := h.Eng.Cells(warm.Kernel.ID)
	if len(recs) != 2 {
		t.Fatalf("%d cell records, want 2 (the warm-up and the running one): %+v", len(recs), recs)
	}
	run := recs[1]
	if run.ID != cell || !run.Running || run.Status != "" || !strings.Contains(run.Code, "print('first'") ||
		!strings.HasPrefix(run.Stdout.Head, "first\n") || run.Owner != "agent" {
		t.Fatalf("record of the running cell: %+v", run)
	}
	h.Host("touch " + warm.Kernel.Dir + "/go")
	res := <-done
	expectOK(t, res, "first\nsecond\n")
	recs = h.Eng.Cells(warm.Kernel.ID)
	run = recs[len(recs)-1]
	if run.ID != cell || run.Running || run.Status != engine.StatusSuccess || run.Stdout.Head != "first\nsecond\n" ||
		run.Stdout.Bytes != int64(len("first\nsecond\n")) || run.Duration <= 0 {
		t.Fatalf("record of the finished cell: %+v", run)
	}
	if recs[0].Code != "x = 1" || recs[0].Status != engine.StatusSuccess {
		t.Fatalf("record of the warm-up cell: %+v", recs[0])
	}

	// A big output keeps its head, its tail and its length (the watcher
	// made it stream, all of it), and where the whole of it is, though the
	// result itself is clipped.
	big := h.Run("agent", "print('H' * 3000 + 'x' * 100000 + 'T' * 3000)", 0)
	if big.Status != engine.StatusSuccess || !big.StdoutClipped || big.SpillPath == "" {
		t.Fatalf("big cell: %+v", big)
	}
	recs = h.Eng.Cells(warm.Kernel.ID)
	rec := recs[len(recs)-1]
	x := rec.Stdout
	if x.Bytes != 106001 || !x.Clipped || rec.SpillPath != big.SpillPath || !strings.HasPrefix(x.Head, "HHHH") ||
		len(x.Head) > 2<<10 || !strings.HasSuffix(x.Tail, strings.Repeat("T", 3000)+"\n") || len(x.Tail) > 4<<10 {
		t.Fatalf("big output record: head %d bytes %.8q…, tail %d bytes, %d bytes in all (result %d), clipped %v, spill %q",
			len(x.Head), x.Head, len(x.Tail), x.Bytes, len(big.Stdout), x.Clipped, rec.SpillPath)
	}

	// A late subscriber gets the history first, then live events, with no
	// gap and no repeat.
	late := h.Eng.SubscribeWith(engine.SubscribeOptions{Buffer: 64, Since: since})
	defer late.Close()
	var started, finished int
	for _, ev := range late.History {
		if !ev.History || ev.Type == engine.EventCellOutput {
			t.Fatalf("history event %+v: want History set and no cell output", ev)
		}
		switch ev.Type {
		case engine.EventCellStarted:
			started++
		case engine.EventCellFinished:
			finished++
		}
	}
	if started != 3 || finished != 3 {
		t.Fatalf("history holds %d cell_started and %d cell_finished, want 3 of each:\n%+v", started, finished, late.History)
	}
	last := late.History[len(late.History)-1]
	h.Run("agent", "pass", 0)
	for {
		select {
		case ev := <-late.C:
			if ev.History || ev.Type == engine.EventCellOutput {
				t.Fatalf("live event %+v is marked history or is output", ev)
			}
			if ev.Time.Before(last.Time) {
				t.Fatalf("live event %+v is older than the last replayed one %+v", ev, last)
			}
			if ev.Type == engine.EventCellFinished {
				return
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the late subscriber saw no live cell_finished")
		}
	}
}
