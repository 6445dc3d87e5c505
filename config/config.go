// Package config loads kerneldeck's TOML config file. Every value in it can
// be overridden by a command-line flag; the file only changes defaults.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/bytesize"
)

// DefaultMaxToolCalls is how many host tool calls one cell may make when the
// file does not say.
const DefaultMaxToolCalls = engine.DefaultMaxToolCalls

// The blanket approval modes of the approve key and the --approve flag. Each
// replaces every per-tool and per-owner rule.
const (
	ApproveAll  = "all"  // every tool call runs without asking
	ApproveAsk  = "ask"  // every tool call asks the operator
	ApproveNone = "none" // every tool call is refused
)

// ValidApprove reports whether s is one of ApproveAll, ApproveAsk, ApproveNone.
func ValidApprove(s string) bool {
	return s == ApproveAll || s == ApproveAsk || s == ApproveNone
}

// Config is the merged configuration: defaults, then the file.
type Config struct {
	MaxKernels int
	// MaxKernelsPerOwner bounds each owner's kernels; 0 is no bound (a
	// member's owner then gets a quarter of MaxKernels).
	MaxKernelsPerOwner int
	IdleExit           time.Duration
	CellTimeout        time.Duration
	// MaxToolCalls is how many host tool calls one cell may make; 0 allows
	// none.
	MaxToolCalls int
	Theme        string
	// Backends maps a backend name the operator chose to its URI.
	Backends map[string]string
	// DefaultBackend is a name from Backends or a URI; empty means "local".
	DefaultBackend string
	// Workspace is the directory the host file tools and terminal are
	// confined to; "" means the current directory.
	Workspace string
	// Approve is ApproveAll, ApproveAsk, ApproveNone, or "" when the file
	// does not set it (the per-tool rules and defaults then apply).
	Approve string
	// Approvals holds the [approvals] rules: Tools from tool = policy lines,
	// Owners from [approvals.owners.NAME] tables. Default is never set.
	Approvals engine.Approvals
	// ApprovalTimeout is how long a tool call that asks waits for the
	// operator before it is denied.
	ApprovalTimeout time.Duration
	// HTTPAllow is where http_get may connect; nil means the default,
	// hosttools.DefaultAllowList (loopback only). Empty allows nothing.
	HTTPAllow *hosttools.AllowList
	// ToolOutputMaxBytes and ToolOutputRetention bound the stored output of
	// tool calls (0: the defaults); KeepToolOutput keeps a kernel's stored
	// output after the kernel is gone.
	ToolOutputMaxBytes  int64
	ToolOutputRetention time.Duration
	// EventLogMaxBytes and EventLogRetention bound the event log (0: the
	// defaults).
	EventLogMaxBytes  int64
	EventLogRetention time.Duration
	KeepToolOutput    bool
	// NoConfine asks runners not to confine themselves with Landlock.
	NoConfine bool
	// KernelMemory, KernelCPUTime and KernelMaxProcs limit each kernel
	// (0: no limit): its address space in bytes, its CPU seconds, and the
	// processes of its login on its host.
	KernelMemory   int64
	KernelCPUTime  time.Duration
	KernelMaxProcs int
	// SpareKernels is how many spare runners to keep ready on each
	// backend; SpareKernelsSet says the file gave it (otherwise 1 on the
	// local backend, 0 on the others).
	SpareKernels    int
	SpareKernelsSet bool
	// Path is the file that was loaded, or "" when there was none.
	Path string
}

// Defaults returns the configuration used when no file sets anything.
func Defaults() Config {
	return Config{
		MaxKernels:      engine.DefaultMaxKernels,
		IdleExit:        engine.DefaultIdleExit,
		CellTimeout:     engine.DefaultCellTimeout,
		MaxToolCalls:    DefaultMaxToolCalls,
		ApprovalTimeout: engine.DefaultApprovalTimeout,
		Backends:        map[string]string{},
	}
}

// DefaultPath is $XDG_CONFIG_HOME/kerneldeck/config.toml, or
// ~/.config/kerneldeck/config.toml when XDG_CONFIG_HOME is unset.
func DefaultPath() (string, error) {
	return xdgPath("XDG_CONFIG_HOME", ".config", "config.toml")
}

