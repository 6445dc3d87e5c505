package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/headless"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/internal/readiness"
	"github.com/kerneldeck/kerneldeck/server"
	"github.com/kerneldeck/kerneldeck/wire"
)

const serveIntro = `Usage: kerneldeck serve [flags]

Runs the engine with no UI, on a Unix socket, until SIGTERM or SIGINT. Any
number of clients connect: agents with 'kerneldeck headless --connect' (or
speaking the same JSON lines on the socket themselves), operators with
'kerneldeck --attach' here or 'kerneldeck --attach ssh://thishost' from
another machine, and 'kerneldeck repl --connect'. Each connection speaks the
headless protocol ('kerneldeck help headless'). A client that goes away kills
nothing; its running cells finish.

Who may connect is checked on every connection by the kernel's account of
the peer: the engine's own user may do anything; with --allow-group GROUP,
members of GROUP connect too, but each acts only as the owner named by its
login: it cannot run cells in, list, interrupt, kill or watch another
owner's kernels, change the limits or answer approvals. Its kernels never
run as the engine's user: on local, a serve run as root runs them as the
member's own OS user; docker-image:// and k8s-image:// give each one a
container or a pod of its own; the
other backends refuse them. serve says at start where members may run
them, and a member's owner has at most a quarter of --max-kernels unless
--max-kernels-per-owner says otherwise. Anyone else is refused, and the
refusal is an event. Code running in a kernel is refused too, whatever
user it runs as: every runner lives in a user namespace of its own, which
nothing it starts can leave. Each member's user may hold 32 connections;
a connection that sends nothing for 10s is closed.

On SIGTERM or SIGINT it stops accepting, tells every client (a goodbye
line), lets running cells finish within --cell-timeout, interrupts what is
left, kills every kernel unless --keep-kernels, and exits 0.

`

const serveEpilogue = `
Every event is also kept in <state dir>/events/ (see 'kerneldeck help
events'), and replayed to clients that subscribe with "since".

Examples:
  kerneldeck serve --backend local --backend ssh://gpu-box
  kerneldeck serve --listen /run/kerneldeck/engine.sock --allow-group agents
`

// serveCmd is `kerneldeck serve`: the engine on a socket.
type serveCmd struct {
	eng        engineFlags
	listen     string
	allowGroup string
	readyFD    int // -1: none
}

func (c *serveCmd) flags() *flagSet {
	fs := newFlagSet("kerneldeck serve")
	fs.section("Serve flags:")
	fs.Path(&c.listen, "listen", "the socket `PATH` to serve on (default $XDG_RUNTIME_DIR/kerneldeck/engine.sock, else "+
		"<state dir>/engine.sock); its dir is made 0700 if missing, and an existing one must already be 0700 and yours")
	fs.Func("allow-group", "also admit members of `GROUP`, each held to the owner of its login name; the socket's dir "+
		"is then 0750 and the socket 0660 of that group, and every dir above must let the group through",
		func(s string) error {
			if s == "" {
				return errors.New("it needs a group name, e.g. --allow-group agents")
			}
			c.allowGroup = s
			return nil
		})
	fs.Func("ready-fd", "once the socket takes connections, write \"READY <socket path>\" and a newline to the open file "+
		"descriptor `N` and close it, for a supervisor that waits for it (systemd's NOTIFY_SOCKET is told READY=1 "+
		"whenever it is set)", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return fmt.Errorf("%q is not a file descriptor number, e.g. --ready-fd 3", s)
		}
		c.readyFD = n
		return nil
	})
	c.eng.register(fs)
	return fs
}

func serveMode() mode {
	return newMode("serve", "run the engine on a socket for agents and dashboards (no UI)", serveIntro, serveEpilogue, func() command { return &serveCmd{readyFD: -1} })
}

func (c *serveCmd) run(args []string, std stdio, help func(io.Writer)) int {
	const prog = "kerneldeck serve"
	r, code, ok := startMode(prog, c.flags(), &c.eng, args, std, help)
	if !ok {
		return code
	}
	s, code, ok := r.settings()
	if !ok {
		return code
	}
	note, err := readiness.New(c.readyFD, os.Getenv)
	if err != nil {
		return r.usage(err)
	}
	// The supervisor's socket is the engine's to speak to, not its kernels'.
	os.Unsetenv("NOTIFY_SOCKET")
	path := c.listen
	if path == "" {
		path = wire.SocketPath(s.stateDir)
	}
	s.socket = path
	eng, code, ok := r.openEngine(s)
	if !ok {
		return code
	}
	srv, err := server.Listen(eng.Engine, server.Options{Path: path, AllowGroup: c.allowGroup, Version: versionString()})
	if err != nil {
		eng.close()
		return r.fail(err)
	}
	eng.takeKept(context.Background(), true)

	signal.Ignore(syscall.SIGPIPE)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	fmt.Fprintf(std.err, "%s: serving the engine at %s\n  dashboard: kerneldeck --attach %s\n  agents:    kerneldeck headless --connect %s\n",
		prog, path, path, path)
	if c.allowGroup != "" {
		fmt.Fprintf(std.err, "  group %s: %s\n", c.allowGroup, headless.MemberBackends(eng.MemberBackends()))
	}
	if os.Geteuid() == 0 && s.cfg.KernelUIDs.IsZero() {
		fmt.Fprintf(std.err, "  kernels:   owners' local kernels run as root (in namespaces of their own, the engine's files hidden); "+
			"--kernel-uids FIRST-LAST gives each owner a uid of its own\n")
	}
	if err := note.Ready(path); err != nil {
		fmt.Fprintf(std.err, "%s: %v\n", prog, err)
	}

	var why string
	var serveErr error
	select {
	case sig := <-sigs:
		why = fmt.Sprintf("the engine is shutting down (%v)", sig)
	case serveErr = <-served:
		why = "the engine stopped serving"
	}
	// A second signal now ends the process at once.
	signal.Stop(sigs)
	note.Stopping()
	grace := s.cfg.CellTimeout
	if grace <= 0 {
		grace = engine.DefaultCellTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	shutErr := srv.Shutdown(ctx, why)
	cancel()
	if serveErr == nil {
		serveErr = <-served
	}
	n, closeErr := eng.close()
	if shutErr != nil {
		fmt.Fprintf(std.err, "%s: %v\n", prog, shutErr)
	}
	if c.eng.keep {
		fmt.Fprintf(std.err, "%s: stopped; left %s running (--keep-kernels)\n", prog, english.Count(n, "kernel"))
	} else {
		fmt.Fprintf(std.err, "%s: stopped; killed %s\n", prog, english.Count(n, "kernel"))
	}
	if err := errors.Join(serveErr, closeErr); err != nil {
		return r.fail(err)
	}
	return exitOK
}
