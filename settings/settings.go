// Package settings holds the engine's settings as one table: each with its
// config-file key, its flag, its bounds, its default and its help. The
// config file, the flags and their --help, and the headless limits op all
// read and check a setting through its record here.
package settings

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/bytesize"
)

// Values are the settings' values: the defaults, then the config file,
// then the flags.
type Values struct {
	MaxKernels int
	// MaxKernelsPerOwner bounds each owner's kernels; 0 is no bound (a
	// member's owner then gets a quarter of MaxKernels).
	MaxKernelsPerOwner int
	IdleExit           time.Duration
	// HibernateAfter is how long a kernel sits idle before it hibernates
	// (0: never).
	HibernateAfter time.Duration
	CellTimeout    time.Duration
	// MaxToolCalls is how many host tool calls one cell may make; 0 allows
	// none (see ToolCallLimit).
	MaxToolCalls    int
	ApprovalTimeout time.Duration
	// KernelMemory, KernelCPUTime and KernelMaxProcs limit each kernel
	// (0: no limit).
	KernelMemory   int64
	KernelCPUTime  time.Duration
	KernelMaxProcs int
	// SpareKernels is how many spare runners each backend keeps;
	// SpareKernelsSet says it was given (otherwise 1 on the local backend,
	// 0 on the others).
	SpareKernels    int
	SpareKernelsSet bool
	// ToolOutputMaxBytes, ToolOutputRetention, EventLogMaxBytes and
	// EventLogRetention bound what is stored (0: the stores' defaults).
	ToolOutputMaxBytes  int64
	ToolOutputRetention time.Duration
	EventLogMaxBytes    int64
	EventLogRetention   time.Duration
	KeepToolOutput      bool
	// NoConfine asks runners not to confine themselves with Landlock.
	NoConfine bool
	// KernelUIDs, on a root engine, are the uids its owners' kernels run
	// as (zero: the engine's user).
	KernelUIDs engine.UIDRange
	// Python is the interpreter kernels run with ("": python3 on each
	// host's PATH).
	Python string
	// NoPark: evicted and reaped kernels lose their state instead of
	// parking it; ParkMaxBytes, ParkTimeout, ParkRetention and
	// ParkTotalBytes bound parked states (0: the engine's defaults).
	NoPark         bool
	ParkMaxBytes   int64
	ParkTimeout    time.Duration
	ParkRetention  time.Duration
	ParkTotalBytes int64
}

// ToolCallLimit is MaxToolCalls as engine.Config takes it, where 0 is the
// default and a negative number allows none.
func (v Values) ToolCallLimit() int {
	if v.MaxToolCalls == 0 {
		return -1
	}
	return v.MaxToolCalls
}

// Kind is how a setting's value is written.
type Kind int

// The kinds of setting.
const (
	Count     Kind = iota // a whole number
	Duration              // a Go duration: "30m"
	Size                  // bytes, with a unit: "512MiB"
	Megabytes             // a whole number of megabytes, kept as bytes
	Bool                  // true or false
	Program               // an interpreter: an absolute path, or a name looked up on PATH
	UIDs                  // a range of OS user ids: "200000-265535"
)

// Section is the part of --help a setting's flag is listed in.
type Section int

// The sections of the engine's flags.
const (
	Engine Section = iota
	HostTools
)

// Setting is one setting's record.
type Setting struct {
	Key  string // in the config file, and in the headless limits op when Live
	Flag string // the flag's name; "" where there is none
	Kind Kind
	// Min and Max bound a Count or Megabytes; Min is the least Duration
	// (0: more than zero) and the least Size.
	Min, Max int64
	// Zero says what 0 means, where 0 is allowed: "0: no bound".
	Zero string
	// Example is a good value, as a flag gives it.
	Example string
	// Help is the flag's help (its `PLACEHOLDER` in back quotes); the
	// default is added to it.
	Help    string
	Section Section
	// DefaultText says the default where it is not one value.
	DefaultText string
	// Live: the headless limits op may change it while the engine runs.
	Live bool
	// Negated: the config file's true is the field's false (the key says
	// what is on, the field what is off).
	Negated bool
	// field points at the setting's value: *int, *int64, *time.Duration
	// or *bool.
	field func(v *Values) any
	// given is called when the setting is set, by a file or a flag.
	given func(v *Values)
}

