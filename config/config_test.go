package config

import (
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/settings"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadGoodFile(t *testing.T) {
	p := writeFile(t, `
max_kernels = 7
max_kernels_per_owner = 2
idle_exit = "45m"
cell_timeout = "90s"
max_tool_calls = 12
theme = "dark"
default_backend = "gpu"

[backends]
gpu = "ssh://me@gpu-box:2222"
box = "docker://box"
`)
	cfg, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Values: settings.Values{MaxKernels: 7, IdleExit: 45 * time.Minute, CellTimeout: 90 * time.Second, MaxToolCalls: 12},
		Theme: "dark", DefaultBackend: "gpu", Path: p}
	if cfg.MaxKernelsPerOwner != 2 {
		t.Errorf("max_kernels_per_owner = %d, want 2", cfg.MaxKernelsPerOwner)
	}
	if cfg.MaxKernels != want.MaxKernels || cfg.IdleExit != want.IdleExit || cfg.CellTimeout != want.CellTimeout ||
		cfg.MaxToolCalls != want.MaxToolCalls || cfg.Theme != want.Theme || cfg.DefaultBackend != want.DefaultBackend || cfg.Path != p {
		t.Errorf("Load = %+v, want %+v", cfg, want)
	}
	if got := cfg.ResolveBackend("gpu"); got != "ssh://me@gpu-box:2222" {
		t.Errorf("ResolveBackend(gpu) = %q", got)
	}
	if got := cfg.ResolveBackend("local"); got != "local" {
		t.Errorf("ResolveBackend(local) = %q, want it passed through as a URI", got)
	}
	if got := strings.Join(cfg.BackendNames(), ","); got != "box,gpu" {
		t.Errorf("BackendNames = %q", got)
	}
}

