package backends

import (
	"fmt"
	"strings"
	"time"
)

// Options are the settings Open needs to build a backend from a URI.
type Options struct {
	// LocalTempDir overrides where the local backend puts kernel roots.
	LocalTempDir string

	// SSHConfig is the OpenSSH client config to read (default ~/.ssh/config;
	// a given file must exist).
	SSHConfig string
	// SSHIdentity and SSHKnownHosts override IdentityFile and
	// UserKnownHostsFile for every ssh backend.
	SSHIdentity   string
	SSHKnownHosts string
	// AcceptNewHostKey records an unknown host's key on first use, like
	// OpenSSH's StrictHostKeyChecking=accept-new. A changed key is always refused.
	AcceptNewHostKey bool
	// SSHTempDir is where kernel roots go on ssh hosts (default /tmp).
	SSHTempDir string
	// SSHMaxSessions bounds concurrent commands on one connection
	// (default DefaultSSHMaxSessions).
	SSHMaxSessions int
	// SSHDialTimeout bounds connecting and the handshake (default
	// DefaultSSHDialTimeout).
	SSHDialTimeout time.Duration

	// DockerTimeout bounds reaching the Docker Engine and the checks made
	// when a docker backend is opened (default DefaultDockerTimeout).
	DockerTimeout time.Duration
	// DockerTempDir is where kernel roots go in containers (default the
	// user's $TMPDIR there, else /tmp).
	DockerTempDir string
}

// Open builds the backend a URI names: "local", "ssh://[user@]host[:port]"
// "docker://CONTAINER[?user=U]" or "docker-image://IMAGE[?memory=…]".
func Open(uri string, opts Options) (Env, error) {
	switch {
	case uri == "local" || uri == "local://":
		return NewLocal(opts.LocalTempDir), nil
	case strings.HasPrefix(uri, "ssh://"):
		s, err := NewSSH(uri, opts)
		if err != nil {
			return nil, err // not a typed nil inside the Env
		}
		return s, nil
	case strings.HasPrefix(uri, "docker-image://"):
		b, err := NewImageSandbox(uri, opts)
		if err != nil {
			return nil, err
		}
		return b, nil
	case strings.HasPrefix(uri, "docker://"):
		d, err := NewDocker(uri, opts)
		if err != nil {
			return nil, err
		}
		return d, nil
	default:
		return nil, fmt.Errorf("backend %q: unknown backend URI; use local, ssh://[user@]host[:port], docker://CONTAINER[?user=USER] or docker-image://IMAGE[?memory=512m&…]", uri)
	}
}
