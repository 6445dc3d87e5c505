package sshdtest

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// run runs cmd in a new session on c and returns its trimmed combined output.
func run(c *ssh.Client, cmd string) (string, error) {
	sess, err := c.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	// Only stdout is the command's answer: a login's rc files may print
	// to stderr (root's pyenv here: "cannot rehash" when shells race).
	var stdout, stderr bytes.Buffer
	sess.Stdout, sess.Stderr = &stdout, &stderr
	if err := sess.Run(cmd); err != nil {
		return strings.TrimSpace(stdout.String() + stderr.String()), err
	}
	return strings.TrimSpace(stdout.String()), nil
}

func mustRun(t *testing.T, c *ssh.Client, cmd string) string {
	t.Helper()
	out, err := run(c, cmd)
	if err != nil {
		t.Fatalf("%q: %v: %s", cmd, err, out)
	}
	return out
}

func requireRoot(t *testing.T) {
	t.Helper()
	if !CanCreateUsers() {
		t.Skip("needs root to create OS users")
	}
}

func currentUser(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return u.Username
}

// startRemote starts cmd in a session on c without waiting for it, and
// returns the session.
func startRemote(t *testing.T, c *ssh.Client, cmd string) *ssh.Session {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Start(cmd); err != nil {
		t.Fatal(err)
	}
	return sess
}

