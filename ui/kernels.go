package ui

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/charmbracelet/bubbles/key"
	"github.com/charmbracelet/bubbles/textinput"
	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/english"
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

// kernelRow is one line of the list: an owner group, a kernel, a kernel
// gone or a parked state.
type kernelRow struct {
	owner   string
	count   int  // kernels in the group (owner rows)
	parkedN int  // parked states in the group (owner rows)
	folded  bool // the group is collapsed (owner rows)
	kernel  *engine.KernelInfo
	gone    *goneKernel
	parked  *engine.ParkedKernel
	ownerIx int
}

// kernelColumn is one column of a kernel row: its title, its width (the gap
// after it included; 0 takes the rest of the line) and its cell.
type kernelColumn struct {
	title string
	width int
	cell  func(p *KernelsPane, k *engine.KernelInfo, now time.Time) (text string, style *lipgloss.Style)
}

// kernelColumns describes the list once: the header and every row come
// from it.
var kernelColumns = []kernelColumn{
	{"TASK", 14, func(_ *KernelsPane, k *engine.KernelInfo, _ time.Time) (string, *lipgloss.Style) {
		return taskLabel(k), nil
	}},
	{"ID", 9, func(_ *KernelsPane, k *engine.KernelInfo, _ time.Time) (string, *lipgloss.Style) {
		// Enough of the id to tell kernels apart on screen and find them in
		// the events; the detail view has it whole.
		id := plain(k.ID)
		if len(id) > 8 {
			id = id[:8]
		}
		return id, nil
	}},
	{"STATE", 11, func(p *KernelsPane, k *engine.KernelInfo, _ time.Time) (string, *lipgloss.Style) {
		t := p.ctx.Theme
		switch k.State {
		case engine.StateRunning:
			if k.Queued > 0 {
				return fmt.Sprintf("run+%d", k.Queued), &t.StateRunning
			}
			return string(engine.StateRunning), &t.StateRunning
		case engine.StateQueued:
			return fmt.Sprintf("queued %d", k.Queued), &t.StateQueued
		case engine.StateStarting:
			return string(engine.StateStarting), &t.StateStarting
		case engine.StateHibernating:
			return "parking", &t.StateStarting // to hibernate
		}
		return string(engine.StateIdle), &t.StateIdle
	}},
	{"TIME", 8, func(p *KernelsPane, k *engine.KernelInfo, now time.Time) (string, *lipgloss.Style) {
		switch k.State {
		case engine.StateRunning:
			return short(now.Sub(k.RunningSince)), nil
		case engine.StateQueued, engine.StateStarting:
			return "", nil
		}
		return short(now.Sub(k.LastUsed)), nil // hibernating: how long it has been idle
	}},
	{"REAP IN", 10, func(p *KernelsPane, k *engine.KernelInfo, now time.Time) (string, *lipgloss.Style) {
		if k.State != engine.StateIdle && k.State != "" {
			return "", nil
		}
		return short(p.idleExit - now.Sub(k.LastUsed)), nil
	}},
	{"#", 5, func(_ *KernelsPane, k *engine.KernelInfo, _ time.Time) (string, *lipgloss.Style) {
		return fmt.Sprint(k.ExecutionCount), nil
	}},
	{"LRU", 6, func(p *KernelsPane, k *engine.KernelInfo, _ time.Time) (string, *lipgloss.Style) {
		// The whole eviction order: 1 goes first when the cap needs room.
		if k.NextEvict {
			return "next", &p.ctx.Theme.NextEvict
		}
		if n := p.lruPos[k.ID]; n > 0 {
			return fmt.Sprint(n), nil
		}
		return "", nil
	}},
	{"PID", 8, func(_ *KernelsPane, k *engine.KernelInfo, _ time.Time) (string, *lipgloss.Style) {
		return fmt.Sprint(k.PID), nil
	}},
	{"BACKEND", 14, func(_ *KernelsPane, k *engine.KernelInfo, _ time.Time) (string, *lipgloss.Style) {
		if k.Host.Kind == "pod" { // one pod per kernel: the pod says which
			_, pod, _ := strings.Cut(k.Host.Name, "/")
			return shortBackend(plain("pod:"+strings.TrimPrefix(pod, "kd-")), 13), nil
		}
		return shortBackend(plain(k.Backend), 13), nil
	}},
	{"TOOLS", 0, func(_ *KernelsPane, k *engine.KernelInfo, _ time.Time) (string, *lipgloss.Style) {
		return plain(strings.Join(k.Tools, ",")), nil
	}},
}

