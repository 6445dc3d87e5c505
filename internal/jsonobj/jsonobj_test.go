package jsonobj

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    map[string]string // nil: an error containing wantErr
		wantErr string
	}{
		{in: `{}`, want: map[string]string{}},
		{in: ` {"a":1, "b":{"c":[1,2]}, "A":"x"} `, want: map[string]string{"a": `1`, "b": `{"c":[1,2]}`, "A": `"x"`}},
		{in: `{"a":null}`, want: map[string]string{"a": `null`}},
		{in: `{"a":1,"a":2}`, wantErr: `key "a" appears twice`},
		{in: `{"token":"x","tok\u0065n":"y"}`, wantErr: `key "token" appears twice`},
		{in: `{"a":{"b":1,"b":2}}`, want: map[string]string{"a": `{"b":1,"b":2}`}}, // only the top level is checked
		{in: `{"a":1}}`, wantErr: "invalid character"},
		{in: `{"a":1}{"b":2}`, wantErr: "invalid character"},
		{in: `[1]`, wantErr: ErrNotObject.Error()},
		{in: `null`, wantErr: ErrNotObject.Error()},
		{in: `"x"`, wantErr: ErrNotObject.Error()},
		{in: `{"a":`, wantErr: "unexpected end"},
		{in: ``, wantErr: "unexpected end"},
	} {
		got, err := Decode([]byte(tc.in))
		if tc.want == nil {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Decode(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("Decode(%q): %v", tc.in, err)
			continue
		}
		if len(got) != len(tc.want) {
			t.Errorf("Decode(%q) = %d keys, want %d", tc.in, len(got), len(tc.want))
		}
		for k, v := range tc.want {
			if string(got[k]) != v {
				t.Errorf("Decode(%q)[%q] = %s, want %s", tc.in, k, got[k], v)
			}
		}
	}
}

// A syntax error keeps encoding/json's type, so callers can report its offset.
func TestDecodeSyntaxError(t *testing.T) {
	in := []byte(`{"a" 1}`)
	var v any
	want := json.Unmarshal(in, &v).(*json.SyntaxError)
	_, err := Decode(in)
	var syn *json.SyntaxError
	if !errors.As(err, &syn) || syn.Offset != want.Offset || syn.Error() != want.Error() {
		t.Fatalf("Decode: %v (%T), want %v at offset %d", err, err, want, want.Offset)
	}
}

// Decode agrees with encoding/json on every input, except that it refuses
// objects with a repeated key, which encoding/json resolves silently.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"a":2}`, `{"a":1,"A":2}`, `{"\u00e9":1,"é":2}`, "{\"\xff\":1,\"\xfe\":2}",
		`[]`, `{"a":[{"b":1}]}`, `{"a":1} `, `{"a":1}x`, `1`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Decode(data)
		var want map[string]json.RawMessage
		stdErr := json.Unmarshal(data, &want)
		if stdErr != nil || want == nil {
			if err == nil {
				t.Fatalf("Decode accepted %q; encoding/json: %v", data, stdErr)
			}
			return
		}
		if err != nil {
			if !strings.Contains(err.Error(), "appears twice") {
				t.Fatalf("Decode refused %q (%v), encoding/json accepts it", data, err)
			}
			return
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d keys, encoding/json has %d", data, len(got), len(want))
		}
		for k, v := range want {
			if !bytes.Equal(bytes.TrimSpace(got[k]), bytes.TrimSpace(v)) {
				t.Fatalf("%q: key %q = %s, encoding/json has %s", data, k, got[k], v)
			}
			var str string
			if json.Unmarshal(v, &str) == nil {
				if u, err := Unquote(got[k]); err != nil || u != str {
					t.Fatalf("%q: Unquote of key %q = %q (%v), encoding/json has %q", data, k, u, err, str)
				}
			}
		}
	})
}

// Unquote decodes a string as encoding/json does, and refuses what it
// refuses, on its fast path (no escapes) and off it.
func TestUnquote(t *testing.T) {
	for _, q := range []string{`"plain"`, `""`, `"caf\u00e9"`, `"a\"b"`, `"tab\tx"`, "\"\xff\xfe\"", "\"ctl\x01\"",
		`"unterminated`, `12`, `"`, `"a"b"`, `null`} {
		var want string
		wantErr := json.Unmarshal([]byte(q), &want)
		got, err := Unquote([]byte(q))
		if (err != nil) != (wantErr != nil) || got != want {
			t.Errorf("Unquote(%q) = %q, %v; encoding/json: %q, %v", q, got, err, want, wantErr)
		}
	}
}

// A tool request as a runner sends one: decoded once per tool call.
func BenchmarkDecodeRequest(b *testing.B) {
	data := []byte(`{"seq": 12, "tool": "read_file", "args": {"path": "/tmp/x", "max": 100}, "cell": "c3f9a1b2c4d5e6f70", "token": "e48169b4d892d4d86904aace3d582540fd193cbdd551c5ac9491a61a801ce775"}`)
	for b.Loop() {
		if _, err := Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}
