package engine

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Key identifies a kernel: who owns it, where it runs, for which task and
// delegated child, and which host tools it may call. The tool stubs are
// generated at spawn, so a different tool set is a different kernel.
type Key struct {
	Owner   string
	Backend string
	Task    string
	Child   string
	Tools   string // sorted, comma-joined
}

var toolName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// maxName bounds an owner, task or child name, in bytes.
const maxName = 256

// NewKey builds a key; tools are deduplicated and sorted. Tool names must be
// Python identifiers because each becomes a function in the stub module.
// Names are shown on operators' terminals, so they may hold no control
// character.
func NewKey(owner, backend, task, child string, tools []string) (Key, error) {
	for _, f := range []struct{ what, v string }{{"owner", owner}, {"task", task}, {"child", child}} {
		if err := checkName(f.what, f.v); err != nil {
			return Key{}, err
		}
	}
	set := slices.Clone(tools)
	for _, t := range set {
		if !toolName.MatchString(t) {
			return Key{}, &KeyError{Field: "tools", Err: fmt.Errorf("tool name %q is not a Python identifier (letters, digits, _; at most 64)", t)}
		}
	}
	slices.Sort(set)
	set = slices.Compact(set)
	return Key{Owner: owner, Backend: backend, Task: task, Child: child, Tools: strings.Join(set, ",")}, nil
}

// KeyError says which part of a kernel key is not acceptable, and why.
type KeyError struct {
	Field string // owner, task, child or tools
	Err   error
}

func (e *KeyError) Error() string { return e.Err.Error() }
func (e *KeyError) Unwrap() error { return e.Err }

func checkName(what, v string) error {
	fail := func(format string, args ...any) error {
		return &KeyError{Field: what, Err: fmt.Errorf(format, args...)}
	}
	if len(v) > maxName {
		return fail("%s is %d bytes long; at most %d are allowed", what, len(v), maxName)
	}
	if !utf8.ValidString(v) {
		return fail("%s %q is not valid UTF-8", what, v)
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return fail("%s %+q holds a control character (%U); names are shown on terminals, so use printable characters", what, v, r)
		}
	}
	return nil
}

// ToolList returns the key's tools as a slice.
func (k Key) ToolList() []string {
	if k.Tools == "" {
		return []string{}
	}
	return strings.Split(k.Tools, ",")
}

// String renders the key for events and the UI.
func (k Key) String() string {
	s := k.Owner + "/" + k.Task
	if k.Child != "" {
		s += "/" + k.Child
	}
	return s + "@" + k.Backend + "[" + k.Tools + "]"
}
