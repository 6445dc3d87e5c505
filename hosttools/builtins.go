package hosttools

import (
	"context"
	"errors"
	"net/netip"
	"time"
)

// Defaults for the built-in tools. A zero field in Builtins means its default.
const (
	DefaultReadLimit        = 1 << 20 // bytes one read_file call returns
	DefaultListLimit        = 10000   // entries one list_files call returns
	DefaultOutputLimit      = 1 << 20 // bytes of terminal output kept
	DefaultTerminalTimeout  = 60 * time.Second
	MaxTerminalTimeout      = 600 * time.Second
	DefaultHTTPBodyLimit    = 1 << 20 // bytes of an http_get body kept
	DefaultHTTPTimeout      = 30 * time.Second
	MaxHTTPTimeout          = 120 * time.Second
	defaultMaxHTTPRedirects = 5
)

// Builtins configures the built-in tools. Workspace is required; every
// other zero field takes its default. The handlers read these fields on
// every call, so do not change them after Register.
type Builtins struct {
	Workspace *Workspace

	ReadLimit   int64 // read_file: bytes per call
	ListLimit   int   // list_files: entries per call
	OutputLimit int   // terminal: bytes of combined output kept

	TerminalTimeout    time.Duration // terminal: when the call gives none
	TerminalMaxTimeout time.Duration // terminal: the largest a call may ask for

	// HTTPAllow lists where http_get may connect; nil means
	// DefaultAllowList (loopback only). An empty, non-nil list allows nothing.
	HTTPAllow      *AllowList
	HTTPBodyLimit  int64
	HTTPTimeout    time.Duration
	HTTPMaxTimeout time.Duration
	// LookupIP resolves host names for http_get; nil means the system
	// resolver. Tests substitute a fixed table.
	LookupIP func(ctx context.Context, host string) ([]netip.Addr, error)
}

// Register adds read_file, write_file, list_files, terminal and http_get
// to r.
func (b *Builtins) Register(r *Registry) error {
	if b.Workspace == nil {
		return errors.New("register built-in tools: no Workspace")
	}
	tools := []Tool{
		{
			Name:        "read_file",
			Description: "Read a text file in the host workspace (offset and limit count bytes).",
			Params: Schema{
				{Name: "path", Type: TypeString, Required: true, Description: "file path, relative to the workspace"},
				{Name: "offset", Type: TypeInt, Description: "byte offset to start at (default 0)"},
				{Name: "limit", Type: TypeInt, Description: "at most this many bytes (default and maximum: the read cap)"},
			},
			Handler: b.readFile,
		},
		{
			Name:        "write_file",
			Description: "Write (or append to) a file in the host workspace; new files are private (0600).",
			Params: Schema{
				{Name: "path", Type: TypeString, Required: true, Description: "file path; its directory must already exist"},
				{Name: "content", Type: TypeString, Required: true},
				{Name: "append", Type: TypeBool, Description: "append instead of replacing (default false)"},
			},
			Handler: b.writeFile,
		},
		{
			Name:        "list_files",
			Description: "List a directory in the host workspace: name, type and size, sorted by name.",
			Params: Schema{
				{Name: "path", Type: TypeString, Description: "directory (default: the workspace root)"},
				{Name: "pattern", Type: TypeString, Description: `glob on entry names, e.g. "*.py"`},
			},
			Handler: b.listFiles,
		},
		{
			Name:        "terminal",
			Description: "Run a bash command on the host in the workspace; returns exit_code, combined output and timed_out.",
			Params: Schema{
				{Name: "command", Type: TypeString, Required: true},
				{Name: "timeout", Type: TypeNumber, Description: "seconds (default 60, at most 600)"},
				{Name: "cwd", Type: TypeString, Description: "working directory inside the workspace (default: its root)"},
			},
			Handler:               b.terminal,
			DropsBackgroundParams: true,
		},
		{
			Name:        "http_get",
			Description: "Fetch an http(s) URL from the host; only allow-listed hosts (default: loopback).",
			Params: Schema{
				{Name: "url", Type: TypeString, Required: true},
				{Name: "timeout", Type: TypeNumber, Description: "seconds (default 30, at most 120)"},
			},
			Handler: b.httpGet,
		},
	}
	for _, t := range tools {
		if err := r.Register(t); err != nil {
			return err
		}
	}
	return nil
}

func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}
