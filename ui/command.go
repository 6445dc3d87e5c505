package ui

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/charmbracelet/bubbles/key"
	"github.com/charmbracelet/bubbles/textinput"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/kerneldeck/kerneldeck/engine"
)

// commandLine is the : prompt (k9s's command mode): a command, completed
// with tab, run with enter; an error stays on the line to be fixed.
type commandLine struct {
	in  textinput.Model
	err string
	// hist is the place in the model's command history that up and down
	// reached (its length: the new line); draft is that new line.
	hist  int
	draft string
}

// maxCommandHistory bounds the : commands remembered.
const maxCommandHistory = 100

// commands are the : commands, with their arguments for the help.
var commands = []struct{ name, args, help string }{
	{"cap", "N", "set max_kernels now"},
	{"idle", "DURATION", "set idle_exit now (e.g. 10m)"},
	{"kill", "ID|OWNER/TASK", "kill a kernel (asks first)"},
	{"owner", "NAME", "run the editor's cells as NAME"},
	{"filter", "TEXT", "filter the kernels list (as /)"},
	{"detail", "ID|OWNER/TASK", "open a kernel's detail"},
	{"park", "ID|OWNER/TASK", "park an idle kernel now: its state waits for its key's next cell"},
	{"unpark", "OWNER/TASK|ID", "restore a parked state now (as the key's next cell would)"},
	{"drop", "OWNER/TASK|ID", "drop a parked state (asks first)"},
}

func (m *Model) openCommand() tea.Cmd {
	in := textinput.New()
	in.Prompt = ":"
	in.Placeholder = "cap 3, idle 10m, kill ID, owner alice, filter etl, detail ID, park ID (tab completes, ↑ recalls)"
	c := &commandLine{in: in, hist: len(m.cmdHistory)}
	m.layers.open(c)
	return c.in.Focus()
}

// onCommandKey handles the keys while the : line c is open.
func (m *Model) onCommandKey(c *commandLine, km tea.KeyMsg) tea.Cmd {
	keys := m.ctx.Keys
	switch {
	case key.Matches(km, keys.Cancel):
		m.layers.close(layerCommand)
		return nil
	case key.Matches(km, keys.Submit):
		line := c.in.Value()
		cmd, err := m.runCommand(line)
		if err != nil {
			c.err = err.Error()
			return nil
		}
		if line = strings.TrimSpace(line); line != "" && (len(m.cmdHistory) == 0 || m.cmdHistory[len(m.cmdHistory)-1] != line) {
			m.cmdHistory = append(m.cmdHistory, line)
			if len(m.cmdHistory) > maxCommandHistory {
				m.cmdHistory = m.cmdHistory[1:]
			}
		}
		m.layers.close(layerCommand)
		return cmd
	case km.Type == tea.KeyUp || km.Type == tea.KeyDown:
		// Arrows only: k and j are letters of commands.
		if c.hist == len(m.cmdHistory) {
			c.draft = c.in.Value()
		}
		if km.Type == tea.KeyUp {
			c.hist = max(0, c.hist-1)
		} else {
			c.hist = min(len(m.cmdHistory), c.hist+1)
		}
		if c.hist == len(m.cmdHistory) {
			c.in.SetValue(c.draft)
		} else {
			c.in.SetValue(m.cmdHistory[c.hist])
		}
		c.in.CursorEnd()
		c.err = ""
		return nil
	case key.Matches(km, keys.Focus):
		c.in.SetValue(m.complete(c.in.Value()))
		c.in.CursorEnd()
		return nil
	}
	var cmd tea.Cmd
	c.in, cmd = c.in.Update(km)
	c.err = ""
	return cmd
}

// complete extends line to the longest common prefix of what could come
// next: a command name, or a kernel id, owner/task or owner.
func (m *Model) complete(line string) string {
	name, arg, hasArg := strings.Cut(line, " ")
	var cands []string
	prefix := line
	if !hasArg {
		for _, c := range commands {
			cands = append(cands, c.name+" ")
		}
	} else {
		prefix = arg
		for _, k := range m.kernels.kernels {
			switch name {
			case "kill", "detail", "park":
				cands = append(cands, k.ID, k.Owner+"/"+k.Task)
			case "owner":
				cands = append(cands, k.Owner)
			}
		}
		if name == "unpark" || name == "drop" {
			for _, pk := range m.kernels.parked {
				cands = append(cands, pk.Owner+"/"+pk.Task, pk.Kernel)
			}
		}
	}
	var match []string
	for _, c := range cands {
		if strings.HasPrefix(c, prefix) && !slices.Contains(match, c) {
			match = append(match, c)
		}
	}
	if len(match) == 0 {
		return line
	}
	common := match[0]
	for _, c := range match[1:] {
		for !strings.HasPrefix(c, common) {
			common = common[:len(common)-1]
		}
	}
	if hasArg {
		return name + " " + common
	}
	return common
}

