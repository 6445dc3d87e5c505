package backends

import (
	"fmt"
	"strings"
)

// Options are the settings Open needs to build a backend from a URI.
type Options struct {
	// LocalTempDir overrides where the local backend puts kernel roots.
	LocalTempDir string
}

// Open builds the backend a URI names: "local", "ssh://[user@]host[:port]"
// or "docker://container".
func Open(uri string, opts Options) (Env, error) {
	switch {
	case uri == "local" || uri == "local://":
		return NewLocal(opts.LocalTempDir), nil
	case strings.HasPrefix(uri, "ssh://"):
		return nil, fmt.Errorf("backend %q: the ssh backend is not available in this build yet; use --backend local", uri)
	case strings.HasPrefix(uri, "docker://"):
		return nil, fmt.Errorf("backend %q: the docker backend is not available in this build yet; use --backend local", uri)
	default:
		return nil, fmt.Errorf("backend %q: unknown backend URI; use local, ssh://[user@]host[:port] or docker://container", uri)
	}
}
