// Command kerneldeck is a terminal dashboard and embedded engine for
// persistent Python session kernels on local and remote hosts. Until the
// dashboard lands, `kerneldeck headless` serves the engine as JSON lines.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/config"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/headless"
)

// Exit statuses: 2 is for a command line or config the user must fix.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// closeTimeout bounds killing every kernel at exit, so a hung host cannot
// keep the process alive forever.
const closeTimeout = 30 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

const usageText = `kerneldeck: a terminal dashboard and embedded engine for persistent Python
session kernels on local and remote hosts.

Usage:
  kerneldeck headless [flags]   serve the engine as JSON lines on stdin/stdout
  kerneldeck version            print the version
  kerneldeck help [command]     show this help, or the flags of a command

The dashboard (kerneldeck without a command) is not built yet.
Run 'kerneldeck help headless' for the JSON-lines contract and its flags.
`

const noDashboardText = `kerneldeck: the dashboard is not built yet.
For now, drive kernels through the JSON-lines mode:
  echo '{"id":"1","op":"execute","code":"print(1)"}' | kerneldeck headless
Run 'kerneldeck --help' for the commands.
`

const headlessHelp = `Usage: kerneldeck headless [flags]

Serves the kernel engine on stdin/stdout: one JSON request per input line, one
JSON response per output line. Requests run concurrently; every response
echoes its request's "id" (a string) and has an "op". Cells for one kernel
run in the order their lines arrived. At EOF it finishes the running
requests, kills every kernel on its host and exits 0; SIGINT and SIGTERM also
kill every kernel before exiting.

Flags (flags override the config file):
  --backend URI            where kernels run: local, ssh://[user@]host[:port],
                           docker://container, or a name from [backends] in
                           the config file. Repeat it to offer several; the
                           first is used by requests without "backend".
                           (default: default_backend from the config, else local)
  --max-kernels N          at most N kernels at once; beyond that the least
                           recently used idle kernel is killed (default 4)
  --idle-exit DURATION     kill kernels idle for longer than this, as a Go
                           duration such as 30m or 1h; at least 1s (default 30m)
  --cell-timeout DURATION  timeout of a cell whose request gives none, such
                           as 300s or 5m (default 5m)
  --events                 interleave lifecycle events as lines like
                           {"op":"event","type":"spawned","time":...,
                           "kernel":...,"owner":...,"detail":...}
  --trace FILE             append one JSON line per backend command to FILE
                           (created 0600): time, backend, command, rc, ms
  --config FILE            TOML config file (default
                           $XDG_CONFIG_HOME/kerneldeck/config.toml, or
                           ~/.config/kerneldeck/config.toml); it must exist
                           when given here
  --state-dir DIR          where full output of clipped cells is kept, created
                           0700 (default $XDG_STATE_HOME/kerneldeck, or
                           ~/.local/state/kerneldeck)

SSH backends (ssh://[user@]host[:port], host may be a Host alias):
  --ssh-config FILE        OpenSSH client config to read Host aliases from
                           (default ~/.ssh/config): HostName, User, Port,
                           IdentityFile, IdentitiesOnly, UserKnownHostsFile,
                           ProxyJump (one hop), ServerAliveInterval
  --identity FILE          private key to use instead of IdentityFile; keys
                           in ssh-agent (SSH_AUTH_SOCK) are offered too. An
                           encrypted key must be loaded with ssh-add
  --known-hosts FILE       known_hosts file instead of UserKnownHostsFile
                           (default ~/.ssh/known_hosts). Host keys are always
                           checked: an unknown host is refused, a changed
                           key is refused loudly
  --accept-new-host-key    record the key of a host seen for the first time
                           (like OpenSSH's StrictHostKeyChecking=accept-new)

Requests (timeouts and idle_exit are in seconds):
  {"id":"1","op":"execute","code":"x = 1","owner":"me","task":"t","backend":"local",
   "child":"","tools":[],"timeout":30,"reset":false}     only id, op, code are required
  {"id":"2","op":"kernels"}
  {"id":"3","op":"limits","max_kernels":2,"idle_exit":600}
  {"id":"4","op":"interrupt","kernel":"KERNEL-ID"}
  {"id":"5","op":"kill","kernel":"KERNEL-ID"}
  {"id":"6","op":"shutdown_owner","owner":"me"}
  {"id":"7","op":"shutdown_all"}
A bad request is answered with {"id":...,"op":"error","error":"..."} and
serving goes on.

Example:
  echo '{"id":"1","op":"execute","code":"print(1)"}' | kerneldeck headless
`

// run is main without the process: it returns the exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, noDashboardText)
		return exitUsage
	}
	switch args[0] {
	case "headless":
		return runHeadless(args[1:], stdin, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, versionString())
		return exitOK
	case "help", "--help", "-help", "-h":
		if len(args) > 1 && args[1] == "headless" {
			fmt.Fprint(stdout, headlessHelp)
			return exitOK
		}
		fmt.Fprint(stdout, usageText)
		return exitOK
	default:
		fmt.Fprintf(stderr, "kerneldeck: unknown command %q; the commands are headless, version and help.\nRun 'kerneldeck --help' for usage.\n", args[0])
		return exitUsage
	}
}

func versionString() string {
	version, rev := "(devel)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " " + s.Value[:12]
			}
		}
	}
	return fmt.Sprintf("kerneldeck %s%s %s", version, rev, runtime.Version())
}

// headlessFlags are the parsed flags of `kerneldeck headless`.
type headlessFlags struct {
	backends    []string
	maxKernels  int
	idleExit    time.Duration
	cellTimeout time.Duration
	events      bool
	trace       string
	config      string
	stateDir    string
	ssh         backends.Options // --ssh-config, --identity, --known-hosts, --accept-new-host-key
	set         map[string]bool  // flags given on the command line
}

