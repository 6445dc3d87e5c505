package ui

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/charmbracelet/bubbles/help"
	"github.com/charmbracelet/bubbles/key"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/themes"
)

// Options configures the dashboard.
type Options struct {
	Engine Engine
	// Events is the engine's event stream (a Subscription's C); nil shows none.
	Events <-chan engine.Event
	Theme  *themes.Theme
	// Now is the clock of the timers (default time.Now).
	Now func() time.Time
	// User is the default owner of the first target (default "me").
	User string
	// TickEvery is how often timers refresh (default 1s); negative disables
	// the tick (tests drive the clock themselves).
	TickEvery time.Duration
}

// Focusable panes, in tab order.
const (
	focusEditor = iota
	focusKernels
	focusOutput
	focusEvents
	paneCount
)

// Messages from the engine and from background work.
type (
	tickMsg       time.Time
	eventBatchMsg []engine.Event
	eventsDoneMsg struct{}
	cellOutputMsg struct {
		run          *cellRun
		stream, text string
	}
	cellResultMsg struct {
		run *cellRun
		res *engine.Result
		err error
	}
	actionDoneMsg struct {
		what string
		err  error
	}
	refreshNowMsg struct{}
)

// maxStreamKept bounds the streamed output kept per stream of a running cell.
const maxStreamKept = 256 << 10

// Model is the dashboard's root: it owns the layout, the focus and the
// engine bridge, and routes messages to the panes.
type Model struct {
	ctx    *Context
	eng    Engine
	events <-chan engine.Event
	inbox  *inbox
	runCtx context.Context
	cancel context.CancelFunc
	tick   time.Duration

	kernels *KernelsPane
	editor  *EditorPane
	output  *OutputPane
	evPane  *EventsPane
	panes   [paneCount]Component
	focus   int

	help     help.Model
	showHelp bool

	maxKernels int
	idleExit   time.Duration
	backends   []string
	backendOK  map[string]string // URI -> "ok" or the last transport error
	reasons    map[string]string // kernel id -> why it left the registry
	approvals  []engine.Event    // pending approval requests, oldest first
	runs       map[*cellRun]bool // cells started here and still running
	runSeq     int
	status     string
	statusErr  bool
	confirm    bool // quitting while cells run: waiting for y/n
	quitting   bool
}

// New builds the dashboard model.
func New(opts Options) *Model {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	theme := opts.Theme
	if theme == nil {
		theme, _ = themes.New("dark", themes.Options{})
	}
	user := opts.User
	if user == "" {
		user = "me"
	}
	ctx := &Context{Theme: theme, Keys: DefaultKeyMap(), Now: now, User: user, borders: newBoxStyle(theme)}
	backendsList := opts.Engine.Backends()
	first := ""
	if len(backendsList) > 0 {
		first = backendsList[0]
	}
	target := Target{Owner: user, Task: "default", Backend: first}
	runCtx, cancel := context.WithCancel(context.Background())
	m := &Model{
		ctx: ctx, eng: opts.Engine, events: opts.Events, inbox: newInbox(), runCtx: runCtx, cancel: cancel,
		tick:      opts.TickEvery,
		kernels:   newKernelsPane(ctx),
		editor:    newEditorPane(ctx, target),
		output:    newOutputPane(ctx),
		evPane:    newEventsPane(ctx),
		backends:  backendsList,
		backendOK: map[string]string{},
		reasons:   map[string]string{},
		runs:      map[*cellRun]bool{},
	}
	if m.tick == 0 {
		m.tick = time.Second
	}
	m.editor.backends = backendsList
	m.panes = [paneCount]Component{m.editor, m.kernels, m.output, m.evPane}
	m.help = help.New()
	m.help.Styles = theme.HelpStyles()
	m.output.setTarget(target)
	m.editor.setFocus(true)
	m.refresh()
	return m
}

// Init starts the tick, the event listener and the inbox listener.
func (m *Model) Init() tea.Cmd {
	cmds := []tea.Cmd{m.inbox.wait(), m.editor.area.Focus()}
	if m.tick > 0 {
		cmds = append(cmds, m.tickCmd())
	}
	if m.events != nil {
		cmds = append(cmds, waitEvents(m.events))
	}
	return tea.Batch(cmds...)
}