// DefaultStateDir is $XDG_STATE_HOME/kerneldeck, or ~/.local/state/kerneldeck
// when XDG_STATE_HOME is unset.
func DefaultStateDir() (string, error) {
	return xdgPath("XDG_STATE_HOME", filepath.Join(".local", "state"))
}

func xdgPath(envVar, homeRel string, rest ...string) (string, error) {
	// The XDG spec says relative values are invalid and must be ignored.
	base := os.Getenv(envVar)
	if base == "" || !filepath.IsAbs(base) {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("find the home directory for the default %s path (set %s): %w", envVar, envVar, err)
		}
		base = filepath.Join(home, homeRel)
	}
	return filepath.Join(append([]string{base, "kerneldeck"}, rest...)...), nil
}

// file mirrors the TOML document. Scalars are decoded as any so that a value
// of the wrong type gets a message naming the key, not a reflection error.
type file struct {
	MaxKernels      any            `toml:"max_kernels"`
	PerOwner        any            `toml:"max_kernels_per_owner"`
	IdleExit        any            `toml:"idle_exit"`
	CellTimeout     any            `toml:"cell_timeout"`
	MaxToolCalls    any            `toml:"max_tool_calls"`
	Theme           any            `toml:"theme"`
	DefaultBackend  any            `toml:"default_backend"`
	Workspace       any            `toml:"workspace"`
	Approve         any            `toml:"approve"`
	ApprovalTimeout any            `toml:"approval_timeout"`
	HTTPAllow       any            `toml:"http_allow"`
	Backends        map[string]any `toml:"backends"`
	Approvals       any            `toml:"approvals"`
	ToolOutputMaxMB any            `toml:"tool_output_max_mb"`
	ToolOutputKeep  any            `toml:"tool_output_retention"`
	EventLogMaxMB   any            `toml:"event_log_max_mb"`
	EventLogKeep    any            `toml:"event_log_retention"`
	KeepToolOutput  any            `toml:"keep_tool_output"`
	ConfineKernels  any            `toml:"confine_kernels"`
	KernelMemory    any            `toml:"kernel_memory"`
	KernelCPUTime   any            `toml:"kernel_cpu_time"`
	KernelMaxProcs  any            `toml:"kernel_max_procs"`
	SpareKernels    any            `toml:"spare_kernels"`
}

const knownKeys = "max_kernels, max_kernels_per_owner, idle_exit, cell_timeout, max_tool_calls, theme, default_backend, " +
	"workspace, approve, approval_timeout, http_allow, tool_output_max_mb, tool_output_retention, keep_tool_output, " +
	"event_log_max_mb, event_log_retention, " +
	"confine_kernels, kernel_memory, kernel_cpu_time, kernel_max_procs, spare_kernels, [backends], [approvals]"

// Load reads the config file at path over the defaults. An empty path means
// DefaultPath, which may be missing; a path the caller named must exist.
func Load(path string) (Config, error) {
	cfg := Defaults()
	explicit := path != ""
	if !explicit {
		p, err := DefaultPath()
		if err != nil {
			return cfg, err
		}
		path = p
	}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
	case !explicit && errors.Is(err, fs.ErrNotExist):
		return cfg, nil
	case errors.Is(err, fs.ErrNotExist):
		return cfg, fmt.Errorf("config file %s does not exist; create it or drop --config to use %s", path, defaultPathHint())
	default:
		return cfg, fmt.Errorf("read config file %s: %w", path, err)
	}
	if err := parse(string(data), path, &cfg); err != nil {
		return cfg, err
	}
	cfg.Path = path
	return cfg, nil
}

func defaultPathHint() string {
	if p, err := DefaultPath(); err == nil {
		return "the default " + p
	}
	return "the default file"
}

