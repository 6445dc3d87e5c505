package ui

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/charmbracelet/bubbles/cursor"
	"github.com/charmbracelet/bubbles/key"
	"github.com/charmbracelet/bubbles/textarea"
	"github.com/charmbracelet/bubbles/textinput"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
)

// runCellMsg asks the root to run code in target.
type runCellMsg struct {
	target Target
	code   string
}

// completeAskMsg asks the root for the completions of code at cursor
// (characters) in target's kernel; completionsMsg brings them back.
type completeAskMsg struct {
	target Target
	code   string
	cursor int
}

type completionsMsg struct {
	ask completeAskMsg
	c   engine.Completion
	err error
}

// EditorPane is the multi-line cell editor with its target and history.
type EditorPane struct {
	pane

	area    textarea.Model
	target  Target
	history []string
	histPos int    // len(history) when editing a new cell
	draft   string // the new cell while browsing history
	keys    actions

	form     *targetForm
	backends []string // for the target form's check
	// failed is the failed cell's code restore put back, until it runs
	// or is cleared (heldFailed).
	failed string

	// view is the pane drawn after its last change (render): an idle
	// dashboard redraws once a second, and the text area's own View is a
	// fifth of a frame's cost.
	view string
}

func newEditorPane(ctx *Context, target Target) *EditorPane {
	ta := textarea.New()
	ta.Placeholder = "Python code; ctrl+r runs it"
	ta.ShowLineNumbers = false
	ta.Prompt = "│ "
	ta.CharLimit = 0
	ta.MaxHeight = 0
	ta.FocusedStyle.CursorLine = ctx.Theme.Editor
	ta.FocusedStyle.Prompt = ctx.Theme.EditorPrompt
	ta.BlurredStyle.Prompt = ctx.Theme.Faint
	ta.FocusedStyle.Placeholder = ctx.Theme.Faint
	ta.BlurredStyle.Placeholder = ctx.Theme.Faint
	// A steady cursor: a blinking one redraws the dashboard twice a second
	// while nothing changes (the focused box already shows where keys go).
	ta.Cursor.SetMode(cursor.CursorStatic)
	p := &EditorPane{pane: pane{ctx: ctx}, area: ta, target: target}
	k := ctx.Keys
	p.keys = actions{
		{k.Run, run(p.runCell)},
		{k.HistPrev, run(func() tea.Cmd { p.historyStep(-1); return nil })},
		{k.HistNext, run(func() tea.Cmd { p.historyStep(1); return nil })},
		// Python wants indentation: tab indents once there is text (an
		// empty editor's tab moves on, as shift+tab always does), and a
		// new line keeps the indent, one more after a ':'. After a word,
		// tab completes it from the kernel, as Jupyter's does.
		{k.Complete, func(tea.KeyMsg) (tea.Cmd, bool) {
			if p.area.Value() == "" {
				return nil, false
			}
			if code, cursor, ok := p.wordAtCursor(); ok {
				ask := completeAskMsg{target: p.target, code: code, cursor: cursor}
				return func() tea.Msg { return ask }, true
			}
			p.area.InsertString("    ")
			return nil, true
		}},
		{k.Newline, run(func() tea.Cmd {
			p.area.InsertString("\n" + nextIndent(currentLine(p.area.Value(), p.area.Line())))
			return nil
		})},
		{k.External, run(p.openExternal)},
		{k.NewTarget, run(func() tea.Cmd {
			p.form = newTargetForm(p.ctx, p.target, p.width-2)
			p.form.backends = p.backends
			p.area.Blur()
			return p.form.focusField()
		})},
	}
	return p
}

// editedMsg brings back the cell from $EDITOR.
type editedMsg struct {
	path string
	err  error
}

// openExternal hands the cell to $VISUAL or $EDITOR (else vi) in a private
// file; the dashboard waits, then takes the file back.
func (p *EditorPane) openExternal() tea.Cmd {
	failed := func(err error) tea.Cmd {
		return func() tea.Msg { return actionDoneMsg{what: "ctrl+e", err: err} }
	}
	f, err := os.CreateTemp("", "kerneldeck-cell-*.py") // 0600
	if err != nil {
		return failed(err)
	}
	_, werr := f.WriteString(p.area.Value())
	f.Close()
	if werr != nil {
		os.Remove(f.Name())
		return failed(werr)
	}
	editor := cmp.Or(os.Getenv("VISUAL"), os.Getenv("EDITOR"), "vi")
	args := strings.Fields(editor)
	path := f.Name()
	return tea.ExecProcess(exec.Command(args[0], append(args[1:], path)...), func(err error) tea.Msg {
		return editedMsg{path: path, err: err}
	})
}