func (m *Model) tickCmd() tea.Cmd {
	return tea.Tick(m.tick, func(t time.Time) tea.Msg { return tickMsg(t) })
}

// waitEvents delivers the next events: one blocking receive, then whatever
// else is already queued, so a burst costs one render.
func waitEvents(ch <-chan engine.Event) tea.Cmd {
	return func() tea.Msg {
		ev, ok := <-ch
		if !ok {
			return eventsDoneMsg{}
		}
		batch := []engine.Event{ev}
		for len(batch) < 512 {
			select {
			case ev, ok := <-ch:
				if !ok {
					return eventBatchMsg(batch)
				}
				batch = append(batch, ev)
			default:
				return eventBatchMsg(batch)
			}
		}
		return eventBatchMsg(batch)
	}
}

// Close stops background work started by the model (running cells are
// cancelled); the caller closes the engine.
func (m *Model) Close() {
	m.cancel()
	m.inbox.close()
}

// refresh takes a new snapshot of the registry and the limits.
func (m *Model) refresh() {
	m.maxKernels, m.idleExit = m.eng.Limits()
	m.kernels.setSnapshot(m.eng.Kernels(), m.idleExit, m.reasons)
}

// Update routes a message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.ctx.Width, m.ctx.Height = msg.Width, msg.Height
		m.layout()
		return m, nil
	case tickMsg:
		m.refresh()
		if m.tick <= 0 {
			return m, nil
		}
		return m, m.tickCmd()
	case refreshNowMsg:
		m.refresh()
		return m, nil
	case eventBatchMsg:
		m.onEvents(msg)
		if m.events == nil {
			return m, nil
		}
		return m, waitEvents(m.events)
	case eventsDoneMsg:
		return m, nil
	case inboxMsg:
		for _, sub := range msg {
			m.onBackground(sub)
		}
		return m, m.inbox.wait()
	case runCellMsg:
		m.startCell(msg)
		return m, nil
	case actionDoneMsg:
		m.setStatus(msg.what, msg.err)
		m.refresh()
		return m, nil
	case tea.KeyMsg:
		return m.onKey(msg)
	}
	// Anything else (cursor blink) goes to the focused pane.
	var cmd tea.Cmd
	m.panes[m.focus], cmd = m.panes[m.focus].Update(msg)
	return m, cmd
}

func (m *Model) setStatus(s string, err error) {
	m.status, m.statusErr = s, err != nil
	if err != nil {
		m.status = s + ": " + err.Error()
	}
}

func (m *Model) onEvents(evs []engine.Event) {
	m.evPane.add(evs...)
	for _, ev := range evs {
		switch ev.Type {
		case engine.EventApprovalRequest:
			m.approvals = append(m.approvals, ev)
		case engine.EventApprovalDecided:
			for i, a := range m.approvals {
				if a.Request == ev.Request {
					m.approvals = append(m.approvals[:i], m.approvals[i+1:]...)
					break
				}
			}
		case engine.EventKilled:
			// A kill follows every eviction and reap: keep their reason.
			if _, known := m.reasons[ev.Kernel]; ev.Kernel != "" && !known {
				m.reasons[ev.Kernel] = string(ev.Type) + ": " + ev.Detail
			}
		case engine.EventEvictedCap, engine.EventReapedIdle, engine.EventStateLost,
			engine.EventOwnerShutdown, engine.EventSpawnFailed:
			if ev.Kernel != "" {
				m.reasons[ev.Kernel] = string(ev.Type) + ": " + ev.Detail
			}
		}
		if b := backendOfKey(ev.Key); b != "" {
			switch ev.Type {
			case engine.EventTransportError:
				m.backendOK[b] = ev.Detail
			case engine.EventSpawned, engine.EventReconnected, engine.EventCellFinished:
				m.backendOK[b] = "ok"
			}
		}
	}
	m.refresh()
}