func parse(data, path string, cfg *Config) error {
	var f file
	md, err := toml.Decode(data, &f)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return fmt.Errorf("config file %s is not valid TOML:\n%s", path, perr.ErrorWithUsage())
		}
		return fmt.Errorf("config file %s: %w", path, err)
	}
	// [approvals] is decoded as a whole into any and checked by
	// parseApprovals, which names a bad key better than "unknown key".
	extra := slices.DeleteFunc(md.Undecoded(), func(k toml.Key) bool { return len(k) > 1 && k[0] == "approvals" })
	if len(extra) > 0 {
		return fmt.Errorf("config file %s: unknown key %q; the known keys are %s (named backends go under [backends] as name = \"URI\")",
			path, extra[0].String(), knownKeys)
	}
	fail := func(key, format string, args ...any) error {
		return fmt.Errorf("config file %s: %s %s", path, key, fmt.Sprintf(format, args...))
	}
	if f.MaxKernels != nil {
		n, ok := f.MaxKernels.(int64)
		if !ok || n < 1 || n > 1<<20 {
			return fail("max_kernels", "= %s is invalid: it must be a whole number >= 1, e.g. max_kernels = 4", tomlValue(f.MaxKernels))
		}
		cfg.MaxKernels = int(n)
	}
	if f.PerOwner != nil {
		n, ok := f.PerOwner.(int64)
		if !ok || n < 0 || n > 1<<20 {
			return fail("max_kernels_per_owner", "= %s is invalid: it must be a whole number >= 0 (0: no bound), e.g. max_kernels_per_owner = 2", tomlValue(f.PerOwner))
		}
		cfg.MaxKernelsPerOwner = int(n)
	}
	if f.IdleExit != nil {
		d, err := duration(f.IdleExit)
		if err == nil && d < time.Second {
			err = errors.New("it must be at least 1s")
		}
		if err != nil {
			return fail("idle_exit", "= %s is invalid: %v; write a duration string such as idle_exit = \"30m\"", tomlValue(f.IdleExit), err)
		}
		cfg.IdleExit = d
	}
	if f.CellTimeout != nil {
		d, err := duration(f.CellTimeout)
		if err != nil {
			return fail("cell_timeout", "= %s is invalid: %v; write a duration string such as cell_timeout = \"300s\"", tomlValue(f.CellTimeout), err)
		}
		cfg.CellTimeout = d
	}
	if f.KernelMemory != nil {
		str, ok := f.KernelMemory.(string)
		n, err := bytesize.Parse(str)
		if !ok || err != nil || n < 32<<20 {
			return fail("kernel_memory", "= %s is invalid: it must be a quoted size of at least 32MiB, e.g. kernel_memory = \"512MiB\"", tomlValue(f.KernelMemory))
		}
		cfg.KernelMemory = n
	}
	if f.KernelCPUTime != nil {
		d, err := duration(f.KernelCPUTime)
		if err == nil && d < time.Second {
			err = errors.New("it must be at least 1s")
		}
		if err != nil {
			return fail("kernel_cpu_time", "= %s is invalid: %v; write a duration string such as kernel_cpu_time = \"10m\"", tomlValue(f.KernelCPUTime), err)
		}
		cfg.KernelCPUTime = d
	}
	if f.SpareKernels != nil {
		n, ok := f.SpareKernels.(int64)
		if !ok || n < 0 || n > 64 {
			return fail("spare_kernels", "= %s is invalid: it must be a whole number from 0 to 64, e.g. spare_kernels = 1 (0: none)", tomlValue(f.SpareKernels))
		}
		cfg.SpareKernels, cfg.SpareKernelsSet = int(n), true
	}
	if f.KernelMaxProcs != nil {
		n, ok := f.KernelMaxProcs.(int64)
		if !ok || n < 8 || n > 1<<20 {
			return fail("kernel_max_procs", "= %s is invalid: it must be a whole number >= 8, e.g. kernel_max_procs = 64", tomlValue(f.KernelMaxProcs))
		}
		cfg.KernelMaxProcs = int(n)
	}
	if f.MaxToolCalls != nil {
		n, ok := f.MaxToolCalls.(int64)
		if !ok || n < 0 || n > 1<<20 {
			return fail("max_tool_calls", "= %s is invalid: it must be a whole number >= 0 (0 allows no tool calls), e.g. max_tool_calls = 50", tomlValue(f.MaxToolCalls))
		}
		cfg.MaxToolCalls = int(n)
	}
	if f.Theme != nil {
		s, ok := f.Theme.(string)
		if !ok {
			return fail("theme", "= %s is invalid: it must be a string, e.g. theme = \"dark\"", tomlValue(f.Theme))
		}
		cfg.Theme = s
	}
	for name, v := range f.Backends {
		uri, ok := v.(string)
		if !ok || strings.TrimSpace(uri) == "" {
			return fail("backends."+name, "= %s is invalid: it must be a non-empty URI string, e.g. %s = \"ssh://user@host:22\"", tomlValue(v), name)
		}
		if strings.Contains(name, "://") || name == "" {
			return fail("backends."+name, "has an invalid name: pick a short name without \"://\", e.g. gpu = %q", uri)
		}
		cfg.Backends[name] = uri
	}
	if f.DefaultBackend != nil {
		s, ok := f.DefaultBackend.(string)
		if !ok || s == "" {
			return fail("default_backend", "= %s is invalid: it must be a backend name from [backends] or a URI such as \"local\"", tomlValue(f.DefaultBackend))
		}
		cfg.DefaultBackend = s
	}
	if f.Workspace != nil {
		s, ok := f.Workspace.(string)
		switch {
		case !ok || strings.TrimSpace(s) == "":
			return fail("workspace", "= %s is invalid: it must be a directory path, e.g. workspace = \"/home/me/project\" (leave it out to use the current directory)", tomlValue(f.Workspace))
		case strings.HasPrefix(s, "~"):
			return fail("workspace", "= %s is invalid: \"~\" is not expanded; write the full path, e.g. workspace = \"/home/me/project\"", tomlValue(f.Workspace))
		}
		cfg.Workspace = s
	}
	if f.Approve != nil {
		s, ok := f.Approve.(string)
		if !ok || !ValidApprove(s) {
			return fail("approve", "= %s is invalid: write approve = \"all\" (every tool call runs), \"ask\" (every call asks the operator) or \"none\" (every call is refused), or leave it out to use [approvals] and the defaults", tomlValue(f.Approve))
		}
		cfg.Approve = s
	}
	if f.ApprovalTimeout != nil {
		d, err := duration(f.ApprovalTimeout)
		if err == nil && d < time.Second {
			err = errors.New("it must be at least 1s")
		}
		if err != nil {
			return fail("approval_timeout", "= %s is invalid: %v; write a duration string such as approval_timeout = \"60s\"", tomlValue(f.ApprovalTimeout), err)
		}
		cfg.ApprovalTimeout = d
	}
	if f.HTTPAllow != nil {
		items, ok := f.HTTPAllow.([]any)
		if !ok {
			return fail("http_allow", "= %s is invalid: it must be an array of host names, IP addresses or CIDR prefixes, e.g. http_allow = [\"localhost\", \"127.0.0.0/8\"] ([] allows nothing)", tomlValue(f.HTTPAllow))
		}
		entries := make([]string, len(items))
		for i, it := range items {
			s, ok := it.(string)
			if !ok {
				return fail("http_allow", "item %d = %s is invalid: every item must be a quoted string, e.g. \"10.0.0.0/8\"", i+1, tomlValue(it))
			}
			entries[i] = s
		}
		allow, err := ParseAllowList(entries)
		if err != nil {
			return fail("http_allow", "is invalid: %v", err)
		}
		cfg.HTTPAllow = &allow
	}
	for _, c := range []struct {
		key    string
		mb     any
		keep   any
		bytes  *int64
		retain *time.Duration
	}{
		{"tool_output", f.ToolOutputMaxMB, f.ToolOutputKeep, &cfg.ToolOutputMaxBytes, &cfg.ToolOutputRetention},
		{"event_log", f.EventLogMaxMB, f.EventLogKeep, &cfg.EventLogMaxBytes, &cfg.EventLogRetention},
	} {
		if c.mb != nil {
			n, ok := c.mb.(int64)
			if !ok || n < 1 || n > 1<<20 {
				return fail(c.key+"_max_mb", "= %s is invalid: it must be a whole number of megabytes >= 1, e.g. %s_max_mb = 256", tomlValue(c.mb), c.key)
			}
			*c.bytes = n << 20
		}
		if c.keep != nil {
			d, err := duration(c.keep)
			if err == nil && d < time.Minute {
				err = errors.New("it must be at least 1m")
			}
			if err != nil {
				return fail(c.key+"_retention", "= %s is invalid: %v; write a duration string such as %s_retention = \"168h\"", tomlValue(c.keep), err, c.key)
			}
			*c.retain = d
		}
	}
	for _, b := range []struct {
		key string
		v   any
		dst *bool
		neg bool
	}{{"keep_tool_output", f.KeepToolOutput, &cfg.KeepToolOutput, false}, {"confine_kernels", f.ConfineKernels, &cfg.NoConfine, true}} {
		if b.v == nil {
			continue
		}
		v, ok := b.v.(bool)
		if !ok {
			return fail(b.key, "= %s is invalid: it must be true or false, e.g. %s = true", tomlValue(b.v), b.key)
		}
		*b.dst = v != b.neg
	}
	if f.Approvals != nil {
		a, err := parseApprovals(f.Approvals)
		if err != nil {
			return fmt.Errorf("config file %s: %w", path, err)
		}
		cfg.Approvals = a
	}
	return nil
}

