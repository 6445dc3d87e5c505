package mcpserver

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeExecInput: python_exec's arguments are hostile input. What is
// accepted is what encoding/json reads too, key for key.
func FuzzDecodeExecInput(f *testing.F) {
	for _, s := range []string{`{"code":"1"}`, `{"code":"x","session":"s","timeout_s":2.5,"reset":true}`,
		`{"code":"1","code":"2"}`, `{"Code":"1"}`, `{"code":5}`, `{"code":"\u0000"}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		in, err := decodeExecInput(raw)
		if err != nil {
			return
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", raw, err)
		}
		if m["code"] != in.Code {
			t.Fatalf("code %q from %q, encoding/json reads %v", in.Code, raw, m["code"])
		}
		if s, _ := m["session"].(string); s != in.Session {
			t.Fatalf("session %q from %q", in.Session, raw)
		}
		if n, _ := m["timeout_s"].(float64); n != in.TimeoutS {
			t.Fatalf("timeout_s %g from %q", in.TimeoutS, raw)
		}
		if b, _ := m["reset"].(bool); b != in.Reset {
			t.Fatalf("reset %v from %q", in.Reset, raw)
		}
		for k := range m {
			switch k {
			case "code", "session", "timeout_s", "reset":
			default:
				t.Fatalf("accepted the unknown key %q in %q", k, raw)
			}
		}
	})
}
