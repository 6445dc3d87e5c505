package backends

import (
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kevinburke/ssh_config"
)

// ~/.ssh/config is the operator's own file, but it is often generated,
// shared or copied from elsewhere, and a bad value must stop kerneldeck with
// a message rather than crash it or turn into something else.

var sshConfigSeeds = []struct{ config, alias string }{
	{"Host box\n  HostName 127.0.0.1\n  Port 2222\n  User me\n  IdentityFile ~/.ssh/id_ed25519\n  IdentitiesOnly yes\n  UserKnownHostsFile /tmp/kh1 /tmp/kh2\n  ServerAliveInterval 15\n", "box"},
	{"Host box\n  Port 0\n", "box"},
	{"Host box\n  Port 65536\n", "box"},
	{"Host box\n  Port twenty-two\n", "box"},
	{"Host box\n  Port -1\n", "box"},
	{"Host box\n  Port +22\n", "box"},
	{"Host box\n  ProxyJump a,b\n", "box"},
	{"Host box\n  ProxyJump jumper@bastion:2200\nHost bastion\n  HostName 10.0.0.1\n", "box"},
	{"Host box\n  ProxyJump bastion\nHost bastion\n  ProxyJump other\n", "box"},
	{"Host box\n  ProxyJump bastion:0\n", "box"},
	{"Host box\n  ProxyJump [::1]:22\n", "box"},
	{"Host box\n  ProxyJump none\n", "box"},
	{"Host box\n  ServerAliveInterval -5\n", "box"},
	{"Host box\n  ServerAliveInterval 1h\n", "box"},
	{"Host box\n  ServerAliveInterval 9223372037\n", "box"},
	{"Host *\n  User everyone\nHost box\n  User me\n", "box"},
	{"Host box\n  HostName %h.example.com\n  IdentityFile %d/.ssh/%r@%h\n", "box"},
	{"Host b?x !nope\n  HostName \"quoted name\"\n", "box"},
	{"Match host box\n  User m\n", "box"},
	{"Host box\n  User a\x00b\n", "box"},
	{"Host box\n  HostName a\rb\n", "box"},
	{"Host box\n\tPort\t22 # comment\n", "box"},
	{"Host box\n  Port=2200\n", "box"},
	{"Host\n", "box"},
	{"", "127.0.0.1"},
	{"", "me@[::1]:2200"},
	{"", "user:secret@box"},
	{"Host box\n  UserKnownHostsFile none\n", "box"},
}

// FuzzSSHConfig resolves a host through a fuzzed ssh config file with
// NewSSH, the way `--backend ssh://ALIAS --ssh-config FILE` does (nothing
// is dialed). It never panics; an accepted target (and its jump host) has a
// port from 1 to 65535, the port and ServerAliveInterval the file gives
// (no overflow into another value), at most one ProxyJump hop, and no
// NUL, CR or LF in any value it will use; a refusal names the bad key.
func FuzzSSHConfig(f *testing.F) {
	for _, s := range sshConfigSeeds {
		f.Add(s.config, s.alias)
	}
	cfgPath := filepath.Join(f.TempDir(), "ssh_config")
	f.Fuzz(func(t *testing.T, config, alias string) {
		if strings.Contains(strings.ToLower(config), "include") {
			// Include reads (and globs) other files: the result depends on
			// this machine, and "Include /dev/zero" never returns, as with
			// OpenSSH. Not fuzzed here.
			t.Skip("Include directive")
		}
		if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		uri := "ssh://" + alias
		s, err := NewSSH(uri, Options{SSHConfig: cfgPath})
		if err != nil {
			checkSSHConfigError(t, config, uri, err)
			return
		}
		cfg, derr := ssh_config.Decode(strings.NewReader(config))
		if derr != nil {
			t.Fatalf("NewSSH accepted a config the parser refuses (%v):\n%q", derr, config)
		}
		uriPort := 0
		if u, err := url.Parse(uri); err == nil && u.Port() != "" {
			uriPort, _ = strconv.Atoi(u.Port())
		}
		checkSSHTarget(t, config, cfg, s.target, uriPort)
		if s.target.proxyJump == "" {
			if s.jump != nil {
				t.Fatalf("a jump host without ProxyJump: %+v", s.jump)
			}
			return
		}
		if strings.Contains(s.target.proxyJump, ",") {
			t.Fatalf("ProxyJump %q with several hops was accepted", s.target.proxyJump)
		}
		if s.jump == nil {
			t.Fatalf("ProxyJump %q was accepted but no jump host resolved", s.target.proxyJump)
		}
		if s.jump.proxyJump != "" {
			t.Fatalf("the jump host has a ProxyJump of its own (%q): two hops", s.jump.proxyJump)
		}
		checkSSHTarget(t, config, cfg, *s.jump, -1)
	})
}

