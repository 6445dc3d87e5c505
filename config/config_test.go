package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
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
	want := Config{MaxKernels: 7, IdleExit: 45 * time.Minute, CellTimeout: 90 * time.Second, MaxToolCalls: 12,
		Theme: "dark", DefaultBackend: "gpu", Path: p}
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

func TestLoadPartialFileKeepsDefaults(t *testing.T) {
	cfg, err := Load(writeFile(t, "theme = \"light\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxKernels != engine.DefaultMaxKernels || cfg.IdleExit != engine.DefaultIdleExit ||
		cfg.CellTimeout != engine.DefaultCellTimeout || cfg.MaxToolCalls != DefaultMaxToolCalls {
		t.Errorf("defaults not kept: %+v", cfg)
	}
}

func TestLoadRejects(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []string // substrings of the error
	}{
		{"unknown key", "max_kernel = 3\n", []string{`unknown key "max_kernel"`, "max_kernels"}},
		{"unknown nested key", "[ui]\ncolor = 1\n", []string{`unknown key "ui`}},
		{"bad duration", `idle_exit = "30x"` + "\n", []string{"idle_exit", `"30x" is not a Go duration`, `"30m"`}},
		{"duration without unit", "cell_timeout = 30\n", []string{"cell_timeout = 30 is invalid", "quoted duration string"}},
		{"idle_exit below 1s", `idle_exit = "500ms"` + "\n", []string{"idle_exit", "at least 1s"}},
		{"zero cell timeout", `cell_timeout = "0s"` + "\n", []string{"cell_timeout", "greater than zero"}},
		{"max_kernels zero", "max_kernels = 0\n", []string{"max_kernels = 0 is invalid", ">= 1"}},
		{"max_kernels string", `max_kernels = "4"` + "\n", []string{`max_kernels = "4" is invalid`}},
		{"negative tool calls", "max_tool_calls = -1\n", []string{"max_tool_calls = -1 is invalid"}},
		{"theme not a string", "theme = 3\n", []string{"theme = 3 is invalid"}},
		{"backend not a string", "[backends]\ngpu = 3\n", []string{"backends.gpu = 3 is invalid", "URI"}},
		{"backend name is a URI", "[backends]\n\"ssh://x\" = \"ssh://x\"\n", []string{"invalid name"}},
		{"empty default backend", `default_backend = ""` + "\n", []string{"default_backend"}},
		{"syntax error", "max_kernels = = 3\n", []string{"not valid TOML", "line 1"}},
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
