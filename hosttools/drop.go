package hosttools

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Terminal-like tools drop background-style parameters: a call runs under
// one cell's authority, and a background job, notification, heartbeat or
// kept process would outlive it. Every name starting with one of these
// words is dropped (the reference learned them one at a time); dropped, not
// refused, so a call written for a usual terminal tool still runs, in the
// foreground, and its result says what was dropped.

// backgroundPrefixes are the words that mark a background-style modifier.
func backgroundPrefixes() [4]string {
	return [4]string{"background", "notify", "heartbeat", "persist"}
}

// IsBackgroundParam reports whether a terminal-like tool drops the named
// parameter: the explicit names below, or any name (case-insensitive) that
// starts with background, notify, heartbeat or persist.
func IsBackgroundParam(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "run_in_background", "in_background", "pty", "watch_patterns", "check_interval":
		// pty and watch_patterns attach a terminal or a watcher that outlives
		// the call; check_interval only makes sense for a background poll.
		return true
	}
	for _, p := range backgroundPrefixes() {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	return false
}

// dropBackgroundParams returns args without background-style parameters
// and the sorted names it dropped. It never edits the caller's map.
func dropBackgroundParams(args Args) (Args, []string) {
	var dropped []string
	for name := range args {
		if IsBackgroundParam(name) {
			dropped = append(dropped, name)
		}
	}
	if len(dropped) == 0 {
		return args, nil
	}
	kept := maps.Clone(args)
	for _, name := range dropped {
		delete(kept, name)
	}
	slices.Sort(dropped)
	return kept, dropped
}

// dropNote explains dropped parameters; lead prefixes it and wraps it in
// parentheses when it is appended to an error.
func dropNote(dropped []string, lead string) string {
	if len(dropped) == 0 {
		return ""
	}
	note := fmt.Sprintf("dropped parameters %s: a tool call from a kernel cannot start background jobs, notifications or processes that outlive the call, so the command ran in the foreground", strings.Join(dropped, ", "))
	if lead != "" {
		return lead + note + ")"
	}
	return note
}