// shortBackend fits a backend URI in w cells: the scheme goes
// (ssh://me@gpu-box is me@gpu-box), then the middle, so the ends stay
// (the detail view has it whole).
func shortBackend(uri string, w int) string {
	if len(uri) <= w {
		return uri
	}
	if scheme, rest, ok := strings.Cut(uri, "://"); ok {
		// A docker-image's limits are in the detail view; the kind of
		// host stays, in short, where it is not ssh (the common case).
		rest, _, _ = strings.Cut(rest, "?")
		switch scheme {
		case "docker":
			rest = "dk:" + rest
		case "docker-image":
			rest = "img:" + rest
		}
		uri = rest
	}
	if r := []rune(uri); len(r) > w {
		head := (w - 1) / 2
		uri = string(r[:head]) + "…" + string(r[len(r)-(w-1-head):])
	}
	return uri
}

// kernelSort orders the kernels within each owner's group.
type kernelSort int

// The orders s cycles through.
const (
	sortByTask kernelSort = iota
	sortByState
	sortByIdle
	sortByLRU
	sortCount
)

func (s kernelSort) String() string {
	return [...]string{"task", "state", "idle", "LRU"}[s]
}

// stateRank puts busy kernels first.
func stateRank(s engine.KernelState) int {
	switch s {
	case engine.StateRunning:
		return 0
	case engine.StateQueued:
		return 1
	case engine.StateStarting:
		return 2
	}
	return 3
}

// sortGroups sorts ks within each owner's run by p.sortBy, ties by id, so
// the order is the same every frame (the list in place: a sorted run costs
// a pass).
func (p *KernelsPane) sortGroups(ks []engine.KernelInfo) {
	cmpKernels := func(a, b engine.KernelInfo) int {
		var c int
		switch p.sortBy {
		case sortByTask: // the engine's order
			c = cmp.Or(cmp.Compare(a.Task, b.Task), cmp.Compare(a.Child, b.Child), cmp.Compare(a.Backend, b.Backend))
		case sortByState:
			c = cmp.Compare(stateRank(a.State), stateRank(b.State))
		case sortByIdle:
			c = a.LastUsed.Compare(b.LastUsed) // idle the longest first
		case sortByLRU:
			pa, pb := p.lruPos[a.ID], p.lruPos[b.ID]
			if pa == 0 {
				pa = len(ks) + 1 // busy ones after the evictable
			}
			if pb == 0 {
				pb = len(ks) + 1
			}
			c = cmp.Compare(pa, pb)
		}
		return cmp.Or(c, cmp.Compare(a.ID, b.ID))
	}
	for i := 0; i < len(ks); {
		j := i
		for j < len(ks) && ks[j].Owner == ks[i].Owner {
			j++
		}
		slices.SortStableFunc(ks[i:j], cmpKernels)
		i = j
	}
}

// kernelName names a kernel for the operator: owner/task[/child]@backend,
// and its tools.
func kernelName(k engine.KernelInfo) string {
	name := plain(k.Owner) + "/" + taskLabel(&k) + "@" + plain(k.Backend)
	if len(k.Tools) > 0 {
		name += "[" + plain(strings.Join(k.Tools, ",")) + "]"
	}
	return name
}

// kernelSubject is how a question about a kernel names it: name and id.
func kernelSubject(k engine.KernelInfo) string { return fmt.Sprintf("%s (%s)", kernelName(k), k.ID) }

