package ui

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/charmbracelet/bubbles/key"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
)

// goneKernel is a kernel that left the registry, shown as dead for a while
// with the reason the engine gave.
type goneKernel struct {
	info   engine.KernelInfo
	reason string
	at     time.Time
}

// showGoneFor is how long a dead kernel stays in the list.
const showGoneFor = time.Minute

// kernelRow is one line of the list: an owner group or a kernel.
type kernelRow struct {
	owner   string
	count   int  // kernels in the group (owner rows)
	folded  bool // the group is collapsed (owner rows)
	kernel  *engine.KernelInfo
	gone    *goneKernel
	ownerIx int
}

// KernelsPane lists the kernels grouped by owner, with their state and
// timers. Rows are rebuilt when the snapshot changes; View formats only the
// rows that fit.
type KernelsPane struct {
	ctx           *Context
	width, height int
	focused       bool

	kernels  []engine.KernelInfo
	gone     map[string]*goneKernel
	idleExit time.Duration
	folded   map[string]bool
	rows     []kernelRow
	cursor   int
	offset   int
}

func newKernelsPane(ctx *Context) *KernelsPane {
	return &KernelsPane{ctx: ctx, gone: map[string]*goneKernel{}, folded: map[string]bool{}}
}

// SetSize sets the pane's outer size.
func (p *KernelsPane) SetSize(w, h int) { p.width, p.height = w, h }

// setSnapshot replaces the kernels shown; kernels that disappeared are kept
// as dead with their last known reason.
func (p *KernelsPane) setSnapshot(ks []engine.KernelInfo, idleExit time.Duration, reasons map[string]string) {
	now := p.ctx.Now()
	present := make(map[string]bool, len(ks))
	for _, k := range ks {
		present[k.ID] = true
		delete(p.gone, k.ID)
	}
	for _, old := range p.kernels {
		if !present[old.ID] {
			reason := reasons[old.ID]
			if reason == "" {
				reason = "gone"
			}
			p.gone[old.ID] = &goneKernel{info: old, reason: reason, at: now}
		}
	}
	for id, g := range p.gone {
		if now.Sub(g.at) > showGoneFor {
			delete(p.gone, id)
		} else if r := reasons[id]; r != "" {
			// The event with the reason may come after the snapshot that
			// first missed the kernel.
			g.reason = r
		}
	}
	p.kernels, p.idleExit = ks, idleExit
	p.rebuild()
}

// rebuild regroups the rows. The engine lists kernels sorted by owner, so
// each owner's kernels are one run of the slice: no copies, no maps.
func (p *KernelsPane) rebuild() {
	selectedID := ""
	if r := p.selectedRow(); r != nil && r.kernel != nil {
		selectedID = r.kernel.ID
	}
	goneBy := map[string][]*goneKernel{}
	for _, g := range p.gone {
		goneBy[g.info.Owner] = append(goneBy[g.info.Owner], g)
	}
	var goneOwners []string
	for o, gs := range goneBy {
		goneOwners = append(goneOwners, o)
		slices.SortFunc(gs, func(a, b *goneKernel) int { return b.at.Compare(a.at) })
	}
	slices.Sort(goneOwners)
	rows := p.rows[:0]
	ks := p.kernels
	i, gi, ownerIx := 0, 0, 0
	for i < len(ks) || gi < len(goneOwners) {
		var owner string
		switch {
		case i < len(ks) && (gi >= len(goneOwners) || ks[i].Owner <= goneOwners[gi]):
			owner = ks[i].Owner
		default:
			owner = goneOwners[gi]
		}
		j := i
		for j < len(ks) && ks[j].Owner == owner {
			j++
		}
		if gi < len(goneOwners) && goneOwners[gi] == owner {
			gi++
		}
		folded := p.folded[owner]
		rows = append(rows, kernelRow{owner: owner, count: j - i, folded: folded, ownerIx: ownerIx})
		if !folded {
			for x := i; x < j; x++ {
				rows = append(rows, kernelRow{owner: owner, kernel: &ks[x], ownerIx: ownerIx})
			}
			for _, g := range goneBy[owner] {
				rows = append(rows, kernelRow{owner: owner, gone: g, ownerIx: ownerIx})
			}
		}
		i = j
		ownerIx++
	}
	p.rows = rows
	if selectedID != "" {
		for i, r := range rows {
			if r.kernel != nil && r.kernel.ID == selectedID {
				p.cursor = i
			}
		}
	}
	p.cursor = min(max(p.cursor, 0), max(len(rows)-1, 0))
}

func (p *KernelsPane) selectedRow() *kernelRow {
	if p.cursor < 0 || p.cursor >= len(p.rows) {
		return nil
	}
	return &p.rows[p.cursor]
}

// Selected returns the kernel under the cursor, if the cursor is on one.
func (p *KernelsPane) Selected() (engine.KernelInfo, bool) {
	if r := p.selectedRow(); r != nil && r.kernel != nil {
		return *r.kernel, true
	}
	return engine.KernelInfo{}, false
}

// SelectedOwner returns the owner of the row under the cursor.
func (p *KernelsPane) SelectedOwner() string {
	if r := p.selectedRow(); r != nil {
		return r.owner
	}
	return ""
}

// selectTarget puts the cursor on the kernel of t, if it is listed.
func (p *KernelsPane) selectTarget(t Target) {
	for i, r := range p.rows {
		if r.kernel != nil && t.matches(*r.kernel) {
			p.cursor = i
			return
		}
	}
}

