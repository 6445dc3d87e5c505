package hosttools

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Why terminal-like tools drop these parameters instead of honouring them:
// a tool call from a kernel runs under the authority of one cell (its
// owner's approval, its timeout, its call budget). A background job, a
// completion notification, a heartbeat or a process kept on release would
// outlive that cell and keep acting after the cell's authority ended, with
// nobody left to read its output or stop it. The reference implementation
// learned this one modifier at a time (background and notify first, then
// heartbeat because it implies notify and rides the same delivery path,
// then persist_on_release as a background-only modifier), so besides the
// explicit names the rule drops every name that starts with one of those
// words: the next such modifier is refused before anyone lists it.
//
// They are dropped rather than rejected so a call written for an agent's
// usual terminal tool still runs, in the foreground, and the result says
// what was dropped.

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