// killAct kills k, reporting through act.
func killAct(act func(string, func(context.Context, Engine) error) tea.Cmd, k engine.KernelInfo) tea.Cmd {
	id := k.ID
	return act("killed "+kernelName(k), func(c context.Context, eng Engine) error { return eng.Kill(c, id) })
}

func taskLabel(k *engine.KernelInfo) string {
	if k.Child != "" {
		return plain(k.Task + "/" + k.Child)
	}
	return plain(k.Task)
}

// KernelsPane lists the kernels grouped by owner, with their state and
// timers. Rows are rebuilt when the snapshot changes; View formats only the
// rows that fit.
type KernelsPane struct {
	pane

	kernels []engine.KernelInfo
	gone    map[string]*goneKernel
	// parked are the engine's parked states (greyed rows under their
	// owner), and parkedSig what they were at the last rebuild.
	parked    []engine.ParkedKernel
	parkedSig string
	idleExit  time.Duration
	folded    map[string]bool
	rows      []kernelRow
	cursor    int
	offset    int
	shown     int            // kernels that pass the filter
	lruPos    map[string]int // id -> place among idle kernels, 1 evicted first
	sortBy    kernelSort     // the order within each owner's group
	header    string
	keys      actions
	// engineGone says why the engine went away ("" while it is there).
	engineGone string
	// The / filter: the line being edited, and the filter applied.
	filterIn textinput.Model
	editing  bool
	filter   kernelFilter
	editKeys actions

	// onSelect is told the target of the kernel the cursor moved onto;
	// onEdit, of the kernel enter was pressed on.
	onSelect func(Target)
	onEdit   func(Target) tea.Cmd
}

