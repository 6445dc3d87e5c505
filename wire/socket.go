package wire

import (
	"os"
	"path/filepath"
)

// SocketName is an engine socket's file name in its dir.
const SocketName = "engine.sock"

// SocketPath is where an engine listens, and its clients connect, unless
// told otherwise: $XDG_RUNTIME_DIR/kerneldeck/engine.sock, else
// <stateDir>/engine.sock.
func SocketPath(stateDir string) string {
	if rt := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(rt) {
		return filepath.Join(rt, "kerneldeck", SocketName)
	}
	return filepath.Join(stateDir, SocketName)
}
