package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/config"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/eventlog"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/english"
	"github.com/kerneldeck/kerneldeck/settings"
)

// resolved is the flags over the config file, as the engine takes them.
type resolved struct {
	backendURIs []string
	cfg         config.Config
	stateDir    string
	// workspace is the workspace dir and whence it came, for messages.
	workspace, workspaceFrom string
	approvals                engine.Approvals
	pythonFlag               bool // --python was given: it is every backend's
	// socket is where the engine will be served, if it will: kernels must
	// not see it.
	socket string
}

func resolve(f *engineFlags) (*resolved, error) {
	cfg, err := config.Load(f.config)
	if err != nil {
		return nil, err
	}
	for key, v := range f.values {
		set, _ := settings.Lookup(key)
		set.Set(&cfg.Values, v)
	}
	_, pythonFlag := f.values["python"]
	if f.set["approve"] {
		cfg.Approve = f.approve
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
	s := &resolved{cfg: cfg, stateDir: f.stateDir, approvals: buildApprovals(cfg), pythonFlag: pythonFlag}
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

// pythons is each backend's interpreter from [backends]; --python, given,
// is every backend's.
func (s *resolved) pythons() map[string]string {
	if s.pythonFlag {
		return nil
	}
	return s.cfg.Pythons
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
func openTools(s *resolved) (*hosttools.Registry, *hosttools.Workspace, error) {
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

// openEngine opens the workspace, the backends, the state dir, the tool
// output storage and the trace, and starts the engine. cleanup releases them
// all (after the engine is closed). On error, code says whether the user
// must fix the command line (exitUsage) or something failed (exitFail).
func openEngine(f *engineFlags, s *resolved) (eng *engine.Engine, cleanup func(), code int, err error) {
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
	toolOutput.SetQuota(s.cfg.ToolOutputMaxBytes, s.cfg.ToolOutputRetention)
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
	// The event log: what the engine says is kept on disk, and the engine
	// starts remembering what an earlier one said (for replays).
	logDir := filepath.Join(s.stateDir, "events")
	evlog, err := eventlog.Open(logDir, eventlog.Options{MaxBytes: s.cfg.EventLogMaxBytes, Retention: s.cfg.EventLogRetention})
	if err != nil {
		return fail(exitFail, fmt.Errorf("state dir: %w", err))
	}
	closers = append(closers, evlog.Close)
	since := time.Now().Add(-cmp.Or(s.cfg.EventLogRetention, eventlog.DefaultRetention))
	eng, err = engine.New(engine.Config{
		Earlier:            func(n int) ([]engine.Event, error) { return eventlog.Recent(logDir, since, n) },
		Backends:           envs,
		MaxKernels:         s.cfg.MaxKernels,
		MaxKernelsPerOwner: s.cfg.MaxKernelsPerOwner,
		IdleExit:           s.cfg.IdleExit,
		CellTimeout:        s.cfg.CellTimeout,
		StateDir:           s.stateDir,
		JournalDir:         filepath.Join(s.stateDir, "journal"),
		HidePaths:          socketHidden(s.socket),
		Tracer:             tracer,

		Tools:           tools,
		ToolOutput:      toolOutput,
		MaxToolCalls:    s.cfg.ToolCallLimit(),
		Approvals:       s.approvals,
		ApprovalTimeout: s.cfg.ApprovalTimeout,
		KeepToolOutput:  s.cfg.KeepToolOutput,
		NoConfine:       s.cfg.NoConfine,
		KernelUIDs:      s.cfg.KernelUIDs,
		Python:          s.cfg.Python,
		Pythons:         s.pythons(),
		KernelLimits:    engine.KernelLimits{Memory: s.cfg.KernelMemory, CPUTime: s.cfg.KernelCPUTime, MaxProcs: s.cfg.KernelMaxProcs},
		SpareKernels:    spareKernels(s.cfg, envs),
		ParkDir:         parkDir(s.cfg, s.stateDir),
		ParkMaxBytes:    s.cfg.ParkMaxBytes,
		ParkTimeout:     s.cfg.ParkTimeout,
		ParkRetention:   s.cfg.ParkRetention,
		ParkTotalBytes:  s.cfg.ParkTotalBytes,
		HibernateAfter:  s.cfg.HibernateAfter, // the engine hibernates only where it parks
	})
	if err != nil {
		return fail(exitFail, err)
	}
	// The log takes every event until the engine closes its bus; a disk it
	// cannot write says so on the bus, once a minute at most.
	logSub := eng.Subscribe(1 << 16)
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		evlog.Run(logSub.C, func(detail string) { eng.Publish(engine.Event{Type: engine.EventNotice, Detail: detail}) })
	}()
	closers = append(closers, func() error { logSub.Close(); <-logged; return nil })
	return eng, cleanup, exitOK, nil
}

// takeKept takes back the kernels of engines on the same state dir that
// died without closing, and adopts the kernels an earlier kerneldeck left
// running at a clean exit; each only when this process was asked to
// (--keep-kernels or --adopt, or always for takeBack): a one-shot run must
// not take an operator's kernels and kill them at its exit. What is left
// alone is said, with what takes it.
func takeKept(ctx context.Context, eng *engine.Engine, f *engineFlags, stateDir string, takeBack bool, stderr io.Writer, prog string) {
	say := func(format string, args ...any) { fmt.Fprintf(stderr, prog+": "+format+"\n", args...) }
	if takeBack || f.keep || f.adopt {
		tb, err := eng.TakeBack(ctx)
		if err != nil {
			say("%v", err)
		}
		if tb.Kernels > 0 {
			running := ""
			if tb.Collecting > 0 {
				running = fmt.Sprintf("; %d had a cell running, collected once it ends", tb.Collecting)
			}
			say("took back %s of an engine that stopped without closing%s", english.Count(tb.Kernels, "kernel"), running)
		}
		for _, why := range tb.Failed {
			say("not taken back: %s", why)
		}
	} else if n, err := eng.Orphaned(); err != nil {
		say("%v", err)
	} else if n > 0 {
		say("%s of an engine that stopped without closing left alone; kerneldeck serve, --keep-kernels or --adopt takes them back", english.Count(n, "kernel"))
	}
	store := engine.KeptStoreIn(stateDir)
	if !f.keep && !f.adopt {
		kept, err := store.Peek(eng.Backends())
		if err != nil {
			say("%v", err)
			return
		}
		if n := len(kept); n > 0 {
			say("%s left alone; --adopt takes them over", english.Count(n, "kept kernel"))
		}
		return
	}
	n, skipped, err := eng.AdoptFrom(ctx, store)
	if err != nil {
		say("%v", err)
		return
	}
	if n > 0 {
		say("adopted %s left running by an earlier kerneldeck", english.Count(n, "kernel"))
	}
	for _, s := range skipped {
		say("not adopted: %s", s)
	}
}

// closeEngine records the kernels for the next start when keep is set, then
// closes the engine: it kills every kernel unless keep. It returns how many
// kernels there were and a record error, if any, for the caller's message.
func closeEngine(eng *engine.Engine, stateDir string, keep bool) (n int, recordErr, closeErr error) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	n = len(eng.Kernels())
	if keep {
		recordErr = engine.KeptStoreIn(stateDir).Record(eng.Kept())
	}
	return n, recordErr, eng.Close(ctx, keep)
}

// spareKernels is how many spare runners each backend keeps: spare_kernels
// when given, else one on the local backend (where a start costs the most
// of a first cell) and none on the others (a spare there holds a remote
// process for nobody).
func spareKernels(cfg config.Config, envs []backends.Env) map[string]int {
	out := map[string]int{}
	for _, env := range envs {
		switch {
		case cfg.SpareKernelsSet:
			out[env.URI()] = cfg.SpareKernels
		case env.URI() == "local":
			out[env.URI()] = 1
		}
	}
	return out
}

// parkDir is where the engine parks kernels' state: in the state dir,
// unless parking is off.
func parkDir(cfg config.Config, stateDir string) string {
	if cfg.NoPark {
		return ""
	}
	return filepath.Join(stateDir, "parked")
}

// socketHidden is what kernels must not see of the engine's socket at
// path: its dir, where that is the engine's own (the default
// .../kerneldeck/engine.sock), else the socket itself (covered where it
// exists when a runner starts; the engine refuses kernels at connect
// anyway).
func socketHidden(path string) []string {
	if path == "" {
		return nil
	}
	if filepath.Base(filepath.Dir(path)) == "kerneldeck" {
		return []string{filepath.Dir(path)}
	}
	return []string{path}
}
