package engine

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/hosttools"
)

// Request files are written by code in the kernel, or by anyone who can
// write into rpc/: hostile input. The parser must never panic, accept only
// a positive integer seq and an object for args, and keep what it parsed.
func FuzzParseRPCRequest(f *testing.F) {
	for _, seed := range []string{
		`{"seq":1,"tool":"read_file","args":{"path":"x"},"token":"t","cell":"c1"}`,
		`{"seq":1.5,"tool":"x","args":{},"token":"t","cell":"c"}`,
		`{"seq":"1","tool":"x"}`,
		`{"seq":-3}`, `{"seq":1e3}`, `{"seq":9223372036854775808}`, `{"seq":0}`,
		`{not json`, `[]`, `null`, `{"seq":1}{"seq":2}`, `{"seq":1,"extra":true}`,
		`{"seq":1,"tool":"x","args":[1,2],"token":"t","cell":"c"}`,
		"{\"seq\":1,\"tool\":\"\u2603\",\"token\":\"\\u0000\"}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := parseRPCRequest(data)
		if err != nil {
			return
		}
		if req.Seq < 1 {
			t.Fatalf("accepted seq %d", req.Seq)
		}
		var raw map[string]any
		if json.Unmarshal(data, &raw) != nil {
			t.Fatalf("accepted a request encoding/json cannot decode: %q", data)
		}
		for field, got := range map[string]string{"tool": req.Tool, "token": req.Token, "cell": req.Cell} {
			want, _ := raw[field].(string)
			if got != want {
				t.Fatalf("%s: parsed %q, the request says %q", field, got, want)
			}
		}
	})
}

// The whole check, fuzzed: whatever a request file holds, a tool runs only
// if the file carries the kernel's token, the running cell's id, a fresh
// positive integer seq and an args object under the limit.
func FuzzServeRPC(f *testing.F) {
	const token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	f.Add([]byte(`{"seq":1,"tool":"noop","args":{},"token":"` + token + `","cell":"c1"}`))
	f.Add([]byte(`{"seq":2,"tool":"noop","args":{},"token":"` + token[:63] + `0","cell":"c1"}`))
	f.Add([]byte(`{"seq":3,"tool":"noop","args":{},"token":"` + token + `","cell":"c0"}`))
	f.Add([]byte(`{"seq":4.0,"tool":"noop","token":"` + token + `","cell":"c1"}`))
	f.Add([]byte(`{"seq":5,"tool":"noop","args":"x","token":"` + token + `","cell":"c1"}`))
	f.Add([]byte(`{"seq":6,"tool":"noop","args":null,"token":"","cell":"c1"}`))
	var ran atomic.Int64
	reg := hosttools.NewRegistry()
	if err := reg.Register(hosttools.Tool{Name: "noop", Description: "Count calls.", Handler: func(context.Context, hosttools.Call) (hosttools.Result, error) {
		ran.Add(1)
		return hosttools.Result{Text: "ok"}, nil
	}}); err != nil {
		f.Fatal(err)
	}
	e, err := New(Config{Backends: []backends.Env{backends.NewLocal(f.TempDir())}, Tools: reg,
		Approvals: Approvals{Default: PolicyAllow}, MaxToolCalls: 1 << 30})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close(context.Background(), true) })
	key, _ := NewKey("o", e.DefaultBackend(), "t", "", []string{"noop"})
	f.Fuzz(func(t *testing.T, data []byte) {
		k := &Kernel{key: key, id: "k1", token: token}
		s := e.newRPCSession(context.Background(), k, &cellRun{id: "c1", deadline: time.Now().Add(time.Minute)})
		defer s.close()
		before := ran.Load()
		ans, answered := s.serve(rpcItem{name: "f.req", data: data})
		dispatched := ran.Load() != before
		if !dispatched {
			if answered && ans.resp.OK {
				t.Fatalf("an undispatched request got a success answer: %+v", ans)
			}
			return
		}
		var raw struct {
			Seq   json.Number     `json:"seq"`
			Token string          `json:"token"`
			Cell  string          `json:"cell"`
			Args  json.RawMessage `json:"args"`
		}
		if err := json.Unmarshal(data, &raw); err != nil {
			t.Fatalf("dispatched an undecodable request %q: %v", data, err)
		}
		if raw.Token != token || raw.Cell != "c1" || strings.ContainsAny(raw.Seq.String(), ".eE-") || len(raw.Args) > MaxToolArgs {
			t.Fatalf("dispatched a request that fails a check: %q", data)
		}
		// Never twice: the same bytes again are a replay.
		if _, _ = s.serve(rpcItem{name: "f.req", data: data}); ran.Load() != before+1 {
			t.Fatalf("a replayed request was dispatched again: %q", data)
		}
	})
}
