package engine

import (
	"github.com/kerneldeck/kerneldeck/backends"
	"strings"
	"testing"
)

// Host output can carry forwarded tool requests, whose bodies the kernel
// controls: markers count only at the start of a line, and messages never
// quote a request.
func TestHostOutputMarkers(t *testing.T) {
	const token = "5ecret5ecret"
	cut := `KD:RPC 1.req {"seq":1,"tool":"x","args":{"a":"KD:DEAD KD:LOST KD:RESULT {}"},"token":"` + token + `","cell":"c1"}`
	for _, tc := range []struct {
		output string
		m      marker
		want   bool
	}{
		{cut, "KD:DEAD", false},
		{cut, "KD:LOST", false},
		{cut + "\nKD:RPCWAIT\n", "KD:RPCWAIT", true},
		{"noise\nKD:PENDING\n", "KD:PENDING", true},
		{"KD:PENDINGX\n", "KD:PENDING", false},
		{"KD:OK\r\n", "KD:OK", true},
		{"x KD:OK", "KD:OK", false},
	} {
		if got := hasLine(tc.output, tc.m); got != tc.want {
			t.Errorf("hasLine(%.40q, %s) = %v, want %v", tc.output, tc.m, got, tc.want)
		}
	}
	if _, ok := findLine(cut, markResult); ok {
		t.Error("a request body was taken for a result")
	}
	msg := hostError(backendsResult(cut + "\nsomething else\n"))
	if strings.Contains(msg, token) || !strings.Contains(msg, "something else") {
		t.Errorf("hostError quotes a request or drops the rest: %q", msg)
	}
	items := rpcItemsFromOutput(cut + "\nKD:RPCBAD ? not-a-regular-file\nKD:RPCWAIT\n")
	if len(items) != 2 || items[0].name != "1.req" || !strings.HasPrefix(string(items[0].data), `{"seq":1`) ||
		items[1].name != "?" || items[1].problem != "not a regular file" {
		t.Errorf("items: %+v", items)
	}
}

func backendsResult(output string) backends.Result { return backends.Result{Output: output} }
