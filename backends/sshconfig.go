package backends

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kevinburke/ssh_config"
)

// sshTarget is where an ssh:// URI leads once ~/.ssh/config has been applied.
type sshTarget struct {
	alias          string // the host as written in the URI
	user           string
	hostName       string
	port           int
	identities     []string
	identitiesOnly bool
	knownHosts     []string
	proxyJump      string // "" or one hop, [user@]host[:port] or an alias
	aliveInterval  time.Duration
}

func (t sshTarget) addr() string { return net.JoinHostPort(t.hostName, strconv.Itoa(t.port)) }

// parseSSHURI splits ssh://[user@]host[:port] (no path, query or password).
func parseSSHURI(uri string) (userName, host string, port int, err error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "ssh" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", "", 0, fmt.Errorf("backend %q: want ssh://[user@]host[:port], where host may be a Host alias from ~/.ssh/config", uri)
	}
	if _, hasPass := u.User.Password(); hasPass {
		// Say which URI without repeating the secret.
		return "", "", 0, fmt.Errorf("backend %q: passwords do not belong in a URI (it would show in ps and logs); use a key or ssh-agent", u.Redacted())
	}
	if p := u.Port(); p != "" {
		port, err = strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			return "", "", 0, fmt.Errorf("backend %q: port %q is not a number from 1 to 65535", uri, p)
		}
	}
	return u.User.Username(), u.Hostname(), port, nil
}

// fileKind names what a non-regular file is, for error messages.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	default:
		return "not a regular file"
	}
}

// maxSSHConfig bounds the size of an ssh client config file.
const maxSSHConfig = 4 << 20

// loadSSHConfig reads an OpenSSH client config; a missing default file is an
// empty config, a missing explicit one an error.
func loadSSHConfig(path string, explicit bool) (*ssh_config.Config, error) {
	// A config is a small regular file. Checked before opening: opening a
	// FIFO blocks until someone writes to it, and /dev/zero never ends.
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !explicit {
			return &ssh_config.Config{}, nil
		}
		return nil, fmt.Errorf("read ssh config %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("ssh config %s is %s, not a regular file; point --ssh-config at a file", path, fileKind(st.Mode()))
	}
	if st.Size() > maxSSHConfig {
		return nil, fmt.Errorf("ssh config %s is %d bytes, over the %d-byte limit for a client config", path, st.Size(), maxSSHConfig)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read ssh config %s: %w", path, err)
	}
	defer f.Close()
	cfg, err := ssh_config.Decode(io.LimitReader(f, maxSSHConfig))
	if err != nil {
		return nil, fmt.Errorf("parse ssh config %s: %w", path, err)
	}
	return cfg, nil
}

// resolveSSHTarget applies the config to (user, host, port) from a URI or a
// ProxyJump hop. Values given in the URI win over the config, as with ssh.
func resolveSSHTarget(cfg *ssh_config.Config, userName, host string, port int, opts Options) (sshTarget, error) {
	get := func(key string) string {
		v, _ := cfg.Get(host, key)
		return strings.TrimSpace(v)
	}
	getAll := func(key string) []string {
		v, _ := cfg.GetAll(host, key)
		return v
	}
	t := sshTarget{alias: host, user: userName, hostName: host, port: port}
	if hn := get("HostName"); hn != "" {
		t.hostName = strings.ReplaceAll(hn, "%h", host)
	}
	local, err := user.Current()
	if err != nil {
		return t, fmt.Errorf("find the local user: %w", err)
	}
	if t.user == "" {
		t.user = cmp.Or(get("User"), local.Username)
	}
	if t.port == 0 {
		t.port = 22
		if p := get("Port"); p != "" {
			if t.port, err = strconv.Atoi(p); err != nil || t.port < 1 || t.port > 65535 {
				return t, fmt.Errorf("ssh config for %s: Port %q is not a number from 1 to 65535", host, p)
			}
		}
	}
	expand := func(p string) string {
		r := strings.NewReplacer("%d", local.HomeDir, "%u", local.Username, "%h", t.hostName, "%r", t.user, "%%", "%")
		p = r.Replace(p)
		if p == "~" || strings.HasPrefix(p, "~/") {
			p = filepath.Join(local.HomeDir, p[1:])
		}
		return p
	}
	t.identitiesOnly = strings.EqualFold(get("IdentitiesOnly"), "yes")
	if opts.SSHIdentity != "" {
		t.identities = []string{expand(opts.SSHIdentity)}
	} else {
		for _, f := range getAll("IdentityFile") {
			t.identities = append(t.identities, expand(f))
		}
		if len(t.identities) == 0 {
			for _, name := range []string{"id_ed25519", "id_ecdsa", "id_rsa"} {
				t.identities = append(t.identities, filepath.Join(local.HomeDir, ".ssh", name))
			}
		}
	}
	if opts.SSHKnownHosts != "" {
		t.knownHosts = []string{expand(opts.SSHKnownHosts)}
	} else if v := get("UserKnownHostsFile"); v != "" {
		for _, f := range strings.Fields(v) {
			t.knownHosts = append(t.knownHosts, expand(f))
		}
	} else {
		t.knownHosts = []string{filepath.Join(local.HomeDir, ".ssh", "known_hosts")}
	}
	if j := get("ProxyJump"); j != "" && !strings.EqualFold(j, "none") {
		if strings.Contains(j, ",") {
			return t, fmt.Errorf("ssh config for %s: ProxyJump %q has several hops; kerneldeck supports one", host, j)
		}
		t.proxyJump = j
	}
	t.aliveInterval = 5 * time.Second
	if v := get("ServerAliveInterval"); v != "" {
		n, err := strconv.Atoi(v)
		// OpenSSH's limit, and far below where seconds overflow a Duration.
		if err != nil || n < 0 || n > math.MaxInt32 {
			return t, fmt.Errorf("ssh config for %s: ServerAliveInterval %q is not a number of seconds", host, v)
		}
		t.aliveInterval = time.Duration(n) * time.Second
	}
	// A NUL, CR or LF in a value would reach the server, a path or a
	// known_hosts line as something OpenSSH never reads from the same file.
	values := [][2]string{{"User", t.user}, {"HostName", t.hostName}, {"ProxyJump", t.proxyJump}}
	for _, f := range t.identities {
		values = append(values, [2]string{"IdentityFile", f})
	}
	for _, f := range t.knownHosts {
		values = append(values, [2]string{"UserKnownHostsFile", f})
	}
	for _, kv := range values {
		if strings.ContainsAny(kv[1], "\x00\r\n") {
			return t, fmt.Errorf("ssh config for %s: %s %q contains a NUL, CR or LF", host, kv[0], kv[1])
		}
	}
	return t, nil
}

// splitJump parses a ProxyJump value: [user@]host[:port].
func splitJump(j string) (userName, host string, port int, err error) {
	if u, h, ok := strings.Cut(j, "@"); ok {
		userName, j = u, h
	}
	host = j
	if h, p, err2 := net.SplitHostPort(j); err2 == nil {
		host = h
		if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
			return "", "", 0, fmt.Errorf("ProxyJump %q: bad port", j)
		}
	}
	if host == "" {
		return "", "", 0, fmt.Errorf("ProxyJump %q names no host; write [user@]host[:port]", j)
	}
	return userName, host, port, nil
}