func parseHeadlessFlags(args []string) (*headlessFlags, error) {
	f := &headlessFlags{set: map[string]bool{}}
	fs := flag.NewFlagSet("kerneldeck headless", flag.ContinueOnError)
	// Errors and help are printed by the caller, in our own words.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.Func("backend", "", func(s string) error {
		if strings.TrimSpace(s) == "" {
			return errors.New("it must be a backend URI such as local, or a name from [backends] in the config file")
		}
		f.backends = append(f.backends, s)
		return nil
	})
	fs.Func("max-kernels", "", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return errors.New("it must be a whole number >= 1, e.g. --max-kernels 4")
		}
		f.maxKernels = n
		return nil
	})
	fs.Func("idle-exit", "", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d < time.Second {
			return errors.New("it must be a Go duration of at least 1s, e.g. --idle-exit 30m")
		}
		f.idleExit = d
		return nil
	})
	fs.Func("cell-timeout", "", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return errors.New("it must be a positive Go duration, e.g. --cell-timeout 300s")
		}
		f.cellTimeout = d
		return nil
	})
	fs.BoolVar(&f.events, "events", false, "")
	fs.StringVar(&f.trace, "trace", "", "")
	fs.StringVar(&f.config, "config", "", "")
	fs.StringVar(&f.stateDir, "state-dir", "", "")
	fs.StringVar(&f.ssh.SSHConfig, "ssh-config", "", "")
	fs.StringVar(&f.ssh.SSHIdentity, "identity", "", "")
	fs.StringVar(&f.ssh.SSHKnownHosts, "known-hosts", "", "")
	fs.BoolVar(&f.ssh.AcceptNewHostKey, "accept-new-host-key", false, "")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: headless reads its requests from stdin", fs.Arg(0))
	}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	for _, name := range []string{"trace", "config", "state-dir", "ssh-config", "identity", "known-hosts"} {
		if f.set[name] && fs.Lookup(name).Value.String() == "" {
			return nil, fmt.Errorf("--%s needs a path", name)
		}
	}
	return f, nil
}

// settings resolves flags over the config file into engine settings.
type settings struct {
	backendURIs []string
	cfg         config.Config
	stateDir    string
}

func resolve(f *headlessFlags) (*settings, error) {
	cfg, err := config.Load(f.config)
	if err != nil {
		return nil, err
	}
	if f.set["max-kernels"] {
		cfg.MaxKernels = f.maxKernels
	}
	if f.set["idle-exit"] {
		cfg.IdleExit = f.idleExit
	}
	if f.set["cell-timeout"] {
		cfg.CellTimeout = f.cellTimeout
	}
	names := f.backends
	if len(names) == 0 {
		names = []string{"local"}
		if cfg.DefaultBackend != "" {
			names = []string{cfg.DefaultBackend}
		}
	}
	s := &settings{cfg: cfg, stateDir: f.stateDir}
	for _, n := range names {
		uri := cfg.ResolveBackend(n)
		if slices.Contains(s.backendURIs, uri) {
			return nil, fmt.Errorf("backend %s is given twice (as %q); give each backend once", uri, n)
		}
		s.backendURIs = append(s.backendURIs, uri)
	}
	if s.stateDir == "" {
		if s.stateDir, err = config.DefaultStateDir(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func runHeadless(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	usageErr := func(err error) int {
		fmt.Fprintf(stderr, "kerneldeck headless: %v\nRun 'kerneldeck headless --help' for the flags.\n", err)
		return exitUsage
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "kerneldeck headless: %v\n", err)
		return exitFail
	}
	f, err := parseHeadlessFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, headlessHelp)
		return exitOK
	}
	if err != nil {
		return usageErr(err)
	}
	s, err := resolve(f)
	if err != nil {
		return usageErr(err)
	}
	var envs []backends.Env
	for _, uri := range s.backendURIs {
		env, err := backends.Open(uri, f.ssh)
		if err != nil {
			return usageErr(err)
		}
		if c, ok := env.(io.Closer); ok {
			defer c.Close()
		}
		envs = append(envs, env)
	}
	if err := engine.EnsurePrivateDir(s.stateDir); err != nil {
		return fail(fmt.Errorf("state dir: %w", err))
	}
	var tracer *backends.Tracer
	if f.trace != "" {
		if tracer, err = backends.OpenTracer(f.trace); err != nil {
			return fail(err)
		}
		defer tracer.Close()
		for i, env := range envs {
			envs[i] = backends.Traced(env, tracer)
		}
	}
	eng, err := engine.New(engine.Config{
		Backends:    envs,
		MaxKernels:  s.cfg.MaxKernels,
		IdleExit:    s.cfg.IdleExit,
		CellTimeout: s.cfg.CellTimeout,
		StateDir:    s.stateDir,
		Tracer:      tracer,
	})
	if err != nil {
		return fail(err)
	}

	// A reader that goes away must not kill us with SIGPIPE before the
	// kernels are killed: the write fails instead and Serve returns.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	serveErr := headless.Serve(ctx, eng, stdin, stdout, headless.Options{Events: f.events})
	signaled := ctx.Err() != nil
	// A second signal now ends the process at once, as an impatient
	// operator expects.
	stop()

	closeCtx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	closeErr := eng.Close(closeCtx, false)
	switch {
	case signaled:
		fmt.Fprintln(stderr, "kerneldeck headless: stopped by a signal; every kernel was killed")
	case serveErr != nil:
		return fail(errors.Join(serveErr, closeErr))
	}
	if closeErr != nil {
		return fail(fmt.Errorf("shut down kernels: %w", closeErr))
	}
	return exitOK
}
