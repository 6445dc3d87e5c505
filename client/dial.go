// Package client talks to an engine served by `kerneldeck serve` (or a
// dashboard's engine), over its Unix socket here or over SSH: the headless
// protocol, as an agent speaks it, behind the same methods the embedded
// engine has, so a dashboard or a REPL can attach to a shared engine.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path"
	"strings"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/wire"
)

// DialOptions tell Dial where the default socket is and how to reach ssh
// hosts.
type DialOptions struct {
	// StateDir is the local state dir, for the default local path.
	StateDir string
	// SSH configures ssh:// targets (ssh config, identity, known_hosts).
	SSH backends.Options
}

// Conn is a connection to an engine; Close also closes the ssh connection
// it runs on, if any.
type Conn struct {
	net.Conn
	// Where names the engine as the user wrote it, for messages.
	Where  string
	closer io.Closer
}

// Close closes the connection and what it runs on.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	if c.closer != nil {
		c.closer.Close()
	}
	return err
}

// Dial connects to an engine. target is a socket path, "" for this
// machine's default, or ssh://[user@]host[:port][/PATH] (an ssh config
// alias works as host; the default PATH is the remote user's default).
func Dial(ctx context.Context, target string, o DialOptions) (*Conn, error) {
	if strings.HasPrefix(target, "ssh://") {
		return dialSSH(ctx, target, o)
	}
	p := target
	if p == "" {
		p = wire.SocketPath(o.StateDir)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", p)
	if err != nil {
		return nil, explain(p, err)
	}
	return &Conn{Conn: c, Where: p}, nil
}

// explain turns a failed dial into what to do about it.
func explain(where string, err error) error {
	var oe *net.OpError
	switch {
	case errors.As(err, &oe) && strings.Contains(err.Error(), "no such file"),
		errors.As(err, &oe) && strings.Contains(err.Error(), "connection refused"):
		return fmt.Errorf("no engine is serving at %s (%v); start one with 'kerneldeck serve' (or open the dashboard, which serves its engine there)", where, err)
	case strings.Contains(err.Error(), "permission denied"):
		return fmt.Errorf("connect to the engine at %s: %v; only the engine's user (and members of its --allow-group) may connect", where, err)
	}
	return fmt.Errorf("connect to the engine at %s: %w", where, err)
}

// remotePathScript prints the engine socket a remote user's engine listens
// on by default (see wire.SocketPath).
const remotePathScript = `p=
if [ -n "${XDG_RUNTIME_DIR:-}" ]; then p="$XDG_RUNTIME_DIR/kerneldeck/engine.sock"; fi
if [ -z "$p" ] || [ ! -S "$p" ]; then s="${XDG_STATE_HOME:-}"; case "$s" in /*) ;; *) s="$HOME/.local/state";; esac; p="$s/kerneldeck/engine.sock"; fi
printf 'KD:SOCK %s\n' "$p"`

func dialSSH(ctx context.Context, target string, o DialOptions) (*Conn, error) {
	rest := strings.TrimPrefix(target, "ssh://")
	hostPart, sockPath, hasPath := strings.Cut(rest, "/")
	if hostPart == "" {
		return nil, fmt.Errorf("%s: no host; write ssh://[user@]host[:port][/PATH]", target)
	}
	if hasPath {
		sockPath = "/" + sockPath
		if path.Clean(sockPath) != sockPath {
			return nil, fmt.Errorf("%s: the socket path %q is not clean; write it as an absolute path", target, sockPath)
		}
	}
	env, err := backends.NewSSH("ssh://"+hostPart, o.SSH)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Conn, error) {
		env.Close()
		return nil, err
	}
	if !hasPath {
		res, err := env.Execute(ctx, remotePathScript, backends.ExecOptions{Timeout: 30 * time.Second})
		if err != nil {
			return fail(fmt.Errorf("%s: find the engine's socket: %w", target, err))
		}
		for line := range strings.SplitSeq(res.Output, "\n") {
			if p, ok := strings.CutPrefix(strings.TrimSpace(line), "KD:SOCK "); ok {
				sockPath = p
			}
		}
		if !strings.HasPrefix(sockPath, "/") {
			return fail(fmt.Errorf("%s: could not find the engine's socket (the host said %q); give it: ssh://%s/PATH", target, res.Output, hostPart))
		}
	}
	c, err := env.DialUnix(ctx, sockPath)
	if err != nil {
		return fail(fmt.Errorf("connect to the engine at %s on %s: %w; is 'kerneldeck serve' running there as that user?", sockPath, hostPart, err))
	}
	return &Conn{Conn: c, Where: "ssh://" + hostPart + sockPath, closer: env}, nil
}
