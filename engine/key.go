package engine

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
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

// NewKey builds a key; tools are deduplicated and sorted. Tool names must be
// Python identifiers because each becomes a function in the stub module.
func NewKey(owner, backend, task, child string, tools []string) (Key, error) {
	set := slices.Clone(tools)
	for _, t := range set {
		if !toolName.MatchString(t) {
			return Key{}, fmt.Errorf("tool name %q is not a Python identifier (letters, digits, _; at most 64)", t)
		}
	}
	slices.Sort(set)
	set = slices.Compact(set)
	return Key{Owner: owner, Backend: backend, Task: task, Child: child, Tools: strings.Join(set, ",")}, nil
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