// backendOfKey extracts the backend from a key string owner/task@backend[tools].
func backendOfKey(key string) string {
	_, rest, ok := strings.Cut(key, "@")
	if !ok {
		return ""
	}
	if i := strings.LastIndex(rest, "["); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

func (m *Model) onBackground(msg tea.Msg) {
	switch msg := msg.(type) {
	case cellOutputMsg:
		buf := &msg.run.stdout
		if msg.stream == "stderr" {
			buf = &msg.run.stderr
		}
		buf.WriteString(msg.text)
		if buf.Len() > maxStreamKept {
			// Keep the tail: the pane shows the newest output, and the full
			// text is in the result's spill file.
			tail := buf.String()[buf.Len()-maxStreamKept/2:]
			buf.Reset()
			buf.WriteString("… (earlier output not kept here)\n" + tail)
		}
		m.output.changed(msg.run)
	case cellResultMsg:
		r := msg.run
		r.running, r.res, r.err, r.finished = false, msg.res, msg.err, m.ctx.Now()
		delete(m.runs, r)
		m.output.changed(r)
		m.refresh()
	}
}

// startCell runs a cell in the background; its output and result come back
// through the inbox.
func (m *Model) startCell(msg runCellMsg) {
	m.runSeq++
	r := &cellRun{seq: m.runSeq, target: msg.target, code: msg.code, started: m.ctx.Now(), running: true}
	m.runs[r] = true
	m.output.setTarget(msg.target)
	m.output.add(r)
	req := engine.Request{Owner: msg.target.Owner, Task: msg.target.Task, Backend: msg.target.Backend,
		Child: msg.target.Child, Tools: msg.target.Tools, Code: msg.code,
		OnOutput: func(stream, text string) { m.inbox.post(cellOutputMsg{run: r, stream: stream, text: text}) }}
	ctx, box := m.runCtx, m.inbox
	go func() {
		res, err := m.eng.Execute(ctx, req)
		box.post(cellResultMsg{run: r, res: res, err: err})
	}()
}

// runningTargetKernel returns the kernel of the editor's target if a cell
// runs in it.
func (m *Model) runningTargetKernel() (engine.KernelInfo, bool) {
	t := m.editor.Target()
	for _, k := range m.kernels.kernels {
		if t.matches(k) && k.State == "running" {
			return k, true
		}
	}
	return engine.KernelInfo{}, false
}

func (m *Model) anyRunning() bool {
	if len(m.runs) > 0 {
		return true
	}
	for _, k := range m.kernels.kernels {
		if k.State == "running" || k.State == "queued" {
			return true
		}
	}
	return false
}

func (m *Model) quit() (tea.Model, tea.Cmd) {
	m.quitting, m.confirm = true, false
	return m, tea.Quit
}

func (m *Model) action(what string, f func(ctx context.Context) error) tea.Cmd {
	ctx := m.runCtx
	return func() tea.Msg { return actionDoneMsg{what: what, err: f(ctx)} }
}

func (m *Model) onKey(km tea.KeyMsg) (tea.Model, tea.Cmd) {
	keys := m.ctx.Keys
	if m.confirm {
		switch {
		case key.Matches(km, keys.Yes):
			return m.quit()
		case key.Matches(km, keys.No), key.Matches(km, keys.Interrupt):
			m.confirm = false
			m.setStatus("quit cancelled", nil)
		}
		return m, nil
	}
	if len(m.approvals) > 0 {
		a := m.approvals[0]
		var d engine.Decision
		switch {
		case key.Matches(km, keys.ApproveOnce):
			d = engine.ApproveOnce
		case key.Matches(km, keys.ApproveAlways):
			d = engine.ApproveAlways
		case key.Matches(km, keys.Deny):
			d = engine.ApproveDeny
		}
		if d != "" {
			m.approvals = m.approvals[1:]
			eng := m.eng
			return m, func() tea.Msg {
				return actionDoneMsg{what: fmt.Sprintf("%s %s for %s", d, a.Tool, a.Owner), err: eng.Approve(a.Request, d)}
			}
		}
		if !key.Matches(km, keys.Interrupt) {
			return m, nil // the prompt is modal
		}
	}
	if key.Matches(km, keys.Interrupt) {
		if k, ok := m.runningTargetKernel(); ok {
			id := k.ID
			return m, m.action("interrupted "+id, func(ctx context.Context) error { return m.eng.Interrupt(ctx, id) })
		}
		if m.anyRunning() {
			m.confirm = true
			return m, nil
		}
		return m.quit()
	}
	// The editor and the filter line take every other key they understand.
	typing := m.focus == focusEditor || (m.focus == focusEvents && m.evPane.Editing())
	if !typing && km.Type == tea.KeyRunes && len(km.Runes) > 1 && !km.Paste {
		// Keys read together (auto-repeat, a busy terminal) arrive as one
		// message: outside a text field each one is a command of its own.
		var cmds []tea.Cmd
		for _, r := range km.Runes {
			_, cmd := m.onKey(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune{r}, Alt: km.Alt})
			cmds = append(cmds, cmd)
			if m.quitting {
				break
			}
		}
		return m, tea.Batch(cmds...)
	}
	switch {
	case key.Matches(km, keys.Focus) && !(m.focus == focusEditor && m.editor.form != nil):
		if !m.evPane.Editing() {
			return m, m.setFocus((m.focus + 1) % paneCount)
		}
	case key.Matches(km, keys.FocusBack) && !(m.focus == focusEditor && m.editor.form != nil):
		if !m.evPane.Editing() {
			return m, m.setFocus((m.focus + paneCount - 1) % paneCount)
		}
	}
	if typing {
		var cmd tea.Cmd
		m.panes[m.focus], cmd = m.panes[m.focus].Update(km)
		return m, cmd
	}
	switch {
	case key.Matches(km, keys.Quit):
		if m.anyRunning() {
			m.confirm = true
			return m, nil
		}
		return m.quit()
	case key.Matches(km, keys.Help):
		m.showHelp = !m.showHelp
		m.layout()
		return m, nil
	case key.Matches(km, keys.CapUp), key.Matches(km, keys.CapDown):
		n := m.maxKernels + 1
		if key.Matches(km, keys.CapDown) {
			n = m.maxKernels - 1
		}
		if n < 1 {
			m.setStatus("the cap is at least 1", nil)
			return m, nil
		}
		err := m.eng.SetLimits(&n, nil)
		m.setStatus(fmt.Sprintf("max_kernels %d", n), err)
		m.refresh()
		return m, nil
	case key.Matches(km, keys.IdleUp), key.Matches(km, keys.IdleDown):
		d := stepIdle(m.idleExit, key.Matches(km, keys.IdleUp))
		err := m.eng.SetLimits(nil, &d)
		m.setStatus("idle_exit "+short(d), err)
		m.refresh()
		return m, nil
	}
	if m.focus == focusKernels {
		if cmd, handled := m.kernelAction(km); handled {
			return m, cmd
		}
		var cmd tea.Cmd
		m.panes[m.focus], cmd = m.panes[m.focus].Update(km)
		if k, ok := m.kernels.Selected(); ok {
			m.retarget(targetOf(k))
		}
		return m, cmd
	}
	var cmd tea.Cmd
	m.panes[m.focus], cmd = m.panes[m.focus].Update(km)
	return m, cmd
}

