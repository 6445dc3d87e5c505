package kernelauth

import (
	"os/exec"
	"strings"
	"testing"
)

// TestMACAgreesWithTheRunner computes the same MACs in Python with the
// runner's own code (imported from engine/runner/runner.py).
func TestMACAgreesWithTheRunner(t *testing.T) {
	secret := NewSecret()
	cases := []struct {
		kind  Kind
		parts []string
	}{
		{Request, []string{`{"id":"c1","code":"print(1)"}`}},
		{Answer, []string{"12", `{"ok":true}`}},
		{RPC, []string{"1", "c1", "read_file", `{"path": "é\u0000x"}`}},
		{Engine, []string{"00ff"}},
		{Interrupt, nil},
	}
	var py strings.Builder
	py.WriteString("import sys\nsys.path.insert(0, '../../engine/runner')\nimport runner\na = runner.Auth(bytes.fromhex('" + secret + "'))\n")
	for _, c := range cases {
		py.WriteString("print(a.mac(" + pyStr(string(c.kind)))
		for _, p := range c.parts {
			py.WriteString(", " + pyStr(p))
		}
		py.WriteString("))\n")
	}
	out, err := exec.Command("python3", "-c", py.String()).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	got := strings.Fields(string(out))
	if len(got) != len(cases) {
		t.Fatalf("python printed %q", out)
	}
	for i, c := range cases {
		if want := MAC(secret, c.kind, c.parts...); got[i] != want {
			t.Errorf("%s %q: runner %s, engine %s", c.kind, c.parts, got[i], want)
		}
		if !Valid(secret, got[i], c.kind, c.parts...) {
			t.Errorf("%s %q: Valid refuses the runner's MAC", c.kind, c.parts)
		}
	}
	if Valid(secret, MAC(secret, Request, "a"), Result, "a") || Valid(secret, MAC(secret, RPC, "ab", "c"), RPC, "a", "bc") {
		t.Error("a MAC of one message passes for another")
	}
	if Valid("", "", Request) || Valid(secret, "", Request) || MAC("zz", Request) != "" {
		t.Error("an empty or malformed secret or MAC is valid")
	}
}

// pyStr renders s as a Python str literal (JSON escapes are Python escapes
// for what these cases hold).
func pyStr(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteString(`\` + string(r))
		case r < 0x20:
			b.WriteString(`\x` + string("0123456789abcdef"[r>>4]) + string("0123456789abcdef"[r&15]))
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
