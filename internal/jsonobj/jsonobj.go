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
	"unicode/utf8"
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
		// error (with its offset).
		var v any
		err := json.Unmarshal(data, &v)
		if err == nil {
			err = errors.New("invalid JSON")
		}
		return nil, err
	}
	// The input is one valid JSON value: what is left is to split the
	// object's members, which needs no more checks than where each ends.
	i := skipSpace(data, 0)
	if data[i] != '{' {
		return nil, ErrNotObject
	}
	obj := Object{}
	for i = skipSpace(data, i+1); data[i] != '}'; i = skipSpace(data, i) {
		if data[i] == ',' {
			i = skipSpace(data, i+1)
		}
		end := skipString(data, i)
		key, err := Unquote(data[i:end])
		if err != nil {
			return nil, err
		}
		if _, dup := obj[key]; dup {
			return nil, &DuplicateKeyError{Key: key}
		}
		i = skipSpace(data, skipSpace(data, end)+1) // past the colon
		end = skipValue(data, i)
		obj[key] = bytes.Clone(data[i:end])
		i = end
	}
	return obj, nil
}

// Unquote decodes a JSON string value (a member of a decoded Object) as
// encoding/json does (escapes, and invalid UTF-8 replaced), without its
// cost when there is nothing to do.
func Unquote(q []byte) (string, error) {
	if len(q) >= 2 && q[0] == '"' && q[len(q)-1] == '"' {
		body := q[1 : len(q)-1]
		plain := utf8.Valid(body)
		for _, b := range body {
			if b < 0x20 || b == '"' || b == '\\' {
				plain = false
				break
			}
		}
		if plain {
			return string(body), nil
		}
	}
	var s string
	err := json.Unmarshal(q, &s)
	return s, err
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the end of the (valid) string starting at data[i].
func skipString(data []byte, i int) int {
	for i++; data[i] != '"'; i++ {
		if data[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// skipValue returns the end of the (valid) value starting at data[i].
func skipValue(data []byte, i int) int {
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch data[i] {
			case '"':
				i = skipString(data, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for ; i < len(data); i++ {
		switch data[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return i
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
