package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/term"

	"github.com/kerneldeck/kerneldeck/client"
	"github.com/kerneldeck/kerneldeck/config"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/headless"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/internal/termimage"
	"github.com/kerneldeck/kerneldeck/replay"
	"github.com/kerneldeck/kerneldeck/server"
	"github.com/kerneldeck/kerneldeck/themes"
	"github.com/kerneldeck/kerneldeck/ui"
	"github.com/kerneldeck/kerneldeck/wire"
)

const dashboardIntro = `Usage: kerneldeck [flags]
       kerneldeck --attach [PATH | ssh://[user@]host[/PATH]] [flags]

Opens the dashboard on the embedded engine: live kernels per owner with their
timers (running time, idle time, countdown to idle reap), the cap and which
kernel is next in line for eviction, a cell editor, the output of the
selected kernel's cells (also those other clients run), the engine's event
stream with the reason for every reap and eviction (the last hour first),
and prompts for tool calls that need approval. The embedded engine is served
on a socket too, so agents can join it with 'kerneldeck headless --connect'.
With --attach it opens on a shared engine instead ('kerneldeck serve', or
another dashboard's), here or over ssh, and quitting leaves it running.
Started with no engine settings while an engine already serves the default
socket, it attaches to that one (the header says so); --own-engine opens an
engine of its own all the same.

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
	eng          engineFlags
	theme        string
	replay       string
	replayPaused bool
	mouse        bool
	replaySpeed  float64
	attach       string
	attachedHere bool // attached to the engine found on the default socket, unasked
	ownEngine    bool
	listen       string
	images       string
}

func newDashboardCmd() *dashboardCmd { return &dashboardCmd{} }

// dashboardFPS is how often the renderer looks for a new frame. Bubble
// Tea's 60 wakes an idle dashboard 60 times a second; at 10 it stays under
// half a percent of a core (go run ./bench -phases dashboard), and a key
// shows within 100 ms.
const dashboardFPS = 10

// programOptions are the Bubble Tea options: the alternate screen, the
// terminal, the frame rate, and the mouse only when asked for.
func (c *dashboardCmd) programOptions(in io.Reader, out io.Writer) []tea.ProgramOption {
	opts := []tea.ProgramOption{tea.WithAltScreen(), tea.WithInput(in), tea.WithOutput(out), tea.WithFPS(dashboardFPS)}
	if c.mouse {
		opts = append(opts, tea.WithMouseCellMotion())
	}
	return opts
}

// registerOwn defines the dashboard's own flags (not the engine's).
func (c *dashboardCmd) registerOwn(fs *flagSet) {
	fs.section("Dashboard flags:")
	fs.Func("theme", "dark (default), light or high-contrast: the colour `NAME`; theme in the config file sets the "+
		"default. NO_COLOR turns colour off", func(s string) error { c.theme = s; return nil })
	fs.Path(&c.replay, "replay", "feed a `FILE` of headless requests (one JSON object per line, see 'kerneldeck help "+
		"headless'; a line may also carry \"after_ms\": wait that long before sending it) into the engine while the "+
		"dashboard shows it, from its first frame, e.g. examples/eviction.jsonl; p pauses and resumes it, n sends one "+
		"request while paused")
	imagesFlag(fs, &c.images, "in the output pane", "; s saves the images, o opens them with the system's viewer")
	fs.Bool(&c.mouse, "mouse", "let the mouse select kernels (click) and scroll (wheel); off by default, so the "+
		"terminal's own selection and copy keep working")
	fs.Bool(&c.replayPaused, "replay-paused", "start the --replay paused: n sends the requests one by one, p runs the rest")
	fs.Func("replay-speed", "scale the --replay's after_ms delays by `FACTOR`: 2 is twice as fast, 0.5 half (default 1)",
		func(v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 || f > 1000 {
				return fmt.Errorf("%q is not a factor above 0 and up to 1000, e.g. 0.5 or 2", v)
			}
			c.replaySpeed = f
			return nil
		})
	fs.Optional(&c.attach, "attach", "open the dashboard on "+connectTarget+", instead of an engine of its own; "+
		"quitting leaves that engine and its kernels alone")
	fs.Bool(&c.ownEngine, "own-engine", "open an engine of this dashboard's own even when one already serves the "+
		"default socket (by default the dashboard, started with no engine settings, attaches to that one)")
	fs.Func("listen", "serve the dashboard's engine to agents ('kerneldeck headless --connect') and other dashboards on "+
		"the socket `PATH`, or none (default $XDG_RUNTIME_DIR/kerneldeck/engine.sock, else <state dir>/engine.sock)",
		func(s string) error {
			if s == "" {
				return errors.New("it needs a socket path, or none")
			}
			c.listen = s
			return nil
		})
}

func (c *dashboardCmd) flags() *flagSet {
	fs := newFlagSet("kerneldeck")
	c.registerOwn(fs)
	c.eng.register(fs)
	return fs
}

func dashboardMode() mode {
	return newMode("", "open the dashboard (needs a terminal)", dashboardIntro, dashboardEpilogue, func() command { return newDashboardCmd() })
}

func (c *dashboardCmd) run(args []string, std stdio, help func(io.Writer)) int {
	r, code, ok := startMode("kerneldeck", c.flags(), &c.eng, args, std, help)
	if !ok {
		return code
	}
	if attach, err := r.connects("attach", "theme", "config", "images"); err != nil {
		return r.usage(err)
	} else if attach {
		if c.replay != "" || c.listen != "" || c.replayPaused || c.replaySpeed != 0 {
			return r.usage(errors.New("--replay and --listen are for a dashboard with an engine of its own; with --attach, feed that engine with 'kerneldeck headless --connect'"))
		}
		return c.runAttached(std)
	}
	s, code, ok := r.settings()
	if !ok {
		return code
	}
	if c.replay != "" && c.eng.stateDir == "" {
		// A replay is a show of its own: it neither lists nor restores
		// what earlier runs parked, nor leaves anything for later ones.
		scratch, err := os.MkdirTemp("", "kerneldeck-replay-")
		if err != nil {
			return r.fail(fmt.Errorf("--replay: a state dir of its own: %w", err))
		}
		defer os.RemoveAll(scratch)
		s.stateDir = scratch
	}
	if path, ok := c.engineServingHere(s.stateDir); ok {
		c.attach, c.attachedHere = path, true
		return c.runAttached(std)
	}
	theme, err := c.themeFor(s.cfg.Theme)
	if err != nil {
		return r.usage(err)
	}
	var feed *replay.Feed
	if c.replay != "" {
		f, err := os.Open(c.replay)
		if err != nil {
			return r.usage(fmt.Errorf("--replay: %w", err))
		}
		feed, err = replay.Load(f, cmp.Or(c.replaySpeed, 1), c.replayPaused)
		f.Close()
		if err != nil {
			return r.usage(fmt.Errorf("--replay %s: %w", c.replay, err))
		}
	} else if c.replayPaused || c.replaySpeed != 0 {
		return r.usage(errors.New("--replay-paused and --replay-speed steer a --replay FILE; give one"))
	}
	in, out, err := terminal(std)
	if err != nil {
		return r.usage(err)
	}
	if c.listen != "none" {
		s.socket = cmp.Or(c.listen, wire.SocketPath(s.stateDir))
	}
	le, code, ok := r.openEngine(s)
	if !ok {
		return code
	}
	le.takeKept(context.Background(), false)
	eng := le.Engine

	// The dashboard's engine is served too, so agents started with
	// 'headless --connect' land here; not serving is said, not fatal.
	where := ""
	var srv *server.Server
	if c.listen != "none" {
		path := cmp.Or(c.listen, wire.SocketPath(s.stateDir))
		if srv, err = server.Listen(eng, server.Options{Path: path, Version: versionString()}); err != nil {
			fmt.Fprintf(std.err, "kerneldeck: not serving this dashboard's engine: %v (--listen none says not to)\n", err)
			where = "not serving"
		} else {
			go srv.Serve()
			where = "serving at " + path
		}
	}
	sub := eng.SubscribeWith(engine.SubscribeOptions{Buffer: 4096, Output: true, Since: time.Now().Add(-historyShown)})
	opts := ui.Options{Engine: ui.Embedded{Engine: eng}, Events: sub.C, History: sub.History, Theme: theme,
		User: os.Getenv("USER"), Where: where, KeepsKernels: c.eng.keep, Clipboard: out, SaveDir: workingDir()}
	c.imageOptions(&opts, s.stateDir)
	firstFrame := make(chan struct{})
	if feed != nil {
		// A replay shows what it makes happen: an earlier run's events
		// would read as part of it.
		opts.Replay, opts.History = feed, nil
		opts.OnFirstFrame = func() { close(firstFrame) }
	}
	m := ui.New(opts)
	p := tea.NewProgram(m, c.programOptions(in, out)...)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	go func() {
		<-ctx.Done()
		p.Quit()
	}()
	if feed != nil {
		// The replay starts with the first frame, so the operator sees it
		// from its first request; it is fed through a pipe at its pace.
		pr, pw := io.Pipe()
		go func() {
			select {
			case <-firstFrame:
				pw.CloseWithError(feed.Run(ctx, pw))
			case <-ctx.Done():
				pw.Close()
			}
		}()
		go headless.Serve(ctx, eng, pr, io.Discard, headless.Options{Version: versionString()})
	}
	_, runErr := p.Run()
	m.Close()
	stop()
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		srv.Shutdown(ctx, "the dashboard that runs this engine quit")
		cancel()
	}

	n, closeErr := le.close()
	sub.Close()
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

// engineServingHere returns the default socket when an engine answers
// there and this dashboard would only open a second, empty one beside it:
// no --own-engine, --listen or --replay, and no engine settings given.
func (c *dashboardCmd) engineServingHere(stateDir string) (string, bool) {
	if c.ownEngine || c.listen != "" || c.replay != "" || checkConnectFlags(&c.eng, "attach", "theme", "config", "images") != nil {
		return "", false
	}
	path := wire.SocketPath(stateDir)
	// Only a socket of this user's (or root's) is taken for this user's
	// engine, unasked.
	var st syscall.Stat_t
	if syscall.Lstat(path, &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK || (st.Uid != uint32(os.Getuid()) && st.Uid != 0) {
		return "", false
	}
	conn, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return "", false
	}
	conn.Close()
	return path, true
}

// historyShown is how far back a dashboard's events pane starts.
const historyShown = time.Hour

// dashboardBatch is how long an attached dashboard lets the engine hold
// events to send them together: invisible to a person, and one wake-up
// per batch rather than per event when cells run back to back.
const dashboardBatch = 50 * time.Millisecond

// terminal returns the terminal the dashboard draws on, or why there is none.
func terminal(std stdio) (in, out *os.File, err error) {
	in, inOK := std.in.(*os.File)
	out, outOK := std.out.(*os.File)
	if !inOK || !outOK || !term.IsTerminal(in.Fd()) || !term.IsTerminal(out.Fd()) {
		return nil, nil, errors.New("the dashboard needs a terminal; for pipes use 'kerneldeck repl' or 'kerneldeck headless'")
	}
	return in, out, nil
}

// themeFor builds the --theme, else the config's theme.
func (c *dashboardCmd) themeFor(configured string) (*themes.Theme, error) {
	name := cmp.Or(c.theme, configured)
	theme, err := themes.New(name, themes.Options{NoColor: themes.NoColorFromEnv()})
	if err != nil {
		return nil, fmt.Errorf("--theme: %w", err)
	}
	return theme, nil
}

// runAttached is the dashboard on an engine elsewhere: quitting detaches.
func (c *dashboardCmd) runAttached(std stdio) int {
	usageErr, fail := reporters(std.err, "kerneldeck")
	cfg, err := config.Load(c.eng.config)
	if err != nil {
		return usageErr(err)
	}
	theme, err := c.themeFor(cfg.Theme)
	if err != nil {
		return usageErr(err)
	}
	in, out, err := terminal(std)
	if err != nil {
		return usageErr(err)
	}
	copts := client.Options{Since: historyShown, Output: true, Batch: dashboardBatch}
	cl, err := dialEngine(context.Background(), &c.eng, c.attach, copts)
	if err != nil {
		if c.attachedHere {
			err = fmt.Errorf("an engine serves the default socket, but attaching to it failed: %w; --own-engine opens an engine of this dashboard's own", err)
		}
		return fail(err)
	}
	opts := ui.Options{Engine: cl, Events: cl.Events(), Theme: theme, User: os.Getenv("USER"),
		Where: attachedTo(cl), Lost: cl.Err, Reconnects: true, KeepsKernels: true, Clipboard: out, SaveDir: workingDir()}
	stateDir := c.eng.stateDir
	if stateDir == "" {
		stateDir, _ = config.DefaultStateDir()
	}
	c.imageOptions(&opts, stateDir)
	m := ui.New(opts)
	p := tea.NewProgram(m, c.programOptions(in, out)...)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	go func() {
		<-ctx.Done()
		p.Quit()
	}()
	loop, endLoop := context.WithCancel(context.Background())
	last := make(chan *client.Client, 1)
	go func() { last <- c.reattach(loop, p, cl, copts) }()
	_, runErr := p.Run()
	endLoop()
	cl = <-last
	defer cl.Close()
	m.Close()
	if runErr != nil {
		return fail(runErr)
	}
	if err := cl.Err(); err != nil {
		fmt.Fprintf(std.err, "kerneldeck: the engine at %s went away (%v); what became of its kernels is not known here\n", cl.Where(), err)
		return exitOK
	}
	fmt.Fprintf(std.err, "kerneldeck: detached from the engine at %s; its kernels keep running there\n", cl.Where())
	return exitOK
}

// attachedTo is what the header says of an attached dashboard's engine.
func attachedTo(cl *client.Client) string { return "attached to " + cl.Where() }

// reattach dials the engine again whenever cl, its connection, ends,
// waiting longer after each failure (as every client does: client.RedialFirst
// doubling to RedialMost, but for as long as it runs), and hands the
// dashboard each new connection; when ctx ends it returns the connection
// in use, for the caller to close.
func (c *dashboardCmd) reattach(ctx context.Context, p *tea.Program, cl *client.Client, opts client.Options) *client.Client {
	for {
		select {
		case <-cl.Done():
		case <-ctx.Done():
			return cl
		}
		for wait := client.RedialFirst; ; wait = min(2*wait, client.RedialMost) {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return cl
			}
			next, err := dialEngine(ctx, &c.eng, c.attach, opts)
			if err != nil {
				continue
			}
			cl.Close()
			cl = next
			p.Send(ui.Reattached{Engine: next, Events: next.Events(), Lost: next.Err, Where: attachedTo(next)})
			break
		}
	}
}

// imageOptions sets how the output pane draws images (--images) and what o
// opens them with: xdg-open (open on macOS), from <state dir>/images.
func (c *dashboardCmd) imageOptions(opts *ui.Options, stateDir string) {
	opts.Images, _ = termimage.Parse(c.images, os.Getenv) // checked when the flag was read
	viewer := "xdg-open"
	if runtime.GOOS == "darwin" {
		viewer = "open"
	}
	path, err := exec.LookPath(viewer)
	if err != nil || stateDir == "" {
		return
	}
	opts.OpenDir = filepath.Join(stateDir, "images")
	opts.Open = func(file string) error {
		// The viewer runs on its own: nothing of it reaches the dashboard's
		// terminal, and it is waited for only to be reaped.
		cmd := exec.Command(path, file)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", viewer, err)
		}
		go cmd.Wait()
		return nil
	}
}

// workingDir is where the dashboard saves images (s in the output pane): the
// directory it was started in, or nowhere when that cannot be known.
func workingDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	return wd
}