func newKernelsPane(ctx *Context) *KernelsPane {
	fi := textinput.New()
	fi.Prompt = "/"
	fi.Placeholder = "owner, task, id, backend or state (a regexp; !x hides x)"
	p := &KernelsPane{pane: pane{ctx: ctx}, gone: map[string]*goneKernel{}, folded: map[string]bool{}, filterIn: fi}
	p.header = "   " + columnsHeader()
	k := ctx.Keys
	onKernel := func(f func(k engine.KernelInfo) tea.Cmd) func(tea.KeyMsg) (tea.Cmd, bool) {
		return func(tea.KeyMsg) (tea.Cmd, bool) {
			sel, ok := p.Selected()
			if !ok {
				return nil, false
			}
			return f(sel), true
		}
	}
	// onKernelAct names the selected kernel for a destructive key's question.
	onKernelAct := func(f func(k engine.KernelInfo) tea.Cmd) func() (string, tea.Cmd, bool) {
		return func() (string, tea.Cmd, bool) {
			sel, ok := p.Selected()
			if !ok {
				return "", nil, false
			}
			return kernelSubject(sel), f(sel), true
		}
	}
	p.keys = actions{
		// enter on a kernel edits a cell for it; on a parked state, for its
		// key, whose next cell restores it.
		{k.Select, func(tea.KeyMsg) (tea.Cmd, bool) {
			if sel, ok := p.Selected(); ok {
				return p.onEdit(targetOf(sel)), true
			}
			if pk, ok := p.SelectedParked(); ok {
				return p.onEdit(Target{Owner: pk.Owner, Task: pk.Task, Backend: pk.Backend, Child: pk.Child}), true
			}
			return nil, false
		}},
		{k.Toggle, run(func() tea.Cmd { p.toggleFold(); return nil })},
		destroy(ctx, k.Reset, onKernelAct(func(sel engine.KernelInfo) tea.Cmd {
			t := targetOf(sel)
			return ctx.act("reset "+kernelName(sel), func(c context.Context, eng Engine) error {
				_, err := eng.Execute(c, engine.Request{Owner: t.Owner, Task: t.Task, Backend: t.Backend, Child: t.Child,
					Tools: t.Tools, Code: "pass", Reset: true})
				return err
			})
		})),
		{k.InterruptSel, onKernel(func(sel engine.KernelInfo) tea.Cmd {
			return ctx.act("interrupted "+sel.ID, func(c context.Context, eng Engine) error { return eng.Interrupt(c, sel.ID) })
		})},
		destroy(ctx, k.Kill, onKernelAct(func(sel engine.KernelInfo) tea.Cmd { return killAct(ctx.act, sel) })),
		destroy(ctx, k.DropParked, func() (string, tea.Cmd, bool) {
			pk, ok := p.SelectedParked()
			if !ok {
				return "", nil, false
			}
			return fmt.Sprintf("%s (parked from %s)", parkedName(pk), plain(pk.Kernel)), dropAct(ctx.act, pk), true
		}),
		{k.Park, onKernel(func(sel engine.KernelInfo) tea.Cmd { return parkAct(ctx.act, sel) })},
		destroy(ctx, k.ShutdownOwner, func() (string, tea.Cmd, bool) {
			owner := p.SelectedOwner()
			if owner == "" {
				return "", nil, false
			}
			n := 0
			for _, k := range p.kernels {
				if k.Owner == owner {
					n++
				}
			}
			return fmt.Sprintf("%s (%s)", plain(owner), english.Count(n, "kernel")),
				ctx.act("shut down owner "+owner, func(c context.Context, eng Engine) error {
					eng.ShutdownOwner(c, owner)
					return nil
				}), true
		}),
		{k.Filter, run(func() tea.Cmd { p.editing = true; return p.filterIn.Focus() })},
		{k.Detail, run(func() tea.Cmd { return ctx.detail() })},
		{k.Sort, run(func() tea.Cmd { p.sortBy = (p.sortBy + 1) % sortCount; p.rebuild(); return nil })},
		{k.Cancel, func(tea.KeyMsg) (tea.Cmd, bool) {
			if !p.filter.active() {
				return nil, false
			}
			p.setFilter("")
			return nil, true
		}},
		{k.Up, run(func() tea.Cmd { p.move(-1); return nil })},
		{k.Down, run(func() tea.Cmd { p.move(1); return nil })},
		{k.PageUp, run(func() tea.Cmd { p.move(-p.page()); return nil })},
		{k.PageDown, run(func() tea.Cmd { p.move(p.page()); return nil })},
	}
	endEdit := func(clear bool) tea.Cmd {
		p.editing = false
		p.filterIn.Blur()
		if clear {
			p.setFilter("")
		}
		return nil
	}
	p.editKeys = actions{
		{k.Submit, run(func() tea.Cmd { return endEdit(false) })},
		{k.Cancel, run(func() tea.Cmd { return endEdit(true) })},
	}
	return p
}

// setFilter applies the / filter (and shows it in the line).
func (p *KernelsPane) setFilter(s string) {
	p.filterIn.SetValue(s)
	p.filter = parseKernelFilter(s)
	p.rebuild()
}

// Typing implements Pane: the filter line takes the keys while it is open.
func (p *KernelsPane) Typing() bool { return p.editing }

// Modal implements Pane: so does it take tab.
func (p *KernelsPane) Modal() bool { return p.editing }

func columnsHeader() string {
	var b strings.Builder
	for _, c := range kernelColumns {
		if c.width == 0 {
			b.WriteString(c.title)
		} else {
			fmt.Fprintf(&b, "%-*s", c.width, c.title)
		}
	}
	return b.String()
}

// Title implements Pane.
func (p *KernelsPane) Title() string {
	t := fmt.Sprintf("Kernels (%d)", len(p.kernels))
	if p.filter.active() {
		t = fmt.Sprintf("Kernels (%d of %d) · /%s", p.shown, len(p.kernels), plain(strings.TrimPrefix(p.filter.text, "/")))
	}
	if p.sortBy != sortByTask {
		t += " · by " + p.sortBy.String()
	}
	// A list taller than the pane says which rows show, so that kernels
	// below the edge are not taken for absent.
	if v := p.visibleRows(); v > 0 && len(p.rows) > v {
		t += fmt.Sprintf(" · rows %d–%d of %d", p.offset+1, min(p.offset+v, len(p.rows)), len(p.rows))
	}
	return t
}