// stepIdle moves idle_exit by a step that suits its size: 10s under two
// minutes, 1m under an hour, 10m above; never below 10s.
func stepIdle(d time.Duration, up bool) time.Duration {
	// The step is that of the range being entered, so ] then [ (or [ then ])
	// always comes back to where it started.
	stepAt := func(d time.Duration) time.Duration {
		switch {
		case d >= time.Hour:
			return 10 * time.Minute
		case d >= 2*time.Minute:
			return time.Minute
		}
		return 10 * time.Second
	}
	if up {
		return d + stepAt(d)
	}
	return max(10*time.Second, d-stepAt(d-1))
}

func (m *Model) retarget(t Target) {
	m.editor.SetTarget(t)
	m.output.setTarget(t)
}

func (m *Model) kernelAction(km tea.KeyMsg) (tea.Cmd, bool) {
	keys := m.ctx.Keys
	k, onKernel := m.kernels.Selected()
	switch {
	case key.Matches(km, keys.Select) && onKernel:
		m.retarget(targetOf(k))
		return m.setFocus(focusEditor), true
	case key.Matches(km, keys.Reset) && onKernel:
		t := targetOf(k)
		return m.action("reset "+k.ID, func(ctx context.Context) error {
			_, err := m.eng.Execute(ctx, engine.Request{Owner: t.Owner, Task: t.Task, Backend: t.Backend, Child: t.Child, Tools: t.Tools, Code: "pass", Reset: true})
			return err
		}), true
	case key.Matches(km, keys.InterruptSel) && onKernel:
		id := k.ID
		return m.action("interrupted "+id, func(ctx context.Context) error { return m.eng.Interrupt(ctx, id) }), true
	case key.Matches(km, keys.Kill) && onKernel:
		id := k.ID
		return m.action("killed "+id, func(ctx context.Context) error { return m.eng.Kill(ctx, id) }), true
	case key.Matches(km, keys.ShutdownOwner):
		owner := m.kernels.SelectedOwner()
		if owner == "" {
			return nil, true
		}
		return m.action("shut down owner "+owner, func(ctx context.Context) error {
			m.eng.ShutdownOwner(ctx, owner)
			return nil
		}), true
	}
	return nil, false
}

