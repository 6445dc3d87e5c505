package ui

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/charmbracelet/bubbles/key"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/internal/termtext"
)

// kernelDetail is the detail view of one kernel ("d" on its row): what the
// list has no room for. It stays open on a kernel that died, with its
// last state and the reason, until dismissed.
type kernelDetail struct {
	id string
	// parked, for the detail of a parked state: what the kernel of id
	// parked, as listed when the detail opened.
	parked *engine.ParkedKernel
	recs   []engine.CellRecord
	err    error
	offset int // first line shown
}

// openDetail opens the detail of the selected kernel, live or dead.
func (m *Model) openDetail() tea.Cmd {
	r := m.kernels.selectedRow()
	switch {
	case r == nil:
		return nil
	case r.kernel != nil:
		m.layers.open(&kernelDetail{id: r.kernel.ID})
	case r.gone != nil:
		m.layers.open(&kernelDetail{id: r.gone.info.ID})
	case r.parked != nil:
		pk := *r.parked
		m.layers.open(&kernelDetail{id: pk.Kernel, parked: &pk})
	default:
		return nil
	}
	id := m.detail().id
	delete(m.cellsAsked, id) // a fresh look
	return m.fetchCells(id)
}

// detailKernel is the kernel the detail shows: live, or its last listing
// and why it went.
func (m *Model) detailKernel(d *kernelDetail) (k engine.KernelInfo, reason string, live bool) {
	for _, k := range m.kernels.kernels {
		if k.ID == d.id {
			return k, "", true
		}
	}
	if g := m.kernels.gone[d.id]; g != nil {
		return g.info, g.reason, false
	}
	return engine.KernelInfo{ID: d.id}, m.reasons[d.id], false
}

// detailLines is the detail's text at width w.
func (m *Model) detailLines(d *kernelDetail, w int) []string {
	t := m.ctx.Theme
	k, reason, live := m.detailKernel(d)
	now := m.ctx.Now()
	var out []string
	add := func(label, value string) {
		for i, l := range wordWrapLines(value, max(10, w-16)) {
			if i == 0 {
				out = append(out, t.Muted.Render(fmt.Sprintf("%-14s", label))+l)
			} else {
				out = append(out, strings.Repeat(" ", 14)+l)
			}
		}
	}
	if d.parked != nil && !live {
		m.parkedLines(d.parked, add)
		return out
	}
	add("kernel", plain(k.ID))
	add("key", kernelName(k))
	if !live {
		add("state", "dead")
		add("why", cmp.Or(plain(reason), "gone from the engine's listing (no reason seen)"))
	} else {
		state := string(k.State)
		switch k.State {
		case engine.StateRunning:
			state += fmt.Sprintf(" for %s (cell %s)", short(now.Sub(k.RunningSince)), plain(k.RunningCell))
		case engine.StateIdle:
			state += " for " + short(now.Sub(k.LastUsed))
			if !k.Attached {
				state += fmt.Sprintf("; reaped in %s unless used", short(m.idleExit-now.Sub(k.LastUsed)))
			}
		}
		if k.Queued > 0 {
			state += fmt.Sprintf("; %d cells queued", k.Queued)
		}
		add("state", state)
		// The kernels pane numbers the eviction order at each snapshot.
		if pos, of := m.kernels.lruPos[k.ID], len(m.kernels.lruPos); pos > 0 {
			lru := fmt.Sprintf("%d of %d idle kernels (1 goes first when the cap needs room)", pos, of)
			if k.NextEvict {
				lru += "; next to be evicted"
			}
			add("LRU", lru)
		} else {
			add("LRU", "not evictable while busy")
		}
	}
	if h := k.Host.String(); h != "" {
		add("host", plain(h))
	}
	add("pid", fmt.Sprint(k.PID))
	add("dir", plain(k.Dir))
	add("cells run", fmt.Sprint(k.ExecutionCount))
	if k.Confinement != "" {
		add("confinement", plain(k.Confinement))
	}
	if k.Python != "" {
		add("python", plain(k.Python))
	}
	if k.Cwd != "" {
		add("works in", plain(k.Cwd))
	}
	out = append(out, "", t.Bold.Render("Cells (recent, whoever ran them)"))
	switch {
	case d.err != nil:
		out = append(out, t.Error.Render("  "+plain(d.err.Error())))
	case len(d.recs) == 0:
		out = append(out, t.Muted.Render("  none recorded"))
	}
	for i := len(d.recs) - 1; i >= 0; i-- {
		rec := d.recs[i]
		status := string(rec.Status)
		if rec.Running {
			status = "running"
		}
		out = append(out, fmt.Sprintf("  %s  %-11s %-9s %s", rec.Started.Format("15:04:05"), plain(rec.Owner), status, english.Duration(rec.Duration)))
		for _, l := range strings.Split(strings.TrimRight(plain(rec.Code), "\n"), "\n") {
			out = append(out, "    "+t.Muted.Render("│ ")+l)
		}
		if o := strings.TrimRight(plain(rec.Stdout.Head+rec.Stdout.Tail), "\n"); o != "" {
			for _, l := range wordWrapLines(o, max(10, w-8)) {
				out = append(out, "    "+l)
			}
		}
		if rec.Traceback != "" {
			tb := strings.Split(strings.TrimRight(plain(rec.Traceback), "\n"), "\n")
			out = append(out, "    "+t.Error.Render(tb[len(tb)-1]))
		}
	}
	out = append(out, "", t.Bold.Render("Events"))
	n := 0
	for _, ev := range m.evPane.events {
		if ev.Kernel == k.ID && ev.Type != engine.EventCellOutput {
			out = append(out, "  "+ev.Time.Format("15:04:05")+" "+t.EventStyle(ev.Type).Render(fmt.Sprintf("%-18s", termtext.Line(string(ev.Type))))+" "+termtext.Line(ev.Detail))
			n++
		}
	}
	if n == 0 {
		out = append(out, t.Muted.Render("  none seen by this dashboard"))
	}
	return out
}