// edited takes the cell back from $EDITOR; an error leaves it unchanged.
func (p *EditorPane) edited(msg editedMsg) error {
	defer p.render()
	defer os.Remove(msg.path)
	if msg.err != nil {
		return fmt.Errorf("the editor failed, the cell is unchanged: %w", msg.err)
	}
	b, err := os.ReadFile(msg.path)
	if err != nil {
		return err
	}
	p.area.SetValue(strings.TrimRight(string(b), "\n"))
	return nil
}

// cursor is the cursor's place in the text, in characters, and the place
// its line starts at.
func (p *EditorPane) cursor() (at, lineStart int) {
	lines := strings.Split(p.area.Value(), "\n")
	row := min(p.area.Line(), len(lines)-1)
	for _, l := range lines[:row] {
		lineStart += utf8.RuneCountInString(l) + 1
	}
	li := p.area.LineInfo()
	return lineStart + li.StartColumn + li.ColumnOffset, lineStart
}

// wordAtCursor says whether the cursor follows a word (a name, an
// attribute's dot, a string being typed): tab completes there.
func (p *EditorPane) wordAtCursor() (code string, cursor int, ok bool) {
	code = p.area.Value()
	cursor, lineStart := p.cursor()
	runes := []rune(code)
	if cursor <= lineStart || cursor > len(runes) {
		return "", 0, false
	}
	c := runes[cursor-1]
	return code, cursor, c == '_' || c == '.' || c == '/' || c == '\'' || c == '"' || unicode.IsLetter(c) || unicode.IsDigit(c)
}

// complete applies a kernel's completion if the cell is as it was asked:
// one match replaces the word, several put in what they share; it says
// what happened, for the status line.
func (p *EditorPane) complete(msg completionsMsg) string {
	defer p.render()
	at, lineStart := p.cursor()
	if p.area.Value() != msg.ask.code || at != msg.ask.cursor || p.form != nil {
		return "" // typed on since: the answer is stale
	}
	runes := []rune(msg.ask.code)
	if msg.c.Start < lineStart || msg.c.Start > msg.ask.cursor {
		return ""
	}
	typed := string(runes[msg.c.Start:msg.ask.cursor])
	var matches []string
	for _, m := range msg.c.Matches {
		if strings.HasPrefix(m, typed) && m != typed {
			matches = append(matches, m)
		}
	}
	if len(matches) == 0 {
		return "no completions"
	}
	add := matches[0]
	for _, m := range matches[1:] {
		for !strings.HasPrefix(m, add) {
			_, size := utf8.DecodeLastRuneInString(add)
			add = add[:len(add)-size]
		}
	}
	p.area.InsertString(strings.TrimPrefix(add, typed))
	if len(matches) == 1 {
		return ""
	}
	shown := matches[:min(len(matches), 12)]
	more := ""
	if len(matches) > len(shown) {
		more = fmt.Sprintf(" … %d more", len(matches)-len(shown))
	}
	return "tab: " + strings.Join(shown, "  ") + more
}

// TakesTab says whether tab goes to the editor (it indents) rather than
// to the next pane.
func (p *EditorPane) TakesTab() bool { return p.form == nil && p.area.Value() != "" }

// currentLine is line row of text.
func currentLine(text string, row int) string {
	lines := strings.Split(text, "\n")
	if row < 0 || row >= len(lines) {
		return ""
	}
	return lines[row]
}

// nextIndent is the indent of the line after line: the same, four more
// spaces after a line ending in ':'.
func nextIndent(line string) string {
	indent := line[:len(line)-len(strings.TrimLeft(line, " \t"))]
	if code, _, _ := strings.Cut(line, "#"); strings.HasSuffix(strings.TrimRight(code, " \t"), ":") {
		indent += "    "
	}
	return indent
}

