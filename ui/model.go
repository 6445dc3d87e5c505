package ui

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/charmbracelet/bubbles/help"
	"github.com/charmbracelet/bubbles/key"
	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/internal/termimage"
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
	// Where says where the engine is, for the header: "serving at PATH" or
	// "attached to ssh://host/PATH"; "" says nothing.
	Where string
	// History is shown in the events pane before the live events, marked.
	History []engine.Event
	// Lost, when the events stop, says why the engine is gone (an attached
	// dashboard's connection); nil or a nil error says nothing.
	Lost func() error
	// Reconnects says that an engine gone is dialled again: the header
	// says so until a Reattached message brings it back.
	Reconnects bool
	// KeepsKernels says quitting leaves the kernels running (an attached
	// dashboard, --keep-kernels), so it asks nothing first.
	KeepsKernels bool
	// LimitsPause is how long a cap or idle_exit edit waits for the next
	// key before it applies (default DefaultLimitsPause).
	LimitsPause time.Duration
	// Replay, when set, is a replay feeding the engine: the header says so
	// and p/n pause, resume and step it.
	Replay ReplayControl
	// Clipboard is the terminal the output pane's y copies a cell's output
	// to, as an OSC 52 sequence the terminal may honour; nil turns y off.
	Clipboard io.Writer
	// SaveDir is where the output pane's s saves a cell's images (the
	// dashboard's working directory); "" turns s off.
	SaveDir string
	// Images is how the output pane draws a cell's images (--images);
	// "" is termimage.Off: a label line each.
	Images termimage.Mode
	// Open shows an image file with the system's viewer (the output pane's
	// o, which saves the images to a private dir first); nil turns o off.
	// It must not wait for the viewer to close.
	Open func(path string) error
	// OpenDir is the private dir (0700) o saves images to before opening.
	OpenDir string
	// OnFirstFrame runs once, when the window's size is first known (the
	// first frame follows): a replay starts then, not before.
	OnFirstFrame func()
}

// ReplayControl is what the dashboard shows and steers of a replay.
type ReplayControl interface {
	State() (sent, total int, paused bool, speed float64)
	SetPaused(bool)
	Step()
	// Say is what request i (from 0) says when it is sent, or "".
	Say(i int) string
}

// eventReplaySay is the events pane's line for what a replay says: the
// dashboard's own, never the engine's.
const eventReplaySay engine.EventType = "replay says"