// visibleRows is how many kernel rows fit under the header (and the
// filter line, when there is one).
func (p *KernelsPane) visibleRows() int {
	v := p.height - 3 // border and header
	if p.editing || p.filter.active() {
		v-- // the filter line
	}
	return v
}

// ShortHelp implements help.KeyMap.
func (p *KernelsPane) ShortHelp() []key.Binding {
	k := p.ctx.Keys
	if p.editing {
		return []key.Binding{k.Submit, k.Cancel}
	}
	// The footer is one line: pairs share an entry, the rest is under ?.
	return []key.Binding{k.Edit, k.Select, k.Detail, k.Filter, k.Sort, k.Reset.Binding, k.Kill.Binding, k.ShutdownOwner.Binding,
		helpOnly("+/-", "cap"), helpOnly("[/]", "idle"), k.Help}
}

// helpOnly is a footer entry for keys that have bindings of their own.
func helpOnly(keys, desc string) key.Binding {
	return key.NewBinding(key.WithKeys(keys), key.WithHelp(keys, desc))
}

// FullHelp implements help.KeyMap.
func (p *KernelsPane) FullHelp() [][]key.Binding { return [][]key.Binding{p.keys.bindings()} }

// SetSize implements Pane.
func (p *KernelsPane) SetSize(w, h int) {
	p.width, p.height = w, h
	p.scroll()
}

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
	p.ageGone(now, reasons)
	p.kernels, p.idleExit = ks, idleExit
	p.lruPos = lruOrder(ks)
	p.rebuild()
}

// setParked replaces the parked states shown; the rows are rebuilt only
// when they changed.
func (p *KernelsPane) setParked(ps []engine.ParkedKernel) {
	var b strings.Builder
	for _, pk := range ps {
		fmt.Fprintf(&b, "%s\x00%s\x00%d\x00%t\x00", pk.Key, pk.Kernel, pk.Parked.UnixNano(), pk.Hibernated)
	}
	if sig := b.String(); sig != p.parkedSig {
		p.parked, p.parkedSig = ps, sig
		// A kernel that parked is not shown dead as well.
		for _, pk := range ps {
			delete(p.gone, pk.Kernel)
		}
		p.rebuild()
	}
}

// engineLost empties the pane for an engine that went away (why): its
// kernels, and those it had just lost, are no longer known.
func (p *KernelsPane) engineLost(why string) {
	p.kernels, p.lruPos, p.engineGone, p.parked, p.parkedSig = nil, nil, why, nil, ""
	clear(p.gone)
	p.rebuild()
}

// keepSnapshot is setSnapshot with the listing unchanged: only the gone
// kernels age (and learn their reasons); the rows are rebuilt only when
// one of them goes or idle_exit changed.
func (p *KernelsPane) keepSnapshot(idleExit time.Duration, reasons map[string]string) {
	if p.ageGone(p.ctx.Now(), reasons) || idleExit != p.idleExit {
		p.idleExit = idleExit
		p.rebuild()
	}
}

// ageGone forgets the gone kernels shown long enough and gives the others
// their reasons; it reports whether any went.
func (p *KernelsPane) ageGone(now time.Time, reasons map[string]string) bool {
	went := false
	for id, g := range p.gone {
		if now.Sub(g.at) > showGoneFor {
			delete(p.gone, id)
			went = true
		} else if r := reasons[id]; r != "" {
			// The event with the reason may come after the snapshot that
			// first missed the kernel.
			g.reason = r
		}
	}
	return went
}