// Title implements Pane.
func (p *EditorPane) Title() string { return "Cell" }

// ShortHelp implements help.KeyMap.
func (p *EditorPane) ShortHelp() []key.Binding {
	k := p.ctx.Keys
	// The way out (and so to ? help) comes early: narrow windows cut the rest.
	return []key.Binding{k.Run, k.Leave, k.HistPrev, k.NewTarget, k.External, helpOnly("ctrl+c", "clear/interrupt")}
}

// FullHelp implements help.KeyMap.
func (p *EditorPane) FullHelp() [][]key.Binding {
	return [][]key.Binding{append(p.keys.bindings(), p.ctx.Keys.Leave, p.ctx.Keys.Interrupt)}
}

// Typing implements Pane: every key the editor understands is text.
func (p *EditorPane) Typing() bool { return true }

// Modal implements Pane: the target form takes tab itself.
func (p *EditorPane) Modal() bool { return p.form != nil }

// SetSize sets the pane's outer size.
func (p *EditorPane) SetSize(w, h int) {
	defer p.render()
	p.width, p.height = w, h
	p.area.SetWidth(max(1, w-2))
	p.area.SetHeight(max(1, h-3))
	if p.form != nil {
		p.form.setWidth(w - 2)
	}
}

// Focus implements Pane.
func (p *EditorPane) Focus() tea.Cmd {
	defer p.render()
	p.focused = true
	return p.area.Focus()
}

// Blur implements Pane.
func (p *EditorPane) Blur() {
	defer p.render()
	p.focused = false
	p.area.Blur()
}

// SetTarget points the editor at another kernel key.
func (p *EditorPane) SetTarget(t Target) { p.target = t; p.render() }

// Target is where the next cell runs.
func (p *EditorPane) Target() Target { return p.target }

// runCell asks the root to run the editor's code and clears the editor.
func (p *EditorPane) runCell() tea.Cmd {
	code := p.area.Value()
	if strings.TrimSpace(code) == "" {
		return nil
	}
	p.remember(code)
	p.area.Reset()
	t := p.target
	return func() tea.Msg { return runCellMsg{target: t, code: code} }
}

// clear empties the editor into the history, where ctrl+p finds it; it
// says whether there was text to clear.
func (p *EditorPane) clear() bool {
	code := p.area.Value()
	if code == "" || p.form != nil {
		return false
	}
	defer p.render()
	p.remember(code)
	p.area.Reset()
	return true
}

// restore puts a failed cell's code back in an empty editor still aimed
// at the cell's target.
func (p *EditorPane) restore(t Target, code string) {
	if p.area.Value() != "" || p.form != nil || p.target.String() != t.String() {
		return
	}
	defer p.render()
	p.area.SetValue(code)
	p.failed = code
}

// heldFailed says whether the editor holds, unchanged, a failed cell that
// restore put back: what is typed now goes into it.
func (p *EditorPane) heldFailed() bool {
	return p.failed != "" && p.area.Value() == p.failed
}

// remember adds code to the end of the history, once.
func (p *EditorPane) remember(code string) {
	if len(p.history) == 0 || p.history[len(p.history)-1] != code {
		p.history = append(p.history, code)
	}
	p.histPos, p.draft = len(p.history), ""
}

// historyStep moves through the history (-1 older, +1 newer); the cell
// being written is kept as the draft.
func (p *EditorPane) historyStep(d int) {
	switch {
	case d < 0 && p.histPos > 0:
		if p.histPos == len(p.history) {
			p.draft = p.area.Value()
		}
		p.histPos--
		p.area.SetValue(p.history[p.histPos])
	case d > 0 && p.histPos < len(p.history):
		p.histPos++
		if p.histPos == len(p.history) {
			p.area.SetValue(p.draft)
		} else {
			p.area.SetValue(p.history[p.histPos])
		}
	}
}

// Update edits, runs (ctrl+r), browses history and opens the target form.
func (p *EditorPane) Update(msg tea.Msg) tea.Cmd {
	defer p.render()
	if p.form != nil {
		done, t, cmd := p.form.update(msg)
		if done {
			if t != nil {
				p.target = *t
			}
			p.form = nil
			return p.area.Focus()
		}
		return cmd
	}
	if km, isKey := msg.(tea.KeyMsg); isKey {
		if cmd, ok := p.keys.handle(km); ok {
			return cmd
		}
	}
	var cmd tea.Cmd
	p.area, cmd = p.area.Update(msg)
	return cmd
}

