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

	"github.com/BurntSushi/toml"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/settings"
)

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
	// Values are the settings of the table in package settings.
	settings.Values
	Theme string
	// Backends maps a backend name the operator chose to its URI.
	Backends map[string]string
	// Pythons maps a backend URI to the interpreter its kernels run with,
	// where [backends] names one (name = { uri = "...", python = "..." }).
	Pythons map[string]string
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
	// HTTPAllow is where http_get may connect; nil means the default,
	// hosttools.DefaultAllowList (loopback only). Empty allows nothing.
	HTTPAllow *hosttools.AllowList
	// Path is the file that was loaded, or "" when there was none.
	Path string
}

// Defaults returns the configuration used when no file sets anything.
func Defaults() Config {
	return Config{Values: settings.Defaults(), Backends: map[string]string{}, Pythons: map[string]string{}}
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

// otherKeys are the config file's keys that are not settings of the table
// in package settings, each read by its own code in parse.
var otherKeys = []string{"theme", "default_backend", "workspace", "approve", "http_allow", "[backends]", "[approvals]"}

// knownKeys lists every key of the file, for an error about one it is not.
func knownKeys() string {
	var keys []string
	for _, s := range settings.All() {
		keys = append(keys, s.Key)
	}
	return strings.Join(append(keys, otherKeys...), ", ")
}

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
	var doc map[string]any
	if _, err := toml.Decode(data, &doc); err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return fmt.Errorf("config file %s is not valid TOML:\n%s", path, perr.ErrorWithUsage())
		}
		return fmt.Errorf("config file %s: %w", path, err)
	}
	where := "config file " + path
	fail := func(key, format string, args ...any) error {
		return fmt.Errorf("%s: %s %s", where, key, fmt.Sprintf(format, args...))
	}
	// Sorted, so a file with several mistakes always names the same one first.
	for _, key := range slices.Sorted(maps.Keys(doc)) {
		v := doc[key]
		if set, ok := settings.Lookup(key); ok {
			val, err := set.ParseFile(where, v)
			if err != nil {
				return err
			}
			set.SetFromFile(&cfg.Values, val)
			continue
		}
		var err error
		switch key {
		case "theme":
			s, ok := v.(string)
			if !ok {
				return fail("theme", "= %s is invalid: it must be a string, e.g. theme = \"dark\"", settings.TOMLValue(v))
			}
			cfg.Theme = s
		case "backends":
			err = parseBackends(v, cfg, fail, where)
		case "default_backend":
			s, ok := v.(string)
			if !ok || s == "" {
				return fail("default_backend", "= %s is invalid: it must be a backend name from [backends] or a URI such as \"local\"", settings.TOMLValue(v))
			}
			cfg.DefaultBackend = s
		case "workspace":
			s, ok := v.(string)
			switch {
			case !ok || strings.TrimSpace(s) == "":
				return fail("workspace", "= %s is invalid: it must be a directory path, e.g. workspace = \"/home/me/project\" (leave it out to use the current directory)", settings.TOMLValue(v))
			case strings.HasPrefix(s, "~"):
				return fail("workspace", "= %s is invalid: \"~\" is not expanded; write the full path, e.g. workspace = \"/home/me/project\"", settings.TOMLValue(v))
			}
			cfg.Workspace = s
		case "approve":
			s, ok := v.(string)
			if !ok || !ValidApprove(s) {
				return fail("approve", "= %s is invalid: write approve = \"all\" (every tool call runs), \"ask\" (every call asks the operator) or \"none\" (every call is refused), or leave it out to use [approvals] and the defaults", settings.TOMLValue(v))
			}
			cfg.Approve = s
		case "http_allow":
			err = parseHTTPAllow(v, cfg, fail)
		case "approvals":
			var a engine.Approvals
			if a, err = parseApprovals(v); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
			cfg.Approvals = a
		default:
			return fmt.Errorf("%s: unknown key %q; the known keys are %s (named backends go under [backends] as name = \"URI\")",
				where, key, knownKeys())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func parseBackends(v any, cfg *Config, fail func(key, format string, args ...any) error, where string) error {
	table, ok := v.(map[string]any)
	if !ok {
		return fail("backends", "= %s is invalid: it must be a table of name = \"URI\", e.g.\n[backends]\ngpu = \"ssh://me@gpu-box\"", settings.TOMLValue(v))
	}
	for _, name := range slices.Sorted(maps.Keys(table)) {
		uri, ok := table[name].(string)
		python := ""
		if entry, isTable := table[name].(map[string]any); isTable {
			// name = { uri = "ssh://gpu", python = "/opt/venv/bin/python" }
			for k := range entry {
				if k != "uri" && k != "python" {
					return fail("backends."+name, "has an unknown key %q; a backend table has uri and python, e.g. %s = { uri = \"ssh://gpu-box\", python = \"/opt/venv/bin/python\" }", k, name)
				}
			}
			uri, ok = entry["uri"].(string)
			if p, given := entry["python"]; given {
				set, _ := settings.Lookup("python")
				v, err := set.ParseFile(where+": backends."+name, p)
				if err != nil {
					return err
				}
				python = v.(string)
			}
		}
		if !ok || strings.TrimSpace(uri) == "" {
			return fail("backends."+name, "= %s is invalid: it must be a non-empty URI string, e.g. %s = \"ssh://user@host:22\", or a table with one, e.g. %s = { uri = \"ssh://user@host\", python = \"/opt/venv/bin/python\" }", settings.TOMLValue(table[name]), name, name)
		}
		if strings.Contains(name, "://") || name == "" {
			return fail("backends."+name, "has an invalid name: pick a short name without \"://\", e.g. gpu = %q", uri)
		}
		cfg.Backends[name] = uri
		if python != "" {
			cfg.Pythons[uri] = python
		}
	}
	return nil
}

func parseHTTPAllow(v any, cfg *Config, fail func(key, format string, args ...any) error) error {
	items, ok := v.([]any)
	if !ok {
		return fail("http_allow", "= %s is invalid: it must be an array of host names, IP addresses or CIDR prefixes, e.g. http_allow = [\"localhost\", \"127.0.0.0/8\"] ([] allows nothing)", settings.TOMLValue(v))
	}
	entries := make([]string, len(items))
	for i, it := range items {
		s, ok := it.(string)
		if !ok {
			return fail("http_allow", "item %d = %s is invalid: every item must be a quoted string, e.g. \"10.0.0.0/8\"", i+1, settings.TOMLValue(it))
		}
		entries[i] = s
	}
	allow, err := ParseAllowList(entries)
	if err != nil {
		return fail("http_allow", "is invalid: %v", err)
	}
	cfg.HTTPAllow = &allow
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
		return a, fmt.Errorf("approvals = %s is invalid: it must be a table, e.g.\n[approvals]\nterminal = \"deny\"\n[approvals.owners.alice]\nterminal = \"allow\"", settings.TOMLValue(v))
	}
	policy := func(key string, v any, example string) (engine.Policy, error) {
		s, _ := v.(string)
		p, err := engine.ParsePolicy(s)
		if err != nil || s == "" {
			return "", fmt.Errorf("%s = %s is invalid: %s, e.g. %s", key, settings.TOMLValue(v), policyHint, example)
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
		return a, fmt.Errorf("approvals.owners = %s is invalid: give each owner a table, e.g.\n[approvals.owners.alice]\nterminal = \"allow\"\n\"*\" = \"ask\"", settings.TOMLValue(owners))
	}
	for _, owner := range slices.Sorted(maps.Keys(ownerTables)) {
		v := ownerTables[owner]
		key := "approvals.owners." + owner
		rules, ok := v.(map[string]any)
		if !ok {
			return a, fmt.Errorf("%s = %s is invalid: each owner is a table of tool = policy lines, e.g.\n[approvals.owners.%s]\nterminal = \"allow\"\n\"*\" = \"ask\"", key, settings.TOMLValue(v), owner)
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