// runCommand runs one : command; an error says what to type instead.
func (m *Model) runCommand(line string) (tea.Cmd, error) {
	name, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	arg = strings.TrimSpace(arg)
	need := func(what string) error {
		if arg == "" {
			return fmt.Errorf(":%s needs %s", name, what)
		}
		return nil
	}
	switch name {
	case "":
		return nil, nil
	case "cap":
		n, err := strconv.Atoi(arg)
		if err != nil || n < 1 {
			return nil, fmt.Errorf(":cap needs a whole number of kernels, at least 1 (got %q)", arg)
		}
		err = m.eng.SetLimits(&n, nil)
		m.setStatus(fmt.Sprintf("max_kernels %d", n), err)
		m.refresh()
		return nil, nil
	case "idle":
		d, err := time.ParseDuration(arg)
		if err != nil || d < time.Second {
			return nil, fmt.Errorf(":idle needs a duration of at least 1s, e.g. 10m or 90s (got %q)", arg)
		}
		err = m.eng.SetLimits(nil, &d)
		m.setStatus("idle_exit "+short(d), err)
		m.refresh()
		return nil, nil
	case "park":
		if err := need("a kernel: its id or owner/task (tab completes)"); err != nil {
			return nil, err
		}
		k, ok := m.findKernel(arg)
		if !ok {
			return nil, fmt.Errorf("no kernel %q: give an id or owner/task from the list (tab completes)", arg)
		}
		return parkAct(m.action, k), nil
	case "unpark", "drop":
		if err := need("a parked state: owner/task or the id it was parked from (tab completes)"); err != nil {
			return nil, err
		}
		pk, ok := m.findParked(arg)
		if !ok {
			return nil, fmt.Errorf("no parked state %q: give an owner/task or id from the list's parked rows (tab completes)", arg)
		}
		if name == "drop" {
			m.ctx.ask(m.ctx.Keys.DropParked.question(fmt.Sprintf("%s (parked from %s)", parkedName(pk), plain(pk.Kernel))), dropAct(m.action, pk))
			return nil, nil
		}
		req := engine.Request{Owner: pk.Owner, Task: pk.Task, Backend: pk.Backend, Child: pk.Child, Code: "pass"}
		return m.action("restored "+parkedName(pk), func(c context.Context, eng Engine) error {
			res, err := eng.Execute(c, req)
			if err == nil && (res.Kernel == nil || !res.Kernel.StateRestored) {
				note := "no kernel"
				if res.Kernel != nil {
					note = res.Kernel.Note
				}
				err = fmt.Errorf("not restored: %s", cmp.Or(note, "the parked state was gone"))
			}
			return err
		}), nil
	case "kill", "detail":
		if err := need("a kernel: its id or owner/task (tab completes)"); err != nil {
			return nil, err
		}
		k, ok := m.findKernel(arg)
		if !ok {
			return nil, fmt.Errorf("no kernel %q: give an id or owner/task from the list (tab completes)", arg)
		}
		if name == "detail" {
			m.layers.open(&kernelDetail{id: k.ID})
			delete(m.cellsAsked, k.ID)
			return m.fetchCells(k.ID), nil
		}
		m.ctx.ask(m.ctx.Keys.Kill.question(kernelSubject(k)), killAct(m.action, k))
		return nil, nil
	case "owner":
		if err := need("an owner name"); err != nil {
			return nil, err
		}
		t := m.editor.Target()
		t.Owner = arg
		m.retarget(t)
		m.setStatus("cells now run as "+arg, nil)
		return m.targetFetch(), nil
	case "filter":
		m.kernels.setFilter(arg)
		return nil, nil
	}
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name + " " + c.args
	}
	return nil, fmt.Errorf("unknown command %q; commands: %s", name, strings.Join(names, ", "))
}

// findKernel is the kernel with id s, else the first listed as owner/task s.
func (m *Model) findKernel(s string) (k engine.KernelInfo, ok bool) {
	for _, k := range m.kernels.kernels {
		if k.ID == s {
			return k, true
		}
	}
	for _, k := range m.kernels.kernels {
		if k.Owner+"/"+k.Task == s {
			return k, true
		}
	}
	return engine.KernelInfo{}, false
}

// findParked is the parked state parked from kernel id s, else the first
// listed as owner/task s.
func (m *Model) findParked(s string) (engine.ParkedKernel, bool) {
	for _, pk := range m.kernels.parked {
		if pk.Kernel == s {
			return pk, true
		}
	}
	for _, pk := range m.kernels.parked {
		if pk.Owner+"/"+pk.Task == s {
			return pk, true
		}
	}
	return engine.ParkedKernel{}, false
}

// commandView is the : line c, with its error.
func (m *Model) commandView(c *commandLine) string {
	v := c.in.View()
	if c.err != "" {
		v += "  " + m.ctx.Theme.Error.Render(plain(c.err))
	}
	return v
}