var table = []Setting{
	{Key: "max_kernels", Flag: "max-kernels", Kind: Count, Min: engine.MinMaxKernels, Max: math.MaxInt32, Example: "4", Live: true,
		Help:  "at most `N` kernels at once; beyond that the least recently used idle kernel is killed",
		field: func(v *Values) any { return &v.MaxKernels }},
	{Key: "max_kernels_per_owner", Flag: "max-kernels-per-owner", Kind: Count, Min: engine.MinMaxKernelsPerOwner, Max: math.MaxInt32, Zero: "0: no bound",
		Example: "2", Live: true,
		Help: "at most `N` kernels of one owner; an owner at it gives up its own least recently used idle kernel for a new " +
			"one; with no bound, an --allow-group member's owner gets a quarter of --max-kernels",
		field: func(v *Values) any { return &v.MaxKernelsPerOwner }},
	{Key: "idle_exit", Flag: "idle-exit", Kind: Duration, Min: int64(engine.MinIdleExit), Example: "30m", Live: true,
		Help:  "kill kernels idle for longer than this `DURATION`",
		field: func(v *Values) any { return &v.IdleExit }},
	{Key: "hibernate_after", Flag: "hibernate-after", Kind: Duration, Min: int64(engine.MinHibernateAfter), Zero: "0: never",
		Example: "10m", Live: true,
		Help: "park a kernel idle for this `DURATION` and end its runner, to free its memory; its next call restores it " +
			"(what pickles comes back: a kernel with a thread of its own or a name that does not pickle stays awake). " +
			"Below --idle-exit only, and only with a state dir to park in",
		field: func(v *Values) any { return &v.HibernateAfter }},
	{Key: "cell_timeout", Flag: "cell-timeout", Kind: Duration, Example: "10m",
		Help: "timeout of a cell whose request gives none, a `DURATION`; the cell is interrupted, and its kernel killed " +
			"if it does not stop",
		field: func(v *Values) any { return &v.CellTimeout }},
	{Key: "kernel_memory", Flag: "kernel-memory", Kind: Size, Min: 32 << 20, Example: "512MiB",
		Help: "limit each kernel's address space to this `SIZE`: a cell that allocates past it gets MemoryError and the " +
			"kernel keeps its state",
		DefaultText: "no limit",
		field:       func(v *Values) any { return &v.KernelMemory }},
	{Key: "kernel_cpu_time", Flag: "kernel-cpu-time", Kind: Duration, Min: int64(time.Second), Example: "10m",
		Help: "limit the CPU time of each kernel (its runner and what it starts) to this `DURATION`; past it the " +
			"kernel is killed by SIGXCPU and says so",
		DefaultText: "no limit",
		field:       func(v *Values) any { return &v.KernelCPUTime }},
	{Key: "spare_kernels", Flag: "spare-kernels", Kind: Count, Min: 0, Max: 64, Zero: "0: none", Example: "1",
		Help: "keep `N` runners started and idle on each backend, not yet anyone's kernel, so that a new kernel starts at " +
			"once (spares count toward --max-kernels and go first when it is reached)",
		DefaultText: "1 on the local backend, 0 on the others",
		field:       func(v *Values) any { return &v.SpareKernels },
		given:       func(v *Values) { v.SpareKernelsSet = true }},
	{Key: "kernel_max_procs", Flag: "kernel-max-procs", Kind: Count, Min: 8, Max: math.MaxInt32, Example: "64",
		Help: "limit the processes of each kernel's login on its host to `N` (an rlimit, so it counts every process of " +
			"that login there, and root is exempt)",
		DefaultText: "no limit",
		field:       func(v *Values) any { return &v.KernelMaxProcs }},
	{Key: "confine_kernels", Flag: "no-confine", Kind: Bool, Negated: true,
		Help: "let runners skip hiding what kernels must not see: the engine's state dir and socket, the login's " +
			"control sockets and other kernels' dirs, covered with empty mounts in a mount namespace of each runner " +
			"(or, where the host gives none, denied by Landlock). Confined or not, a kernel reaches everything else its " +
			"user may, and the other protections between kernels hold",
		field: func(v *Values) any { return &v.NoConfine }},
	{Key: "kernel_uids", Flag: "kernel-uids", Kind: UIDs, Example: "200000-265535",
		Help: "on a root engine, run each owner's kernels on this machine as an OS user id of that owner's own from this " +
			"`RANGE` (no user may have one, nor /etc/subuid give it), with a home of its own under " + engine.DefaultKernelHomes +
			": owners are kept apart by the OS, and no kernel is root. Members of --allow-group run as their login",
		DefaultText: "none: kernels run as the engine's user",
		field:       func(v *Values) any { return &v.KernelUIDs }},
	{Key: "park_kernels", Flag: "no-park", Kind: Bool, Negated: true,
		Help: "let kernels that the cap evicts or idle_exit reaps lose their state. Parked (the default), a kernel's " +
			"namespace is saved in the state dir first, as far as it pickles, and its owner's next call gets it back",
		field: func(v *Values) any { return &v.NoPark }},
	{Key: "park_max_mb", Kind: Megabytes, Min: 1, Max: 1 << 20, Example: "256",
		field: func(v *Values) any { return &v.ParkMaxBytes }},
	{Key: "park_timeout", Kind: Duration, Min: int64(time.Second), Example: "10s",
		field: func(v *Values) any { return &v.ParkTimeout }},
	{Key: "park_retention", Kind: Duration, Min: int64(time.Minute), Example: "24h",
		field: func(v *Values) any { return &v.ParkRetention }},
	{Key: "park_total_mb", Kind: Megabytes, Min: 1, Max: 1 << 30, Example: "2048",
		field: func(v *Values) any { return &v.ParkTotalBytes }},
	{Key: "python", Flag: "python", Kind: Program, Example: "/opt/venv/bin/python",
		Help: "run kernels with this `PYTHON`: an absolute path, or a name looked up on each host's PATH (python3.12); " +
			"on this machine it is resolved at each new kernel as your shell would (PATH, a venv, the pyenv version), " +
			"on other hosts a shim (pyenv) once per host",
		DefaultText: "python3 on each host's PATH",
		field:       func(v *Values) any { return &v.Python }},
	{Key: "max_tool_calls", Flag: "max-tool-calls", Kind: Count, Min: 0, Max: 1 << 20, Zero: "0 allows no tool calls",
		Example: "50", Section: HostTools,
		Help:  "at most `N` tool calls per cell; later calls in the cell get a \"limit reached\" answer",
		field: func(v *Values) any { return &v.MaxToolCalls }},
	{Key: "approval_timeout", Flag: "approval-timeout", Kind: Duration, Min: int64(time.Second), Example: "60s",
		Section: HostTools,
		Help:    "how long a call that asks waits for an answer before it is denied, a `DURATION`",
		field:   func(v *Values) any { return &v.ApprovalTimeout }},
	{Key: "tool_output_max_mb", Kind: Megabytes, Min: 1, Max: 1 << 20, Example: "256",
		field: func(v *Values) any { return &v.ToolOutputMaxBytes }},
	{Key: "tool_output_retention", Kind: Duration, Min: int64(time.Minute), Example: "168h",
		field: func(v *Values) any { return &v.ToolOutputRetention }},
	{Key: "keep_tool_output", Kind: Bool, Example: "true",
		field: func(v *Values) any { return &v.KeepToolOutput }},
	{Key: "event_log_max_mb", Kind: Megabytes, Min: 1, Max: 1 << 20, Example: "256",
		field: func(v *Values) any { return &v.EventLogMaxBytes }},
	{Key: "event_log_retention", Kind: Duration, Min: int64(time.Minute), Example: "168h",
		field: func(v *Values) any { return &v.EventLogRetention }},
}

