// Package runner embeds the Python runner that the engine ships to every host
// on stdin; it is never installed on the host by hand.
package runner

import _ "embed"

// Source is runner.py: one persistent Python namespace per kernel.
//
//go:embed runner.py
var Source []byte
