// Package config loads kerneldeck's TOML config file. Every value in it can
// be overridden by a command-line flag; the file only changes defaults.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/kerneldeck/kerneldeck/engine"
)

// DefaultMaxToolCalls is how many host tool calls one cell may make when the
// file does not say.
const DefaultMaxToolCalls = 50

// Config is the merged configuration: defaults, then the file.
type Config struct {
	MaxKernels  int
	IdleExit    time.Duration
	CellTimeout time.Duration
	// MaxToolCalls is carried for the tool RPC, which is not served yet.
	MaxToolCalls int
	Theme        string
	// Backends maps a backend name the operator chose to its URI.
	Backends map[string]string
	// DefaultBackend is a name from Backends or a URI; empty means "local".
	DefaultBackend string
	// Path is the file that was loaded, or "" when there was none.
	Path string
}

// Defaults returns the configuration used when no file sets anything.
func Defaults() Config {
	return Config{
		MaxKernels:   engine.DefaultMaxKernels,
		IdleExit:     engine.DefaultIdleExit,
		CellTimeout:  engine.DefaultCellTimeout,
		MaxToolCalls: DefaultMaxToolCalls,
		Backends:     map[string]string{},
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
	MaxKernels     any            `toml:"max_kernels"`
	IdleExit       any            `toml:"idle_exit"`
	CellTimeout    any            `toml:"cell_timeout"`
	MaxToolCalls   any            `toml:"max_tool_calls"`
	Theme          any            `toml:"theme"`
	DefaultBackend any            `toml:"default_backend"`
	Backends       map[string]any `toml:"backends"`
}

const knownKeys = "max_kernels, idle_exit, cell_timeout, max_tool_calls, theme, default_backend, [backends]"

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
	if extra := md.Undecoded(); len(extra) > 0 {
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
	if f.MaxToolCalls != nil {
		n, ok := f.MaxToolCalls.(int64)
		if !ok || n < 0 || n > 1<<20 {
			return fail("max_tool_calls", "= %s is invalid: it must be a whole number >= 0, e.g. max_tool_calls = 50", tomlValue(f.MaxToolCalls))
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