// All returns the settings in the order --help lists their flags.
func All() []Setting { return slices.Clone(table) }

// Lookup returns the setting of a config-file key.
func Lookup(key string) (Setting, bool) {
	i := slices.IndexFunc(table, func(s Setting) bool { return s.Key == key })
	if i < 0 {
		return Setting{}, false
	}
	return table[i], true
}

// Defaults are the values when nothing sets them.
func Defaults() Values {
	return Values{
		MaxKernels:      engine.DefaultMaxKernels,
		IdleExit:        engine.DefaultIdleExit,
		HibernateAfter:  engine.DefaultHibernateAfter,
		CellTimeout:     engine.DefaultCellTimeout,
		MaxToolCalls:    engine.DefaultMaxToolCalls,
		ApprovalTimeout: engine.DefaultApprovalTimeout,
	}
}

// Rule says what a valid value is, for an error or --help.
func (s Setting) Rule() string {
	switch s.Kind {
	case Count, Megabytes:
		unit := "a whole number"
		if s.Kind == Megabytes {
			unit = "a whole number of megabytes"
		}
		var r string
		if s.Max <= 1000 {
			r = fmt.Sprintf("%s from %d to %d", unit, s.Min, s.Max)
		} else {
			r = fmt.Sprintf("%s >= %d", unit, s.Min)
		}
		if s.Zero != "" {
			r += " (" + s.Zero + ")"
		}
		return r
	case Duration:
		r := "a duration greater than zero"
		if s.Min > 0 {
			r = "a duration of at least " + FormatDuration(time.Duration(s.Min))
		}
		if s.Zero != "" {
			r += " (" + s.Zero + ")"
		}
		return r
	case Size:
		return "a size of at least " + formatSize(s.Min)
	case Program:
		return "an absolute path or a command name, without spaces or quotes"
	case UIDs:
		return "a range of user ids FIRST-LAST above 0 that no user has, nor /etc/subuid gives anyone"
	default:
		return "true or false"
	}
}

