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
	"maps"
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
	"github.com/kerneldeck/kerneldeck/hosttools"
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
  kerneldeck [flags]            open the dashboard (needs a terminal)
  kerneldeck headless [flags]   serve the engine as JSON lines on stdin/stdout
  kerneldeck repl [flags]       a persistent Python REPL on one kernel, for pipes and terminals
  kerneldeck version            print the version
  kerneldeck help [command]     show this help, or the flags of a command
                                (help dashboard, help headless, help repl)

Run 'kerneldeck help dashboard' for the dashboard's flags and keys, and
'kerneldeck help headless' for the JSON-lines contract and the engine flags.
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
  --state-dir DIR          where full output of clipped cells (spill/) and of
                           large tool results (tool-output/) is kept, created
                           0700 (default $XDG_STATE_HOME/kerneldeck, or
                           ~/.local/state/kerneldeck)

Host tools (code in a kernel whose request lists them in "tools" calls them
on this machine: read_file, write_file, list_files, terminal, http_get):
  --workspace DIR          the directory read_file, write_file, list_files and
                           terminal are confined to; it must exist (default:
                           workspace from the config, else the current
                           directory)
  --max-tool-calls N       at most N tool calls per cell; later calls in the
                           cell get a "limit reached" answer. 0 allows none
                           (default 50)
  --http-allow HOST        where http_get may connect: a host name, an IP
                           address or a CIDR prefix such as 10.0.0.0/8. Repeat
                           it for several; the list replaces http_allow from
                           the config and the default, loopback only
                           (localhost, 127.0.0.0/8, ::1). A host name is
                           allowed only when every address it resolves to is
                           allowed too, so list its addresses or prefix as well
  --approve all|ask|none   one policy for every tool call by every owner,
                           replacing approve and every [approvals] rule from
                           the config: all runs every call, ask asks the
                           operator for each, none refuses every call
  --approval-timeout DURATION
                           how long a call that asks waits for an answer
                           before it is denied, at least 1s (default 60s)

Approvals: without --approve (and without approve = "all"|"ask"|"none" in the
config, which works like it), read_file, list_files and http_get run, and
write_file, terminal and any other tool ask. [approvals] in the config changes
this per tool (terminal = "deny") and per owner ([approvals.owners.NAME],
where "*" is every tool); the policies are allow, ask and deny. A call that
asks writes an event line, even without --events:
  {"op":"event","type":"approval_request","request":"REQUEST-ID","kernel":...,
   "owner":...,"tool":"terminal","args":{...},"time":...,"detail":...}
and waits until an approve request answers it (see below) or the approval
timeout ends, which denies it. An approval_decided event with the same
"request" tells how it ended. After end of input nothing can answer, so
pending calls are denied when their timeout ends.

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
  {"id":"8","op":"approve","request":"REQUEST-ID","decision":"once"}
      answers an approval_request at once, even while cells run: once runs
      this call, always runs every call of this tool by this owner until
      kerneldeck exits, deny refuses it. Answered with {"id":"8","op":"ok"},
      or an error if the request is unknown (already answered, timed out or
      its cell ended)
A bad request is answered with {"id":...,"op":"error","error":"..."} and
serving goes on.

Example:
  echo '{"id":"1","op":"execute","code":"print(1)"}' | kerneldeck headless