// Messages from the engine and from background work.
type (
	tickMsg       time.Time
	eventBatchMsg []engine.Event
	eventsDoneMsg struct{}
	cellOutputMsg struct {
		run          *cellRun
		stream, text string
	}
	// cellStartedMsg: a cell of this dashboard got its kernel (until then
	// it waits in the kernel's queue).
	cellStartedMsg struct {
		run  *cellRun
		cell string
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
	// applyLimitsMsg applies the pending limits if nothing changed them
	// since it was scheduled.
	applyLimitsMsg struct{ seq int }
)

// DefaultLimitsPause is how long + - [ ] wait for the next press before
// the pending value is applied, as one change.
const DefaultLimitsPause = 1500 * time.Millisecond

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
	// panes are every pane in tab order; focus indexes it.
	panes []Pane
	focus int
	// rows place the panes in the window, top to bottom.
	rows []layoutRow
	// globals are the keys that work in every pane not typing text.
	globals actions

	help help.Model
	// cmdHistory is the : commands that ran, oldest first.
	cmdHistory []string
	showHelp   bool

	maxKernels int
	spares     int    // spare runners ready, counted toward maxKernels
	kernelsGen uint64 // generation of the listing the kernels pane holds (kernelsVersioner)
	idleExit   time.Duration
	// An edit of the limits, applied as one change after limitsPause.
	pendingCap  *int
	pendingIdle *time.Duration
	pendingSeq  int
	limitsPause time.Duration
	backends    []string
	backendOK   map[string]string // URI -> "ok" or the last transport error
	unconfined  map[string]bool   // URI -> its runners cannot confine themselves (Landlock)
	reasons     map[string]string // kernel id -> why it left the registry
	runs        map[*cellRun]bool // cells started here and still running
	runSeq      int
	own         ownCells            // ids of the cells started here
	byCell      map[string]*cellRun // others' cells, by id
	cellsAsked  map[string]time.Time
	cellsDue    map[string]bool // kernels whose records changed while asked
	fetchWant   bool            // the target changed: show its kernel's cells
	where       string
	lost        func() error
	// gone is why the engine went away (an attached dashboard's), or nil:
	// its kernels are no longer shown, and no cell is sent.
	gone       error
	reconnects bool
	status     string
	statusAt   time.Time // when status was set: it goes after statusShown
	statusErr  bool
	// layers are the overlays open over the panes, lowest first: they take
	// the keys before the panes.
	layers     overlays
	zoomed     bool // the focused pane has the whole window
	replay     ReplayControl
	replaySaid int // the replay's requests whose say is shown
	firstFrame func()
	keeps      bool // quitting leaves the kernels running
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
	ctx := &Context{Theme: theme, Keys: DefaultKeyMap(), Now: now, User: user, borders: newBoxStyle(theme), clipboard: opts.Clipboard, saveDir: opts.SaveDir,
		images: opts.Images, drawer: newImageDrawer(opts.Images), open: opts.Open, openDir: opts.OpenDir}
	backendsList := opts.Engine.Backends()
	first := ""
	if len(backendsList) > 0 {
		first = backendsList[0]
	}
	target := Target{Owner: user, Task: "default", Backend: first}
	runCtx, cancel := context.WithCancel(context.Background())
	m := &Model{
		ctx: ctx, eng: opts.Engine, events: opts.Events, inbox: newInbox(), runCtx: runCtx, cancel: cancel,
		tick:        opts.TickEvery,
		kernels:     newKernelsPane(ctx),
		editor:      newEditorPane(ctx, target),
		output:      newOutputPane(ctx),
		evPane:      newEventsPane(ctx),
		backends:    backendsList,
		backendOK:   map[string]string{},
		unconfined:  map[string]bool{},
		reasons:     map[string]string{},
		runs:        map[*cellRun]bool{},
		byCell:      map[string]*cellRun{},
		cellsAsked:  map[string]time.Time{},
		cellsDue:    map[string]bool{},
		fetchWant:   true,
		where:       opts.Where,
		lost:        opts.Lost,
		reconnects:  opts.Reconnects,
		keeps:       opts.KeepsKernels,
		limitsPause: cmp.Or(opts.LimitsPause, DefaultLimitsPause),
		replay:      opts.Replay,
		firstFrame:  opts.OnFirstFrame,
	}
	if len(opts.History) > 0 {
		m.evPane.add(opts.History...)
	}
	ctx.act = m.action
	ctx.ask = func(text string, yes tea.Cmd) { m.layers.open(&question{text: text, yes: yes}) }
	ctx.detail = m.openDetail
	if m.tick == 0 {
		m.tick = time.Second
	}
	m.editor.backends = backendsList
	m.kernels.onSelect = m.retarget
	m.kernels.onEdit = func(t Target) tea.Cmd {
		m.retarget(t)
		return m.focusPane(m.editor)
	}
	// Tab goes down the screen: the list first, as k9s and lazydocker
	// start, so every key the first frame offers works.
	m.panes = []Pane{m.kernels, m.editor, m.output, m.evPane}
	m.rows = []layoutRow{
		{panes: []Pane{m.kernels}, share: 40},
		{panes: []Pane{m.editor, m.output}, share: 33},
		{panes: []Pane{m.evPane}},
	}
	m.globals = m.globalKeys()
	m.help = help.New()
	m.help.Styles = theme.HelpStyles()
	m.output.setTarget(target)
	m.setFocus(0)
	m.refresh()
	return m
}

// layoutRow is one band of the window: its panes side by side, and its
// share of the height in percent (0: what the others leave).
type layoutRow struct {
	panes []Pane
	share int
}

// globalKeys are the keys of the whole dashboard: each with its handler.
func (m *Model) globalKeys() actions {
	k := m.ctx.Keys
	setCap := func(d int) tea.Cmd {
		n := cmp.Or(deref(m.pendingCap), m.maxKernels) + d
		if n < 1 {
			m.setStatus("the cap is at least 1", nil)
			return nil
		}
		m.pendingCap = &n
		return m.schedulePending()
	}
	setIdle := func(up bool) tea.Cmd {
		d := stepIdle(cmp.Or(deref(m.pendingIdle), m.idleExit), up)
		m.pendingIdle = &d
		return m.schedulePending()
	}
	var replayKeys actions
	if m.replay != nil {
		replayKeys = actions{
			{k.ReplayPause, run(func() tea.Cmd {
				_, _, paused, _ := m.replay.State()
				m.replay.SetPaused(!paused)
				return nil
			})},
			{k.ReplayStep, run(func() tea.Cmd {
				if _, _, paused, _ := m.replay.State(); !paused {
					m.setStatus("the replay runs: p pauses it, then n steps", nil)
					return nil
				}
				m.replay.Step()
				return tea.Tick(100*time.Millisecond, func(time.Time) tea.Msg { return refreshNowMsg{} })
			})},
		}
	}
	return append(actions{
		{k.Quit, run(func() tea.Cmd {
			if q := m.quitQuestion(); q != nil {
				m.layers.open(q)
				return nil
			}
			return m.quit()
		})},
		{k.Help, run(func() tea.Cmd { m.showHelp = !m.showHelp; m.layout(); return nil })},
		{k.Zoom, run(func() tea.Cmd { m.zoomed = !m.zoomed; m.layout(); return nil })},
		{k.Command, run(m.openCommand)},
		{k.Edit, run(func() tea.Cmd {
			if m.editor.heldFailed() {
				// A person who wants a new cell would type into the old one.
				m.setStatus("the cell that failed is back in the editor, to fix; ctrl+c clears it for a new one (ctrl+p brings it back)", nil)
			}
			return m.focusPane(m.editor)
		})},
		{k.CapUp, run(func() tea.Cmd { return setCap(1) })},
		{k.CapDown, run(func() tea.Cmd { return setCap(-1) })},
		{k.IdleUp, run(func() tea.Cmd { return setIdle(true) })},
		{k.IdleDown, run(func() tea.Cmd { return setIdle(false) })},
	}, replayKeys...)
}