// Invalid is the one wording of a bad value, wherever it came from: what
// was given (as it was written there: max_kernels = 0, --max-kernels 0),
// why it is wrong (may be ""), the rule and an example.
func (s Setting) Invalid(given, why, example string) error {
	msg := given + " is invalid: "
	if why != "" {
		msg += why + "; "
	}
	return fmt.Errorf("%sit must be %s, e.g. %s", msg, s.Rule(), example)
}

// FlagExample is the setting given well on the command line.
func (s Setting) FlagExample() string { return "--" + s.Flag + " " + s.Example }

// FileExample is the setting written well in the config file.
func (s Setting) FileExample() string {
	if s.Kind == Duration || s.Kind == Size || s.Kind == Program || s.Kind == UIDs {
		return s.Key + " = " + strconv.Quote(s.Example)
	}
	return s.Key + " = " + s.Example
}

// ParseText reads a value as a flag gives it. The error says why it is
// invalid, the rule and an example.
func (s Setting) ParseText(text string) (any, error) {
	return s.parse(text, false, func(why string) error { return s.Invalid("--"+s.Flag+" "+text, why, s.FlagExample()) })
}

// ParseFile reads a value as the TOML decoder gives it (int64, string,
// bool). where names the file for the error.
func (s Setting) ParseFile(where string, v any) (any, error) {
	bad := func(why string) error {
		return fmt.Errorf("%s: %w", where, s.Invalid(s.Key+" = "+TOMLValue(v), why, s.FileExample()))
	}
	var text string
	ok := false
	switch s.Kind {
	case Count, Megabytes:
		var n int64
		n, ok = v.(int64)
		text = strconv.FormatInt(n, 10)
	case Duration:
		if text, ok = v.(string); !ok {
			return nil, bad("a duration is a quoted duration string with a unit")
		}
	case Size:
		if text, ok = v.(string); !ok {
			return nil, bad("a size is a quoted string with a unit")
		}
	case Program:
		if text, ok = v.(string); !ok {
			return nil, bad("a program is a quoted string")
		}
	case UIDs:
		if text, ok = v.(string); !ok {
			return nil, bad("a range is a quoted string")
		}
	default:
		var b bool
		b, ok = v.(bool)
		text = strconv.FormatBool(b)
	}
	if !ok {
		return nil, bad("")
	}
	return s.parse(text, true, bad)
}