// Update moves the cursor and folds owner groups; the root handles actions.
func (p *KernelsPane) Update(msg tea.Msg) (Component, tea.Cmd) {
	km, ok := msg.(tea.KeyMsg)
	if !ok {
		return p, nil
	}
	keys := p.ctx.Keys
	page := max(1, p.height-3)
	switch {
	case key.Matches(km, keys.Up):
		p.cursor--
	case key.Matches(km, keys.Down):
		p.cursor++
	case key.Matches(km, keys.PageUp):
		p.cursor -= page
	case key.Matches(km, keys.PageDown):
		p.cursor += page
	case key.Matches(km, keys.Toggle):
		if r := p.selectedRow(); r != nil {
			p.folded[r.owner] = !p.folded[r.owner]
			owner := r.owner
			p.rebuild()
			for i, row := range p.rows {
				if row.kernel == nil && row.gone == nil && row.owner == owner {
					p.cursor = i
				}
			}
		}
	}
	p.cursor = min(max(p.cursor, 0), max(len(p.rows)-1, 0))
	return p, nil
}

// Column widths of a kernel row; tools take the rest.
const (
	colTask, colState, colTime, colReap, colExec, colNext, colPID, colBackend = 14, 10, 8, 10, 5, 6, 8, 14
)

func (p *KernelsPane) header() string {
	return fmt.Sprintf("   %-*s%-*s%-*s%-*s%-*s%-*s%-*s%-*s%s", colTask, "TASK", colState, "STATE", colTime, "TIME", colReap, "REAP IN",
		colExec, "#", colNext, "LRU", colPID, "PID", colBackend, "BACKEND", "TOOLS")
}

// View renders the visible rows inside the pane's border.
func (p *KernelsPane) View() string {
	inner := p.height - 2
	title := fmt.Sprintf("Kernels (%d)", len(p.kernels))
	if inner < 1 {
		return p.ctx.box(title, nil, p.width, p.height, p.focused)
	}
	lines := []string{p.ctx.Theme.Muted.Render(p.header())}
	visible := inner - 1
	if p.cursor < p.offset {
		p.offset = p.cursor
	}
	if visible > 0 && p.cursor >= p.offset+visible {
		p.offset = p.cursor - visible + 1
	}
	p.offset = min(p.offset, max(0, len(p.rows)-visible))
	now := p.ctx.Now()
	for i := p.offset; i < len(p.rows) && i < p.offset+visible; i++ {
		// A text cursor as well as the style: it shows without colour or
		// reverse video (NO_COLOR, the ASCII profile).
		line := " " + p.renderRow(&p.rows[i], now)
		if i == p.cursor {
			line = ">" + line[1:]
			if p.focused {
				line = p.ctx.Theme.Selected.Render(fit(line, p.width-2))
			} else {
				line = p.ctx.Theme.Bold.Render(fit(line, p.width-2))
			}
		}
		lines = append(lines, line)
	}
	if len(p.rows) == 0 {
		lines = append(lines, p.ctx.Theme.Muted.Render("  no kernels yet: write a cell below and press ctrl+r"))
	}
	return p.ctx.box(title, lines, p.width, p.height, p.focused)
}

func (p *KernelsPane) renderRow(r *kernelRow, now time.Time) string {
	t := p.ctx.Theme
	switch {
	case r.kernel != nil:
		k := r.kernel
		state, st := "idle", t.StateIdle
		timer, reap := "", ""
		switch k.State {
		case "running":
			state, st = "running", t.StateRunning
			if k.Queued > 0 {
				state = fmt.Sprintf("run+%d", k.Queued)
			}
			timer = short(now.Sub(k.RunningSince))
		case "queued":
			state, st = fmt.Sprintf("queued %d", k.Queued), t.StateQueued
		case "starting":
			state, st = "starting", t.StateStarting
		default:
			idle := now.Sub(k.LastUsed)
			timer = short(idle)
			reap = short(p.idleExit - idle)
		}
		next := ""
		if k.NextEvict {
			next = t.NextEvict.Render(fit("next", colNext-1)) + " "
		} else {
			next = strings.Repeat(" ", colNext)
		}
		task := k.Task
		if k.Child != "" {
			task += "/" + k.Child
		}
		return "  " + fit(task, colTask-1) + " " + st.Render(fit(state, colState-1)) + " " + fit(timer, colTime-1) + " " +
			fit(reap, colReap-1) + " " + fit(fmt.Sprint(k.ExecutionCount), colExec-1) + " " + next +
			fit(fmt.Sprint(k.PID), colPID-1) + " " + fit(k.Backend, colBackend-1) + " " + joinComma(k.Tools)
	case r.gone != nil:
		g := r.gone
		task := g.info.Task
		if g.info.Child != "" {
			task += "/" + g.info.Child
		}
		return "  " + fit(task, colTask-1) + " " + t.StateDead.Render(fit("dead", colState-1)) + " " +
			t.Muted.Render(fit(short(now.Sub(g.at))+" ago", colTime+colReap-1)+" "+g.reason)
	default:
		mark := "▾"
		if r.folded {
			mark = "▸"
		}
		return t.Owner.Render(fmt.Sprintf("%s %s", mark, r.owner)) + t.Muted.Render(fmt.Sprintf("  %d kernel%s", r.count, plural(r.count)))
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