func (m *Model) setFocus(f int) tea.Cmd {
	m.focus = f
	m.kernels.focused = f == focusKernels
	m.output.focused = f == focusOutput
	m.evPane.focused = f == focusEvents
	if f == focusKernels {
		m.kernels.selectTarget(m.editor.Target())
	}
	return m.editor.setFocus(f == focusEditor)
}

// Sizes of the layout rows for the window.
func (m *Model) rows() (kernelsH, middleH, eventsH, helpH int) {
	helpH = 1
	if m.showHelp {
		helpH = 6
	}
	avail := max(0, m.ctx.Height-1-helpH)
	kernelsH = avail * 40 / 100
	middleH = avail * 33 / 100
	eventsH = avail - kernelsH - middleH
	return
}

func (m *Model) layout() {
	w := m.ctx.Width
	kh, mh, eh, _ := m.rows()
	m.kernels.SetSize(w, kh)
	m.editor.SetSize(w/2, mh)
	m.output.SetSize(w-w/2, mh)
	m.evPane.SetSize(w, eh)
	m.help.Width = w
}

// View draws the whole window, never wider or taller than it.
func (m *Model) View() string {
	if m.quitting || m.ctx.Width <= 0 || m.ctx.Height <= 0 {
		return ""
	}
	w := m.ctx.Width
	kh, mh, eh, _ := m.rows()
	parts := []string{fit(m.headerView(), w)}
	if kh > 0 {
		parts = append(parts, m.kernels.View())
	}
	if len(m.approvals) > 0 {
		// The prompt is modal and takes the events pane's rows too: the
		// more of the arguments the operator sees, the better.
		mh, eh = mh+eh, 0
	}
	if mh > 0 {
		if len(m.approvals) > 0 {
			parts = append(parts, m.approvalView(w, mh))
		} else {
			parts = append(parts, joinColumns(m.editor.View(), m.output.View()))
		}
	}
	if eh > 0 {
		parts = append(parts, m.evPane.View())
	}
	parts = append(parts, m.helpView())
	out := strings.Split(strings.Join(parts, "\n"), "\n")
	if len(out) > m.ctx.Height {
		out = out[:m.ctx.Height]
	}
	for i, l := range out {
		out[i] = fit(l, w)
	}
	return strings.Join(out, "\n")
}

