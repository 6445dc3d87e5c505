package sshdtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// HostKeys returns the server's public host keys, in HostKey order.
func (s *Server) HostKeys() []ssh.PublicKey {
	out := make([]ssh.PublicKey, len(s.hostKeys))
	for i, k := range s.hostKeys {
		out[i] = k.pub
	}
	return out
}

// HostKey returns the public host key of type typ, or nil if the server has
// none.
func (s *Server) HostKey(typ KeyType) ssh.PublicKey {
	for _, k := range s.hostKeys {
		if k.typ == typ {
			return k.pub
		}
	}
	return nil
}

// KnownHostsLine returns known_hosts entries for "[127.0.0.1]:port", one line
// per host key of the given types (all keys when none are given), joined by
// "\n" without a trailing newline. With a single key it is exactly
// knownhosts.Line. It panics on a type the server does not have.
func (s *Server) KnownHostsLine(types ...KeyType) string {
	var lines []string
	if len(types) == 0 {
		for _, k := range s.hostKeys {
			lines = append(lines, knownhosts.Line([]string{s.Addr()}, k.pub))
		}
	}
	for _, typ := range types {
		pub := s.HostKey(typ)
		if pub == nil {
			panic(fmt.Sprintf("sshdtest: server has no %s host key", typ))
		}
		lines = append(lines, knownhosts.Line([]string{s.Addr()}, pub))
	}
	return strings.Join(lines, "\n")
}

// WriteKnownHosts writes (creating or replacing, mode 0600) a known_hosts
// file at path holding KnownHostsLine(types...).
func (s *Server) WriteKnownHosts(path string, types ...KeyType) error {
	return os.WriteFile(path, []byte(s.KnownHostsLine(types...)+"\n"), 0o600)
}

// KnownHostsFile is a known_hosts file listing all the server's host keys,
// kept in the server's dir (removed at cleanup).
func (s *Server) KnownHostsFile() string { return s.knownHosts }

// ClientConfig is an x/crypto/ssh client config for u: u's key, host key
// checked against KnownHostsFile, 10 s timeout.
func (s *Server) ClientConfig(t testing.TB, u *User) *ssh.ClientConfig {
	t.Helper()
	cb, err := knownhosts.New(s.knownHosts)
	if err != nil {
		t.Fatalf("sshdtest: %v", err)
	}
	return &ssh.ClientConfig{
		User:            u.Name,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(u.Signer)},
		HostKeyCallback: cb,
		Timeout:         10 * time.Second,
	}
}

// Dial connects to the server as u with ClientConfig and closes the client
// at cleanup. It fails the test if the connection or authentication fails.
func (s *Server) Dial(t testing.TB, u *User) *ssh.Client {
	t.Helper()
	c, err := ssh.Dial("tcp", s.Addr(), s.ClientConfig(t, u))
	if err != nil {
		t.Fatalf("sshdtest: dial %s as %s: %v", s.Addr(), u.Name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// SSHConfig returns an ssh_config "Host alias" block that reaches the server
// as u: HostName 127.0.0.1, Port, User, IdentityFile u.KeyFile,
// IdentitiesOnly yes, UserKnownHostsFile KnownHostsFile() and
// StrictHostKeyChecking yes, then the extra lines (e.g.
// "ServerAliveInterval 1", "ProxyJump other").
func (s *Server) SSHConfig(alias string, u *User, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Host %s\n", alias)
	fmt.Fprintf(&b, "  HostName 127.0.0.1\n")
	fmt.Fprintf(&b, "  Port %s\n", strconv.Itoa(s.port))
	fmt.Fprintf(&b, "  User %s\n", u.Name)
	fmt.Fprintf(&b, "  IdentityFile %s\n", configQuote(u.KeyFile))
	fmt.Fprintf(&b, "  IdentitiesOnly yes\n")
	fmt.Fprintf(&b, "  UserKnownHostsFile %s\n", configQuote(s.knownHosts))
	fmt.Fprintf(&b, "  StrictHostKeyChecking yes\n")
	for _, l := range extra {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	return b.String()
}

// WriteSSHConfig writes SSHConfig(alias, u, extra...) to a new file in the
// test's temp dir and returns its path, for `ssh://alias` with
// `--ssh-config FILE` (or `ssh -F FILE alias`).
func (s *Server) WriteSSHConfig(t testing.TB, alias string, u *User, extra ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ssh_config")
	if err := os.WriteFile(path, []byte(s.SSHConfig(alias, u, extra...)), 0o600); err != nil {
		t.Fatalf("sshdtest: %v", err)
	}
	return path
}

func configQuote(p string) string {
	if strings.ContainsAny(p, " \t\"") {
		return strconv.Quote(p)
	}
	return p
}