// Reattached is an attached dashboard's engine back after it went away (a
// new connection, often a new engine): the dashboard shows it from now on.
type Reattached struct {
	Engine Engine
	Events <-chan engine.Event
	Lost   func() error
	Where  string
}

// Init starts the tick, the event listener and the inbox listener.
func (m *Model) Init() tea.Cmd {
	cmds := []tea.Cmd{m.inbox.wait()}
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

// spareCounter is an engine that keeps spare runners (the embedded one).
type spareCounter interface{ Spares() int }

// kernelsVersioner is an engine that says when its listing is the one the
// dashboard already holds (an attached engine answers "unchanged"): the 1 s
// refresh of an idle fleet then copies and regroups nothing.
type kernelsVersioner interface {
	KernelsSince(gen uint64) ([]engine.KernelInfo, uint64, bool)
}

// refresh takes a new snapshot of the registry and the limits.
func (m *Model) refresh() {
	m.showReplaySays()
	if m.gone != nil {
		return // nothing to ask, and what it said last is no longer true
	}
	m.maxKernels, m.idleExit = m.eng.Limits()
	if s, ok := m.eng.(spareCounter); ok {
		m.spares = s.Spares()
	}
	if pk, ok := m.eng.(parker); ok {
		m.kernels.setParked(pk.Parked())
	}
	if v, ok := m.eng.(kernelsVersioner); ok {
		ks, gen, changed := v.KernelsSince(m.kernelsGen)
		if !changed {
			m.kernels.keepSnapshot(m.idleExit, m.reasons)
			return
		}
		m.kernelsGen = gen
		m.kernels.setSnapshot(ks, m.idleExit, m.reasons)
		return
	}
	m.kernels.setSnapshot(m.eng.Kernels(), m.idleExit, m.reasons)
}

// showReplaySays puts what the replay's sent requests say into the events
// pane, once each.
func (m *Model) showReplaySays() {
	if m.replay == nil {
		return
	}
	sent, _, _, _ := m.replay.State()
	for ; m.replaySaid < sent; m.replaySaid++ {
		if say := m.replay.Say(m.replaySaid); say != "" {
			m.evPane.add(engine.Event{Type: eventReplaySay, Time: m.ctx.Now(), Detail: say})
		}
	}
}

// Update routes a message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	model, cmd := m.update(msg)
	if draw := m.ctx.drawer.start(); draw != nil {
		// Rendering asked for images: drawn off the loop.
		cmd = tea.Batch(cmd, draw)
	}
	if m.fetchWant && !m.quitting {
		// The target changed (or its kernel may have appeared): show the
		// cells others ran in it.
		if fetch := m.targetFetch(); fetch != nil {
			m.fetchWant = false
			cmd = tea.Batch(cmd, fetch)
		}
	}
	return model, cmd
}

func (m *Model) update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.ctx.Width, m.ctx.Height = msg.Width, msg.Height
		m.layout()
		if f := m.firstFrame; f != nil {
			m.firstFrame = nil
			f()
		}
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
		cmd := m.onEvents(msg)
		if m.events == nil {
			return m, cmd
		}
		return m, tea.Batch(cmd, waitEvents(m.events))
	case cellsMsg:
		return m, m.onCells(msg)
	case imageDrawnMsg:
		m.ctx.drawer.store(msg)
		m.output.redraw()
		return m, nil
	case eventsDoneMsg:
		if m.lost != nil {
			if err := m.lost(); err != nil {
				m.engineGone(err)
			}
		}
		return m, nil
	case Reattached:
		m.eng, m.events, m.lost, m.where = msg.Engine, msg.Events, msg.Lost, msg.Where
		m.gone, m.kernels.engineGone, m.kernelsGen = nil, "", 0
		m.refresh()
		m.setStatus("back on the engine: "+plain(msg.Where), nil)
		return m, waitEvents(m.events)
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
	case completeAskMsg:
		return m, m.askCompletion(msg)
	case completionsMsg:
		if msg.err != nil {
			m.setStatus("tab completion", msg.err)
			return m, nil
		}
		if said := m.editor.complete(msg); said != "" {
			m.setStatus(said, nil)
		}
		return m, nil
	case pageReadyMsg:
		if msg.err != nil {
			m.setStatus("v", msg.err)
			return m, nil
		}
		return m, pagerCmd(msg)
	case pagedMsg:
		if msg.err != nil {
			m.setStatus("the pager", msg.err)
		}
		return m, nil
	case editedMsg:
		if err := m.editor.edited(msg); err != nil {
			m.setStatus("ctrl+e", err)
		}
		return m, nil
	case applyLimitsMsg:
		if msg.seq == m.pendingSeq {
			m.applyPending()
		}
		return m, nil
	case tea.KeyMsg:
		return m.onKey(msg)
	case tea.MouseMsg:
		return m, m.onMouse(msg)
	}
	// Anything else (cursor blink) goes to the focused pane.
	return m, m.panes[m.focus].Update(msg)
}

