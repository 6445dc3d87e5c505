package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/jsonobj"
	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
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
		`{"seq":1,"TOKEN":"0"}`, `{"seq":1,"token":"a","token":"b"}`, `{"seq":1,"tok\u0065n":"a","token":"b"}`,
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
// if its token is the MAC of its fields under the kernel's secret, it names
// the running cell, and it has a fresh positive integer seq and an args
// object under the limit. With sign set, the harness signs what the fuzzer
// wrote (as the kernel's own runner would), so the checks after the MAC are
// reached too.
func FuzzServeRPC(f *testing.F) {
	const token = rpcToken
	for _, s := range []string{
		`{"seq":1,"tool":"noop","args":{},"cell":"c1"}`,
		`{"seq":3,"tool":"noop","args":{},"cell":"c0"}`,
		`{"seq":4.0,"tool":"noop","cell":"c1"}`,
		`{"seq":5,"tool":"noop","args":"x","cell":"c1"}`,
		`{"seq":6,"tool":"noop","args":null,"cell":"c1"}`,
		`{"seq":7,"tool":"noop","args":{"a":"x","b":2,"path":null},"cell":"c1"}`,
		`{"seq":8,"tool":"noop","args":{"a":"x","a":"y"},"cell":"c1"}`,
		`{"seq":9,"tool":"noop","args":{"A":"x"},"TOKEN":"0","cell":"c1"}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Add([]byte(`{"seq":2,"tool":"noop","args":{},"token":"`+token+`","cell":"c1"}`), false)
	var ran atomic.Int64
	var lastArgs atomic.Pointer[hosttools.Args]
	r := newRPCRig(f, hosttools.Tool{Name: "noop", Description: "Count calls.", Params: fuzzParams, Handler: func(_ context.Context, c hosttools.Call) (hosttools.Result, error) {
		lastArgs.Store(&c.Args)
		ran.Add(1)
		return hosttools.Result{Text: "ok"}, nil
	}}, PolicyAllow)
	f.Fuzz(func(t *testing.T, data []byte, sign bool) {
		if sign {
			data = signRequest(data)
		}
		s := r.session(time.Minute)
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
		// The oracle decodes with exact (case-sensitive) keys, as the
		// runner writes them.
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(data, &raw); err != nil {
			t.Fatalf("dispatched an undecodable request %q: %v", data, err)
		}
		str := func(k string) string { var v string; json.Unmarshal(raw[k], &v); return v }
		mac := kernelauth.MAC(token, kernelauth.RPC, string(raw["seq"]), str("cell"), str("tool"), string(raw["args"]))
		if str("token") != mac || str("cell") != "c1" || strings.ContainsAny(string(raw["seq"]), ".eE-") || len(raw["args"]) > MaxToolArgs {
			t.Fatalf("dispatched a request that fails a check: %q", data)
		}
		// The tool got the args the file holds, each parameter once.
		want := map[string]json.RawMessage{}
		if a := raw["args"]; len(a) > 0 && string(a) != "null" {
			if err := json.Unmarshal(a, &want); err != nil {
				t.Fatalf("dispatched args that are not an object: %q", data)
			}
		}
		if got := lastArgs.Load(); got == nil || !sameArgs(*got, want) {
			t.Fatalf("%q: the tool got args %v, the file says %s", data, got, raw["args"])
		}
		if n := keysWritten(raw["args"]); n != len(want) {
			t.Fatalf("%q: dispatched args that write %d keys for %d parameters (one given twice)", data, n, len(want))
		}
		// Never twice: the same bytes again are a replay.
		if _, _ = s.serve(rpcItem{name: "f.req", data: data}); ran.Load() != before+1 {
			t.Fatalf("a replayed request was dispatched again: %q", data)
		}
	})
}

// fuzzParams lets FuzzServeRPC's tool take a few arguments of any type.
var fuzzParams = hosttools.Schema{{Name: "a", Type: hosttools.TypeString}, {Name: "b", Type: hosttools.TypeInt}, {Name: "path", Type: hosttools.TypeString}}

func sameArgs(got hosttools.Args, want map[string]json.RawMessage) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if !bytes.Equal(bytes.TrimSpace(got[k]), bytes.TrimSpace(v)) {
			return false
		}
	}
	return true
}

// keysWritten counts the keys an args object writes, repeats included (a
// map keeps only the last of two equal keys).
func keysWritten(args json.RawMessage) int {
	dec := json.NewDecoder(bytes.NewReader(args))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return 0
	}
	n := 0
	for dec.More() {
		var v json.RawMessage
		if _, err := dec.Token(); err != nil || dec.Decode(&v) != nil {
			break
		}
		n++
	}
	return n
}

// signRequest rewrites a request the way the kernel's runner writes one:
// its seq, tool, cell and args as given, with the MAC of those as token. Data
// that is no object of those fields is left as it is.
func signRequest(data []byte) []byte {
	obj, err := jsonobj.Decode(data)
	if err != nil {
		return data
	}
	str := func(k string) (string, bool) {
		var v string
		return v, obj[k] == nil || json.Unmarshal(obj[k], &v) == nil
	}
	tool, ok1 := str("tool")
	cell, ok2 := str("cell")
	if !ok1 || !ok2 || obj["seq"] == nil {
		return data
	}
	args := obj["args"]
	if args == nil {
		args = json.RawMessage("null")
	}
	toolJSON, _ := json.Marshal(tool)
	cellJSON, _ := json.Marshal(cell)
	mac := kernelauth.MAC(rpcToken, kernelauth.RPC, string(obj["seq"]), cell, tool, string(args))
	return []byte(fmt.Sprintf(`{"seq":%s,"tool":%s,"cell":%s,"args":%s,"token":%q}`, obj["seq"], toolJSON, cellJSON, args, mac))
}