// toolNameRE is the rule every host tool name follows (a Python identifier,
// as hosttools.Registry requires).
var toolNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

const policyHint = `write "allow" (runs), "ask" (the operator is asked) or "deny" (refused)`

// parseApprovals reads the [approvals] table: tool = policy lines and
// [approvals.owners.NAME] tables of tool (or "*") = policy.
func parseApprovals(v any) (engine.Approvals, error) {
	var a engine.Approvals
	table, ok := v.(map[string]any)
	if !ok {
		return a, fmt.Errorf("approvals = %s is invalid: it must be a table, e.g.\n[approvals]\nterminal = \"deny\"\n[approvals.owners.alice]\nterminal = \"allow\"", tomlValue(v))
	}
	policy := func(key string, v any, example string) (engine.Policy, error) {
		s, _ := v.(string)
		p, err := engine.ParsePolicy(s)
		if err != nil || s == "" {
			return "", fmt.Errorf("%s = %s is invalid: %s, e.g. %s", key, tomlValue(v), policyHint, example)
		}
		return p, nil
	}
	// Sorted, so a file with several mistakes always names the same one first.
	for _, tool := range slices.Sorted(maps.Keys(table)) {
		v := table[tool]
		if tool == "owners" {
			continue
		}
		key := "approvals." + tool
		if tool == "*" {
			return a, fmt.Errorf("approvals.\"*\" is not allowed at the top of [approvals]: to set every tool at once write approve = \"all\", \"ask\" or \"none\"; \"*\" = ... belongs in an owner's table, [approvals.owners.NAME]")
		}
		if _, isTable := v.(map[string]any); isTable {
			return a, fmt.Errorf("[%s] is not a known table: [approvals] holds tool = policy lines and [approvals.owners.NAME] tables", key)
		}
		if !toolNameRE.MatchString(tool) {
			return a, fmt.Errorf("%s: %q is not a tool name (letters, digits and _, not starting with a digit), e.g. approvals.terminal = \"ask\"", key, tool)
		}
		p, err := policy(key, v, tool+` = "ask"`)
		if err != nil {
			return a, err
		}
		if a.Tools == nil {
			a.Tools = map[string]engine.Policy{}
		}
		a.Tools[tool] = p
	}
	owners, present := table["owners"]
	if !present {
		return a, nil
	}
	ownerTables, ok := owners.(map[string]any)
	if !ok {
		return a, fmt.Errorf("approvals.owners = %s is invalid: give each owner a table, e.g.\n[approvals.owners.alice]\nterminal = \"allow\"\n\"*\" = \"ask\"", tomlValue(owners))
	}
	for _, owner := range slices.Sorted(maps.Keys(ownerTables)) {
		v := ownerTables[owner]
		key := "approvals.owners." + owner
		rules, ok := v.(map[string]any)
		if !ok {
			return a, fmt.Errorf("%s = %s is invalid: each owner is a table of tool = policy lines, e.g.\n[approvals.owners.%s]\nterminal = \"allow\"\n\"*\" = \"ask\"", key, tomlValue(v), owner)
		}
		if owner == "" {
			return a, errors.New(`[approvals.owners.""] is invalid: name an owner, e.g. [approvals.owners.alice]`)
		}
		for _, tool := range slices.Sorted(maps.Keys(rules)) {
			v := rules[tool]
			tkey := key + "." + tool
			if tool == "*" {
				tkey = key + `."*"`
			} else if !toolNameRE.MatchString(tool) {
				return a, fmt.Errorf("%s: %q is not a tool name (letters, digits and _, not starting with a digit) or \"*\" (every tool)", tkey, tool)
			}
			example := tool + ` = "allow"`
			if tool == "*" {
				example = `"*" = "ask"`
			}
			p, err := policy(tkey, v, example)
			if err != nil {
				return a, err
			}
			if a.Owners == nil {
				a.Owners = map[string]map[string]engine.Policy{}
			}
			if a.Owners[owner] == nil {
				a.Owners[owner] = map[string]engine.Policy{}
			}
			a.Owners[owner][tool] = p
		}
	}
	return a, nil
}