func TestLoadKernelLimits(t *testing.T) {
	cfg, err := Load(writeFile(t, "kernel_memory = \"512MiB\"\nkernel_cpu_time = \"10m\"\nkernel_max_procs = 64\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.KernelMemory != 512<<20 || cfg.KernelCPUTime != 10*time.Minute || cfg.KernelMaxProcs != 64 {
		t.Errorf("limits %d %v %d", cfg.KernelMemory, cfg.KernelCPUTime, cfg.KernelMaxProcs)
	}
}

func TestLoadSpareKernels(t *testing.T) {
	cfg, err := Load(writeFile(t, "spare_kernels = 0\n"))
	if err != nil || cfg.SpareKernels != 0 || !cfg.SpareKernelsSet {
		t.Fatalf("spare_kernels = 0: %+v %v; want it set to 0", cfg.SpareKernels, err)
	}
	if cfg, err = Load(writeFile(t, "max_kernels = 4\n")); err != nil || cfg.SpareKernelsSet {
		t.Fatalf("without spare_kernels: set %v, %v; want the per-backend default", cfg.SpareKernelsSet, err)
	}
}

// TestLoadPython: python for every backend, and per backend in a
// [backends] table entry.
func TestLoadPython(t *testing.T) {
	cfg, err := Load(writeFile(t, "python = \"python3.12\"\n[backends]\ngpu = { uri = \"ssh://gpu-box\", python = \"/opt/venv/bin/python\" }\ncpu = \"ssh://cpu-box\"\n"))
	if err != nil || cfg.Python != "python3.12" || cfg.Backends["gpu"] != "ssh://gpu-box" || cfg.Backends["cpu"] != "ssh://cpu-box" ||
		len(cfg.Pythons) != 1 || cfg.Pythons["ssh://gpu-box"] != "/opt/venv/bin/python" {
		t.Fatalf("python keys: %v; python %q, backends %v, pythons %v", err, cfg.Python, cfg.Backends, cfg.Pythons)
	}
}

func TestLoadStorageAndConfineKeys(t *testing.T) {
	cfg, err := Load(writeFile(t, "tool_output_max_mb = 8\ntool_output_retention = \"2h\"\nkeep_tool_output = true\nconfine_kernels = false\n"+
		"event_log_max_mb = 16\nevent_log_retention = \"720h\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ToolOutputMaxBytes != 8<<20 || cfg.ToolOutputRetention != 2*time.Hour || !cfg.KeepToolOutput || !cfg.NoConfine ||
		cfg.EventLogMaxBytes != 16<<20 || cfg.EventLogRetention != 720*time.Hour {
		t.Errorf("Load = %+v", cfg)
	}
	if d := Defaults(); d.NoConfine || d.KeepToolOutput || d.ToolOutputMaxBytes != 0 {
		t.Errorf("defaults %+v: kernels are confined and tool output goes with its kernel", d)
	}
}

func TestLoadPartialFileKeepsDefaults(t *testing.T) {
	cfg, err := Load(writeFile(t, "theme = \"light\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxKernels != engine.DefaultMaxKernels || cfg.IdleExit != engine.DefaultIdleExit ||
		cfg.CellTimeout != engine.DefaultCellTimeout || cfg.MaxToolCalls != engine.DefaultMaxToolCalls ||
		cfg.ApprovalTimeout != engine.DefaultApprovalTimeout || cfg.Workspace != "" || cfg.Approve != "" ||
		cfg.HTTPAllow != nil || cfg.Approvals.Tools != nil || cfg.Approvals.Owners != nil {
		t.Errorf("defaults not kept: %+v", cfg)
	}
}

// TestLoadToolKeys covers every valid form of the tool and approval keys.
func TestLoadToolKeys(t *testing.T) {
	prefixes := func(ps ...string) []netip.Prefix {
		out := []netip.Prefix{}
		for _, p := range ps {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	for _, tc := range []struct {
		name, body string
		check      func(t *testing.T, cfg Config)
	}{
		{"workspace", `workspace = "/srv/project"` + "\n", func(t *testing.T, cfg Config) {
			if cfg.Workspace != "/srv/project" {
				t.Errorf("Workspace = %q", cfg.Workspace)
			}
		}},
		{"relative workspace", `workspace = "work/here"` + "\n", func(t *testing.T, cfg Config) {
			if cfg.Workspace != "work/here" {
				t.Errorf("Workspace = %q", cfg.Workspace)
			}
		}},
		{"approve all", `approve = "all"` + "\n", func(t *testing.T, cfg Config) {
			if cfg.Approve != ApproveAll {
				t.Errorf("Approve = %q", cfg.Approve)
			}
		}},
		{"approve ask", `approve = "ask"` + "\n", func(t *testing.T, cfg Config) {
			if cfg.Approve != ApproveAsk {
				t.Errorf("Approve = %q", cfg.Approve)
			}
		}},
		{"approve none", `approve = "none"` + "\n", func(t *testing.T, cfg Config) {
			if cfg.Approve != ApproveNone {
				t.Errorf("Approve = %q", cfg.Approve)
			}
		}},
		{"approval_timeout", `approval_timeout = "2m30s"` + "\n", func(t *testing.T, cfg Config) {
			if cfg.ApprovalTimeout != 150*time.Second {
				t.Errorf("ApprovalTimeout = %v", cfg.ApprovalTimeout)
			}
		}},
		{"approval_timeout of exactly 1s", `approval_timeout = "1s"` + "\n", func(t *testing.T, cfg Config) {
			if cfg.ApprovalTimeout != time.Second {
				t.Errorf("ApprovalTimeout = %v", cfg.ApprovalTimeout)
			}
		}},
		{"max_tool_calls zero", "max_tool_calls = 0\n", func(t *testing.T, cfg Config) {
			if cfg.MaxToolCalls != 0 {
				t.Errorf("MaxToolCalls = %d", cfg.MaxToolCalls)
			}
		}},
		{"http_allow mixed", `http_allow = ["API.internal.", "10.0.0.0/8", "192.168.1.7", "::1", "fd00::/8", "127.1.2.3/8", "::ffff:10.1.0.0/112"]` + "\n",
			func(t *testing.T, cfg Config) {
				want := hosttools.AllowList{Hosts: []string{"API.internal."},
					Nets: prefixes("10.0.0.0/8", "192.168.1.7/32", "::1/128", "fd00::/8", "127.0.0.0/8", "10.1.0.0/16")}
				if cfg.HTTPAllow == nil || !reflect.DeepEqual(*cfg.HTTPAllow, want) {
					t.Errorf("HTTPAllow = %+v, want %+v", cfg.HTTPAllow, want)
				}
			}},
		{"http_allow empty allows nothing", "http_allow = []\n", func(t *testing.T, cfg Config) {
			if cfg.HTTPAllow == nil || len(cfg.HTTPAllow.Hosts) != 0 || len(cfg.HTTPAllow.Nets) != 0 {
				t.Errorf("HTTPAllow = %+v, want a non-nil empty list", cfg.HTTPAllow)
			}
		}},
		{"approvals per tool", "[approvals]\nterminal = \"deny\"\nread_file = \"ask\"\nmy_tool = \"allow\"\n", func(t *testing.T, cfg Config) {
			want := map[string]engine.Policy{"terminal": engine.PolicyDeny, "read_file": engine.PolicyAsk, "my_tool": engine.PolicyAllow}
			if !maps.Equal(cfg.Approvals.Tools, want) || cfg.Approvals.Owners != nil || cfg.Approvals.Default != "" {
				t.Errorf("Approvals = %+v, want Tools %v only", cfg.Approvals, want)
			}
		}},
		{"approvals per owner", `
[approvals]
write_file = "deny"

[approvals.owners.alice]
terminal = "allow"
"*" = "ask"

[approvals.owners."ci bot"]
"*" = "deny"
`, func(t *testing.T, cfg Config) {
			a := cfg.Approvals
			if !maps.Equal(a.Tools, map[string]engine.Policy{"write_file": engine.PolicyDeny}) {
				t.Errorf("Tools = %v", a.Tools)
			}
			if len(a.Owners) != 2 ||
				!maps.Equal(a.Owners["alice"], map[string]engine.Policy{"terminal": engine.PolicyAllow, "*": engine.PolicyAsk}) ||
				!maps.Equal(a.Owners["ci bot"], map[string]engine.Policy{"*": engine.PolicyDeny}) {
				t.Errorf("Owners = %v", a.Owners)
			}
			if err := a.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		}},
		{"approvals owners only", "[approvals.owners.bob]\nhttp_get = \"deny\"\n", func(t *testing.T, cfg Config) {
			if cfg.Approvals.Tools != nil || cfg.Approvals.Owners["bob"]["http_get"] != engine.PolicyDeny {
				t.Errorf("Approvals = %+v", cfg.Approvals)
			}
		}},
		{"empty approvals table", "[approvals]\n", func(t *testing.T, cfg Config) {
			if cfg.Approvals.Tools != nil || cfg.Approvals.Owners != nil {
				t.Errorf("Approvals = %+v", cfg.Approvals)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(writeFile(t, tc.body))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, cfg)
		})
	}
}

func TestParseAllowList(t *testing.T) {
	a, err := ParseAllowList([]string{"localhost", "127.0.0.0/8", "::1", "fe80::1%eth0"})
	if err != nil {
		t.Fatal(err)
	}
	want := hosttools.AllowList{Hosts: []string{"localhost"},
		Nets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("fe80::1/128")}}
	if !reflect.DeepEqual(a, want) {
		t.Errorf("ParseAllowList = %+v, want %+v", a, want)
	}
	if a, err := ParseAllowList(nil); err != nil || a.Hosts == nil || a.Nets == nil || len(a.Hosts)+len(a.Nets) != 0 {
		t.Errorf("ParseAllowList(nil) = %+v, %v; want an empty, non-nil list", a, err)
	}
}

func TestLoadRejects(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []string // substrings of the error
	}{
		{"unknown key", "max_kernel = 3\n", []string{`unknown key "max_kernel"`, "max_kernels"}},
		{"python relative", `python = "venv/bin/python"` + "\n", []string{`python = "venv/bin/python" is invalid`, "relative path"}},
		{"backend python bad", "[backends]\ngpu = { uri = \"ssh://g\", python = \"a b\" }\n", []string{"backends.gpu", "holds a space"}},
		{"backend table key", "[backends]\ngpu = { url = \"ssh://g\" }\n", []string{"backends.gpu", `unknown key "url"`, "uri and python"}},
		{"backend table no uri", "[backends]\ngpu = { python = \"/usr/bin/python3\" }\n", []string{"backends.gpu", "non-empty URI"}},
		{"unknown nested key", "[ui]\ncolor = 1\n", []string{`unknown key "ui`}},
		{"bad duration", `idle_exit = "30x"` + "\n", []string{"idle_exit", `"30x" is not a Go duration`, `"30m"`}},
		{"duration without unit", "cell_timeout = 30\n", []string{"cell_timeout = 30 is invalid", "quoted duration string"}},
		{"idle_exit below 1s", `idle_exit = "500ms"` + "\n", []string{"idle_exit", "at least 1s"}},
		{"zero cell timeout", `cell_timeout = "0s"` + "\n", []string{"cell_timeout", "greater than zero"}},
		{"kernel_memory number", "kernel_memory = 512\n", []string{"kernel_memory = 512 is invalid", `"512MiB"`}},
		{"kernel_memory small", `kernel_memory = "1MiB"` + "\n", []string{"kernel_memory", "at least 32MiB"}},
		{"kernel_memory junk", `kernel_memory = "lots"` + "\n", []string{"kernel_memory"}},
		{"kernel_cpu_time short", `kernel_cpu_time = "10ms"` + "\n", []string{"kernel_cpu_time", "at least 1s"}},
		{"kernel_max_procs few", "kernel_max_procs = 2\n", []string{"kernel_max_procs = 2 is invalid", ">= 8"}},
		{"spare_kernels negative", "spare_kernels = -1\n", []string{"spare_kernels = -1 is invalid", "from 0 to 64"}},
		{"spare_kernels text", "spare_kernels = \"one\"\n", []string{"spare_kernels = \"one\" is invalid"}},
		{"max_kernels zero", "max_kernels = 0\n", []string{"max_kernels = 0 is invalid", ">= 1"}},
		{"max_kernels string", `max_kernels = "4"` + "\n", []string{`max_kernels = "4" is invalid`}},
		{"max_kernels_per_owner negative", "max_kernels_per_owner = -1\n", []string{"max_kernels_per_owner = -1 is invalid", ">= 0 (0: no bound)"}},
		{"negative tool calls", "max_tool_calls = -1\n", []string{"max_tool_calls = -1 is invalid"}},
		{"theme not a string", "theme = 3\n", []string{"theme = 3 is invalid"}},
		{"backend not a string", "[backends]\ngpu = 3\n", []string{"backends.gpu = 3 is invalid", "URI"}},
		{"backend name is a URI", "[backends]\n\"ssh://x\" = \"ssh://x\"\n", []string{"invalid name"}},
		{"empty default backend", `default_backend = ""` + "\n", []string{"default_backend"}},
		{"syntax error", "max_kernels = = 3\n", []string{"not valid TOML", "line 1"}},
		{"unknown key lists the tool keys", "aprove = \"all\"\n", []string{`unknown key "aprove"`, "approve", "http_allow", "[approvals]"}},

		{"workspace empty", `workspace = ""` + "\n", []string{`workspace = "" is invalid`, "directory path", "current directory"}},
		{"workspace blank", `workspace = "  "` + "\n", []string{`workspace = "  " is invalid`}},
		{"workspace not a string", "workspace = 1\n", []string{"workspace = 1 is invalid"}},
		{"workspace tilde", `workspace = "~/src"` + "\n", []string{`workspace = "~/src" is invalid`, "not expanded", "full path"}},

		{"approve unknown", `approve = "yes"` + "\n", []string{`approve = "yes" is invalid`, `"all"`, `"ask"`, `"none"`}},
		{"approve policy word", `approve = "allow"` + "\n", []string{`approve = "allow" is invalid`, `"all"`}},
		{"approve not a string", "approve = true\n", []string{"approve = true is invalid"}},

		{"approval_timeout bare number", "approval_timeout = 60\n", []string{"approval_timeout = 60 is invalid", "quoted duration string", `"60s"`}},
		{"approval_timeout below 1s", `approval_timeout = "900ms"` + "\n", []string{"approval_timeout", "at least 1s"}},
		{"approval_timeout zero", `approval_timeout = "0s"` + "\n", []string{"approval_timeout", "at least 1s"}},
		{"approval_timeout bad", `approval_timeout = "a minute"` + "\n", []string{"approval_timeout", `"a minute" is not a Go duration`}},

		{"http_allow a string", `http_allow = "localhost"` + "\n", []string{`http_allow = "localhost" is invalid`, "array", "[] allows nothing"}},
		{"http_allow item not a string", "http_allow = [\"localhost\", 127]\n", []string{"http_allow item 2 = 127 is invalid", "quoted string"}},
		{"http_allow URL", `http_allow = ["http://example.com", "10.0.0.0/8"]` + "\n", []string{"http_allow is invalid", `"http://example.com" is not a host name`, "no scheme, port"}},
		{"http_allow host:port", `http_allow = ["example.com:8080", "10.0.0.0/8"]` + "\n", []string{`"example.com:8080" is not a host name`}},
		{"http_allow wildcard", `http_allow = ["*.example.com", "10.0.0.0/8"]` + "\n", []string{`"*.example.com"`, "wildcards are not supported"}},
		{"http_allow bad prefix", `http_allow = ["10.0.0.0/33"]` + "\n", []string{`"10.0.0.0/33" is not a host name, IP address or CIDR prefix`}},
		{"http_allow empty item", `http_allow = [""]` + "\n", []string{`"" is not a host name`}},
		{"http_allow bad label", `http_allow = ["-bad.example", "10.0.0.0/8"]` + "\n", []string{`"-bad.example"`, "'-'"}},
		{"http_allow bad char", `http_allow = ["ex ample.com", "10.0.0.0/8"]` + "\n", []string{`"ex ample.com"`, `' ' is not allowed`}},
		{"http_allow hosts without addresses", `http_allow = ["api.internal"]` + "\n", []string{"http_allow is invalid", "names hosts (api.internal) but no address", "every address", "127.0.0.0/8"}},

		{"approvals not a table", "approvals = \"ask\"\n", []string{`approvals = "ask" is invalid`, "must be a table", "[approvals]"}},
		{"approvals bad policy", "[approvals]\nterminal = \"maybe\"\n", []string{`approvals.terminal = "maybe" is invalid`, `"allow"`, `"ask"`, `"deny"`, `terminal = "ask"`}},
		{"approvals policy not a string", "[approvals]\nterminal = false\n", []string{"approvals.terminal = false is invalid"}},
		{"approvals empty policy", "[approvals]\nterminal = \"\"\n", []string{`approvals.terminal = "" is invalid`}},
		{"approvals blanket word as policy", "[approvals]\nterminal = \"all\"\n", []string{`approvals.terminal = "all" is invalid`}},
		{"approvals bad tool name", "[approvals]\n\"read-file\" = \"ask\"\n", []string{`approvals.read-file`, `"read-file" is not a tool name`}},
		{"approvals star at top", "[approvals]\n\"*\" = \"deny\"\n", []string{`approvals."*" is not allowed`, `approve = "all", "ask" or "none"`, "[approvals.owners.NAME]"}},
		{"approvals unknown table", "[approvals.tools]\nterminal = \"ask\"\n", []string{"[approvals.tools] is not a known table", "[approvals.owners.NAME]"}},
		{"owners not a table", "[approvals]\nowners = \"alice\"\n", []string{`approvals.owners = "alice" is invalid`, "[approvals.owners.alice]"}},
		{"owner not a table", "[approvals.owners]\nalice = \"deny\"\n", []string{`approvals.owners.alice = "deny" is invalid`, "table of tool = policy", "[approvals.owners.alice]"}},
		{"owner bad policy", "[approvals.owners.alice]\nterminal = \"yes\"\n", []string{`approvals.owners.alice.terminal = "yes" is invalid`, `"deny"`}},
		{"owner star bad policy", "[approvals.owners.alice]\n\"*\" = \"always\"\n", []string{`approvals.owners.alice."*" = "always" is invalid`, `"*" = "ask"`}},
		{"owner bad tool name", "[approvals.owners.alice]\n\"2fast\" = \"ask\"\n", []string{`approvals.owners.alice.2fast`, "not a tool name", `"*"`}},
		{"owner empty name", "[approvals.owners.\"\"]\nterminal = \"ask\"\n", []string{`[approvals.owners.""] is invalid`, "name an owner"}},

		{"tool output quota zero", "tool_output_max_mb = 0\n", []string{"tool_output_max_mb = 0 is invalid", "megabytes"}},
		{"tool output quota string", `tool_output_max_mb = "1G"` + "\n", []string{`tool_output_max_mb = "1G" is invalid`}},
		{"tool output retention short", `tool_output_retention = "10s"` + "\n", []string{"tool_output_retention", "at least 1m"}},
		{"keep tool output not a bool", `keep_tool_output = "yes"` + "\n", []string{`keep_tool_output = "yes" is invalid`, "true or false"}},
		{"confine kernels not a bool", "confine_kernels = 0\n", []string{"confine_kernels = 0 is invalid"}},
		{"event log cap negative", "event_log_max_mb = -1\n", []string{"event_log_max_mb = -1 is invalid", "megabytes"}},
		{"event log retention not a duration", `event_log_retention = "a week"` + "\n", []string{"event_log_retention", `"168h"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, tc.body)
			_, err := Load(p)
			if err == nil {
				t.Fatalf("Load accepted %q", tc.body)
			}
			msg := err.Error()
			for _, w := range append(tc.want, p) {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)

	missing := filepath.Join(dir, "nope.toml")
	_, err := Load(missing)
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Load(missing explicit file) = %v, want an error naming %s", err, missing)
	}

	cfg, err := Load("")
	if err != nil {
		t.Fatalf("Load(\"\") with no default file: %v", err)
	}
	if cfg.Path != "" || cfg.MaxKernels != engine.DefaultMaxKernels {
		t.Errorf("Load(\"\") = %+v, want defaults and no path", cfg)
	}

	// The default file is used when present.
	def := filepath.Join(dir, "kerneldeck", "config.toml")
	if err := os.MkdirAll(filepath.Dir(def), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(def, []byte("max_kernels = 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = Load("")
	if err != nil || cfg.MaxKernels != 2 || cfg.Path != def {
		t.Errorf("Load(\"\") with a default file = %+v, %v; want max_kernels 2 from %s", cfg, err, def)
	}
}

func TestDefaultPaths(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", "/xdg/config")
	t.Setenv("XDG_STATE_HOME", "/xdg/state")
	if p, _ := DefaultPath(); p != "/xdg/config/kerneldeck/config.toml" {
		t.Errorf("DefaultPath = %q", p)
	}
	if p, _ := DefaultStateDir(); p != "/xdg/state/kerneldeck" {
		t.Errorf("DefaultStateDir = %q", p)
	}
	t.Setenv("HOME", "/home/someone")
	for _, v := range []string{"", "relative/dir"} {
		t.Setenv("XDG_CONFIG_HOME", v)
		t.Setenv("XDG_STATE_HOME", v)
		if p, _ := DefaultPath(); p != "/home/someone/.config/kerneldeck/config.toml" {
			t.Errorf("XDG_CONFIG_HOME=%q: DefaultPath = %q", v, p)
		}
		if p, _ := DefaultStateDir(); p != "/home/someone/.local/state/kerneldeck" {
			t.Errorf("XDG_STATE_HOME=%q: DefaultStateDir = %q", v, p)
		}
	}
}

// Every setting of the table is read from the file by its key, as its
// flag reads it.
func TestLoadReadsEverySetting(t *testing.T) {
	for _, s := range settings.All() {
		line := s.FileExample()
		if s.Kind == settings.Bool {
			line = s.Key + " = " + strconv.FormatBool(!s.Negated)
		}
		cfg, err := Load(writeFile(t, line+"\n"))
		if err != nil {
			t.Errorf("%s: %v", line, err)
			continue
		}
		want := settings.Defaults()
		v, err := s.ParseText(map[bool]string{true: "true", false: s.Example}[s.Kind == settings.Bool])
		if err != nil {
			t.Fatal(err)
		}
		s.Set(&want, v)
		if cfg.Values != want {
			t.Errorf("%s read as %+v, want %+v", line, cfg.Values, want)
		}
	}
}