// reasonOf is why ev's kernel went, in words: its type and detail, the
// type once ("killed: killed by the operator" is "killed by the operator").
func reasonOf(ev engine.Event) string {
	if strings.HasPrefix(ev.Detail, string(ev.Type)) {
		return ev.Detail
	}
	return string(ev.Type) + ": " + ev.Detail
}

func (m *Model) setStatus(s string, err error) {
	m.status, m.statusErr, m.statusAt = plain(s), err != nil, m.ctx.Now()
	if err != nil {
		m.status = plain(s + ": " + err.Error())
	}
}

func (m *Model) onEvents(evs []engine.Event) tea.Cmd {
	var cmds []tea.Cmd
	shown := evs[:0:0]
	for _, ev := range evs {
		if ev.Cell != "" && !ev.History {
			cmds = append(cmds, m.onCellEvent(ev))
		}
		if ev.Type != engine.EventCellOutput {
			shown = append(shown, ev)
		}
	}
	m.evPane.add(shown...)
	for _, ev := range shown {
		if ev.History {
			continue // what happened before we looked: shown, not acted on
		}
		switch ev.Type {
		case engine.EventApprovalRequest:
			a := m.approvals(true)
			a.queue = append(a.queue, ev)
		case engine.EventApprovalDecided:
			if a := m.approvals(false); a != nil {
				a.drop(m, ev.Request)
			}
		case engine.EventKilled:
			// A kill follows every eviction, reap and reset: keep their reason.
			if _, known := m.reasons[ev.Kernel]; ev.Kernel != "" && !known {
				m.reasons[ev.Kernel] = reasonOf(ev)
			}
		case engine.EventEvictedCap, engine.EventReapedIdle, engine.EventStateLost,
			engine.EventOwnerShutdown, engine.EventSpawnFailed, engine.EventReset, engine.EventHibernated:
			if ev.Kernel != "" {
				m.reasons[ev.Kernel] = reasonOf(ev)
			}
		}
		if b := backendOfKey(ev.Key); b != "" {
			switch ev.Type {
			case engine.EventUnconfined:
				m.unconfined[b] = true
			case engine.EventTransportError:
				m.backendOK[b] = ev.Detail
			case engine.EventSpawned, engine.EventReconnected, engine.EventCellFinished:
				m.backendOK[b] = "ok"
			}
		}
		if ev.Type == engine.EventSpawned {
			m.fetchWant = true // maybe the target's kernel
		}
	}
	m.refresh()
	return tea.Batch(cmds...)
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
	case cellStartedMsg:
		msg.run.cell = msg.cell // it has its kernel: no longer queued
		msg.run.renderedDone = false
		m.output.changed(msg.run)
	case cellOutputMsg:
		appendOutput(msg.run, msg.stream, msg.text)
		m.output.changed(msg.run)
	case inputAskMsg:
		m.ask(msg.a)
	case cellResultMsg:
		r := msg.run
		m.dropInputs(r)
		r.running, r.res, r.err, r.finished = false, msg.res, msg.err, m.ctx.Now()
		if msg.res != nil {
			r.cell = msg.res.Cell
		}
		if msg.err != nil || (msg.res != nil && (msg.res.Status == engine.StatusError || msg.res.Status == engine.StatusTimeout)) {
			// A failed cell's code comes back to be fixed, unless something
			// new is being written (an interrupted one was stopped on purpose).
			m.editor.restore(r.target, r.code)
		}
		delete(m.runs, r)
		m.output.changed(r)
		m.refresh()
	}
}

// engineGone is the end of an attached dashboard's engine: its kernels,
// timers and spares leave the screen, the header says so, and no cell is
// sent to it.
func (m *Model) engineGone(why error) {
	m.gone = why
	m.spares = 0
	m.kernels.engineLost(why.Error())
	m.setStatus("lost the engine", why)
}

