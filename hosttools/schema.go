package hosttools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Type is the JSON type a parameter accepts.
type Type string

// The parameter types. Object and Array arguments reach the handler as raw
// JSON; the validator only checks that they are a JSON object or array.
const (
	TypeString Type = "string"
	TypeInt    Type = "int"
	TypeBool   Type = "bool"
	TypeNumber Type = "number"
	TypeObject Type = "object"
	TypeArray  Type = "array"
)

// Param is one named parameter of a tool.
type Param struct {
	Name        string `json:"name"`
	Type        Type   `json:"type"`
	Required    bool   `json:"required,omitempty"`
	Description string `json:"description,omitempty"`
}

// Schema lists a tool's parameters in the order they are documented.
type Schema []Param

// ErrInvalidArgs is matched (errors.Is) by every argument validation error.
var ErrInvalidArgs = errors.New("invalid arguments")

// ValidationError lists every problem found in one set of arguments, each
// phrased for an agent: what was wrong and what to send instead.
type ValidationError struct {
	Problems []string
	// Usage is the schema's one-line parameter summary.
	Usage string
}

func (e *ValidationError) Error() string {
	return "invalid arguments: " + strings.Join(e.Problems, "; ") + " (" + e.Usage + ")"
}

// Is makes errors.Is(err, ErrInvalidArgs) true for validation errors.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidArgs }

// paramName: parameters become Python keyword arguments in the generated
// stub module, so they must be identifiers (the same rule as tool names).
var paramName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// check reports a malformed schema, so a bad tool definition fails at
// Register instead of confusing every later call.
func (s Schema) check() error {
	seen := make(map[string]bool, len(s))
	for _, p := range s {
		if !paramName.MatchString(p.Name) {
			return fmt.Errorf("parameter name %q is not a Python identifier (letters, digits, _; at most 64)", p.Name)
		}
		if seen[p.Name] {
			return fmt.Errorf("parameter %q is declared twice", p.Name)
		}
		seen[p.Name] = true
		if p.Type.example() == "" {
			return fmt.Errorf("parameter %q has unknown type %q (use string, int, bool, number, object or array)", p.Name, p.Type)
		}
	}
	return nil
}

// Usage summarises the parameters, e.g. "takes path (string, required), offset (int)".
func (s Schema) Usage() string {
	if len(s) == 0 {
		return "takes no parameters"
	}
	parts := make([]string, len(s))
	for i, p := range s {
		req := ""
		if p.Required {
			req = ", required"
		}
		parts[i] = fmt.Sprintf("%s (%s%s)", p.Name, p.Type, req)
	}
	return "takes " + strings.Join(parts, ", ")
}

func (s Schema) lookup(name string) (Param, bool) {
	i := slices.IndexFunc(s, func(p Param) bool { return p.Name == name })
	if i < 0 {
		return Param{}, false
	}
	return s[i], true
}

// Validate checks args against the schema: no unknown parameters, every
// required one present, every value of its declared type. A JSON null
// counts as absent, so Python callers can pass None for an optional
// parameter. The error is a *ValidationError naming every problem.
func (s Schema) Validate(args map[string]json.RawMessage) error {
	var problems []string
	unknown := make([]string, 0)
	for name := range args {
		if _, ok := s.lookup(name); !ok {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	for _, name := range unknown {
		problems = append(problems, fmt.Sprintf("unknown parameter %q%s", name, s.suggest(name)))
	}
	for _, p := range s {
		raw, ok := args[p.Name]
		if !ok || isNull(raw) {
			if p.Required {
				problems = append(problems, fmt.Sprintf("missing required parameter %q: send it as %s", p.Name, p.Type.example()))
			}
			continue
		}
		if msg := p.Type.problem(raw); msg != "" {
			problems = append(problems, fmt.Sprintf("parameter %q %s", p.Name, msg))
		}
	}
	if len(problems) > 0 {
		return &ValidationError{Problems: problems, Usage: s.Usage()}
	}
	return nil
}

// suggest points an agent that guessed a near name (Path, file_path) at
// the real one.
func (s Schema) suggest(name string) string {
	lower := strings.ToLower(name)
	for _, p := range s {
		if strings.EqualFold(p.Name, name) || strings.Contains(lower, strings.ToLower(p.Name)) {
			return fmt.Sprintf(": did you mean %q?", p.Name)
		}
	}
	return ""
}

func (t Type) example() string {
	switch t {
	case TypeString:
		return `a JSON string, e.g. "text"`
	case TypeInt:
		return "a whole JSON number, e.g. 10"
	case TypeBool:
		return "true or false"
	case TypeNumber:
		return "a JSON number, e.g. 1.5"
	case TypeObject:
		return `a JSON object, e.g. {"key": "value"}`
	case TypeArray:
		return `a JSON array, e.g. ["a", "b"]`
	}
	return ""
}

// problem returns "" if raw is a valid value of type t, else the rest of a
// sentence saying what is wrong and what to send instead. It shares its
// decoders with the Args accessors, so whatever passes validation also
// decodes in the handler (FuzzValidate checks this).
func (t Type) problem(raw json.RawMessage) string {
	var err error
	switch t {
	case TypeString:
		_, err = decodeString(raw)
	case TypeInt:
		_, err = decodeInt(raw)
	case TypeBool:
		_, err = decodeBool(raw)
	case TypeNumber:
		_, err = decodeNumber(raw)
	case TypeObject:
		err = expectComposite(raw, '{')
	case TypeArray:
		err = expectComposite(raw, '[')
	default:
		return fmt.Sprintf("has unknown type %q", t)
	}
	if err == nil {
		return ""
	}
	return fmt.Sprintf("must be %s, got %s%s", t.example(), describe(raw), t.hint(raw, err))
}

// hint tailors the advice to the common mistakes: numbers or booleans sent
// as strings, strings sent bare, fractions for an int, a JSON-encoded
// object inside a string.
func (t Type) hint(raw json.RawMessage, err error) string {
	raw = bytes.TrimSpace(raw)
	var inner string
	quoted := len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &inner) == nil
	switch {
	case errors.Is(err, errOutOfRange):
		return ": it is out of range"
	case t == TypeInt && isNumberLiteral(raw):
		return ": send a whole number written without a fraction or exponent, e.g. 10"
	case (t == TypeInt || t == TypeNumber) && quoted && isNumberLiteral([]byte(inner)):
		return ": send the number without quotes, e.g. " + inner
	case t == TypeBool && quoted && (inner == "true" || inner == "false"):
		return ": send " + inner + " without quotes"
	case t == TypeString && !quoted && json.Valid(raw):
		return fmt.Sprintf(": send it in quotes, e.g. %q", string(raw))
	case (t == TypeObject || t == TypeArray) && quoted && json.Valid([]byte(inner)):
		return ": send the JSON value itself, not a string that encodes it"
	}
	return ""
}

// describe names the JSON kind of raw with a short excerpt, for messages.
func describe(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	kind := "invalid JSON"
	if json.Valid(raw) {
		switch raw[0] {
		case '"':
			kind = "a string"
		case '{':
			kind = "an object"
		case '[':
			kind = "an array"
		case 't', 'f':
			kind = "a boolean"
		case 'n':
			kind = "null"
		default:
			kind = "a number"
		}
	}
	excerpt := string(raw)
	if r := []rune(excerpt); len(r) > 40 {
		excerpt = string(r[:40]) + "..."
	}
	// The excerpt is JSON text, readable as is; only bytes that would garble
	// a message (invalid UTF-8, control characters) are replaced.
	excerpt = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(excerpt, "\uFFFD"))
	return kind + " " + excerpt
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func isNumberLiteral(b []byte) bool {
	return len(b) > 0 && (b[0] == '-' || (b[0] >= '0' && b[0] <= '9')) && json.Valid(b)
}

var (
	errWrongType  = errors.New("wrong type")
	errOutOfRange = errors.New("out of range")
)

func decodeString(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", errWrongType
	}
	return s, nil
}