// lruOrder numbers the idle kernels least recently used first, the order
// the cap evicts them in.
func lruOrder(ks []engine.KernelInfo) map[string]int {
	type entry struct {
		at int64 // LastUsed, as a number: a dashboard sorts these every second
		i  int32
	}
	idle := make([]entry, 0, len(ks))
	for i, k := range ks {
		if k.State == engine.StateIdle && !k.Attached {
			idle = append(idle, entry{k.LastUsed.UnixNano(), int32(i)})
		}
	}
	slices.SortFunc(idle, func(a, b entry) int {
		// Not cmp.Or: it would compare the ids of every pair, not only of ties.
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return strings.Compare(ks[a.i].ID, ks[b.i].ID) // the engine breaks ties by id too
	})
	pos := make(map[string]int, len(idle))
	for n, e := range idle {
		pos[ks[e.i].ID] = n + 1
	}
	return pos
}

// rebuild regroups the rows. The engine lists kernels sorted by owner, so
// each owner's kernels are one run of the slice: no copies, no maps.
func (p *KernelsPane) rebuild() {
	// The cursor follows the kernel, not the row number: by id, else (a
	// reset or a respawn gives it a new id) by its key, else its dead row.
	selectedID, selectedOwner := "", ""
	var selectedKey *Target
	if r := p.selectedRow(); r != nil {
		selectedOwner = r.owner
		switch {
		case r.kernel != nil:
			selectedID = r.kernel.ID
			t := targetOf(*r.kernel)
			selectedKey = &t
		case r.gone != nil:
			selectedID = r.gone.info.ID
			t := targetOf(r.gone.info)
			selectedKey = &t
		case r.parked != nil:
			selectedID = r.parked.Kernel
		}
	}
	goneBy := map[string][]*goneKernel{}
	for _, g := range p.gone {
		if p.filter.match(g.info) {
			goneBy[g.info.Owner] = append(goneBy[g.info.Owner], g)
		}
	}
	var goneOwners []string
	for o, gs := range goneBy {
		goneOwners = append(goneOwners, o)
		// Newest first, then by id: the same order every frame.
		slices.SortFunc(gs, func(a, b *goneKernel) int { return cmp.Or(b.at.Compare(a.at), cmp.Compare(a.info.ID, b.info.ID)) })
	}
	// Parked states go under their owner too, oldest first (the engine's
	// order), whether or not it has kernels.
	parkedBy := map[string][]*engine.ParkedKernel{}
	for i := range p.parked {
		pk := &p.parked[i]
		if p.filter.match(parkedInfo(pk)) {
			if _, seen := goneBy[pk.Owner]; !seen && len(parkedBy[pk.Owner]) == 0 {
				goneOwners = append(goneOwners, pk.Owner)
			}
			parkedBy[pk.Owner] = append(parkedBy[pk.Owner], pk)
		}
	}
	slices.Sort(goneOwners)
	rows := p.rows[:0]
	ks := p.kernels
	if p.filter.active() {
		ks = nil // a copy: p.kernels stays the engine's listing
		for _, k := range p.kernels {
			if p.filter.match(k) {
				ks = append(ks, k)
			}
		}
	}
	p.shown = len(ks)
	p.sortGroups(ks)
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
		rows = append(rows, kernelRow{owner: owner, count: j - i, parkedN: len(parkedBy[owner]), folded: folded, ownerIx: ownerIx})
		if !folded {
			for x := i; x < j; x++ {
				rows = append(rows, kernelRow{owner: owner, kernel: &ks[x], ownerIx: ownerIx})
			}
			for _, g := range goneBy[owner] {
				rows = append(rows, kernelRow{owner: owner, gone: g, ownerIx: ownerIx})
			}
			for _, pk := range parkedBy[owner] {
				rows = append(rows, kernelRow{owner: owner, parked: pk, ownerIx: ownerIx})
			}
		}
		i = j
		ownerIx++
	}
	p.rows = rows
	if i := p.follow(selectedID, selectedKey, selectedOwner); i >= 0 {
		p.cursor = i
	}
	p.scroll()
}

