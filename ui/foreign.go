package ui

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
)

// Cells run by others (agents, other dashboards) in the same engine: their
// output arrives as cell_output events, their start and end as cell
// events, their code and result from Engine.Cells. They are shown in the
// output pane of their target like the cells run here.

// ownCells are the ids of the cells this dashboard started. The engine
// names a cell (Request.OnStart) before any event of it, from its own
// goroutine, so the set is shared under a lock: by the time the event
// loop sees a cell's events, the cell is known to be ours.
type ownCells struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (o *ownCells) add(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ids == nil {
		o.ids = map[string]bool{}
	}
	if len(o.ids) > 4*maxRuns {
		clear(o.ids) // old ones: their events are long past
	}
	o.ids[id] = true
}

func (o *ownCells) has(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ids[id]
}

// cellsMsg is the engine's record of one kernel's recent cells.
type cellsMsg struct {
	kernel string
	recs   []engine.CellRecord
	err    error
}

// cellsRefetch is how soon the same kernel's records are asked for again.
const cellsRefetch = 500 * time.Millisecond

// fetchCells asks for kernel's records, at most every cellsRefetch.
func (m *Model) fetchCells(kernel string) tea.Cmd {
	if kernel == "" {
		return nil
	}
	now := time.Now()
	if at, ok := m.cellsAsked[kernel]; ok && now.Sub(at) < cellsRefetch {
		m.cellsDue[kernel] = true // asked again once the answer is in
		return nil
	}
	m.cellsAsked[kernel] = now
	ctx, eng := m.runCtx, m.eng
	return func() tea.Msg {
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		recs, err := eng.Cells(c, kernel)
		return cellsMsg{kernel: kernel, recs: recs, err: err}
	}
}

// targetFetch asks for the records of the target's kernel.
func (m *Model) targetFetch() tea.Cmd {
	t := m.editor.Target()
	for _, k := range m.kernels.kernels {
		if t.matches(k) {
			return m.fetchCells(k.ID)
		}
	}
	return nil
}

// foreignRun returns the run of someone else's cell, making it when new.
func (m *Model) foreignRun(cell, kernel, key string) *cellRun {
	if r := m.byCell[cell]; r != nil {
		return r
	}
	t, ok := m.targetOfKernel(kernel, key)
	if !ok {
		return nil
	}
	m.runSeq++
	r := &cellRun{seq: m.runSeq, target: t, cell: cell, foreign: true, started: m.ctx.Now(), running: true}
	m.byCell[cell] = r
	m.output.add(r)
	m.output.follow = m.output.target.String() != t.String() || m.output.follow
	m.pruneCells()
	return r
}

// pruneCells forgets runs the output pane no longer holds.
func (m *Model) pruneCells() {
	if len(m.byCell) <= 2*maxRuns {
		return
	}
	held := map[*cellRun]bool{}
	for _, r := range m.output.runs {
		held[r] = true
	}
	for id, r := range m.byCell {
		if !held[r] {
			delete(m.byCell, id)
		}
	}
}

func (m *Model) targetOfKernel(kernel, key string) (Target, bool) {
	for _, k := range m.kernels.kernels {
		if k.ID == kernel {
			return targetOf(k), true
		}
	}
	return targetOfKey(key)
}

// targetOfKey reads an engine key: owner/task[/child]@backend[tool,tool].
func targetOfKey(key string) (Target, bool) {
	names, rest, ok := strings.Cut(key, "@")
	if !ok {
		return Target{}, false
	}
	backend, tools := rest, ""
	if i := strings.LastIndex(rest, "["); i >= 0 && strings.HasSuffix(rest, "]") {
		backend, tools = rest[:i], rest[i+1:len(rest)-1]
	}
	parts := strings.SplitN(names, "/", 3)
	if len(parts) < 2 {
		return Target{}, false
	}
	t := Target{Owner: parts[0], Task: parts[1], Backend: backend}
	if len(parts) == 3 {
		t.Child = parts[2]
	}
	if tools != "" {
		t.Tools = strings.Split(tools, ",")
	}
	return t, true
}