// parse reads text as the setting's kind and holds it to its bounds;
// quoted: the source writes strings in quotes (a file), so the examples
// in errors do too.
func (s Setting) parse(text string, quoted bool, bad func(why string) error) (any, error) {
	switch s.Kind {
	case Count, Megabytes:
		n, err := strconv.ParseInt(strings.TrimSpace(text), 10, 64)
		if err != nil {
			return nil, bad("")
		}
		return s.check(n, bad)
	case Duration:
		d, err := time.ParseDuration(text)
		if err != nil {
			units := "90s, 1h30m"
			if quoted {
				units = `"90s", "1h30m"`
			}
			return nil, bad(fmt.Sprintf("%q is not a Go duration (units s, m, h: %s)", text, units))
		}
		return s.check(d, bad)
	case Size:
		n, err := bytesize.Parse(text)
		if err != nil {
			return nil, bad("")
		}
		return s.check(n, bad)
	case Program:
		// It goes into the spawn's shell script (quoted) on every host:
		// a plain path or name, nothing the shell or a reader could
		// take otherwise.
		switch {
		case text == "":
			return nil, bad("it is empty")
		case strings.ContainsFunc(text, func(r rune) bool { return r <= ' ' || r == 0x7f || strings.ContainsRune(`"'\$`+"`", r) }):
			return nil, bad(fmt.Sprintf("%q holds a space, a quote or a control character", text))
		case strings.Contains(text, "/") && !strings.HasPrefix(text, "/"):
			return nil, bad(fmt.Sprintf("%q is a relative path; give an absolute one, or a name looked up on PATH", text))
		}
		return text, nil
	case UIDs:
		r, err := engine.ParseUIDRange(text)
		if err != nil {
			return nil, bad(err.Error())
		}
		return r, nil
	default:
		b, err := strconv.ParseBool(text)
		if err != nil {
			return nil, bad("")
		}
		return b, nil
	}
}

// CheckCount checks a whole number given at run time (the headless
// limits op); where names the field for the error.
func (s Setting) CheckCount(where string, n int64) (int, error) {
	v, err := s.check(n, func(why string) error {
		return s.Invalid(where+" "+strconv.FormatInt(n, 10), why, where+" "+s.Example)
	})
	if err != nil {
		return 0, err
	}
	return int(v.(int64)), nil
}

// CheckDuration checks a duration given at run time.
func (s Setting) CheckDuration(where string, d time.Duration, given string) (time.Duration, error) {
	v, err := s.check(d, func(why string) error { return s.Invalid(where+" "+given, why, where+" "+s.Example) })
	if err != nil {
		return 0, err
	}
	return v.(time.Duration), nil
}

// check holds a parsed value to the setting's bounds.
func (s Setting) check(v any, bad func(why string) error) (any, error) {
	switch v := v.(type) {
	case int64:
		if s.Kind == Size {
			if v < s.Min {
				return nil, bad("")
			}
			return v, nil
		}
		if v < s.Min || v > s.Max {
			return nil, bad("")
		}
		return v, nil
	case time.Duration:
		if v == 0 && s.Zero != "" {
			return v, nil
		}
		if v <= 0 || v < time.Duration(s.Min) {
			return nil, bad("")
		}
		return v, nil
	}
	return v, nil
}

// Set stores a value ParseText or ParseFile returned.
func (s Setting) Set(vals *Values, v any) {
	switch p := s.field(vals).(type) {
	case *int:
		*p = int(v.(int64))
	case *int64:
		n := v.(int64)
		if s.Kind == Megabytes {
			n <<= 20
		}
		*p = n
	case *time.Duration:
		*p = v.(time.Duration)
	case *bool:
		*p = v.(bool)
	case *string:
		*p = v.(string)
	case *engine.UIDRange:
		*p = v.(engine.UIDRange)
	}
	if s.given != nil {
		s.given(vals)
	}
}

// SetFromFile stores a value ParseFile returned, as the file means it.
func (s Setting) SetFromFile(vals *Values, v any) {
	if b, ok := v.(bool); ok && s.Negated {
		v = !b
	}
	s.Set(vals, v)
}

// Default says the setting's default for --help.
func (s Setting) Default() string {
	if s.DefaultText != "" {
		return s.DefaultText
	}
	d := Defaults()
	switch p := s.field(&d).(type) {
	case *int:
		return strconv.Itoa(*p)
	case *int64:
		return strconv.FormatInt(*p, 10)
	case *time.Duration:
		return FormatDuration(*p)
	case *bool:
		return strconv.FormatBool(*p)
	}
	return ""
}

// FormatDuration writes d as an operator would: 30m, 1h30m, 90s.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func formatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// TOMLValue renders a value the TOML decoder gave roughly as it was
// written, for messages about it.
func TOMLValue(v any) string {
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	case map[string]any:
		return "a table"
	case []any, []map[string]any:
		return "an array"
	default:
		return fmt.Sprint(v)
	}
}