// follow finds the row of the kernel that was selected: the live kernel
// with its id, else the live kernel with its key, else its dead row, else
// its owner's row; -1 if none.
func (p *KernelsPane) follow(id string, key *Target, owner string) int {
	byKey, dead, ownerRow := -1, -1, -1
	for i, r := range p.rows {
		switch {
		case r.kernel != nil && id != "" && r.kernel.ID == id:
			return i
		case r.kernel != nil && key != nil && byKey < 0 && key.matches(*r.kernel):
			byKey = i
		case r.gone != nil && id != "" && r.gone.info.ID == id:
			dead = i
		case r.parked != nil && id != "" && r.parked.Kernel == id:
			dead = i
		case r.kernel == nil && r.gone == nil && r.parked == nil && r.owner == owner && owner != "":
			ownerRow = i
		}
	}
	for _, i := range []int{byKey, dead} {
		if i >= 0 {
			return i
		}
	}
	return ownerRow
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

// SelectedParked returns the parked state under the cursor, if the cursor
// is on one.
func (p *KernelsPane) SelectedParked() (engine.ParkedKernel, bool) {
	if r := p.selectedRow(); r != nil && r.parked != nil {
		return *r.parked, true
	}
	return engine.ParkedKernel{}, false
}

// parkedInfo is a parked state as the filter and the names read it.
func parkedInfo(pk *engine.ParkedKernel) engine.KernelInfo {
	state := engine.StateParked
	if pk.Hibernated {
		state = engine.StateHibernated
	}
	return engine.KernelInfo{ID: pk.Kernel, Owner: pk.Owner, Task: pk.Task, Backend: pk.Backend, Child: pk.Child, State: state}
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
			p.scroll()
			return
		}
	}
}

func (p *KernelsPane) page() int { return max(1, p.height-3) }

// clickRow puts the cursor on the row drawn at line y of the pane (0 is
// its top border); false if no row is there.
func (p *KernelsPane) clickRow(y int) bool {
	first := 2 // the border and the column header
	if p.editing || p.filter.active() {
		first++ // the filter line
	}
	i := p.offset + y - first
	if y < first || i < 0 || i >= len(p.rows) || y >= p.height-1 {
		return false
	}
	p.cursor = i
	p.scroll()
	if k, ok := p.Selected(); ok && p.onSelect != nil {
		p.onSelect(targetOf(k))
	}
	return true
}

// move moves the cursor by n rows and tells onSelect about the kernel it
// lands on.
func (p *KernelsPane) move(n int) {
	p.cursor += n
	p.scroll()
	if k, ok := p.Selected(); ok && p.onSelect != nil {
		p.onSelect(targetOf(k))
	}
}

func (p *KernelsPane) toggleFold() {
	r := p.selectedRow()
	if r == nil {
		return
	}
	owner := r.owner
	p.folded[owner] = !p.folded[owner]
	p.rebuild()
	for i, row := range p.rows {
		if row.kernel == nil && row.gone == nil && row.owner == owner {
			p.cursor = i
		}
	}
	p.scroll()
}

// scroll keeps the cursor on a row and in view.
func (p *KernelsPane) scroll() {
	p.cursor = min(max(p.cursor, 0), max(len(p.rows)-1, 0))
	visible := p.visibleRows()
	if p.cursor < p.offset {
		p.offset = p.cursor
	}
	if visible > 0 && p.cursor >= p.offset+visible {
		p.offset = p.cursor - visible + 1
	}
	p.offset = max(0, min(p.offset, len(p.rows)-visible))
}

// Update runs the pane's keys.
func (p *KernelsPane) Update(msg tea.Msg) tea.Cmd {
	km, ok := msg.(tea.KeyMsg)
	if !ok {
		return nil
	}
	if p.editing {
		if cmd, ok := p.editKeys.handle(km); ok {
			return cmd
		}
		var cmd tea.Cmd
		p.filterIn, cmd = p.filterIn.Update(msg)
		p.filter = parseKernelFilter(p.filterIn.Value())
		p.rebuild()
		return cmd
	}
	cmd, _ := p.keys.handle(km)
	return cmd
}