// View is the pane as last drawn.
func (p *EditorPane) View() string { return p.view }

// render draws the target line and the text area, or the target form; it
// runs after every change to them.
func (p *EditorPane) render() {
	t := p.ctx.Theme
	lines := []string{t.Muted.Render("target ") + t.Bold.Render(plain(p.target.String()))}
	if p.form != nil {
		lines = append(lines, p.form.view()...)
	} else {
		lines = append(lines, strings.Split(p.area.View(), "\n")...)
	}
	p.view = p.ctx.box(p.Title(), lines, p.width, p.height, p.focused)
}

// targetForm picks a new target: owner, task, backend, tools.
type targetForm struct {
	ctx      *Context
	inputs   [4]textinput.Model
	cur      int
	backends []string
	err      string
}

var formLabels = [4]string{"owner  ", "task   ", "backend", "tools  "}

func newTargetForm(ctx *Context, cur Target, width int) *targetForm {
	f := &targetForm{ctx: ctx}
	vals := [4]string{cur.Owner, cur.Task, cur.Backend, strings.Join(cur.Tools, ",")}
	for i := range f.inputs {
		in := textinput.New()
		in.Prompt = formLabels[i] + " "
		in.SetValue(vals[i])
		f.inputs[i] = in
	}
	f.inputs[3].Placeholder = "comma-separated, e.g. read_file,terminal"
	f.setWidth(width)
	return f
}

func (f *targetForm) setWidth(w int) {
	for i := range f.inputs {
		f.inputs[i].Width = max(1, w-len(formLabels[i])-2)
	}
}

func (f *targetForm) focusField() tea.Cmd {
	for i := range f.inputs {
		f.inputs[i].Blur()
	}
	return f.inputs[f.cur].Focus()
}

// update returns done with the new target (nil when cancelled).
func (f *targetForm) update(msg tea.Msg) (bool, *Target, tea.Cmd) {
	if km, ok := msg.(tea.KeyMsg); ok {
		keys := f.ctx.Keys
		switch {
		case key.Matches(km, keys.Cancel):
			return true, nil, nil
		case key.Matches(km, keys.Focus), km.String() == "down":
			f.cur = (f.cur + 1) % len(f.inputs)
			return false, nil, f.focusField()
		case key.Matches(km, keys.FocusBack), km.String() == "up":
			f.cur = (f.cur + len(f.inputs) - 1) % len(f.inputs)
			return false, nil, f.focusField()
		case key.Matches(km, keys.Submit):
			t, err := f.target()
			if err != nil {
				f.err = err.Error()
				return false, nil, nil
			}
			return true, &t, nil
		}
	}
	var cmd tea.Cmd
	f.inputs[f.cur], cmd = f.inputs[f.cur].Update(msg)
	return false, nil, cmd
}

func (f *targetForm) target() (Target, error) {
	v := func(i int) string { return strings.TrimSpace(f.inputs[i].Value()) }
	t := Target{Owner: v(0), Task: v(1), Backend: v(2)}
	if t.Owner == "" || t.Task == "" {
		return t, fmt.Errorf("owner and task must not be empty")
	}
	if len(f.backends) > 0 && !slices.Contains(f.backends, t.Backend) {
		return t, fmt.Errorf("backend %q is not configured; use one of %s", t.Backend, strings.Join(f.backends, ", "))
	}
	for tool := range strings.SplitSeq(v(3), ",") {
		if tool = strings.TrimSpace(tool); tool != "" {
			t.Tools = append(t.Tools, tool)
		}
	}
	slices.Sort(t.Tools)
	t.Tools = slices.Compact(t.Tools)
	return t, nil
}

func (f *targetForm) view() []string {
	var lines []string
	for i := range f.inputs {
		lines = append(lines, f.inputs[i].View())
	}
	if f.err != "" {
		lines = append(lines, f.ctx.Theme.Error.Render(f.err))
	} else {
		lines = append(lines, f.ctx.Theme.Muted.Render("enter: use this target · esc: cancel · tab: next field"))
	}
	return lines
}