// headerView puts what matters most first, so a narrow window cuts the
// backends list rather than the cap.
func (m *Model) headerView() string {
	t := m.ctx.Theme
	var b strings.Builder
	b.WriteString(t.Title.Render("kerneldeck"))
	n := len(m.kernels.kernels)
	capText := fmt.Sprintf("kernels %d/%d", n, m.maxKernels)
	capStyle := t.CapOK
	switch {
	case n > m.maxKernels:
		capStyle, capText = t.CapOver, capText+" OVER CAP (all busy)"
	case n == m.maxKernels:
		capStyle, capText = t.CapFull, capText+" FULL"
	}
	running, queued := 0, 0
	for _, k := range m.kernels.kernels {
		if k.State == "running" {
			running++
		}
		queued += k.Queued
	}
	b.WriteString("  " + capStyle.Render(capText))
	b.WriteString(t.Muted.Render(fmt.Sprintf("  idle_exit %s  running %d  queued %d", short(m.idleExit), running, queued)))
	for _, uri := range m.backends {
		state, ok := m.backendOK[uri]
		mark := t.Muted.Render("○")
		switch {
		case ok && state == "ok":
			mark = t.OK.Render("●")
		case ok:
			mark = t.Error.Render("✗")
		}
		b.WriteString("  " + mark + " " + uri)
	}
	return b.String()
}

// spaceRun matches the runs of spaces approvalView counts instead of drawing.
var spaceRun = regexp.MustCompile(` {8,}`)

func (m *Model) approvalView(w, h int) string {
	t := m.ctx.Theme
	a := m.approvals[0]
	inner := w - 2
	lines := []string{
		t.PromptTitle.Render(fmt.Sprintf("Approval needed (%d pending)", len(m.approvals))),
		t.HelpKey.Render("o") + " approve once  " + t.HelpKey.Render("a") + " always for this owner  " + t.HelpKey.Render("d") + " deny",
	}
	lines = append(lines, wordWrapLines(fmt.Sprintf("owner %s (kernel %s) wants to call %s with:", a.Owner, a.Kernel, a.Tool), inner)...)
	// Long runs of spaces (the only white space compact JSON leaves raw) are
	// counted instead of drawn, so padding cannot push the rest out of view.
	shown := spaceRun.ReplaceAllStringFunc(string(a.Args), func(run string) string {
		return fmt.Sprintf("⟪%d spaces⟫", len(run))
	})
	args := wrapLines(shown, inner)
	if room := h - 2 - len(lines); len(args) > room && room >= 3 {
		// Too long for the box: keep the head and the tail, since what a
		// command does last matters as much as how it starts.
		tail := (room - 1) / 3
		head := room - 1 - tail
		gap := t.Muted.Render(fmt.Sprintf("... %d lines not shown; deny if unsure ...", len(args)-head-tail))
		args = append(append(args[:head:head], gap), args[len(args)-tail:]...)
	}
	lines = append(lines, args...)
	return m.ctx.box("Approve tool call", lines, w, h, true)
}

func (m *Model) helpView() string {
	t := m.ctx.Theme
	if m.confirm {
		return t.Warn.Render("Cells are running. Quit and kill every kernel? y/n")
	}
	if m.showHelp {
		k := m.ctx.Keys
		return m.help.FullHelpView([][]key.Binding{
			{k.Run, k.HistPrev, k.HistNext, k.NewTarget, k.Interrupt},
			{k.Focus, k.Up, k.Down, k.Toggle, k.Select},
			{k.Reset, k.InterruptSel, k.Kill, k.ShutdownOwner, k.Filter},
			{k.CapUp, k.CapDown, k.IdleUp, k.IdleDown, k.Help, k.Quit},
		})
	}
	short := m.help.ShortHelpView(m.shortKeys())
	if m.status != "" {
		st := t.Muted
		if m.statusErr {
			st = t.Error
		}
		return st.Render(m.status) + "  " + short
	}
	return short
}

func (m *Model) shortKeys() []key.Binding {
	k := m.ctx.Keys
	switch m.focus {
	case focusEditor:
		return []key.Binding{k.Run, k.HistPrev, k.NewTarget, k.Interrupt, k.Focus}
	case focusKernels:
		return []key.Binding{k.Select, k.Toggle, k.Reset, k.InterruptSel, k.Kill, k.ShutdownOwner, k.CapUp, k.CapDown, k.IdleUp, k.IdleDown, k.Help, k.Quit}
	case focusEvents:
		return []key.Binding{k.Filter, k.Up, k.Down, k.Focus, k.Help, k.Quit}
	}
	return []key.Binding{k.Up, k.Down, k.Focus, k.Help, k.Quit}
}