// startCell runs a cell in the background; its output and result come back
// through the inbox.
func (m *Model) startCell(msg runCellMsg) {
	m.runSeq++
	r := &cellRun{seq: m.runSeq, target: msg.target, code: msg.code, started: m.ctx.Now(), running: true}
	m.output.setTarget(msg.target)
	m.output.add(r)
	if m.gone != nil {
		then := "quit, and attach again once it is back"
		if m.reconnects {
			then = "run it again once it is back"
		}
		r.running, r.err, r.finished = false, fmt.Errorf("not run: the engine is gone (%w); %s", m.gone, then), m.ctx.Now()
		m.output.changed(r)
		return
	}
	m.runs[r] = true
	req := engine.Request{Owner: msg.target.Owner, Task: msg.target.Task, Backend: msg.target.Backend,
		Child: msg.target.Child, Tools: msg.target.Tools, Code: msg.code,
		OnStart: func(cell string) {
			m.own.add(cell)
			m.inbox.post(cellStartedMsg{run: r, cell: cell})
		},
		OnOutput: func(stream, text string) { m.inbox.post(cellOutputMsg{run: r, stream: stream, text: text}) },
		// A display made while the cell runs shows as its label where it
		// was made; the result brings the display itself.
		OnDisplay: func(d engine.Display) {
			m.inbox.post(cellOutputMsg{run: r, stream: engine.StreamDisplay, text: d.Label() + "\n"})
		},
		OnInput: asker(m.inbox, r)}
	ctx, box := m.runCtx, m.inbox
	go func() {
		res, err := m.eng.Execute(ctx, req)
		box.post(cellResultMsg{run: r, res: res, err: err})
	}()
}

// completeWait bounds a tab's completion.
const completeWait = 5 * time.Second

// askCompletion asks the target's kernel, in the background, what the
// word at the cursor may be.
func (m *Model) askCompletion(ask completeAskMsg) tea.Cmd {
	if m.gone != nil {
		return nil
	}
	id := ""
	for _, k := range m.kernels.kernels {
		if ask.target.matches(k) && k.State != engine.StateStarting {
			id = k.ID
		}
	}
	if id == "" {
		m.setStatus("tab completes from the target's kernel, which has not started: run a cell first", nil)
		return nil
	}
	ctx, eng := m.runCtx, m.eng
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(ctx, completeWait)
		defer cancel()
		c, err := eng.Complete(ctx, id, ask.code, ask.cursor)
		return completionsMsg{ask: ask, c: c, err: err}
	}
}

