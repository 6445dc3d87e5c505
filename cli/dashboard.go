package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/term"

	"github.com/kerneldeck/kerneldeck/headless"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/themes"
	"github.com/kerneldeck/kerneldeck/ui"
)

const dashboardIntro = `Usage: kerneldeck [flags]

Opens the dashboard on the embedded engine: live kernels per owner with their
timers (running time, idle time, countdown to idle reap), the cap and which
kernel is next in line for eviction, a cell editor, the output of the
selected kernel's cells, the engine's event stream with the reason for every
reap and eviction, and prompts for tool calls that need approval.

`

const dashboardEpilogue = `
Keys: the help line at the bottom shows the keys of the focused pane; ? shows
them all. tab cycles focus (cell editor, kernels, output, events). In the
editor ctrl+r runs the cell in the target shown above it, ctrl+p/ctrl+n walk
the history and ctrl+t picks a new target (owner, task, backend, tools). In
the kernels list enter targets the selected kernel, space folds an owner, r
resets, i interrupts, x kills the kernel and X shuts down its owner; +/-
change the cap and [/] idle_exit at once, so you can watch eviction happen.
ctrl+c interrupts the target's running cell, or quits when none runs; q quits
outside the editor. Quitting asks first only while cells are running.
`

// dashboardCmd is kerneldeck with no command: the dashboard.
type dashboardCmd struct {
	eng    engineFlags
	theme  string
	replay string
}

func newDashboardCmd() *dashboardCmd { return &dashboardCmd{} }

// registerOwn defines the dashboard's own flags (not the engine's).
func (c *dashboardCmd) registerOwn(fs *flagSet) {
	fs.section("Dashboard flags:")
	fs.Func("theme", "dark (default), light or high-contrast: the colour `NAME`; theme in the config file sets the "+
		"default. NO_COLOR turns colour off", func(s string) error { c.theme = s; return nil })
	fs.Path(&c.replay, "replay", "feed a `FILE` of headless requests (one JSON object per line, see 'kerneldeck help "+
		"headless') into the engine while the dashboard shows it, e.g. examples/eviction.jsonl")
}

func (c *dashboardCmd) flags() *flagSet {
	fs := newFlagSet("kerneldeck")
	c.registerOwn(fs)
	c.eng.register(fs)
	return fs
}

func dashboardMode() mode {
	help := func(w io.Writer) {
		fmt.Fprint(w, dashboardIntro)
		newDashboardCmd().flags().writeHelp(w)
		fmt.Fprint(w, dashboardEpilogue)
	}
	return mode{
		summary: "open the dashboard (needs a terminal)",
		help:    help,
		run:     func(args []string, std stdio) int { return newDashboardCmd().run(args, std, help) },
	}
}

func (c *dashboardCmd) run(args []string, std stdio, help func(io.Writer)) int {
	usageErr, _ := reporters(std.err, "kerneldeck")
	set, done, err := parseMode(c.flags(), args, std, help)
	if done {
		return exitOK
	}
	if err == nil {
		err = c.eng.parsed(set)
	}
	if err != nil {
		return usageErr(err)
	}
	s, err := resolve(&c.eng)
	if err != nil {
		return usageErr(err)
	}
	themeName := c.theme
	if themeName == "" {
		themeName = s.cfg.Theme
	}
	theme, err := themes.New(themeName, themes.Options{NoColor: themes.NoColorFromEnv()})
	if err != nil {
		return usageErr(fmt.Errorf("--theme: %w", err))
	}
	var replay *os.File
	if c.replay != "" {
		if replay, err = os.Open(c.replay); err != nil {
			return usageErr(fmt.Errorf("--replay: %w", err))
		}
		defer replay.Close()
	}
	in, inOK := std.in.(*os.File)
	out, outOK := std.out.(*os.File)
	if !inOK || !outOK || !term.IsTerminal(in.Fd()) || !term.IsTerminal(out.Fd()) {
		return usageErr(errors.New("the dashboard needs a terminal; for pipes use 'kerneldeck repl' or 'kerneldeck headless'"))
	}
	eng, cleanup, code, err := openEngine(&c.eng, s)
	if err != nil {
		fmt.Fprintf(std.err, "kerneldeck: %v\n", err)
		return code
	}
	defer cleanup()
	takeKept(context.Background(), eng, &c.eng, s.stateDir, std.err, "kerneldeck")

	sub := eng.Subscribe(4096)
	m := ui.New(ui.Options{Engine: ui.Embedded{Engine: eng}, Events: sub.C, Theme: theme, User: os.Getenv("USER")})
	p := tea.NewProgram(m, tea.WithAltScreen(), tea.WithInput(in), tea.WithOutput(out))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	go func() {
		<-ctx.Done()
		p.Quit()
	}()
	if replay != nil {
		go headless.Serve(ctx, eng, replay, io.Discard, headless.Options{})
	}
	_, runErr := p.Run()
	m.Close()
	stop()

	n, recordErr, closeErr := closeEngine(eng, s.stateDir, c.eng.keep)
	sub.Close()
	if recordErr != nil {
		fmt.Fprintf(std.err, "kerneldeck: %v; the kernels are not recorded for the next start\n", recordErr)
	}
	switch {
	case runErr != nil:
		fmt.Fprintf(std.err, "kerneldeck: %v\n", runErr)
		return exitFail
	case closeErr != nil:
		fmt.Fprintf(std.err, "kerneldeck: shut down kernels: %v\n", closeErr)
		return exitFail
	case c.eng.keep:
		fmt.Fprintf(std.err, "kerneldeck: left %s running (--keep-kernels); the next kerneldeck with this state dir and --keep-kernels or --adopt takes them over\n", english.Count(n, "kernel"))
	default:
		fmt.Fprintf(std.err, "kerneldeck: killed %s\n", english.Count(n, "kernel"))
	}
	return exitOK
}
