package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/term"

	"github.com/kerneldeck/kerneldeck/headless"
	"github.com/kerneldeck/kerneldeck/themes"
	"github.com/kerneldeck/kerneldeck/ui"
)

const dashboardHelp = `Usage: kerneldeck [flags]

Opens the dashboard on the embedded engine: live kernels per owner with their
timers (running time, idle time, countdown to idle reap), the cap and which
kernel is next in line for eviction, a cell editor, the output of the
selected kernel's cells, the engine's event stream with the reason for every
reap and eviction, and prompts for tool calls that need approval.

Flags (the engine flags of 'kerneldeck headless --help' apply too: --max-kernels,
--idle-exit, --cell-timeout, --config, --state-dir, --workspace, --approve, ...):
  --backend URI            a backend to run kernels on: local (default), or
                           ssh://[user@]host[:port]; repeat it to show several
                           backends in one dashboard
  --theme NAME             dark (default), light or high-contrast; theme in the
                           config file sets the default. NO_COLOR turns colour off
  --keep-kernels           leave the kernels running on their hosts at exit
                           (default: quitting kills every kernel)
  --replay FILE            feed a file of headless requests (one JSON object
                           per line, see 'kerneldeck headless --help') into the
                           engine while the dashboard shows it, e.g.
                           examples/eviction.jsonl

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

// dashboardFlags are the dashboard's own flags, beside the engine flags.
type dashboardFlags struct {
	theme  string
	keep   bool
	replay string
}

func runDashboard(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	usageErr, _ := reporters(stderr, "kerneldeck")
	var d dashboardFlags
	f, err := parseFlags("kerneldeck", args, func(fs *flag.FlagSet) {
		fs.StringVar(&d.theme, "theme", "", "")
		fs.BoolVar(&d.keep, "keep-kernels", false, "")
		fs.StringVar(&d.replay, "replay", "", "")
	})
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, dashboardHelp)
		return exitOK
	}
	if err != nil {
		return usageErr(err)
	}
	s, err := resolve(f)
	if err != nil {
		return usageErr(err)
	}
	themeName := d.theme
	if themeName == "" {
		themeName = s.cfg.Theme
	}
	theme, err := themes.New(themeName, themes.Options{NoColor: themes.NoColorFromEnv()})
	if err != nil {
		return usageErr(fmt.Errorf("--theme: %w", err))
	}
	var replay *os.File
	if d.replay != "" {
		if replay, err = os.Open(d.replay); err != nil {
			return usageErr(fmt.Errorf("--replay: %w", err))
		}
		defer replay.Close()
	}
	in, inOK := stdin.(*os.File)
	out, outOK := stdout.(*os.File)
	if !inOK || !outOK || !term.IsTerminal(in.Fd()) || !term.IsTerminal(out.Fd()) {
		return usageErr(errors.New("the dashboard needs a terminal; for pipes use 'kerneldeck repl' or 'kerneldeck headless'"))
	}
	eng, cleanup, code, err := openEngine(f, s)
	if err != nil {
		fmt.Fprintf(stderr, "kerneldeck: %v\n", err)
		return code
	}
	defer cleanup()
	adoptKept(context.Background(), eng, s.stateDir, stderr, "kerneldeck")

	sub := eng.Subscribe(4096)
	user := os.Getenv("USER")
	m := ui.New(ui.Options{Engine: eng, Events: sub.C, Theme: theme, User: user})
	p := tea.NewProgram(m, tea.WithAltScreen(), tea.WithInput(in), tea.WithOutput(out))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	go func() {
		<-ctx.Done()
		p.Quit()
	}()
	replayDone := make(chan error, 1)
	if replay != nil {
		go func() { replayDone <- headless.Serve(ctx, eng, replay, io.Discard, headless.Options{}) }()
	}
	_, runErr := p.Run()
	m.Close()
	stop()

	closeCtx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	n := len(eng.Kernels())
	if d.keep {
		if err := saveKept(eng, s.stateDir); err != nil {
			fmt.Fprintf(stderr, "kerneldeck: %v; the kernels are not recorded for the next start\n", err)
		}
	}
	closeErr := eng.Close(closeCtx, d.keep)
	sub.Close()
	switch {
	case runErr != nil:
		fmt.Fprintf(stderr, "kerneldeck: %v\n", runErr)
		return exitFail
	case closeErr != nil:
		fmt.Fprintf(stderr, "kerneldeck: shut down kernels: %v\n", closeErr)
		return exitFail
	case d.keep:
		fmt.Fprintf(stderr, "kerneldeck: left %d kernel%s running (--keep-kernels); the next kerneldeck with this state dir adopts them\n", n, plural(n))
	default:
		fmt.Fprintf(stderr, "kerneldeck: killed %d kernel%s\n", n, plural(n))
	}
	return exitOK
}
