package mcpserver

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// The filter passes JSON-RPC messages and batches on as they came, and
// answers every other line, a line over the limit included, with a
// JSON-RPC error of no id, keeping the lines after it.
func TestFilterLines(t *testing.T) {
	good := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	batch := `[{"jsonrpc":"2.0","id":2,"method":"ping"}]`
	in := strings.Join([]string{good, "{oops", `"a string"`, strings.Repeat("x", maxLine+10), "", batch}, "\n") + "\n"
	pr, pw := io.Pipe()
	var out bytes.Buffer
	go filterLines(strings.NewReader(in), pw, &out)
	passed, _ := io.ReadAll(pr)
	if string(passed) != good+"\n"+batch+"\n" {
		t.Errorf("passed on %q", passed)
	}
	var codes []float64
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m struct {
			ID    any
			Error struct{ Code float64 }
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil || m.ID != nil {
			t.Fatalf("answer %q: %v", line, err)
		}
		codes = append(codes, m.Error.Code)
	}
	if len(codes) != 3 || codes[0] != -32700 || codes[1] != -32600 || codes[2] != -32700 {
		t.Errorf("answers %q", out.String())
	}
}