`

// reporters returns a mode's two ways to end with an error: usage (the
// command line must be fixed; exit 2, with a pointer to --help) and fail
// (something went wrong; exit 1).
func reporters(stderr io.Writer, prog string) (usage, fail func(error) int) {
	usage = func(err error) int {
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for the flags.\n", prog, err, prog)
		return exitUsage
	}
	fail = func(err error) int {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return exitFail
	}
	return usage, fail
}

// isHelpOrVersion tells the top-level help and version flags from the
// dashboard's flags.
func isHelpOrVersion(arg string) bool {
	switch arg {
	case "--version", "-version", "--help", "-help", "-h":
		return true
	}
	return false
}

// run is main without the process: it returns the exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || (strings.HasPrefix(args[0], "-") && !isHelpOrVersion(args[0])) {
		return runDashboard(args, stdin, stdout, stderr)
	}
	switch args[0] {
	case "headless":
		return runHeadless(args[1:], stdin, stdout, stderr)
	case "repl":
		return runREPL(args[1:], stdin, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, versionString())
		return exitOK
	case "help", "--help", "-help", "-h":
		if len(args) > 1 && args[1] == "headless" {
			fmt.Fprint(stdout, headlessHelp)
			return exitOK
		}
		if len(args) > 1 && args[1] == "repl" {
			fmt.Fprint(stdout, replHelp)
			return exitOK
		}
		if len(args) > 1 && args[1] == "dashboard" {
			fmt.Fprint(stdout, dashboardHelp)
			return exitOK
		}
		fmt.Fprint(stdout, usageText)
		return exitOK
	default:
		fmt.Fprintf(stderr, "kerneldeck: unknown command %q; the commands are headless, repl, version and help (no command opens the dashboard).\nRun 'kerneldeck --help' for usage.\n", args[0])
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
	// Host tools.
	workspace       string
	maxToolCalls    int
	approve         string
	approvalTimeout time.Duration
	httpAllow       []string
	httpAllowList   hosttools.AllowList // httpAllow parsed
	set             map[string]bool     // flags given on the command line
}

func parseHeadlessFlags(args []string) (*headlessFlags, error) {
	return parseFlags("kerneldeck headless", args, nil)
}

// parseFlags parses the engine flags every mode shares; extra registers a
// mode's own flags on the same set.
func parseFlags(name string, args []string, extra func(fs *flag.FlagSet)) (*headlessFlags, error) {
	f := &headlessFlags{set: map[string]bool{}}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	if extra != nil {
		extra(fs)
	}
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
	fs.Func("max-tool-calls", "", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 1<<20 {
			return errors.New("it must be a whole number >= 0 (0 allows no tool calls), e.g. --max-tool-calls 50")
		}
		f.maxToolCalls = n
		return nil
	})
	fs.Func("approve", "", func(s string) error {
		if !config.ValidApprove(s) {
			return errors.New("it must be all (every tool call runs), ask (every call asks the operator) or none (every call is refused)")
		}
		f.approve = s
		return nil
	})
	fs.Func("approval-timeout", "", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d < time.Second {
			return errors.New("it must be a Go duration of at least 1s, e.g. --approval-timeout 60s")
		}
		f.approvalTimeout = d
		return nil
	})
	fs.Func("http-allow", "", func(s string) error {
		if strings.TrimSpace(s) == "" {
			return errors.New(`it must be a host name, IP address or CIDR prefix, e.g. --http-allow 10.0.0.0/8; to forbid http_get, set http_get = "deny" under [approvals] in the config`)
		}
		f.httpAllow = append(f.httpAllow, s)
		return nil
	})
	fs.StringVar(&f.workspace, "workspace", "", "")
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
		return nil, fmt.Errorf("unexpected argument %q: %s takes only flags (run %s --help)", fs.Arg(0), name, name)
	}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if f.set["http-allow"] {
		var err error
		if f.httpAllowList, err = config.ParseAllowList(f.httpAllow); err != nil {
			return nil, fmt.Errorf("--http-allow: %w", err)
		}
	}
	for _, name := range []string{"trace", "config", "state-dir", "ssh-config", "identity", "known-hosts", "workspace"} {
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
	// workspace is the workspace dir and whence it came, for messages.
	workspace, workspaceFrom string
	approvals                engine.Approvals
	// maxToolCalls is in engine.Config terms: negative allows none.
	maxToolCalls int
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
	if f.set["max-tool-calls"] {
		cfg.MaxToolCalls = f.maxToolCalls
	}
	if f.set["approve"] {
		cfg.Approve = f.approve
	}
	if f.set["approval-timeout"] {
		cfg.ApprovalTimeout = f.approvalTimeout
	}
	if f.set["http-allow"] {
		cfg.HTTPAllow = &f.httpAllowList
	}
	names := f.backends
	if len(names) == 0 {
		names = []string{"local"}
		if cfg.DefaultBackend != "" {
			names = []string{cfg.DefaultBackend}
		}
	}
	s := &settings{cfg: cfg, stateDir: f.stateDir, approvals: buildApprovals(cfg), maxToolCalls: cfg.MaxToolCalls}
	if s.maxToolCalls == 0 {
		s.maxToolCalls = -1 // the engine reads 0 as "the default"
	}
	switch {
	case f.set["workspace"]:
		s.workspace, s.workspaceFrom = f.workspace, "--workspace"
	case cfg.Workspace != "":
		s.workspace, s.workspaceFrom = cfg.Workspace, fmt.Sprintf("workspace in config file %s", cfg.Path)
	default:
		s.workspace, s.workspaceFrom = ".", "the default workspace, the current directory (set it with --workspace)"
	}
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

// buildApprovals turns the approve mode and [approvals] rules into the
// engine's policies. A blanket mode (--approve or approve) replaces every
// rule; otherwise the config's rules apply over engine.DefaultToolPolicies,
// and any other tool asks.
func buildApprovals(cfg config.Config) engine.Approvals {
	switch cfg.Approve {
	case config.ApproveAll:
		return engine.Approvals{Default: engine.PolicyAllow}
	case config.ApproveAsk:
		return engine.Approvals{Default: engine.PolicyAsk}
	case config.ApproveNone:
		return engine.Approvals{Default: engine.PolicyDeny}
	}
	tools := engine.DefaultToolPolicies()
	maps.Copy(tools, cfg.Approvals.Tools)
	var owners map[string]map[string]engine.Policy
	for o, rules := range cfg.Approvals.Owners {
		if owners == nil {
			owners = map[string]map[string]engine.Policy{}
		}
		owners[o] = maps.Clone(rules)
	}
	return engine.Approvals{Default: engine.PolicyAsk, Tools: tools, Owners: owners}
}

// checkApprovalTools refuses [approvals] rules that name a tool the registry
// does not have: a misspelt rule would otherwise be ignored silently.
func checkApprovalTools(cfg config.Config, reg *hosttools.Registry) error {
	known := reg.Names()
	check := func(where, tool string) error {
		if tool == "*" || slices.Contains(known, tool) {
			return nil
		}
		return fmt.Errorf("config file %s: %s names tool %q, which is not a host tool; the tools are %s (\"*\" means every tool in an owner's table)",
			cfg.Path, where, tool, strings.Join(known, ", "))
	}
	for _, tool := range slices.Sorted(maps.Keys(cfg.Approvals.Tools)) {
		if err := check("[approvals]", tool); err != nil {
			return err
		}
	}
	for _, owner := range slices.Sorted(maps.Keys(cfg.Approvals.Owners)) {
		for _, tool := range slices.Sorted(maps.Keys(cfg.Approvals.Owners[owner])) {
			if err := check(fmt.Sprintf("[approvals.owners.%s]", owner), tool); err != nil {
				return err
			}
		}
	}
	return nil
}

// openTools opens the workspace and registers the built-in tools in a new
// registry. The caller closes the workspace.
func openTools(s *settings) (*hosttools.Registry, *hosttools.Workspace, error) {
	ws, err := hosttools.NewWorkspace(s.workspace)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s.workspaceFrom, err)
	}
	reg := hosttools.NewRegistry()
	b := &hosttools.Builtins{Workspace: ws, HTTPAllow: s.cfg.HTTPAllow}
	if err := b.Register(reg); err != nil {
		ws.Close()
		return nil, nil, err
	}
	if err := checkApprovalTools(s.cfg, reg); err != nil {
		ws.Close()
		return nil, nil, err
	}
	return reg, ws, nil
}

func runHeadless(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	usageErr, fail := reporters(stderr, "kerneldeck headless")
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
	eng, cleanup, code, err := openEngine(f, s)
	if err != nil {
		if code == exitUsage {
			return usageErr(err)
		}
		return fail(err)
	}
	defer cleanup()
	adoptKept(context.Background(), eng, s.stateDir, stderr, "kerneldeck headless")

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

// openEngine opens the workspace, the backends, the state dir, the tool
// output storage and the trace, and starts the engine. cleanup releases them
// all (after the engine is closed). On error, code says whether the user
// must fix the command line (exitUsage) or something failed (exitFail).
func openEngine(f *headlessFlags, s *settings) (eng *engine.Engine, cleanup func(), code int, err error) {
	var closers []func() error
	cleanup = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	fail := func(c int, e error) (*engine.Engine, func(), int, error) {
		cleanup()
		return nil, func() {}, c, e
	}
	tools, ws, err := openTools(s)
	if err != nil {
		return fail(exitUsage, err)
	}
	closers = append(closers, ws.Close)
	var envs []backends.Env
	for _, uri := range s.backendURIs {
		env, err := backends.Open(uri, f.ssh)
		if err != nil {
			return fail(exitUsage, err)
		}
		if c, ok := env.(io.Closer); ok {
			closers = append(closers, c.Close)
		}
		envs = append(envs, env)
	}
	if err := engine.EnsurePrivateDir(s.stateDir); err != nil {
		return fail(exitFail, fmt.Errorf("state dir: %w", err))
	}
	// Storage keeps large tool results under <state dir>/tool-output.
	toolOutput, err := hosttools.NewStorage(s.stateDir, 0, 0)
	if err != nil {
		return fail(exitFail, fmt.Errorf("state dir: %w", err))
	}
	closers = append(closers, toolOutput.Close)
	var tracer *backends.Tracer
	if f.trace != "" {
		if tracer, err = backends.OpenTracer(f.trace); err != nil {
			return fail(exitFail, err)
		}
		closers = append(closers, tracer.Close)
		for i, env := range envs {
			envs[i] = backends.Traced(env, tracer)
		}
	}
	eng, err = engine.New(engine.Config{
		Backends:    envs,
		MaxKernels:  s.cfg.MaxKernels,
		IdleExit:    s.cfg.IdleExit,
		CellTimeout: s.cfg.CellTimeout,
		StateDir:    s.stateDir,
		Tracer:      tracer,

		Tools:           tools,
		ToolOutput:      toolOutput,
		MaxToolCalls:    s.maxToolCalls,
		Approvals:       s.approvals,
		ApprovalTimeout: s.cfg.ApprovalTimeout,
	})
	if err != nil {
		return fail(exitFail, err)
	}
	return eng, cleanup, exitOK, nil
}
