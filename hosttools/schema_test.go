package hosttools

import (
	"encoding/json"
	"errors"
	"testing"
)

var testSchema = Schema{
	{Name: "path", Type: TypeString, Required: true},
	{Name: "offset", Type: TypeInt},
	{Name: "verbose", Type: TypeBool},
	{Name: "ratio", Type: TypeNumber},
	{Name: "opts", Type: TypeObject},
	{Name: "items", Type: TypeArray},
}

func TestValidateMessages(t *testing.T) {
	tests := []struct {
		name  string
		args  string
		wants []string // each must appear in the error; none means valid
	}{
		{"minimal", `{"path":"a"}`, nil},
		{"every type", `{"path":"a","offset":-3,"verbose":false,"ratio":0.5,"opts":{"k":[1]},"items":[]}`, nil},
		{"null optional is absent", `{"path":"a","offset":null}`, nil},
		{"unknown with suggestion", `{"path":"a","file_path":"b"}`, []string{`unknown parameter "file_path": did you mean "path"?`, "takes path (string, required), offset (int)"}},
		{"unknown case", `{"Path":"a"}`, []string{`unknown parameter "Path": did you mean "path"?`, `missing required parameter "path": send it as a JSON string`}},
		{"missing required", `{}`, []string{`missing required parameter "path": send it as a JSON string, e.g. "text"`}},
		{"null required", `{"path":null}`, []string{`missing required parameter "path"`}},
		{"int as string", `{"path":"a","offset":"10"}`, []string{`parameter "offset" must be a whole JSON number, e.g. 10, got a string "10"`, "send the number without quotes, e.g. 10"}},
		{"int with fraction", `{"path":"a","offset":1.5}`, []string{`parameter "offset"`, "send a whole number written without a fraction or exponent, e.g. 10"}},
		{"int with exponent", `{"path":"a","offset":1e3}`, []string{`parameter "offset"`, "without a fraction or exponent"}},
		{"int out of range", `{"path":"a","offset":9223372036854775808}`, []string{`parameter "offset"`, "out of range"}},
		{"number out of range", `{"path":"a","ratio":1e400}`, []string{`parameter "ratio"`, "out of range"}},
		{"bool as string", `{"path":"a","verbose":"true"}`, []string{`parameter "verbose" must be true or false`, "send true without quotes"}},
		{"string as number", `{"path":5}`, []string{`parameter "path" must be a JSON string`, `got a number 5`, `send it in quotes, e.g. "5"`}},
		{"number as string", `{"path":"a","ratio":"0.5"}`, []string{`parameter "ratio"`, "without quotes"}},
		{"object encoded in a string", `{"path":"a","opts":"{\"k\":1}"}`, []string{`parameter "opts" must be a JSON object`, "not a string that encodes it"}},
		{"array given an object", `{"path":"a","items":{}}`, []string{`parameter "items" must be a JSON array`, "got an object"}},
		{"several problems at once", `{"path":1,"zzz":0,"offset":true}`, []string{`unknown parameter "zzz"`, `parameter "path"`, `parameter "offset"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var args map[string]json.RawMessage
			if err := json.Unmarshal([]byte(tc.args), &args); err != nil {
				t.Fatal(err)
			}
			err := testSchema.Validate(args)
			if len(tc.wants) == 0 {
				if err != nil {
					t.Fatalf("Validate(%s) = %v, want nil", tc.args, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate(%s) = nil, want an error", tc.args)
			}
			if !errors.Is(err, ErrInvalidArgs) {
				t.Errorf("error %v does not match ErrInvalidArgs", err)
			}
			mustContain(t, "error", err.Error(), tc.wants...)
		})
	}
}

func TestArgsAccessors(t *testing.T) {
	a := rawArgs(t, map[string]any{"s": "x", "i": 7, "b": true, "n": 2.5, "null": nil, "o": map[string]int{"k": 1}})
	if v, err := a.Str("s", "d"); err != nil || v != "x" {
		t.Errorf("Str = %q, %v", v, err)
	}
	if v, err := a.Str("missing", "d"); err != nil || v != "d" {
		t.Errorf("Str(missing) = %q, %v; want the default", v, err)
	}
	if v, err := a.Int("i", 0); err != nil || v != 7 {
		t.Errorf("Int = %d, %v", v, err)
	}
	if v, err := a.Int("null", 42); err != nil || v != 42 {
		t.Errorf("Int(null) = %d, %v; want the default", v, err)
	}
	if v, err := a.Bool("b", false); err != nil || !v {
		t.Errorf("Bool = %v, %v", v, err)
	}
	if v, err := a.Num("n", 0); err != nil || v != 2.5 {
		t.Errorf("Num = %v, %v", v, err)
	}
	if raw := a.Raw("o"); string(raw) != `{"k":1}` {
		t.Errorf("Raw = %s", raw)
	}
	if _, err := a.Int("s", 0); !errors.Is(err, ErrInvalidArgs) {
		t.Errorf("Int of a string: err = %v, want ErrInvalidArgs", err)
	}
}