// onCellEvent follows someone else's cell; it returns a fetch when the
// record has news (its code at the start, its result at the end).
func (m *Model) onCellEvent(ev engine.Event) tea.Cmd {
	if ev.Cell == "" || m.own.has(ev.Cell) {
		return nil
	}
	switch ev.Type {
	case engine.EventCellOutput:
		r := m.foreignRun(ev.Cell, ev.Kernel, ev.Key)
		if r == nil || !r.running {
			return nil
		}
		appendOutput(r, ev.Stream, ev.Text)
		m.output.changed(r)
	case engine.EventCellStarted:
		if m.foreignRun(ev.Cell, ev.Kernel, ev.Key) != nil {
			return m.fetchCells(ev.Kernel)
		}
	case engine.EventCellFinished, engine.EventStateLost, engine.EventCellTimeout:
		if r := m.byCell[ev.Cell]; r != nil || ev.Type == engine.EventCellFinished {
			return m.fetchCells(ev.Kernel)
		}
	}
	return nil
}

// onCells merges a kernel's records: new cells (run before we looked)
// become runs, running ones learn their code, finished ones their result.
func (m *Model) onCells(msg cellsMsg) tea.Cmd {
	if d := m.detail(); d != nil && d.id == msg.kernel {
		d.recs, d.err = msg.recs, msg.err
	}
	if msg.err != nil {
		m.setStatus("cells of "+msg.kernel, msg.err)
		return nil
	}
	for _, rec := range msg.recs {
		if m.own.has(rec.ID) {
			continue
		}
		r := m.byCell[rec.ID]
		if r == nil {
			r = m.foreignRun(rec.ID, rec.Kernel, rec.Key)
			if r == nil {
				continue
			}
			r.started = rec.Started
		}
		r.code = rec.Code
		if !rec.Running && r.running {
			r.running, r.finished = false, rec.Started.Add(rec.Duration)
			r.res = resultOf(rec)
			if rec.Error != "" {
				r.err = errorText(rec.Error)
			}
		}
		r.renderedDone = false
		m.output.changed(r)
	}
	if m.cellsDue[msg.kernel] {
		delete(m.cellsDue, msg.kernel)
		delete(m.cellsAsked, msg.kernel)
		return m.fetchCells(msg.kernel)
	}
	return nil
}

type errorText string

func (e errorText) Error() string { return string(e) }

// resultOf is a record as the output pane shows a result: the head and the
// tail of each stream, with the middle said to be left out.
func resultOf(rec engine.CellRecord) *engine.Result {
	return &engine.Result{Status: rec.Status, Stdout: excerptText(rec.Stdout), Stderr: excerptText(rec.Stderr),
		Traceback: rec.Traceback, StdoutClipped: rec.Stdout.Clipped, StderrClipped: rec.Stderr.Clipped,
		SpillPath: rec.SpillPath, StderrSpillPath: rec.StderrSpillPath, ToolCallsMade: rec.ToolCallsMade,
		Duration: rec.Duration, Cell: rec.ID}
}

func excerptText(x engine.Excerpt) string {
	if omitted := x.Bytes - int64(len(x.Head)+len(x.Tail)); omitted > 0 {
		return x.Head + "\n… (" + sizeText(omitted) + " not kept by the engine) …\n" + x.Tail
	}
	return x.Head + x.Tail
}

func sizeText(n int64) string {
	switch {
	case n >= 1<<20:
		return strconv.FormatInt(n>>20, 10) + " MB"
	case n >= 1<<10:
		return strconv.FormatInt(n>>10, 10) + " KB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// appendOutput adds streamed text to a running cell, keeping the tail.
func appendOutput(r *cellRun, stream, text string) {
	buf, wrapped := &r.stdout, &r.out
	if stream == "stderr" {
		buf, wrapped = &r.stderr, &r.errOut
	}
	buf.WriteString(text)
	if buf.Len() > maxStreamKept {
		// Keep the tail: the pane shows the newest output, and the full
		// text is in the result's spill file.
		tail := buf.String()[buf.Len()-maxStreamKept/2:]
		buf.Reset()
		buf.WriteString("… (earlier output not kept here)\n" + tail)
		*wrapped = wrapCache{}
	}
}