// waitErr waits up to d for f's result.
func waitErr(d time.Duration, f func() error) (error, bool) {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	select {
	case err := <-ch:
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// findProc returns the pid of the live process whose command line is
// exactly cmdline, waiting up to 10 s for it to appear.
func findProc(t *testing.T, cmdline string) procID {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		pt := scanProcs()
		for pid := range pt.procs {
			if pt.alive(pt.id(pid)) && procTitle(pid) == cmdline {
				return pt.id(pid)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no process %q", cmdline)
	return procID{}
}

// uniqueSleep is a sleep command line no other test runs.
func uniqueSleep(n int) string {
	return fmt.Sprintf("sleep %d.%d%d", 60+n, os.Getpid()%1000, time.Now().UnixNano()%1000)
}

// TestLoginAsCurrentUser: the server comes up in its own process group,
// lets the current user in with a generated key while checking the host
// key against known_hosts, and never touches the real authorized_keys.
func TestLoginAsCurrentUser(t *testing.T) {
	t.Parallel()
	name := currentUser(t)
	home, _ := os.UserHomeDir()
	realAK := filepath.Join(home, ".ssh", "authorized_keys")
	before, errBefore := os.ReadFile(realAK)

	srv := Start(t, Options{})
	u := srv.User(t, "", UserOptions{})
	if u.Name != name {
		t.Fatalf("User(\"\") = %q, want %q", u.Name, name)
	}
	st, err := os.Stat(u.KeyFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file %s: %v, mode %v", u.KeyFile, err, st.Mode())
	}
	if pem, _ := os.ReadFile(u.KeyFile); !bytes.HasPrefix(pem, []byte("-----BEGIN OPENSSH PRIVATE KEY-----")) {
		t.Fatalf("key file is not in OpenSSH format: %.40q", pem)
	}
	c := srv.Dial(t, u)
	if got := mustRun(t, c, "id -un; echo $"+EnvVar); got != name+"\n"+srv.Dir() {
		t.Fatalf("id -un; echo $%s = %q, want %q and the server dir", EnvVar, got, name)
	}
	pid := srv.PID()
	p, ok := readStat(pid)
	if !ok || p.pgid != pid || p.comm != "sshd" {
		t.Fatalf("listener %d: %+v (want its own process group)", pid, p)
	}
	if !strings.Contains(srv.Log(), "Accepted publickey for "+name) {
		t.Fatalf("log lacks the login:\n%s", srv.Log())
	}
	after, errAfter := os.ReadFile(realAK)
	if !bytes.Equal(before, after) || (errBefore == nil) != (errAfter == nil) {
		t.Fatalf("%s changed", realAK)
	}
}

// sshdT returns `sshd -T` (effective config) for a connection by user.
func sshdT(t *testing.T, srv *Server, user string) map[string][]string {
	t.Helper()
	out, err := exec.Command(SSHDPath, "-T", "-f", srv.ConfigPath(), "-C",
		"user="+user+",host=localhost,addr=127.0.0.1").CombinedOutput()
	if err != nil {
		t.Fatalf("sshd -T: %v: %s", err, out)
	}
	m := map[string][]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			m[k] = append(m[k], v)
		}
	}
	return m
}

// TestConfig: the effective sshd config has the settings the helper
// promises, extra lines override defaults, Match blocks go last, and
// MaxSessions from Options really limits channels per connection.
func TestConfig(t *testing.T) {
	t.Parallel()
	srv := Start(t, Options{Config: []string{
		"MaxSessions 2",
		"LoginGraceTime 17",
		"PrintMotd yes", // overrides the generated PrintMotd no
		"Match User kdnobody",
		"  PermitTTY no",
	}})
	name := currentUser(t)
	m := sshdT(t, srv, name)
	want := map[string]string{
		"strictmodes":                  "no",
		"usepam":                       "no",
		"passwordauthentication":       "no",
		"kbdinteractiveauthentication": "no",
		"pubkeyauthentication":         "yes",
		"allowstreamlocalforwarding":   "yes",
		"loglevel":                     "VERBOSE",
		"maxsessions":                  "2",
		"logingracetime":               "17",
		"permittty":                    "yes",
		"pidfile":                      filepath.Join(srv.Dir(), "sshd.pid"),
		"authorizedkeysfile":           filepath.Join(srv.Dir(), "authorized_keys") + "/%u",
		"listenaddress":                srv.Addr(),
		"hostkey":                      filepath.Join(srv.Dir(), "ssh_host_ed25519_key"),
		"permitrootlogin":              "without-password",
		"hostbasedauthentication":      "no",
		"permituserenvironment":        "no",
		"allowtcpforwarding":           "yes",
		"kerberosauthentication":       "no",
		"gssapiauthentication":         "no",
		"ignorerhosts":                 "yes",
		"x11forwarding":                "no",
		"printmotd":                    "yes",
		"usedns":                       "no",
		"exposeauthinfo":               "no",
		"disableforwarding":            "no",
		"permittunnel":                 "no",
		"authorizedkeyscommand":        "none",
		"authorizedprincipalsfile":     "none",
		"permitemptypasswords":         "no",
	}
	for k, v := range want {
		if got := strings.Join(m[k], "|"); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if got := sshdT(t, srv, "kdnobody")["permittty"]; len(got) != 1 || got[0] != "no" {
		t.Errorf("Match block not applied: permittty for kdnobody = %q", got)
	}
	cfg, _ := os.ReadFile(srv.ConfigPath())
	if !strings.HasSuffix(string(cfg), "Match User kdnobody\n  PermitTTY no\n") {
		t.Errorf("Match block is not at the end:\n%s", cfg)
	}

	c := srv.Dial(t, srv.User(t, "", UserOptions{}))
	var sessions []*ssh.Session
	for i := 0; i < 2; i++ {
		s, err := c.NewSession()
		if err != nil {
			t.Fatalf("session %d of MaxSessions 2: %v", i+1, err)
		}
		sessions = append(sessions, s)
	}
	if s, err := c.NewSession(); err == nil {
		s.Close()
		t.Fatal("a third session opened despite MaxSessions 2")
	}
	for _, s := range sessions {
		s.Close()
	}
}

// TestCreatedUsers: as root the helper creates OS users, each logs in with
// its own key only (per-user authorized_keys files), and asking again adds
// a key without breaking the first.
func TestCreatedUsers(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	srv := Start(t, Options{})
	u1 := srv.User(t, "kdtest1", UserOptions{})
	u2 := srv.User(t, "kdtest2", UserOptions{})
	for _, u := range []*User{u1, u2} {
		if got := mustRun(t, srv.Dial(t, u), "id -un; echo $SHELL"); got != u.Name+"\n/bin/bash" {
			t.Errorf("%s: id -un; echo $SHELL = %q", u.Name, got)
		}
		// sshd opens it as the user: it belongs to the user.
		st, err := os.Stat(filepath.Join(srv.Dir(), "authorized_keys", u.Name))
		if err != nil || int(st.Sys().(*syscall.Stat_t).Uid) != u.UID {
			t.Fatalf("%s's authorized_keys: %v %+v", u.Name, err, st)
		}
	}
	// kdtest2's key does not open kdtest1's account.
	cfg := srv.ClientConfig(t, u2)
	cfg.User = u1.Name
	if c, err := ssh.Dial("tcp", srv.Addr(), cfg); err == nil {
		c.Close()
		t.Fatal("kdtest2's key logged in as kdtest1")
	}
	// Idempotent: a second User call for kdtest1 adds a second working key.
	again := srv.User(t, "kdtest1", UserOptions{})
	for _, u := range []*User{u1, again} {
		if got := mustRun(t, srv.Dial(t, u), "id -un"); got != "kdtest1" {
			t.Errorf("id -un = %q", got)
		}
	}
	// And root (the current user) can be served alongside.
	if got := mustRun(t, srv.Dial(t, srv.User(t, "root", UserOptions{})), "id -un"); got != "root" {
		t.Errorf("root: id -un = %q", got)
	}
}

// TestKnownHosts: every generated host key is the one sshd really presents
// (each verifies through a known_hosts file holding only it, with the
// client restricted to that algorithm), the lines are for [127.0.0.1]:port,
// and a known_hosts with a different key is refused as a changed key.
func TestKnownHosts(t *testing.T) {
	t.Parallel()
	types := []KeyType{ED25519, RSA, ECDSA}
	srv := Start(t, Options{HostKeyTypes: types})
	u := srv.User(t, "", UserOptions{})
	if n := len(srv.HostKeys()); n != 3 {
		t.Fatalf("%d host keys, want 3", n)
	}
	all := strings.Split(srv.KnownHostsLine(), "\n")
	if len(all) != 3 {
		t.Fatalf("KnownHostsLine() has %d lines, want 3", len(all))
	}
	algos := map[KeyType]string{ED25519: ssh.KeyAlgoED25519, RSA: ssh.KeyAlgoRSASHA256, ECDSA: ssh.KeyAlgoECDSA256}
	prefix := fmt.Sprintf("[127.0.0.1]:%d ", srv.Port())
	for i, typ := range types {
		line := srv.KnownHostsLine(typ)
		if line != all[i] || !strings.HasPrefix(line, prefix) {
			t.Errorf("KnownHostsLine(%s) = %q, want prefix %q and line %d of all", typ, line, prefix, i)
		}
		path := filepath.Join(t.TempDir(), "known_hosts")
		if err := srv.WriteKnownHosts(path, typ); err != nil {
			t.Fatal(err)
		}
		cb, err := knownhosts.New(path)
		if err != nil {
			t.Fatal(err)
		}
		var seen ssh.PublicKey
		cfg := srv.ClientConfig(t, u)
		cfg.HostKeyAlgorithms = []string{algos[typ]}
		cfg.HostKeyCallback = func(host string, remote net.Addr, key ssh.PublicKey) error {
			seen = key
			return cb(host, remote, key)
		}
		c, err := ssh.Dial("tcp", srv.Addr(), cfg)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		c.Close()
		if seen == nil || !bytes.Equal(seen.Marshal(), srv.HostKey(typ).Marshal()) {
			t.Errorf("%s: server presented a different key than HostKey", typ)
		}
	}

	// A different key recorded for this host: refused as a changed key.
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	otherSigner, _ := ssh.NewSignerFromKey(other)
	path := filepath.Join(t.TempDir(), "known_hosts")
	os.WriteFile(path, []byte(knownhosts.Line([]string{srv.Addr()}, otherSigner.PublicKey())+"\n"), 0o600)
	cb, _ := knownhosts.New(path)
	cfg := srv.ClientConfig(t, u)
	cfg.HostKeyAlgorithms = []string{ssh.KeyAlgoED25519}
	cfg.HostKeyCallback = cb
	_, err := ssh.Dial("tcp", srv.Addr(), cfg)
	var ke *knownhosts.KeyError
	if !errors.As(err, &ke) || len(ke.Want) == 0 {
		t.Fatalf("dial with a changed key: %v, want a knownhosts.KeyError with Want", err)
	}
}

// TestSSHConfigFile: the written ssh_config block names the server, user,
// key and known_hosts, and OpenSSH's own client reads it and logs in through
// the alias with strict host key checking.
func TestSSHConfigFile(t *testing.T) {
	t.Parallel()
	srv := Start(t, Options{})
	u := srv.User(t, "", UserOptions{})
	path := srv.WriteSSHConfig(t, "kdbox", u, "ServerAliveInterval 7")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if lines[0] != "Host kdbox" {
		t.Fatalf("first line %q, want Host kdbox", lines[0])
	}
	for _, l := range lines[1:] {
		k, v, _ := strings.Cut(strings.TrimSpace(l), " ")
		got[k] = v
	}
	want := map[string]string{
		"HostName":              "127.0.0.1",
		"Port":                  strconv.Itoa(srv.Port()),
		"User":                  u.Name,
		"IdentityFile":          u.KeyFile,
		"IdentitiesOnly":        "yes",
		"UserKnownHostsFile":    srv.KnownHostsFile(),
		"StrictHostKeyChecking": "yes",
		"ServerAliveInterval":   "7",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	kh, _ := os.ReadFile(srv.KnownHostsFile())
	if strings.TrimSpace(string(kh)) != srv.KnownHostsLine() {
		t.Errorf("KnownHostsFile = %q, want %q", kh, srv.KnownHostsLine())
	}

	sshBin, err := exec.LookPath("ssh")
	if err != nil {
		t.Log("no OpenSSH client: checked the file's content only")
		return
	}
	// Stdout only: the login's shell rc may say things on stderr (pyenv's
	// rehash, racing another shell's, did once under load).
	cmd := exec.Command(sshBin, "-F", path, "-o", "BatchMode=yes", "kdbox", "id -un")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != u.Name {
		t.Fatalf("ssh -F %s kdbox id -un: %v: %s (stderr: %s)", path, err, out, stderr.String())
	}
}

// TestKillSessions: dropping a user's connections ends the command running
// on them and the client connection, keeps the listener, spares other
// users' connections, and new connections still work.
func TestKillSessions(t *testing.T) {
	t.Parallel()
	srv := Start(t, Options{})
	// As root: drop a created user's connection while root's stays up.
	// Otherwise only the current user exists for this server.
	u := srv.User(t, "", UserOptions{})
	var other *ssh.Client
	if CanCreateUsers() {
		other = srv.Dial(t, u)
		u = srv.User(t, "kdtest2", UserOptions{})
	}
	otherName := currentUser(t)
	listener := srv.PID()
	c := srv.Dial(t, u)
	mustRun(t, c, "true")
	cmd := uniqueSleep(1)
	sess := startRemote(t, c, cmd)
	findProc(t, cmd) // forked and exec'd: no transient sshd child left

	pids := srv.SessionPIDs(u.Name)
	if len(pids) != 1 {
		t.Fatalf("SessionPIDs(%s) = %v, want one connection", u.Name, pids)
	}
	// The connection's sshd processes: the monitor and its user child.
	pt := scanProcs()
	conn := []procID{pt.id(pids[0])}
	for _, d := range pt.descendants(pids[0]) {
		if isSSHD(pt.procs[d].comm) {
			conn = append(conn, pt.id(d))
		}
	}
	// sshd skips the unprivileged child for root logins (and cannot
	// separate privileges when not run as root).
	if want := 2; CanCreateUsers() && len(conn) != want {
		t.Fatalf("connection %d has sshd processes %v, want %d", pids[0], conn, want)
	}
	if n := srv.KillSessions(t, u.Name); n != 1 {
		t.Fatalf("KillSessions = %d, want 1", n)
	}
	for _, p := range conn {
		if procAlive(p) {
			t.Errorf("sshd process %d of the connection survived KillSessions", p.pid)
		}
	}
	if err, ok := waitErr(10*time.Second, sess.Wait); !ok || err == nil {
		t.Fatalf("the running command's session did not end with an error (ended %v, err %v)", ok, err)
	}
	if err, ok := waitErr(10*time.Second, c.Wait); !ok {
		t.Fatalf("client connection still open after KillSessions (%v)", err)
	}
	if _, err := run(c, "true"); err == nil {
		t.Fatal("a new session on the dropped connection succeeded")
	}
	if srv.PID() != listener || !procAlive(procID{pid: listener}) {
		t.Fatalf("listener %d gone after KillSessions", listener)
	}
	if got := mustRun(t, srv.Dial(t, u), "id -un"); got != u.Name {
		t.Fatalf("new connection: id -un = %q", got)
	}
	if other != nil {
		if got := mustRun(t, other, "id -un"); got != otherName {
			t.Fatalf("other user's connection: %q", got)
		}
	}
	if n := srv.KillSessions(t, "kdnobody"); n != 0 {
		t.Fatalf("KillSessions(kdnobody) = %d, want 0", n)
	}
}

// TestRestart: a restarted listener has a new pid on the same port with the
// same host keys (known_hosts still verifies), established connections
// survive a restart as with a real sshd, KillSessions still finds them, and
// while stopped the port refuses connections.
func TestRestart(t *testing.T) {
	t.Parallel()
	srv := Start(t, Options{HostKeyTypes: []KeyType{ED25519, ECDSA}})
	u := srv.User(t, "", UserOptions{})
	keys := srv.KnownHostsLine()
	port, pid := srv.Port(), srv.PID()
	c := srv.Dial(t, u)

	srv.Restart(t)
	if srv.Port() != port || srv.PID() == pid || srv.PID() == 0 {
		t.Fatalf("after Restart: port %d pid %d (was %d, %d)", srv.Port(), srv.PID(), port, pid)
	}
	if procAlive(procID{pid: pid}) {
		t.Fatalf("old listener %d still alive", pid)
	}
	if srv.KnownHostsLine() != keys {
		t.Fatal("host keys changed")
	}
	if got := mustRun(t, srv.Dial(t, u), "id -un"); got != u.Name {
		t.Fatalf("after restart: %q", got)
	}
	if got := mustRun(t, c, "id -un"); got != u.Name {
		t.Fatalf("connection from before the restart: %q", got)
	}

	if n := srv.KillSessions(t, u.Name); n != 2 {
		t.Fatalf("KillSessions after restart = %d, want 2 (one from each listener)", n)
	}
	if _, ok := waitErr(10*time.Second, c.Wait); !ok {
		t.Fatal("pre-restart connection survived KillSessions")
	}

	srv.Stop(t)
	if srv.PID() != 0 {
		t.Fatal("PID after Stop")
	}
	if nc, err := net.DialTimeout("tcp", srv.Addr(), time.Second); err == nil {
		nc.Close()
		t.Fatal("stopped server accepts connections")
	}
	srv.Restart(t)
	if got := mustRun(t, srv.Dial(t, u), "id -un"); got != u.Name {
		t.Fatalf("after stop and restart: %q", got)
	}
}

// TestHeavyBashrc: BashrcSleep puts the sleep block at the top of the
// created user's real ~/.bashrc (keeping its content), commands still run
// under bash, a conflicting BashrcSleep is refused, the block stays while
// any holder remains, and the file is restored when the last one leaves.
// It uses a user of its own (kdsshdheavy): another process editing that
// user's .bashrc at the same time would make it fail.
func TestHeavyBashrc(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	srv := Start(t, Options{})
	var rc string
	var before []byte
	// Created (if new) before taking the reference copy of its .bashrc.
	plain := srv.User(t, "kdsshdheavy", UserOptions{})
	if plain.Bashrc != "" {
		t.Fatalf("Bashrc = %q without BashrcSleep", plain.Bashrc)
	}
	t.Run("user", func(t *testing.T) {
		before, _ = os.ReadFile(filepath.Join(plain.Home, ".bashrc"))
		u := srv.User(t, "kdsshdheavy", UserOptions{BashrcSleep: 200 * time.Millisecond})
		rc = u.Bashrc
		if rc != filepath.Join(u.Home, ".bashrc") {
			t.Fatalf("Bashrc = %q", rc)
		}
		b, err := os.ReadFile(rc)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(b), BashrcBlock(200*time.Millisecond)) || !strings.Contains(string(b), "\nsleep 0.2\n") {
			t.Fatalf(".bashrc does not start with the sleep block:\n%s", b)
		}
		if !strings.HasSuffix(string(b), string(before)) {
			t.Fatal(".bashrc lost its original content")
		}
		c := srv.Dial(t, u)
		if got := mustRun(t, c, "echo $0; id -un"); got != "bash\nkdsshdheavy" {
			t.Fatalf("echo $0; id -un = %q, want bash, kdsshdheavy", got)
		}
		// The block belongs to the test using it: another BashrcSleep for the
		// same user at the same time is refused.
		f := &fakeTB{TB: t}
		f.run(func(tb testing.TB) { srv.User(tb, "kdsshdheavy", UserOptions{BashrcSleep: time.Second}) })
		if !strings.Contains(f.fatal, "in use by another test") {
			t.Fatalf("conflicting BashrcSleep: fatal = %q", f.fatal)
		}
		// The current user's real rc file is never edited.
		f = &fakeTB{TB: t}
		f.run(func(tb testing.TB) { srv.User(tb, "", UserOptions{BashrcSleep: time.Second}) })
		if !strings.Contains(f.fatal, "refusing to edit") {
			t.Fatalf("BashrcSleep for the current user: fatal = %q", f.fatal)
		}
		// A second user of the same block (another test, or another test
		// process: each holds its own lock) leaves; the block stays for us.
		t.Run("shared", func(t *testing.T) {
			srv.User(t, "kdsshdheavy", UserOptions{BashrcSleep: 200 * time.Millisecond})
		})
		if b, _ := os.ReadFile(rc); !strings.HasPrefix(string(b), BashrcBlock(200*time.Millisecond)) {
			t.Fatalf("block removed while still in use:\n%s", b)
		}
	})
	after, _ := os.ReadFile(rc)
	if !bytes.Equal(after, before) {
		t.Fatalf(".bashrc not restored at cleanup:\n%s", after)
	}
}

// TestCleanup: at the end of the test no process of the server is left:
// not the listener (nor anything in its process group), not the
// per-connection sshd processes, not commands running on open connections,
// not connections of a listener replaced by Restart, not the commands
// orphaned by KillSessions, not processes that detached from the server's
// process tree; the temp dir is gone and clients see EOF.
func TestCleanup(t *testing.T) {
	t.Parallel()
	var (
		listeners []int
		procs     []procID
		clients   []*ssh.Client
		dir       string
	)
	t.Run("server", func(t *testing.T) {
		srv := Start(t, Options{})
		dir = srv.Dir()
		u := srv.User(t, "", UserOptions{})
		dial := func() *ssh.Client {
			c, err := ssh.Dial("tcp", srv.Addr(), srv.ClientConfig(t, u))
			if err != nil {
				t.Fatal(err)
			}
			clients = append(clients, c)
			return c
		}
		remote := func(c *ssh.Client, n int) {
			cmd := uniqueSleep(n)
			// env -i: not findable by EnvVar, only through the process tree
			// (or KillSessions' record of what it orphaned).
			startRemote(t, c, "env -i "+cmd)
			procs = append(procs, findProc(t, cmd))
		}
		pt := func() procTable { return scanProcs() }
		sessions := func() {
			p := pt()
			for _, pid := range srv.SessionPIDs(u.Name) {
				procs = append(procs, p.id(pid))
				for _, d := range p.descendants(pid) {
					procs = append(procs, p.id(d))
				}
			}
		}

		// Orphaned by KillSessions.
		remote(dial(), 1)
		if srv.KillSessions(t, u.Name) != 1 {
			t.Fatal("KillSessions")
		}
		if !procAlive(procs[0]) {
			t.Fatal("KillSessions killed the user's command")
		}
		// A connection of the listener that Restart replaces.
		remote(dial(), 2)
		listeners = append(listeners, srv.PID())
		srv.Restart(t)
		// A connection of the current listener.
		remote(dial(), 3)
		// Detached from the server's tree (its shell exited, the client
		// closed the connection): found by its environment.
		detached := uniqueSleep(4)
		c := dial()
		mustRun(t, c, "setsid "+detached+" </dev/null >/dev/null 2>&1 &")
		c.Close()
		procs = append(procs, findProc(t, detached))
		for _, d := range scanProcs().descendants(srv.PID()) {
			if d == procs[len(procs)-1].pid {
				t.Fatal("the setsid'd process is still in the listener's tree")
			}
		}
		listeners = append(listeners, srv.PID())
		sessions()
		if len(procs) < 3+2*2 {
			t.Fatalf("expected the monitor and user child of 2 connections, have %d processes", len(procs))
		}
	})
	for _, p := range procs {
		if procAlive(p) {
			t.Errorf("process %d (%s) survived cleanup", p.pid, procTitle(p.pid))
		}
	}
	for _, l := range listeners {
		if procAlive(procID{pid: l}) {
			t.Errorf("listener %d survived cleanup", l)
		}
		pt := scanProcs()
		for pid, p := range pt.procs {
			if p.pgid == l && pt.alive(pt.id(pid)) {
				t.Errorf("process %d in the listener's group %d survived: %s", pid, l, procTitle(pid))
			}
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("server dir %s still there: %v", dir, err)
	}
	for i, c := range clients {
		if _, ok := waitErr(10*time.Second, c.Wait); !ok {
			t.Errorf("client %d still connected after cleanup", i)
		}
		c.Close()
	}
}

// TestOtherUserNeedsRoot: without root, asking for another user skips the
// test with a message that says why (runs only when not root).
func TestOtherUserNeedsRoot(t *testing.T) {
	t.Parallel()
	if CanCreateUsers() {
		t.Skip("running as root: other users can be created")
	}
	srv := Start(t, Options{})
	f := &fakeTB{TB: t}
	f.run(func(tb testing.TB) { srv.User(tb, "kdsshd-other", UserOptions{}) })
	if !strings.Contains(f.skip, "needs root") || f.fatal != "" {
		t.Fatalf("skip %q fatal %q", f.skip, f.fatal)
	}
}

// TestBindRetry: when the picked port is taken, Start retries on another.
func TestBindRetry(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	var mu sync.Mutex
	picks := 0
	srv := Start(t, Options{pickPort: func() (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if picks++; picks == 1 {
			return taken, nil
		}
		return freePort()
	}})
	if srv.Port() == taken || picks != 2 {
		t.Fatalf("port %d after %d picks (taken: %d)", srv.Port(), picks, taken)
	}
	if !strings.Contains(srv.Log(), "Address already in use") {
		t.Fatalf("log does not show the failed first attempt:\n%s", srv.Log())
	}
	mustRun(t, srv.Dial(t, srv.User(t, "", UserOptions{})), "true")
}

// TestLogOnFailure: when the test failed, cleanup logs the sshd log.
func TestLogOnFailure(t *testing.T) {
	t.Parallel()
	for _, failed := range []bool{false, true} {
		f := &fakeTB{TB: t, failed: failed}
		f.run(func(tb testing.TB) {
			srv := Start(tb, Options{})
			mustRun(t, srv.Dial(tb, srv.User(tb, "", UserOptions{})), "true")
		})
		f.runCleanups()
		logged := strings.Join(f.logs, "\n")
		dumped := strings.Contains(logged, "sshd log") && strings.Contains(logged, "Server listening on 127.0.0.1") &&
			strings.Contains(logged, "Accepted publickey")
		if dumped != failed {
			t.Errorf("failed=%v: log dumped=%v:\n%s", failed, dumped, logged)
		}
		if f.fatal != "" || len(f.errors) > 0 {
			t.Errorf("helper failed: %s %v", f.fatal, f.errors)
		}
	}
}

// TestRequireSSHD: a missing sshd skips with the install hint, or fails when
// KERNELDECK_REQUIRE_SSHD=1; an installed one does neither. Not parallel
// (t.Setenv).
func TestRequireSSHD(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "sshd")
	for _, tc := range []struct {
		env, path, skip, fatal string
	}{
		{"", missing, "sshd not installed: apt-get install openssh-server (set KERNELDECK_REQUIRE_SSHD=1 to make this a failure)", ""},
		{"1", missing, "", "apt-get install openssh-server"},
		{"1", SSHDPath, "", ""},
		{"", SSHDPath, "", ""},
	} {
		t.Setenv(RequireEnv, tc.env)
		if tc.path == SSHDPath {
			RequireSSHD(t) // this machine must have it for the rest of the tests anyway
		}
		f := &fakeTB{TB: t}
		f.run(func(tb testing.TB) { requireSSHD(tb, tc.path) })
		if f.skip != tc.skip || !strings.Contains(f.fatal, tc.fatal) || (tc.fatal == "") != (f.fatal == "") {
			t.Errorf("env %q path %s: skip %q fatal %q", tc.env, tc.path, f.skip, f.fatal)
		}
		// Start goes through the same check.
		if tc.path == missing {
			f := &fakeTB{TB: t}
			f.run(func(tb testing.TB) { Start(tb, Options{sshdPath: missing}) })
			f.runCleanups()
			if f.skip != tc.skip || (tc.fatal == "") != (f.fatal == "") {
				t.Errorf("Start, env %q: skip %q fatal %q", tc.env, f.skip, f.fatal)
			}
		}
	}
}

// fakeTB records what a helper does with its testing.TB: Fatal and Skip end
// the goroutine (run it with run), cleanups run when runCleanups is called.
type fakeTB struct {
	testing.TB
	mu           sync.Mutex
	failed       bool
	fatal, skip  string
	errors, logs []string
	cleanups     []func()
}

func (f *fakeTB) run(fn func(testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
}

func (f *fakeTB) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	f.cleanups = nil
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Cleanup(fn func()) { f.mu.Lock(); f.cleanups = append(f.cleanups, fn); f.mu.Unlock() }
func (f *fakeTB) Failed() bool      { f.mu.Lock(); defer f.mu.Unlock(); return f.failed }
func (f *fakeTB) Fail()             { f.mu.Lock(); f.failed = true; f.mu.Unlock() }
func (f *fakeTB) Log(a ...any)      { f.Logf("%s", fmt.Sprint(a...)) }
func (f *fakeTB) Error(a ...any)    { f.Errorf("%s", fmt.Sprint(a...)) }
func (f *fakeTB) Fatal(a ...any)    { f.Fatalf("%s", fmt.Sprint(a...)) }
func (f *fakeTB) Skip(a ...any)     { f.Skipf("%s", fmt.Sprint(a...)) }
func (f *fakeTB) FailNow()          { f.Fatalf("FailNow") }
func (f *fakeTB) SkipNow()          { f.Skipf("SkipNow") }
func (f *fakeTB) Logf(s string, a ...any) {
	f.mu.Lock()
	f.logs = append(f.logs, fmt.Sprintf(s, a...))
	f.mu.Unlock()
}
func (f *fakeTB) Errorf(s string, a ...any) {
	f.mu.Lock()
	f.failed = true
	f.errors = append(f.errors, fmt.Sprintf(s, a...))
	f.mu.Unlock()
}
func (f *fakeTB) Fatalf(s string, a ...any) {
	f.mu.Lock()
	f.failed = true
	f.fatal = fmt.Sprintf(s, a...)
	f.mu.Unlock()
	runtime.Goexit()
}
func (f *fakeTB) Skipf(s string, a ...any) {
	f.mu.Lock()
	f.skip = fmt.Sprintf(s, a...)
	f.mu.Unlock()
	runtime.Goexit()
}