// ParseAllowList turns http_allow entries (or --http-allow values) into an
// allow-list: each is a CIDR prefix, else an IP address (as a /32 or /128),
// else a host name. No entries allow nothing.
func ParseAllowList(entries []string) (hosttools.AllowList, error) {
	a := hosttools.AllowList{Hosts: []string{}, Nets: []netip.Prefix{}}
	for _, e := range entries {
		if p, err := netip.ParsePrefix(e); err == nil {
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			a.Nets = append(a.Nets, p.Masked())
			continue
		}
		if ip, err := netip.ParseAddr(e); err == nil {
			ip = ip.Unmap().WithZone("")
			a.Nets = append(a.Nets, netip.PrefixFrom(ip, ip.BitLen()))
			continue
		}
		if err := checkHostName(e); err != nil {
			return hosttools.AllowList{}, err
		}
		a.Hosts = append(a.Hosts, e)
	}
	if len(a.Hosts) > 0 && len(a.Nets) == 0 {
		return hosttools.AllowList{}, fmt.Errorf("it names hosts (%s) but no address or CIDR prefix, so it would allow nothing: "+
			"http_get connects to a named host only when every address the name resolves to is allowed too; "+
			"add them, e.g. \"10.0.0.0/8\" (and \"127.0.0.0/8\" to keep loopback)", strings.Join(a.Hosts, ", "))
	}
	return a, nil
}