// decodeInt accepts only an integer literal: 10.0 or 1e3 would have to go
// through a float64, which silently rounds long literals, so they are
// refused with a hint instead.
func decodeInt(raw json.RawMessage) (int64, error) {
	raw = bytes.TrimSpace(raw)
	if !isNumberLiteral(raw) {
		return 0, errWrongType
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return 0, errOutOfRange
	case err != nil:
		return 0, errWrongType
	}
	return n, nil
}

func decodeNumber(raw json.RawMessage) (float64, error) {
	raw = bytes.TrimSpace(raw)
	if !isNumberLiteral(raw) {
		return 0, errWrongType
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return 0, errOutOfRange
	}
	return f, nil
}

func decodeBool(raw json.RawMessage) (bool, error) {
	switch string(bytes.TrimSpace(raw)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, errWrongType
}

func expectComposite(raw json.RawMessage, open byte) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != open || !json.Valid(raw) {
		return errWrongType
	}
	return nil
}

// Args are a call's arguments as raw JSON values by parameter name.
type Args map[string]json.RawMessage

// get returns the raw value, or nil if the parameter is absent or null.
func (a Args) get(name string) json.RawMessage {
	raw, ok := a[name]
	if !ok || isNull(raw) {
		return nil
	}
	return raw
}

func argError(name string, t Type, raw json.RawMessage) error {
	return fmt.Errorf("parameter %q must be %s, got %s: %w", name, t.example(), describe(raw), ErrInvalidArgs)
}

// Str returns a string argument, or def if it is absent or null.
func (a Args) Str(name, def string) (string, error) {
	raw := a.get(name)
	if raw == nil {
		return def, nil
	}
	s, err := decodeString(raw)
	if err != nil {
		return "", argError(name, TypeString, raw)
	}
	return s, nil
}

// Int returns an int argument, or def if it is absent or null.
func (a Args) Int(name string, def int64) (int64, error) {
	raw := a.get(name)
	if raw == nil {
		return def, nil
	}
	n, err := decodeInt(raw)
	if err != nil {
		return 0, argError(name, TypeInt, raw)
	}
	return n, nil
}

// Bool returns a bool argument, or def if it is absent or null.
func (a Args) Bool(name string, def bool) (bool, error) {
	raw := a.get(name)
	if raw == nil {
		return def, nil
	}
	b, err := decodeBool(raw)
	if err != nil {
		return false, argError(name, TypeBool, raw)
	}
	return b, nil
}

// Num returns a number argument, or def if it is absent or null.
func (a Args) Num(name string, def float64) (float64, error) {
	raw := a.get(name)
	if raw == nil {
		return def, nil
	}
	f, err := decodeNumber(raw)
	if err != nil {
		return 0, argError(name, TypeNumber, raw)
	}
	return f, nil
}

// Raw returns an object or array argument as raw JSON, or nil if it is
// absent or null.
func (a Args) Raw(name string) json.RawMessage { return a.get(name) }