// View renders the visible rows inside the pane's border.
func (p *KernelsPane) View() string {
	inner := p.height - 2
	if inner < 1 {
		return p.ctx.box(p.Title(), nil, p.width, p.height, p.focused)
	}
	lines := []string{p.ctx.Theme.Muted.Render(p.header)}
	visible := inner - 1
	if p.editing || p.filter.active() {
		lines = append([]string{p.filterIn.View()}, lines...)
		visible--
	}
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
	switch {
	case p.engineGone != "":
		lines = append(lines, p.ctx.Theme.Error.Render("  the engine is gone ("+plain(p.engineGone)+"): what its kernels do now is not known here"))
	case len(p.rows) == 0 && p.filter.active():
		lines = append(lines, p.ctx.Theme.Warn.Render(fmt.Sprintf("  no match for /%s among %s (esc clears the filter)",
			plain(p.filter.text), english.Count(len(p.kernels), "kernel"))))
	case len(p.rows) == 0:
		lines = append(lines, p.ctx.Theme.Muted.Render("  no kernels yet: e writes a cell, ctrl+r runs it"))
	}
	return p.ctx.box(p.Title(), lines, p.width, p.height, p.focused)
}

func (p *KernelsPane) renderRow(r *kernelRow, now time.Time) string {
	t := p.ctx.Theme
	switch {
	case r.kernel != nil:
		var b strings.Builder
		b.WriteString("  ")
		for _, c := range kernelColumns {
			text, st := c.cell(p, r.kernel, now)
			if c.width == 0 {
				b.WriteString(text)
				continue
			}
			text = fit(text, c.width-1)
			if st != nil {
				text = st.Render(text)
			}
			b.WriteString(text + " ")
		}
		return b.String()
	case r.gone != nil:
		g := r.gone
		task, id, state, timer, reap := kernelColumns[0].width, kernelColumns[1].width, kernelColumns[2].width, kernelColumns[3].width, kernelColumns[4].width
		idText, _ := kernelColumns[1].cell(p, &g.info, now)
		return "  " + fit(taskLabel(&g.info), task-1) + " " + fit(idText, id-1) + " " + t.StateDead.Render(fit(string(engine.StateDead), state-1)) + " " +
			t.Muted.Render(fit(short(now.Sub(g.at))+" ago", timer+reap-1)+" "+plain(g.reason))
	case r.parked != nil:
		// Greyed: no process holds it; the key's next cell brings it back.
		pk := r.parked
		info := parkedInfo(pk)
		task, id, state, timer, reap := kernelColumns[0].width, kernelColumns[1].width, kernelColumns[2].width, kernelColumns[3].width, kernelColumns[4].width
		idText, _ := kernelColumns[1].cell(p, &info, now)
		what := english.Bytes(pk.Bytes) + ", " + english.Count(len(pk.Names), "name")
		if n := len(pk.NotSaved); n > 0 {
			what += fmt.Sprintf(" (%d not saved)", n)
		}
		when := short(now.Sub(pk.Parked)) + " ago"
		if pk.Hibernated {
			when = "idle " + short(now.Sub(pk.LastUsed))
		}
		return t.Muted.Render("  " + fit(taskLabel(&info), task-1) + " " + fit(idText, id-1) + " " + fit(string(info.State), state-1) + " " +
			fit(when, timer+reap-1) + " " + what)
	default:
		mark := "▾"
		if r.folded {
			mark = "▸"
		}
		count := english.Count(r.count, "kernel")
		if r.parkedN > 0 {
			count += fmt.Sprintf(", %d parked", r.parkedN)
		}
		return t.Owner.Render(fmt.Sprintf("%s %s", mark, plain(r.owner))) + t.Muted.Render("  "+count)
	}
}