// checkHostName accepts a DNS host name: dot-separated labels of letters,
// digits, '-' and '_' (no leading or trailing '-'), an optional final dot.
func checkHostName(h string) error {
	bad := func(why string) error {
		return fmt.Errorf("%q is not a host name, IP address or CIDR prefix (%s); write a bare name such as \"api.internal\", "+
			"an address such as \"10.0.0.5\" or a prefix such as \"10.0.0.0/8\"", h, why)
	}
	if strings.Contains(h, "://") || strings.ContainsAny(h, "/:@?#") {
		return bad("no scheme, port, user or path")
	}
	if strings.Contains(h, "*") {
		return bad("wildcards are not supported; list each host")
	}
	name := strings.TrimSuffix(h, ".")
	if name == "" || len(name) > 253 {
		return bad("a name has 1 to 253 characters")
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return bad("each dot-separated label has 1 to 63 characters")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return bad("a label does not start or end with '-'")
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return bad(fmt.Sprintf("%q is not allowed in a host name", c))
			}
		}
	}
	return nil
}

// duration parses a TOML duration string. Bare numbers are refused because
// their unit would be a guess.
func duration(v any) (time.Duration, error) {
	s, ok := v.(string)
	if !ok {
		return 0, errors.New("it must be a quoted duration string with a unit")
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a Go duration (use units s, m, h as in \"90s\" or \"1h30m\")", s)
	}
	if d <= 0 {
		return 0, errors.New("it must be greater than zero")
	}
	return d, nil
}

// tomlValue renders a decoded value roughly as it was written, for messages.
func tomlValue(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("%q", v)
	case map[string]any:
		return "a table"
	case []any, []map[string]any:
		return "an array"
	default:
		return fmt.Sprint(v)
	}
}

// ResolveBackend turns a backend name from [backends] into its URI; anything
// else is taken to be a URI already.
func (c Config) ResolveBackend(nameOrURI string) string {
	if uri, ok := c.Backends[nameOrURI]; ok {
		return uri
	}
	return nameOrURI
}

// BackendNames lists the configured backend names, sorted, for messages.
func (c Config) BackendNames() []string {
	names := make([]string, 0, len(c.Backends))
	for n := range c.Backends {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