// checkSSHTarget checks one resolved target; uriPort is the port its URI
// gave (0 for none), or -1 when it is not known (a jump host).
func checkSSHTarget(t *testing.T, config string, cfg *ssh_config.Config, tg sshTarget, uriPort int) {
	t.Helper()
	if tg.port < 1 || tg.port > 65535 {
		t.Fatalf("accepted port %d for %s:\n%q", tg.port, tg.alias, config)
	}
	values := map[string]string{"User": tg.user, "HostName": tg.hostName, "ProxyJump": tg.proxyJump}
	for i, p := range tg.identities {
		values["IdentityFile "+strconv.Itoa(i)] = p
	}
	for i, p := range tg.knownHosts {
		values["UserKnownHostsFile "+strconv.Itoa(i)] = p
	}
	for key, v := range values {
		if strings.ContainsAny(v, "\x00\r\n") {
			t.Fatalf("%s %q of %s was accepted with a NUL, CR or LF:\n%q", key, v, tg.alias, config)
		}
	}
	if tg.hostName == "" || tg.user == "" {
		t.Fatalf("empty host name %q or user %q for %s:\n%q", tg.hostName, tg.user, tg.alias, config)
	}
	// What the file says for this host, read with the same parser.
	get := func(key string) string {
		v, _ := cfg.Get(tg.alias, key)
		return strings.TrimSpace(v)
	}
	// The port: the URI's wins (uriPort, 0 if it has none), else the file's
	// as written, else 22.
	want := 22
	if p := get("Port"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil {
			t.Fatalf("Port %q is not a number but %s was accepted with port %d:\n%q", p, tg.alias, tg.port, config)
		}
		want = n
	}
	if uriPort > 0 {
		want = uriPort
	}
	if uriPort >= 0 && tg.port != want {
		t.Fatalf("%s resolved to port %d, want %d:\n%q", tg.alias, tg.port, want, config)
	}
	if tg.aliveInterval < 0 {
		t.Fatalf("negative ServerAliveInterval %v for %s:\n%q", tg.aliveInterval, tg.alias, config)
	}
	if v := get("ServerAliveInterval"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("ServerAliveInterval %q is not a whole number of seconds but was accepted as %v:\n%q", v, tg.aliveInterval, config)
		}
		if int64(tg.aliveInterval/time.Second) != n || tg.aliveInterval%time.Second != 0 {
			t.Fatalf("ServerAliveInterval %q was accepted as %v:\n%q", v, tg.aliveInterval, config)
		}
	} else if tg.aliveInterval != 5*time.Second {
		t.Fatalf("no ServerAliveInterval, but the interval is %v (want the 5s default)", tg.aliveInterval)
	}
}

// checkSSHConfigError: a refusal says which key (or which part of the URI)
// is wrong, and never crashes on the way.
func checkSSHConfigError(t *testing.T, config, uri string, err error) {
	t.Helper()
	msg := err.Error()
	if !strings.Contains(msg, "backend ") {
		t.Fatalf("error %q does not name the backend", msg)
	}
	for _, key := range []string{"Port", "ProxyJump", "ServerAliveInterval", "User ", "HostName", "IdentityFile", "UserKnownHostsFile", "parse ssh config", "want ssh://", "port ", "passwords", "find the local user"} {
		if strings.Contains(msg, key) {
			return
		}
	}
	t.Fatalf("error %q names no key of the config %q (uri %q)", msg, config, uri)
}