// runningTargetKernel returns the kernel of the editor's target if a cell
// runs in it.
func (m *Model) runningTargetKernel() (engine.KernelInfo, bool) {
	t := m.editor.Target()
	for _, k := range m.kernels.kernels {
		if t.matches(k) && k.State == engine.StateRunning {
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
		if k.State.Busy() {
			return true
		}
	}
	return false
}

func (m *Model) quit() tea.Cmd {
	m.quitting, m.layers = true, nil
	return tea.Quit
}

// quitQuestion is what quitting must ask first, or nil: quitting kills
// the kernels unless they are kept.
func (m *Model) quitQuestion() *question {
	if m.anyRunning() {
		return &question{text: "Cells are running. Quit and kill every kernel? y/n", quit: true}
	}
	if n := len(m.kernels.kernels); n > 0 && !m.keeps {
		return &question{text: fmt.Sprintf("Quit and kill %s? y/n (--keep-kernels keeps them)", english.Count(n, "kernel")), quit: true}
	}
	return nil
}

func (m *Model) action(what string, f func(ctx context.Context, eng Engine) error) tea.Cmd {
	ctx, eng := m.runCtx, m.eng
	return func() tea.Msg { return actionDoneMsg{what: what, err: f(ctx, eng)} }
}

func (m *Model) onKey(km tea.KeyMsg) (tea.Model, tea.Cmd) {
	keys := m.ctx.Keys
	if cmd, pass := m.layers.onKey(m, km); !pass {
		return m, cmd
	}
	if key.Matches(km, keys.Interrupt) {
		if k, ok := m.runningTargetKernel(); ok {
			id := k.ID
			return m, m.action("interrupted "+id, func(ctx context.Context, eng Engine) error { return eng.Interrupt(ctx, id) })
		}
		if m.panes[m.focus] == Pane(m.editor) && m.editor.clear() {
			// As a shell clears its line: typed code is never lost to one
			// key, and the next ctrl+c quits.
			m.setStatus("cleared the cell (ctrl+p brings it back); ctrl+c again quits", nil)
			return m, nil
		}
		if q := m.quitQuestion(); q != nil {
			m.layers.open(q)
			return m, nil
		}
		return m, m.quit()
	}
	focused := m.panes[m.focus]
	typing := focused.Typing()
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
	if !focused.Modal() {
		switch {
		case focused == Pane(m.editor) && key.Matches(km, keys.Leave):
			return m, m.focusPane(m.kernels)
		case key.Matches(km, keys.Focus) && focused == Pane(m.editor) && m.editor.TakesTab():
			// tab indents in the editor; shift+tab still leaves it
		case key.Matches(km, keys.Focus):
			return m, m.setFocus((m.focus + 1) % len(m.panes))
		case key.Matches(km, keys.FocusBack):
			return m, m.setFocus((m.focus + len(m.panes) - 1) % len(m.panes))
		}
	}
	if !typing {
		if key.Matches(km, keys.Cancel) && m.cancelPending() {
			return m, nil
		}
		if cmd, ok := m.globals.handle(km); ok {
			return m, cmd
		}
	}
	return m, focused.Update(km)
}

// onMouse (with --mouse): the wheel scrolls the focused pane, a click on a
// kernel row selects it.
func (m *Model) onMouse(msg tea.MouseMsg) tea.Cmd {
	if msg.Action != tea.MouseActionPress || len(m.layers) > 0 {
		return nil
	}
	switch msg.Button {
	case tea.MouseButtonWheelUp:
		return m.panes[m.focus].Update(tea.KeyMsg{Type: tea.KeyUp})
	case tea.MouseButtonWheelDown:
		return m.panes[m.focus].Update(tea.KeyMsg{Type: tea.KeyDown})
	case tea.MouseButtonLeft:
		// The kernels pane starts under the header and the bands above it
		// (clickRow knows its own border and column header).
		hs, _ := m.heights()
		top := 1
		for i, r := range m.rows {
			if slices.Contains(r.panes, Pane(m.kernels)) {
				if !m.zoomed && msg.Y >= top && msg.Y < top+hs[i] && m.kernels.clickRow(msg.Y-top) {
					return m.focusPane(m.kernels)
				}
				break
			}
			top += hs[i]
		}
	}
	return nil
}

// schedulePending shows the pending limits and applies them after a pause
// without another press.
func (m *Model) schedulePending() tea.Cmd {
	m.pendingSeq++
	seq := m.pendingSeq
	m.setStatus(m.pendingText()+fmt.Sprintf(" pending: applies %s after the last key; esc cancels", m.limitsPause), nil)
	return tea.Tick(m.limitsPause, func(time.Time) tea.Msg { return applyLimitsMsg{seq: seq} })
}

func (m *Model) pendingText() string {
	var parts []string
	if m.pendingCap != nil {
		parts = append(parts, fmt.Sprintf("max_kernels %d → %d", m.maxKernels, *m.pendingCap))
	}
	if m.pendingIdle != nil {
		parts = append(parts, fmt.Sprintf("idle_exit %s → %s", short(m.idleExit), short(*m.pendingIdle)))
	}
	return strings.Join(parts, ", ")
}

// applyPending applies the pending limits as one change.
func (m *Model) applyPending() {
	if m.pendingCap == nil && m.pendingIdle == nil {
		return
	}
	what := m.pendingText()
	err := m.eng.SetLimits(m.pendingCap, m.pendingIdle)
	m.pendingCap, m.pendingIdle = nil, nil
	m.pendingSeq++
	m.setStatus(what, err)
	m.refresh()
}

// cancelPending drops a pending edit of the limits.
func (m *Model) cancelPending() bool {
	if m.pendingCap == nil && m.pendingIdle == nil {
		return false
	}
	m.pendingCap, m.pendingIdle = nil, nil
	m.pendingSeq++
	m.setStatus("limits unchanged", nil)
	return true
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
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
	m.fetchWant = true
}

// focusPane gives pane p the keyboard.
func (m *Model) focusPane(p Pane) tea.Cmd { return m.setFocus(slices.Index(m.panes, p)) }

// setFocus gives pane f (its place in the tab order) the keyboard.
func (m *Model) setFocus(f int) tea.Cmd {
	m.focus = f
	if m.zoomed {
		defer m.layout() // the zoom follows the focus
	}
	var cmd tea.Cmd
	for i, p := range m.panes {
		if i == f {
			cmd = p.Focus()
		} else {
			p.Blur()
		}
	}
	if m.panes[f] == m.kernels {
		m.kernels.selectTarget(m.editor.Target())
	}
	return cmd
}

// heights sizes the layout rows for the window, top to bottom, and the
// help line(s) below them.
func (m *Model) heights() (rows []int, helpH int) {
	helpH = 1
	if m.showHelp {
		helpH = 0
		for _, col := range m.fullHelp() {
			helpH = max(helpH, len(col))
		}
	}
	avail := max(0, m.ctx.Height-1-helpH)
	left := avail
	rows = make([]int, len(m.rows))
	for i, r := range m.rows {
		if r.share > 0 {
			rows[i] = avail * r.share / 100
			left -= rows[i]
		}
	}
	for i, r := range m.rows {
		if r.share == 0 {
			rows[i] = left
		}
	}
	return rows, helpH
}

func (m *Model) layout() {
	w := m.ctx.Width
	hs, _ := m.heights()
	for i, r := range m.rows {
		x := 0
		for j, p := range r.panes {
			pw := w / len(r.panes)
			if j == len(r.panes)-1 {
				pw = w - x
			}
			p.SetSize(pw, hs[i])
			x += pw
		}
	}
	if m.zoomed {
		m.panes[m.focus].SetSize(w, sum(hs))
	}
	m.help.Width = w
}

// View draws the whole window, never wider or taller than it.
func (m *Model) View() string {
	if m.quitting || m.ctx.Width <= 0 || m.ctx.Height <= 0 {
		return ""
	}
	w := m.ctx.Width
	hs, _ := m.heights()
	parts := []string{fit(m.headerView(), w)}
	over := m.layers.top(areaBody, areaBelowKernels)
	for i, r := range m.rows {
		h := hs[i]
		switch {
		case over != nil && over.layer().area() == areaBody:
			// It takes every row below the header.
			if i == 0 {
				parts = append(parts, over.view(m, w, sum(hs)))
			}
			continue
		case over != nil && i > 0:
			// It takes the rows below the kernels (the approval prompt is
			// modal: the more of the arguments the operator sees, the
			// better).
			if i == 1 {
				if rest := sum(hs[1:]); rest > 0 {
					parts = append(parts, over.view(m, w, rest))
				}
			}
			continue
		case m.zoomed && over == nil:
			if i == 0 {
				parts = append(parts, m.panes[m.focus].View())
			}
			continue
		}
		if h <= 0 {
			continue
		}
		views := make([]string, len(r.panes))
		for j, p := range r.panes {
			views[j] = p.View()
		}
		parts = append(parts, joinColumns(views...))
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

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// headerView puts what matters most first, so a narrow window cuts the
// backends list rather than the cap.
func (m *Model) headerView() string {
	t := m.ctx.Theme
	var b strings.Builder
	b.WriteString(t.Title.Render("kerneldeck"))
	if m.replay != nil {
		sent, total, paused, speed := m.replay.State()
		badge := fmt.Sprintf(" REPLAY %d/%d", sent, total)
		// The keys it names are text where keys are typed: it says so.
		first := ""
		if m.panes[m.focus].Typing() {
			first = "esc, then "
		}
		switch {
		case sent == total:
			badge += " done"
		case paused:
			badge += " PAUSED (" + first + "p resumes, n steps)"
		case speed != 1:
			badge += fmt.Sprintf(" ×%g (%sp pauses)", speed, first)
		default:
			badge += " (" + first + "p pauses)"
		}
		b.WriteString(t.Warn.Render(badge))
	}
	if m.gone != nil {
		// Nothing the engine said last holds now: no cap, no counts.
		state := "ENGINE GONE"
		if m.reconnects {
			state += ", reconnecting"
		}
		b.WriteString("  " + t.Error.Render(state) + t.Muted.Render("  "+plain(m.where)+" (q quits)"))
		return b.String()
	}
	n := len(m.kernels.kernels)
	capText := fmt.Sprintf("kernels %d/%d", n, m.maxKernels)
	capStyle := t.CapOK
	switch {
	case n > m.maxKernels:
		why := "all busy" // busy kernels are never evicted
		for _, k := range m.kernels.kernels {
			if k.State == engine.StateIdle && !k.Attached {
				why = "evicting" // the engine has not caught up yet
				break
			}
		}
		capStyle, capText = t.CapOver, capText+fmt.Sprintf(" OVER CAP by %d (%s)", n-m.maxKernels, why)
	case n == m.maxKernels:
		capStyle, capText = t.CapFull, capText+" FULL"
	}
	running, queued := 0, 0
	for _, k := range m.kernels.kernels {
		if k.State == engine.StateRunning {
			running++
		}
		queued += k.Queued
	}
	b.WriteString("  " + capStyle.Render(capText))
	if m.pendingCap != nil {
		// Next to the cap it changes, not after the spares.
		b.WriteString(t.Warn.Render(fmt.Sprintf(" cap → %d pending", *m.pendingCap)))
	}
	if m.spares > 0 {
		b.WriteString(t.Muted.Render(fmt.Sprintf("  spares %d", m.spares)))
	}
	b.WriteString(t.Muted.Render("  idle_exit " + short(m.idleExit)))
	if m.pendingIdle != nil {
		b.WriteString(t.Warn.Render(" → " + short(*m.pendingIdle) + " pending"))
	}
	b.WriteString(t.Muted.Render(fmt.Sprintf("  running %d  queued %d", running, queued)))
	for _, uri := range m.backends {
		state, ok := m.backendOK[uri]
		mark := t.Muted.Render("○")
		switch {
		case ok && state == "ok":
			mark = t.OK.Render("●")
		case ok:
			mark = t.Error.Render("✗")
		}
		b.WriteString("  " + mark + " " + plain(uri))
		if m.unconfined[uri] {
			b.WriteString(t.Warn.Render(" (unconfined)"))
		}
	}
	if m.where != "" {
		b.WriteString(t.Muted.Render("  " + plain(m.where)))
	}
	return b.String()
}

// spaceRun matches the runs of spaces approvalView counts instead of drawing.
var spaceRun = regexp.MustCompile(` {8,}`)

func (m *Model) approvalView(p *approvalPrompt, w, h int) string {
	t := m.ctx.Theme
	a := p.queue[0]
	inner := w - 2
	lines := []string{
		t.PromptTitle.Render(fmt.Sprintf("Approval needed (%d pending)", len(p.queue))),
		t.HelpKey.Render("o") + " approve once  " + t.HelpKey.Render("a") + " always for this owner  " + t.HelpKey.Render("d") + " deny",
	}
	if !a.Until.IsZero() {
		left := a.Until.Sub(m.ctx.Now())
		lines = append(lines, t.Warn.Render(fmt.Sprintf("denied in %s unless answered", short(left))))
	}
	lines = append(lines, wordWrapLines(plain(fmt.Sprintf("owner %s (kernel %s) wants to call %s with:", a.Owner, a.Kernel, a.Tool)), inner)...)
	// Long runs of spaces (the only white space compact JSON leaves raw) are
	// counted instead of drawn, so padding cannot push the rest out of view.
	shown := spaceRun.ReplaceAllStringFunc(plain(string(a.Args)), func(run string) string {
		return fmt.Sprintf("⟪%d spaces⟫", len(run))
	})
	args := hardWrapLines(shown, inner)
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
	if o := m.layers.top(areaStatus); o != nil {
		return o.view(m, m.help.Width, 1)
	}
	if m.showHelp {
		return m.help.FullHelpView(m.fullHelp())
	}
	// A status goes after a while; an error stays until the next one, and
	// a pending limits edit says so until it applies.
	if m.status != "" && (m.statusErr || m.pendingCap != nil || m.pendingIdle != nil || m.ctx.Now().Sub(m.statusAt) < statusShown) {
		st := t.Muted
		if m.statusErr {
			st = t.Error
		}
		status := st.Render(m.status) + "  "
		return status + m.shortHelp(m.help.Width-lipgloss.Width(status))
	}
	return m.shortHelp(m.help.Width)
}

// shortHelp is the focused pane's keys in w cells, "? help" last: what
// does not fit is cut before it, so the way to the rest always shows.
func (m *Model) shortHelp(w int) string {
	helpKey := m.ctx.Keys.Help
	var rest []key.Binding
	hasHelp := false
	keys := m.panes[m.focus].ShortHelp()
	if k := m.layers.helpKeys(m); k != nil {
		keys = k
	}
	for _, b := range keys {
		if slices.Equal(b.Keys(), helpKey.Keys()) {
			hasHelp = true
			continue
		}
		rest = append(rest, b)
	}
	h := m.help
	h.Width = 0 // cut here: bubbles' help lets the last entry spill when no ellipsis fits
	tail := ""
	if hasHelp {
		tail = h.Styles.ShortSeparator.Inline(true).Render(h.ShortSeparator) + h.ShortHelpView([]key.Binding{helpKey})
		if len(rest) == 0 {
			return h.ShortHelpView([]key.Binding{helpKey})
		}
	}
	ellipsis := " " + h.Styles.Ellipsis.Inline(true).Render(h.Ellipsis)
	for n := len(rest); n > 0; n-- {
		v := h.ShortHelpView(rest[:n])
		if n < len(rest) {
			v += ellipsis
		}
		if lipgloss.Width(v)+lipgloss.Width(tail) <= w {
			return v + tail
		}
	}
	return strings.TrimPrefix(tail, h.Styles.ShortSeparator.Inline(true).Render(h.ShortSeparator))
}

// statusShown is how long a status message stays on the help line.
const statusShown = 8 * time.Second

// fullHelpRows is the least height of the full help: a narrow window
// makes its columns longer, so that every column shows.
const fullHelpRows = 9

// fullHelp is every pane's keys, then the dashboard's own, each key once,
// in as few columns as the window's width needs.
func (m *Model) fullHelp() [][]key.Binding {
	k := m.ctx.Keys
	var all []key.Binding
	for _, p := range m.panes {
		for _, col := range p.FullHelp() {
			all = append(all, col...)
		}
	}
	all = append(all, k.Focus, k.FocusBack, k.Help, k.Quit)
	all = append(all, m.globals[2:].bindings()...)
	seen := map[string]bool{}
	var keys []key.Binding
	for _, b := range all {
		if h := b.Help().Key; !seen[h] {
			seen[h] = true
			keys = append(keys, b)
		}
	}
	// The rows' room is what the panes can give up: a header, two lines
	// of a pane and the help.
	most := max(fullHelpRows, m.ctx.Height-3)
	measure := m.help
	measure.Width = 0 // bubbles' help cuts at its width: measure it uncut
	var out [][]key.Binding
	for rows := fullHelpRows; rows <= most; rows++ {
		out = out[:0]
		for i := 0; i < len(keys); i += rows {
			out = append(out, keys[i:min(i+rows, len(keys))])
		}
		if m.help.Width <= 0 || lipgloss.Width(measure.FullHelpView(out)) <= m.help.Width {
			break
		}
	}
	return out
}
