package mcpserver

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kerneldeck/kerneldeck/engine"
)

func TestCheckSession(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"", "default", ""},
		{"etl", "etl", ""},
		{"with space", "with space", ""},
		{"a\x1b[2J", "", "control character"},
		{"a\nb", "", "control character"},
		{strings.Repeat("s", maxSession+1), "", "at most"},
		{"\xff", "", "UTF-8"},
	} {
		got, err := checkSession(tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("checkSession(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestDecisionOf(t *testing.T) {
	for _, tc := range []struct {
		r    *mcp.ElicitResult
		want engine.Decision
	}{
		{nil, engine.ApproveDeny},
		{&mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "once"}}, engine.ApproveOnce},
		{&mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "always"}}, engine.ApproveAlways},
		{&mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "deny"}}, engine.ApproveDeny},
		{&mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "ONCE"}}, engine.ApproveDeny},
		{&mcp.ElicitResult{Action: "accept"}, engine.ApproveDeny},
		{&mcp.ElicitResult{Action: "decline", Content: map[string]any{"decision": "once"}}, engine.ApproveDeny},
		{&mcp.ElicitResult{Action: "cancel"}, engine.ApproveDeny},
	} {
		if got := decisionOf(tc.r); got != tc.want {
			t.Errorf("decisionOf(%+v) = %s, want %s", tc.r, got, tc.want)
		}
	}
}

func TestCheckHTTPAddr(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:8765", true}, {"[::1]:0", true}, {"localhost:80", true}, {"127.1.2.3:9", true},
		{"unix:/run/x.sock", true}, {"/run/x.sock", true},
		{"0.0.0.0:8765", false}, {"[::]:1", false}, {"10.0.0.1:80", false}, {"example.com:80", false},
		{":8765", false}, {"8765", false},
	} {
		err := CheckHTTPAddr(tc.addr)
		if (err == nil) != tc.ok {
			t.Errorf("CheckHTTPAddr(%q) = %v, want ok %v", tc.addr, err, tc.ok)
		}
		if !tc.ok && strings.Contains(tc.addr, ".") && !errors.Is(err, ErrNotLoopback) && !strings.Contains(err.Error(), "give") {
			t.Errorf("CheckHTTPAddr(%q): %v does not say what to give", tc.addr, err)
		}
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	good := "0123456789abcdef0123"
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), mode)
		os.Chmod(p, mode)
		return p
	}
	link := filepath.Join(dir, "link")
	os.Symlink(write("target", good, 0o600), link)
	for _, tc := range []struct {
		path, err string
	}{
		{write("ok", good+"\n", 0o600), ""},
		{write("ro", good, 0o400), ""},
		{write("group", good, 0o640), "chmod 600"},
		{write("world", good, 0o604), "chmod 600"},
		{write("short", "abc", 0o600), "at least 16"},
		{write("two", good+" "+good, 0o600), "without blanks"},
		{link, "not a regular file"},
		{dir, "not a regular file"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		tok, err := ReadToken(tc.path)
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("ReadToken(%s) = %q, %v; want error %q", filepath.Base(tc.path), tok, err, tc.err)
		}
		if err == nil && tok != good {
			t.Errorf("ReadToken(%s) = %q", filepath.Base(tc.path), tok)
		}
		if err != nil && strings.Contains(err.Error(), good) {
			t.Errorf("ReadToken's error shows the token: %v", err)
		}
	}
}

func TestDecodeExecInput(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want ExecInput
		err  string
	}{
		{`{"code":"1"}`, ExecInput{Code: "1"}, ""},
		{`{"code":"x","session":"s","timeout_s":2.5,"reset":true}`, ExecInput{Code: "x", Session: "s", TimeoutS: 2.5, Reset: true}, ""},
		{``, ExecInput{}, `missing argument "code"`},
		{`{}`, ExecInput{}, `missing argument "code"`},
		{`{"session":"s"}`, ExecInput{}, `missing argument "code"`},
		{`{"code":5}`, ExecInput{}, `"code" must be a JSON string, not number`},
		{`{"code":null}`, ExecInput{}, `"code" must be a JSON string, not null`},
		{`{"code":"1","timeout_s":"5"}`, ExecInput{}, `"timeout_s" must be a JSON number`},
		{`{"code":"1","reset":1}`, ExecInput{}, `"reset" must be a JSON boolean`},
		{`{"code":"1","timout_s":1}`, ExecInput{}, `unknown argument "timout_s"; python_exec takes code, reset, session, timeout_s`},
		{`{"Code":"1"}`, ExecInput{}, `unknown argument "Code"`},
		{`{"code":"1","code":"2"}`, ExecInput{}, `twice`},
		{`[1]`, ExecInput{}, `not a JSON object`},
		{`{"code":"1"} x`, ExecInput{}, `not a JSON object`},
	} {
		got, err := decodeExecInput([]byte(tc.raw))
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) || (err == nil && got != tc.want) {
			t.Errorf("decodeExecInput(%s) = %+v, %v; want %+v, %q", tc.raw, got, err, tc.want, tc.err)
		}
	}
}

// TestRenderExecCountsDisplays: the status line counts displays in English.
func TestRenderExecCountsDisplays(t *testing.T) {
	for n, want := range map[int]string{1: "· 1 display follows]", 2: "· 2 displays follow]"} {
		o := ExecOutput{Status: "success", Session: "default", Displays: make([]DisplayInfo, n)}
		if got := renderExec(o); !strings.Contains(got, want) {
			t.Errorf("%d displays: %q, want %q", n, got, want)
		}
	}
}
