package engine

import "strings"

// marker begins a line of a host script's or runner's output that the
// engine reads ("KD:OK"); the rest of the line, after a space, is its
// argument. Markers count only at the start of a line: forwarded tool
// requests put kernel-controlled text in the output.
type marker string

// markerPrefix begins every marker.
const markerPrefix = "KD:"

// The markers, and what says each.
const (
	markOK      marker = "KD:OK"      // a command did what it was for
	markErr     marker = "KD:ERR"     // a script failed, and why
	markSpawned marker = "KD:SPAWNED" // spawn: pid, dir, python, confinement
	markNoCode  marker = "KD:NOCODE"  // spawn: the loader refused the cached code
	markCode    marker = "KD:CODE"    // the runner's code, compiled on the host
	markExe     marker = "KD:EXE"     // the interpreter that compiled it
	markResult  marker = "KD:RESULT"  // exec: the cell's signed result
	markPending marker = "KD:PENDING" // exec: the cell runs; ask again
	markDead    marker = "KD:DEAD"    // exec: the runner is gone and the cell never reached it
	markLost    marker = "KD:LOST"    // exec: the runner died after the cell reached it
	markGone    marker = "KD:GONE"    // the kernel dir is gone
	markPubFail marker = "KD:PUBFAIL" // exec: the cell's record could not be written
	markRPC     marker = "KD:RPC"     // exec: a tool call of the cell: name, JSON
	markRPCBad  marker = "KD:RPCBAD"  // exec: a tool call that could not be read
	markRPCWait marker = "KD:RPCWAIT" // exec: the cell waits for tool answers
	markKilled  marker = "KD:KILLED"  // kill: the kernel's processes are gone
	markAdopt   marker = "KD:ADOPT"   // adopt: the runner is alive and this dir's
)

// markers lists every marker, for the tests that hold the scripts to them.
var markers = []marker{markOK, markErr, markSpawned, markNoCode, markCode, markExe, markResult, markPending,
	markDead, markLost, markGone, markPubFail, markRPC, markRPCBad, markRPCWait, markKilled, markAdopt}

// findLine returns the argument of output's first line of marker m ("" for
// the bare marker).
func findLine(output string, m marker) (string, bool) {
	for line := range strings.SplitSeq(output, "\n") {
		line = strings.TrimRight(line, "\r")
		if line == string(m) {
			return "", true
		}
		if rest, ok := strings.CutPrefix(line, string(m)+" "); ok {
			return rest, true
		}
	}
	return "", false
}

// hasLine reports whether output has a line of marker m.
func hasLine(output string, m marker) bool {
	_, ok := findLine(output, m)
	return ok
}