// parkedLines adds the detail of parked state pk: what was saved, what was
// not and why.
func (m *Model) parkedLines(pk *engine.ParkedKernel, add func(label, value string)) {
	k := parkedInfo(pk)
	add("kernel", plain(k.ID))
	add("key", kernelName(k))
	back := "restores"
	if pk.Hibernated {
		back = "wakes"
	}
	add("state", fmt.Sprintf("%s %s ago (%s); its key's next cell %s it (enter writes one, D drops it)",
		k.State, short(m.ctx.Now().Sub(pk.Parked)), plain(pk.Reason), back))
	add("size", english.Bytes(pk.Bytes))
	add("cells run", fmt.Sprint(pk.ExecutionCount))
	add("saved", cmp.Or(plain(strings.Join(pk.Names, ", ")), "nothing"))
	if len(pk.NotSaved) == 0 {
		add("not saved", "nothing")
	}
	for i, n := range pk.NotSaved {
		label := ""
		if i == 0 {
			label = "not saved"
		}
		add(label, fmt.Sprintf("%s (%s): %s", plain(n.Name), plain(n.Type), plain(n.Why)))
	}
}

// detailView draws the detail in w×h, from its scroll offset.
func (m *Model) detailView(d *kernelDetail, w, h int) string {
	lines := m.detailLines(d, w-2)
	from := min(d.offset, max(0, len(lines)-(h-2)))
	return m.ctx.box("Kernel "+plain(d.id)+" · esc closes, j/k scroll", lines[from:], w, h, true)
}

// onDetailKey handles the keys while the detail d is open.
func (m *Model) onDetailKey(d *kernelDetail, km tea.KeyMsg) {
	keys := m.ctx.Keys
	switch {
	case key.Matches(km, keys.Cancel), key.Matches(km, keys.Detail), key.Matches(km, keys.Quit):
		m.layers.close(layerDetail)
	case key.Matches(km, keys.Down):
		d.offset++
	case key.Matches(km, keys.Up):
		d.offset = max(0, d.offset-1)
	case key.Matches(km, keys.PageDown):
		d.offset += 10
	case key.Matches(km, keys.PageUp):
		d.offset = max(0, d.offset-10)
	}
}
