package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/syncbuf"
)

// isolate points every path the binary derives from the environment into
// fresh temp dirs, and returns the dir that local kernels live under.
func isolate(t *testing.T) (kernelTmp string) {
	t.Helper()
	kernelTmp = t.TempDir()
	t.Setenv("TMPDIR", kernelTmp)
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	t.Setenv("XDG_RUNTIME_DIR", "")
	return kernelTmp
}

// processesUnder lists live (non-zombie) processes whose command line
// mentions dir: the runners run `python3 -I -S -B -c <program> <dir>/kerneldeck-<login>/<id>/runner.py`.
func processesUnder(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(dir)) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
				continue
			}
		}
		found = append(found, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return found
}

// killProcessesUnder kills what processesUnder finds (the runners an engine
// killed with SIGKILL left) and waits until they are gone.
func killProcessesUnder(t *testing.T, dir string) {
	t.Helper()
	// A spawn under way when the engine died shows its dir only once its
	// runner starts: look until two looks in a row find nothing.
	quiet := 0
	for deadline := time.Now().Add(10 * time.Second); quiet < 2 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		found := processesUnder(t, dir)
		if len(found) == 0 {
			quiet++
			continue
		}
		quiet = 0
		for _, p := range found {
			pidText, _, _ := strings.Cut(p, ":")
			if pid, err := strconv.Atoi(pidText); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	wantNoProcessesUnder(t, dir)
}

func wantNoProcessesUnder(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := processesUnder(t, dir)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left running under %s: %v", dir, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// parseHeadlessFlags parses args as the flags of kerneldeck headless.
func parseHeadlessFlags(args []string) (*engineFlags, error) {
	c := &headlessCmd{}
	set, err := c.flags().parse(args)
	if err != nil {
		return nil, err
	}
	return &c.eng, c.eng.parsed(set)
}

func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestCommands(t *testing.T) {
	isolate(t)
	for _, tc := range []struct {
		args   []string
		code   int
		stdout []string // nil: stdout must stay empty
		stderr []string // nil: stderr must stay empty
	}{
		{nil, 2, nil, []string{"the dashboard needs a terminal", "kerneldeck repl", "kerneldeck headless"}},
		{[]string{"--theme", "neon"}, 2, nil, []string{`unknown theme "neon"`, "dark, light or high-contrast"}},
		{[]string{"--replay", "/nonexistent/replay.jsonl"}, 2, nil, []string{"--replay", "no such file"}},
		{[]string{"help", "dashboard"}, 0, []string{"--keep-kernels", "--replay FILE", "--theme NAME"}, nil},
		{[]string{"--help"}, 0, []string{"kerneldeck headless [flags]", "version", "help headless"}, nil},
		{[]string{"-h"}, 0, []string{"kerneldeck headless [flags]"}, nil},
		{[]string{"help"}, 0, []string{"kerneldeck headless [flags]"}, nil},
		{[]string{"help", "headless"}, 0, []string{"--backend URI", "--max-kernels N"}, nil},
		{[]string{"help", "nosuch"}, 2, nil, []string{`no command "nosuch"`, "help knows dashboard, headless", "--help"}},
		{[]string{"version"}, 0, []string{"kerneldeck ", "go1."}, nil},
		{[]string{"dashboard"}, 2, nil, []string{`unknown command "dashboard"`, "--help"}},
		{[]string{"headless", "--help"}, 0, []string{
			"--backend URI", "--max-kernels N", "--idle-exit DURATION", "--cell-timeout DURATION", "--events",
			"--trace FILE", "--config FILE", "--state-dir DIR",
			"--workspace DIR", "--max-tool-calls N", "--http-allow HOST", "--approve all|ask|none", "--approval-timeout DURATION",
			"read_file, list_files and http_get run", "write_file, terminal and any other tool ask", "(default 1m)",
			`"op":"approve","request":"REQUEST-ID","decision":"once"`, `"type":"approval_request"`, "even without --events",
			`echo '{"id":"1","op":"execute","code":"print(1)"}' | kerneldeck headless`,
		}, nil},
	} {
		code, stdout, stderr := runCLI(t, "", tc.args...)
		if code != tc.code {
			t.Errorf("kerneldeck %v: exit %d, want %d (stderr %q)", tc.args, code, tc.code, stderr)
		}
		for _, w := range tc.stdout {
			if !strings.Contains(stdout, w) {
				t.Errorf("kerneldeck %v: stdout does not contain %q:\n%s", tc.args, w, stdout)
			}
		}
		for _, w := range tc.stderr {
			if !strings.Contains(stderr, w) {
				t.Errorf("kerneldeck %v: stderr does not contain %q:\n%s", tc.args, w, stderr)
			}
		}
		if (tc.stdout == nil && stdout != "") || (tc.stderr == nil && stderr != "") {
			t.Errorf("kerneldeck %v: unexpected output: stdout %q stderr %q", tc.args, stdout, stderr)
		}
	}
}

func TestHeadlessRejectsBadSetup(t *testing.T) {
	isolate(t)
	dir := t.TempDir()
	badConfig := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(badConfig, []byte("idle_exit = \"soon\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unknownKey := filepath.Join(dir, "unknown.toml")
	if err := os.WriteFile(unknownKey, []byte("max_kernel = 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	named := filepath.Join(dir, "named.toml")
	if err := os.WriteFile(named, []byte("[backends]\nhere = \"local\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	typoTool := filepath.Join(dir, "typo.toml")
	if err := os.WriteFile(typoTool, []byte("[approvals]\nread_flie = \"deny\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	typoOwnerTool := filepath.Join(dir, "typo-owner.toml")
	if err := os.WriteFile(typoOwnerTool, []byte("[approvals.owners.alice]\n\"*\" = \"ask\"\nshell = \"allow\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missingWS := filepath.Join(dir, "no-such-dir")
	wsConfig := filepath.Join(dir, "ws.toml")
	if err := os.WriteFile(wsConfig, []byte("workspace = \""+missingWS+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	aFile := filepath.Join(dir, "a-file")
	if err := os.WriteFile(aFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--max-kernels", "0"}, []string{"-max-kernels", "whole number >= 1"}},
		{[]string{"--max-kernels", "many"}, []string{"-max-kernels", "whole number >= 1"}},
		{[]string{"--idle-exit", "30x"}, []string{"-idle-exit", "Go duration", "30m"}},
		{[]string{"--idle-exit", "500ms"}, []string{"-idle-exit", "at least 1s"}},
		{[]string{"--cell-timeout", "0s"}, []string{"-cell-timeout", "greater than zero"}},
		{[]string{"--cell-timeout", "-1s"}, []string{"-cell-timeout", "greater than zero"}},
		{[]string{"--nope"}, []string{"unknown flag --nope"}},
		{[]string{"--python", "venv/bin/python"}, []string{"--python venv/bin/python is invalid", "relative path", "/opt/venv/bin/python"}},
		{[]string{"--python", "python3 -S"}, []string{"--python", "holds a space"}},
		{[]string{"--max-kernels"}, []string{"--max-kernels needs a value"}},
		{[]string{"--keep-kernels=maybe"}, []string{`--keep-kernels takes no value, or true or false, not "maybe"`}},
		{[]string{"extra"}, []string{`unexpected argument "extra"`}},
		{[]string{"--backend", ""}, []string{"-backend", "URI"}},
		{[]string{"--backend", "ftp://x"}, []string{`"ftp://x"`, "unknown backend URI"}},
		{[]string{"--backend", "local", "--backend", "local"}, []string{"given twice"}},
		{[]string{"--config", named, "--backend", "here", "--backend", "local"}, []string{"given twice", `"local"`}},
		{[]string{"--trace", ""}, []string{"--trace needs a path"}},
		{[]string{"--config", filepath.Join(dir, "missing.toml")}, []string{"missing.toml does not exist"}},
		{[]string{"--config", badConfig}, []string{badConfig, "idle_exit", `"soon"`}},
		{[]string{"--config", unknownKey}, []string{unknownKey, `unknown key "max_kernel"`}},

		{[]string{"--max-tool-calls", "-1"}, []string{"-max-tool-calls", "whole number >= 0", "0 allows no tool calls"}},
		{[]string{"--max-tool-calls", "lots"}, []string{"-max-tool-calls", "whole number >= 0"}},
		{[]string{"--approve", "yes"}, []string{"-approve", "all", "ask", "none"}},
		{[]string{"--approve", "allow"}, []string{"-approve", "must be all"}},
		{[]string{"--approve", ""}, []string{"-approve", "must be all"}},
		{[]string{"--approval-timeout", "soon"}, []string{"-approval-timeout", "Go duration", "60s"}},
		{[]string{"--approval-timeout", "500ms"}, []string{"-approval-timeout", "at least 1s"}},
		{[]string{"--http-allow", ""}, []string{"-http-allow", "host name, IP address or CIDR prefix", `http_get = "deny"`}},
		{[]string{"--http-allow", "https://api.example.com"}, []string{"--http-allow", `"https://api.example.com" is not a host name`}},
		{[]string{"--http-allow", "10.0.0.0/40"}, []string{"--http-allow", `"10.0.0.0/40"`}},
		{[]string{"--http-allow", "api.internal"}, []string{"--http-allow", "names hosts (api.internal) but no address"}},
		{[]string{"--workspace", ""}, []string{"--workspace needs a path"}},
		{[]string{"--workspace", missingWS}, []string{"--workspace", "workspace " + missingWS + " does not exist", "create it"}},
		{[]string{"--workspace", aFile}, []string{"--workspace", aFile, "is not a directory"}},
		{[]string{"--config", wsConfig}, []string{"workspace in config file " + wsConfig, missingWS + " does not exist"}},
		{[]string{"--config", typoTool}, []string{typoTool, "[approvals]", `tool "read_flie"`, "not a host tool", "read_file"}},
		{[]string{"--config", typoOwnerTool}, []string{typoOwnerTool, "[approvals.owners.alice]", `tool "shell"`, "terminal"}},
	} {
		// A request on stdin: had the command started serving, it would answer.
		code, stdout, stderr := runCLI(t, `{"id":"1","op":"kernels"}`+"\n", append([]string{"headless"}, tc.args...)...)
		if code != 2 || stdout != "" {
			t.Errorf("headless %v: exit %d stdout %q, want exit 2 and no output", tc.args, code, stdout)
		}
		for _, w := range append(tc.want, "kerneldeck headless --help") {
			if !strings.Contains(stderr, w) {
				t.Errorf("headless %v: stderr %q does not say %q", tc.args, stderr, w)
			}
		}
	}
}

// TestHeadlessConfigFlagsStateAndTrace runs the command in-process: the file
// sets limits, flags override them, a named backend resolves, and the state
// dir and trace file are created owner-only.
func TestHeadlessConfigFlagsStateAndTrace(t *testing.T) {
	kernels := isolate(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.toml")
	cfg := "max_kernels = 2\nidle_exit = \"10m\"\ndefault_backend = \"here\"\n[backends]\nhere = \"local\"\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state", "kd")
	trace := filepath.Join(dir, "trace.jsonl")
	stdin := `{"id":"x","op":"execute","code":"print(6*7)"}` + "\n" + `{"id":"k","op":"kernels"}` + "\n"
	code, stdout, stderr := runCLI(t, stdin, "headless", "--config", cfgPath, "--max-kernels", "3",
		"--state-dir", state, "--trace", trace)
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	got := map[string]map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("output line %q: %v", l, err)
		}
		got[m["id"].(string)] = m
	}
	if got["x"]["stdout"] != "42\n" || got["x"]["kernel"].(map[string]any)["backend"] != "local" {
		t.Errorf("execute: %v", got["x"])
	}
	if k := got["k"]; k["cap"] != 3.0 || k["idle_exit"] != 600.0 {
		t.Errorf("kernels: %v; want cap 3 from the flag and idle_exit 600 from the file", k)
	}
	for p, mode := range map[string]os.FileMode{state: 0o700 | os.ModeDir, trace: 0o600} {
		st, err := os.Stat(p)
		if err != nil || st.Mode() != mode {
			t.Errorf("%s: %v, %v; want mode %v", p, st.Mode(), err, mode)
		}
	}
	tr, _ := os.ReadFile(trace)
	if !bytes.Contains(tr, []byte(`"command":"# kerneldeck:spawn`)) || !bytes.Contains(tr, []byte(`"rc":0`)) {
		t.Errorf("trace has no spawn command: %.300s", tr)
	}
	wantNoProcessesUnder(t, kernels)
}

// TestApprovalsResolve checks how the approve mode, [approvals], flags and
// the defaults combine into the engine's policies.
func TestApprovalsResolve(t *testing.T) {
	isolate(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rules := write("rules.toml", `
[approvals]
terminal = "deny"
read_file = "ask"
[approvals.owners.alice]
terminal = "allow"
"*" = "ask"
`)
	blanket := write("blanket.toml", "approve = \"none\"\n[approvals]\nterminal = \"allow\"\n")
	defaults := engine.DefaultToolPolicies()
	withRules := engine.DefaultToolPolicies()
	withRules["terminal"], withRules["read_file"] = engine.PolicyDeny, engine.PolicyAsk
	for _, tc := range []struct {
		name string
		args []string
		want engine.Approvals
		// spot checks of Approvals.For: owner, tool, policy
		checks [][3]string
	}{
		{"defaults", nil, engine.Approvals{Default: engine.PolicyAsk, Tools: defaults},
			[][3]string{{"x", "read_file", "allow"}, {"x", "list_files", "allow"}, {"x", "http_get", "allow"},
				{"x", "write_file", "ask"}, {"x", "terminal", "ask"}, {"x", "other_tool", "ask"}}},
		{"approve all", []string{"--approve", "all"}, engine.Approvals{Default: engine.PolicyAllow},
			[][3]string{{"x", "terminal", "allow"}, {"x", "write_file", "allow"}}},
		{"approve ask", []string{"--approve", "ask"}, engine.Approvals{Default: engine.PolicyAsk},
			[][3]string{{"x", "read_file", "ask"}}},
		{"approve none", []string{"--approve", "none"}, engine.Approvals{Default: engine.PolicyDeny},
			[][3]string{{"x", "read_file", "deny"}, {"x", "list_files", "deny"}}},
		{"config rules over the defaults", []string{"--config", rules},
			engine.Approvals{Default: engine.PolicyAsk, Tools: withRules,
				Owners: map[string]map[string]engine.Policy{"alice": {"terminal": engine.PolicyAllow, "*": engine.PolicyAsk}}},
			[][3]string{{"bob", "terminal", "deny"}, {"bob", "read_file", "ask"}, {"bob", "list_files", "allow"},
				{"alice", "terminal", "allow"}, {"alice", "list_files", "ask"}}},
		{"--approve all overrides config rules", []string{"--config", rules, "--approve", "all"}, engine.Approvals{Default: engine.PolicyAllow},
			[][3]string{{"bob", "terminal", "allow"}, {"alice", "list_files", "allow"}}},
		{"config approve overrides its rules", []string{"--config", blanket}, engine.Approvals{Default: engine.PolicyDeny},
			[][3]string{{"x", "terminal", "deny"}}},
		{"--approve overrides config approve", []string{"--config", blanket, "--approve", "ask"}, engine.Approvals{Default: engine.PolicyAsk},
			[][3]string{{"x", "terminal", "ask"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseHeadlessFlags(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			s, err := resolve(f)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.approvals, tc.want) {
				t.Errorf("approvals = %+v, want %+v", s.approvals, tc.want)
			}
			if err := s.approvals.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			for _, c := range tc.checks {
				if got := s.approvals.For(c[0], c[1]); string(got) != c[2] {
					t.Errorf("For(%s, %s) = %s, want %s", c[0], c[1], got, c[2])
				}
			}
		})
	}
	// The engine's defaults are not shared with the config: editing the
	// result must not change a later call's defaults.
	f, _ := parseHeadlessFlags(nil)
	s, _ := resolve(f)
	s.approvals.Tools["read_file"] = engine.PolicyDeny
	if engine.DefaultToolPolicies()["read_file"] != engine.PolicyAllow {
		t.Error("editing the resolved approvals changed engine.DefaultToolPolicies")
	}
}

// TestToolSettingsResolve checks flag-over-config precedence and defaults
// for the other tool settings.
func TestToolSettingsResolve(t *testing.T) {
	isolate(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.toml")
	body := "max_tool_calls = 7\napproval_timeout = \"2m\"\nworkspace = \"/srv/ws\"\nhttp_allow = [\"svc.internal\", \"10.1.0.0/16\"]\n"
	if err := os.WriteFile(cfgPath, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	fromConfig := hosttools.AllowList{Hosts: []string{"svc.internal"}, Nets: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	fromFlags := hosttools.AllowList{Hosts: []string{}, Nets: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("::1/128")}}
	for _, tc := range []struct {
		name          string
		args          []string
		maxToolCalls  int // in engine terms
		timeout       time.Duration
		workspace     string
		workspaceFrom string
		allow         *hosttools.AllowList // nil: the built-in default
	}{
		{"defaults", nil, engine.DefaultMaxToolCalls, engine.DefaultApprovalTimeout, ".", "current directory", nil},
		{"flags", []string{"--max-tool-calls", "3", "--approval-timeout", "5s", "--workspace", "/tmp", "--http-allow", "192.0.2.1", "--http-allow", "::1"},
			3, 5 * time.Second, "/tmp", "--workspace", &fromFlags},
		{"zero tool calls allows none", []string{"--max-tool-calls", "0"}, -1, engine.DefaultApprovalTimeout, ".", "current directory", nil},
		{"config", []string{"--config", cfgPath}, 7, 2 * time.Minute, "/srv/ws", "workspace in config file " + cfgPath, &fromConfig},
		{"flags over config", []string{"--config", cfgPath, "--max-tool-calls", "0", "--approval-timeout", "1s", "--workspace", "/tmp",
			"--http-allow", "192.0.2.1", "--http-allow", "::1"}, -1, time.Second, "/tmp", "--workspace", &fromFlags},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseHeadlessFlags(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			s, err := resolve(f)
			if err != nil {
				t.Fatal(err)
			}
			if s.cfg.ToolCallLimit() != tc.maxToolCalls || s.cfg.ApprovalTimeout != tc.timeout || s.workspace != tc.workspace ||
				!strings.Contains(s.workspaceFrom, tc.workspaceFrom) {
				t.Errorf("resolved max tool calls %d, approval timeout %v, workspace %q (%s); want %d, %v, %q (%s)",
					s.cfg.ToolCallLimit(), s.cfg.ApprovalTimeout, s.workspace, s.workspaceFrom, tc.maxToolCalls, tc.timeout, tc.workspace, tc.workspaceFrom)
			}
			if !reflect.DeepEqual(s.cfg.HTTPAllow, tc.allow) {
				t.Errorf("http allow-list = %+v, want %+v", s.cfg.HTTPAllow, tc.allow)
			}
		})
	}
}

// TestHeadlessToolFlagsServe starts the command with every tool flag and a
// config that sets the tool keys: it serves cells, answers the approve op,
// and creates nothing in the workspace.
func TestHeadlessToolFlagsServe(t *testing.T) {
	kernels := isolate(t)
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "config.toml")
	body := "approve = \"ask\"\napproval_timeout = \"30s\"\nhttp_allow = []\n[approvals]\nterminal = \"deny\"\n[approvals.owners.me]\n\"*\" = \"allow\"\n"
	if err := os.WriteFile(cfgPath, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	stdin := `{"id":"x","op":"execute","owner":"me","tools":["read_file"],"code":"print(6*7)"}` + "\n" +
		`{"id":"a","op":"approve","request":"a00","decision":"always"}` + "\n"
	code, stdout, stderr := runCLI(t, stdin, "headless", "--config", cfgPath, "--workspace", ws, "--max-tool-calls", "5",
		"--approve", "all", "--approval-timeout", "10s", "--http-allow", "127.0.0.1", "--http-allow", "localhost")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	got := map[string]map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("output line %q: %v", l, err)
		}
		got[m["id"].(string)] = m
	}
	if got["x"]["stdout"] != "42\n" || got["x"]["tool_calls_made"] != 0.0 {
		t.Errorf("execute: %v", got["x"])
	}
	if got["a"]["op"] != "error" || !strings.Contains(got["a"]["error"].(string), `no pending approval request "a00"`) {
		t.Errorf("approve of an unknown request: %v", got["a"])
	}
	if entries, _ := os.ReadDir(ws); len(entries) != 0 {
		t.Errorf("the workspace is not empty after the run: %v", entries)
	}
	wantNoProcessesUnder(t, kernels)
}

// pipedBinary is the real binary running with its stdin, stdout and stderr
// held by the test.
type pipedBinary struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    io.ReadCloser
	stderr *syncBuffer
}

// startPiped starts bin with args; cleanup kills it and closes its stdin.
func startPiped(t *testing.T, bin string, args ...string) *pipedBinary {
	t.Helper()
	return startPipedEnv(t, nil, bin, args...)
}

// startPipedEnv is startPiped with env as the environment (nil: the test's).
func startPipedEnv(t *testing.T, env []string, bin string, args ...string) *pipedBinary {
	t.Helper()
	p := &pipedBinary{cmd: exec.Command(bin, args...), stderr: &syncBuffer{}}
	p.cmd.Env = env
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if p.out, err = p.cmd.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.in.Close(); p.cmd.Process.Kill(); p.cmd.Wait() })
	return p
}

func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kerneldeck")
	out, err := exec.Command("go", "build", "-o", bin, "..").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestBinaryHeadlessPipe is what a script does: pipe requests into the real
// binary, read the answers, and expect nothing left running afterwards.
func TestBinaryHeadlessPipe(t *testing.T) {
	bin := buildBinary(t)
	kernels := isolate(t)
	cmd := exec.Command(bin, "headless")
	cmd.Stdin = strings.NewReader(`{"id":"1","op":"execute","code":"import os\nx = os.getpid()"}` + "\n" +
		`{"id":"2","op":"execute","code":"print(x)"}` + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kerneldeck headless: %v\nstderr: %s", err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("stderr: %s", stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 response lines, got %q", stdout.String())
	}
	res := map[string]map[string]any{}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("response %q: %v", l, err)
		}
		res[m["id"].(string)] = m
	}
	k1, _ := res["1"]["kernel"].(map[string]any)
	k2, _ := res["2"]["kernel"].(map[string]any)
	if res["1"]["status"] != "success" || k1 == nil || k2 == nil {
		t.Fatalf("responses: %v", res)
	}
	pid := int(k2["pid"].(float64))
	if res["2"]["stdout"] != strconv.Itoa(pid)+"\n" || k2["reused"] != true || k2["id"] != k1["id"] {
		t.Errorf("second cell did not run in the first one's runner (pid %d): %v", pid, res["2"])
	}
	if dir, _ := k2["dir"].(string); !strings.HasPrefix(dir, kernels) {
		t.Errorf("kernel dir %q is not under TMPDIR %s", dir, kernels)
	}
	wantNoProcessesUnder(t, kernels)
}

// TestBinarySignalKillsKernels stops the binary with SIGTERM while a cell
// runs and stdin is still open.
func TestBinarySignalKillsKernels(t *testing.T) {
	bin := buildBinary(t)
	kernels := isolate(t)
	p := startPiped(t, bin, "headless")
	cmd, in, stderr := p.cmd, p.in, p.stderr
	out := bufio.NewReader(p.out)
	io.WriteString(in, `{"id":"1","op":"execute","code":"print(1)"}`+"\n")
	if l, err := out.ReadString('\n'); err != nil || !strings.Contains(l, `"stdout":"1\n"`) {
		t.Fatalf("first answer %q, %v", l, err)
	}
	io.WriteString(in, `{"id":"2","op":"execute","code":"import time\ntime.sleep(60)"}`+"\n")
	time.Sleep(300 * time.Millisecond)
	if len(processesUnder(t, kernels)) == 0 {
		t.Fatal("no runner process found before the signal")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		io.Copy(io.Discard, out)
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v (stderr %s)", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("kerneldeck did not exit within 20s of SIGTERM")
	}
	if !strings.Contains(stderr.String(), "every kernel was killed") {
		t.Errorf("stderr: %q", stderr.String())
	}
	wantNoProcessesUnder(t, kernels)
}

// TestBinaryReaderGoneKillsKernels closes the binary's stdout while a cell
// runs: the process must notice at its next write and kill its kernels
// instead of dying of SIGPIPE with them still running.
func TestBinaryReaderGoneKillsKernels(t *testing.T) {
	bin := buildBinary(t)
	kernels := isolate(t)
	p := startPiped(t, bin, "headless")
	cmd, in, outPipe := p.cmd, p.in, p.out
	// The cell outlasts the wait for its runner: a CI run found none 300 ms
	// after the request, and a cell that ended before the reader left
	// would leave nothing to write.
	io.WriteString(in, `{"id":"1","op":"execute","code":"import time\ntime.sleep(3)"}`+"\n")
	waitUntil(t, "a runner to start", func() bool { return len(processesUnder(t, kernels)) > 0 })
	outPipe.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("exit after the reader left: %v, want status 1", err)
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("kerneldeck did not exit after its reader left")
	}
	wantNoProcessesUnder(t, kernels)
}

// syncBuffer is a buffer a process's output goroutine shares with the test.
type syncBuffer = syncbuf.Buffer

// TestHeadlessHelloSaysItsVersion: an in-process engine's hello names the
// version, as a serving engine's does.
func TestHeadlessHelloSaysItsVersion(t *testing.T) {
	isolate(t)
	code, stdout, stderr := runCLI(t, `{"id":"1","op":"hello"}`+"\n", "headless")
	var hello struct{ Op, Version string }
	if err := json.Unmarshal([]byte(stdout), &hello); code != 0 || err != nil || hello.Op != "hello" || hello.Version == "" {
		t.Fatalf("exit %d, hello %q (%v), stderr %q; want a hello with a version", code, stdout, err, stderr)
	}
}

// TestHeadlessPython: --python picks the kernels' interpreter; one the
// host lacks fails the cell's spawn with an error naming it.
func TestHeadlessPython(t *testing.T) {
	isolate(t)
	code, stdout, stderr := runCLI(t, `{"id":"1","op":"execute","code":"import sys; print(sys.executable)"}`+"\n", "headless", "--python", "/usr/bin/python3")
	if code != 0 || !strings.Contains(stdout, `"stdout":"/usr/bin/python3`) {
		t.Fatalf("exit %d, stdout %s, stderr %q; want the kernel on /usr/bin/python3", code, stdout, stderr)
	}
	code, stdout, _ = runCLI(t, `{"id":"1","op":"execute","code":"1"}`+"\n", "headless", "--python", "python3.nosuch", "--spare-kernels", "0")
	if !strings.Contains(stdout, "python3.nosuch was not found on this host") {
		t.Fatalf("exit %d, stdout %s; want the missing interpreter named", code, stdout)
	}
}

// TestBackendPythonFromConfig: a [backends] table entry's python is that
// backend's interpreter; --python, given, is every backend's.
func TestBackendPythonFromConfig(t *testing.T) {
	isolate(t)
	cfg := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(cfg, []byte("[backends]\nhere = { uri = \"local\", python = \"python3.nosuch\" }\n"), 0o600)
	req := `{"id":"1","op":"execute","code":"import sys; print(sys.executable)"}` + "\n"
	_, stdout, _ := runCLI(t, req, "headless", "--config", cfg, "--backend", "here", "--spare-kernels", "0")
	if !strings.Contains(stdout, "python3.nosuch was not found on this host") {
		t.Fatalf("with the backend's python: %s; want its interpreter, missing, named", stdout)
	}
	_, stdout, _ = runCLI(t, req, "headless", "--config", cfg, "--backend", "here", "--spare-kernels", "0", "--python", "/usr/bin/python3")
	if !strings.Contains(stdout, `"stdout":"/usr/bin/python3`) {
		t.Fatalf("with --python over the backend's: %s; want /usr/bin/python3", stdout)
	}
}
