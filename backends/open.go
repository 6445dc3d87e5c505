package backends

import (
	"fmt"
	"net/http"
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
	// DockerTempDir is where kernel roots go in containers, docker's and
	// pods' (default the user's $TMPDIR there, else /tmp).
	DockerTempDir string

	// K8sTimeout bounds reaching the Kubernetes API and the checks made
	// when a k8s backend is opened (default DefaultK8sTimeout).
	K8sTimeout time.Duration

	// k8sTransport wraps the Kubernetes API transport (tests lose answers
	// with it; see export_test.go).
	k8sTransport func(http.RoundTripper) http.RoundTripper
}

// Open builds the backend a URI names: "local", "ssh://[user@]host[:port]"
// "docker://CONTAINER[?user=U]", "docker-image://IMAGE[?memory=…]",
// "k8s://[CONTEXT/]NAMESPACE/POD" or "k8s-image://IMAGE?namespace=…".
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
	case strings.HasPrefix(uri, "k8s-image://"):
		b, err := NewPodSandbox(uri, opts)
		if err != nil {
			return nil, err
		}
		return b, nil
	case strings.HasPrefix(uri, "k8s://"):
		k, err := NewK8s(uri, opts)
		if err != nil {
			return nil, err
		}
		return k, nil
	default:
		return nil, fmt.Errorf("backend %q: unknown backend URI; use local, ssh://[user@]host[:port], docker://CONTAINER[?user=USER], docker-image://IMAGE[?memory=512m&…], k8s://[CONTEXT/]NAMESPACE/POD[?container=NAME] or k8s-image://IMAGE?namespace=NS[&memory=512Mi&…]", uri)
	}
}
