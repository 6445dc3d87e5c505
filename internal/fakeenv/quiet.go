package fakeenv

import (
	"context"

	"github.com/kerneldeck/kerneldeck/backends"
)

// Quiet is an Env answered by a Host that records nothing, for benchmarks
// that spawn thousands of kernels: Env keeps every command and its stdin,
// and each spawn ships the runner on stdin.
type Quiet struct {
	host         *Host
	uri, tempDir string
}

// NewQuiet returns a Quiet env on host with the given URI and temp dir.
func NewQuiet(host *Host, uri, tempDir string) *Quiet {
	return &Quiet{host: host, uri: uri, tempDir: tempDir}
}

// URI is the URI given to NewQuiet.
func (q *Quiet) URI() string { return q.uri }

// TempDir is the temp dir given to NewQuiet.
func (q *Quiet) TempDir() string { return q.tempDir }

// Execute answers the engine's scripts from the host.
func (q *Quiet) Execute(ctx context.Context, command string, opts backends.ExecOptions) (backends.Result, error) {
	c := Call{Command: command, Stdin: opts.Stdin, Marker: Marker(command)}
	switch c.Marker {
	case "spawn":
		return q.host.Spawn(ctx, c)
	case "cell":
		return q.host.Cell(ctx, c)
	case "kill":
		return q.host.Kill(ctx, c)
	case "abandon":
		return q.host.Abandon(ctx, c)
	case "ring":
		return q.host.Ring(ctx, c)
	case "fetch":
		return q.host.Fetch(ctx, c)
	}
	return backends.Result{Output: "fakeenv: no handler for marker " + c.Marker + "\n", ReturnCode: 127}, nil
}
