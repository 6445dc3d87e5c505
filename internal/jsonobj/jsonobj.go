// Package jsonobj decodes one JSON object strictly, for input that crosses a
// trust boundary: keys match exactly, each key appears once, and nothing but
// white space may follow the object.
//
// encoding/json alone is not enough there: decoding into a struct matches
// keys case-insensitively, and decoding into a map keeps the last of two
// equal keys, so two readers of the same bytes (a parser and a check, or a
// tool and the approval prompt that shows its arguments) can disagree.
package jsonobj

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Object is a decoded JSON object: each key with its raw, undecoded value.
type Object map[string]json.RawMessage

// ErrNotObject is returned for valid JSON that is not an object.
var ErrNotObject = errors.New("not a JSON object")

// DuplicateKeyError reports a key that appears more than once.
type DuplicateKeyError struct{ Key string }

func (e *DuplicateKeyError) Error() string { return fmt.Sprintf("key %.80q appears twice", e.Key) }

// Decode parses data as exactly one JSON object. A syntax error is returned
// as the *json.SyntaxError encoding/json reports.
func Decode(data []byte) (Object, error) {
	if !json.Valid(data) {
		// Valid first, so that malformed input gets encoding/json's own
		// error (with its offset) rather than a token reader's.
		var v any
		err := json.Unmarshal(data, &v)
		if err == nil {
			err = errors.New("invalid JSON")
		}
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, ErrNotObject
	}
	obj := Object{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("object key %v is not a string", tok)
		}
		if _, dup := obj[key]; dup {
			return nil, &DuplicateKeyError{Key: key}
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		obj[key] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	// json.Valid accepted the whole input as one value, so only white
	// space can follow; checked anyway, since it is the point of the package.
	if len(bytes.TrimSpace(data[dec.InputOffset():])) > 0 {
		return nil, errors.New("data after the JSON object")
	}
	return obj, nil
}

// Kind names the JSON type of a valid value: string, number, boolean,
// null, object or array ("nothing" for an empty one), for error messages
// and type checks on an Object's values.
func Kind(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}
