package hosttools

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

// FuzzValidate feeds arbitrary JSON objects to the validator. It must never
// panic, and it must agree with the handlers' accessors: whatever passes
// validation decodes, and decodes to what encoding/json reads.
func FuzzValidate(f *testing.F) {
	// More seeds live in testdata/fuzz/FuzzValidate.
	f.Add([]byte(`{"path":"a.txt","offset":0}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var args map[string]json.RawMessage
		if json.Unmarshal(data, &args) != nil {
			return
		}
		err := testSchema.Validate(args)
		if err != nil {
			var verr *ValidationError
			if !errors.As(err, &verr) || len(verr.Problems) == 0 {
				t.Fatalf("Validate error %v is not a *ValidationError with problems", err)
			}
			if !utf8.ValidString(err.Error()) {
				t.Fatalf("Validate error is not valid UTF-8: %q", err.Error())
			}
			return
		}
		a := Args(args)
		for name := range args {
			if _, ok := testSchema.lookup(name); !ok {
				t.Fatalf("unknown parameter %q passed validation", name)
			}
		}
		if a.get("path") == nil {
			t.Fatalf("missing required path passed validation: %s", data)
		}
		s, err := a.Str("path", "")
		var js string
		if err != nil || json.Unmarshal(args["path"], &js) != nil || js != s {
			t.Fatalf("path passed validation but Str = %q, %v; encoding/json reads %q", s, err, js)
		}
		if raw := a.get("offset"); raw != nil {
			n, err := a.Int("offset", 0)
			var f float64
			if err != nil || json.Unmarshal(raw, &f) != nil || float64(n) != f {
				t.Fatalf("offset %s passed validation but Int = %d, %v (json float %v)", raw, n, err, f)
			}
		}
		if raw := a.get("verbose"); raw != nil {
			v, err := a.Bool("verbose", false)
			var jb bool
			if err != nil || json.Unmarshal(raw, &jb) != nil || jb != v {
				t.Fatalf("verbose %s passed validation but Bool = %v, %v", raw, v, err)
			}
		}
		if raw := a.get("ratio"); raw != nil {
			v, err := a.Num("ratio", 0)
			var jf float64
			if err != nil || json.Unmarshal(raw, &jf) != nil || jf != v {
				t.Fatalf("ratio %s passed validation but Num = %v, %v", raw, v, err)
			}
		}
		if raw := a.get("opts"); raw != nil {
			var m map[string]any
			if json.Unmarshal(raw, &m) != nil {
				t.Fatalf("opts %s passed validation but is not a JSON object", raw)
			}
		}
		if raw := a.get("items"); raw != nil {
			var l []any
			if json.Unmarshal(raw, &l) != nil {
				t.Fatalf("items %s passed validation but is not a JSON array", raw)
			}
		}
	})
}
