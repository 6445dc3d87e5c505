package backends

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	skeema "github.com/skeema/knownhosts"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Defaults of the ssh backend.
const (
	DefaultSSHDialTimeout = 15 * time.Second
	// DefaultSSHMaxSessions stays well under OpenSSH's MaxSessions (10 per
	// connection): sshd frees a session only after our close reaches it, so
	// under churn it counts a few more than we have open.
	DefaultSSHMaxSessions = 6
)

// SSH runs commands on a host over one long-lived x/crypto/ssh connection,
// shared by every kernel there and re-dialed when it dies. Its fast path
// opens direct-streamlocal channels to a runner's socket, so a warm cell
// costs one message exchange and never a login shell.
type SSH struct {
	uri      string
	target   sshTarget
	jump     *sshTarget
	tempDir  string
	opts     Options
	sessions chan struct{}

	mu      sync.Mutex
	client  *ssh.Client
	closers []io.Closer // the jump client, if any
	dialing chan struct{}
	dialErr error
	closed  bool
}

// NewSSH resolves uri against the ssh config and returns the backend. It
// does not connect: the first command does.
func NewSSH(uri string, opts Options) (*SSH, error) {
	userName, host, port, err := parseSSHURI(uri)
	if err != nil {
		return nil, err
	}
	cfgPath, explicit := opts.SSHConfig, opts.SSHConfig != ""
	if !explicit {
		home, _ := os.UserHomeDir()
		cfgPath = filepath.Join(home, ".ssh", "config")
	}
	cfg, err := loadSSHConfig(cfgPath, explicit)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", uri, err)
	}
	t, err := resolveSSHTarget(cfg, userName, host, port, opts)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", uri, err)
	}
	s := &SSH{uri: uri, target: t, opts: opts, tempDir: cmp.Or(opts.SSHTempDir, "/tmp"),
		sessions: make(chan struct{}, max(1, cmp.Or(opts.SSHMaxSessions, DefaultSSHMaxSessions)))}
	if t.proxyJump != "" {
		ju, jh, jp, err := splitJump(t.proxyJump)
		if err != nil {
			return nil, fmt.Errorf("backend %s: %w", uri, err)
		}
		jt, err := resolveSSHTarget(cfg, ju, jh, jp, opts)
		if err != nil {
			return nil, fmt.Errorf("backend %s: jump host: %w", uri, err)
		}
		if jt.proxyJump != "" {
			return nil, fmt.Errorf("backend %s: jump host %s has a ProxyJump of its own; kerneldeck supports one hop", uri, jh)
		}
		s.jump = &jt
	}
	return s, nil
}

// URI implements Env.
func (s *SSH) URI() string { return s.uri }

// TempDir implements Env.
func (s *SSH) TempDir() string { return s.tempDir }

// Close ends the connection.
func (s *SSH) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.dropLocked()
	return nil
}

func (s *SSH) dropLocked() {
	if s.client != nil {
		s.client.Close()
		s.client = nil
	}
	for _, c := range s.closers {
		c.Close()
	}
	s.closers = nil
}

// conn returns the live client, dialing (once, for all callers) if needed.
func (s *SSH) conn(ctx context.Context) (*ssh.Client, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, fmt.Errorf("ssh %s: backend closed", s.uri)
		}
		if s.client != nil {
			c := s.client
			s.mu.Unlock()
			return c, nil
		}
		if s.dialing == nil {
			done := make(chan struct{})
			s.dialing = done
			s.mu.Unlock()
			client, closers, err := s.dial(ctx)
			s.mu.Lock()
			s.dialing = nil
			s.dialErr = err
			if err == nil {
				if s.closed {
					client.Close()
					err = fmt.Errorf("ssh %s: backend closed", s.uri)
				} else {
					s.client, s.closers = client, closers
					go s.watch(client)
				}
			}
			s.mu.Unlock()
			close(done)
			if err != nil {
				return nil, err
			}
			return client, nil
		}
		wait := s.dialing
		s.mu.Unlock()
		select {
		case <-wait:
			s.mu.Lock()
			err := s.dialErr
			s.mu.Unlock()
			if err != nil {
				return nil, err
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("ssh %s: %w", s.uri, ctx.Err())
		}
	}
}

// watch forgets the client when its connection ends, and sends keepalives so
// a dead peer is noticed even when nothing else is in flight.
func (s *SSH) watch(c *ssh.Client) {
	ended := make(chan struct{})
	go func() {
		c.Wait()
		close(ended)
	}()
	var tick <-chan time.Time
	if s.target.aliveInterval > 0 {
		t := time.NewTicker(s.target.aliveInterval)
		defer t.Stop()
		tick = t.C
	}
	misses := 0
	for {
		select {
		case <-ended:
			s.forget(c)
			return
		case <-tick:
			answered := make(chan error, 1)
			go func() {
				_, _, err := c.SendRequest("keepalive@openssh.com", true, nil)
				answered <- err
			}()
			select {
			case err := <-answered:
				if err == nil {
					misses = 0
					continue
				}
				misses = 3
			case <-time.After(s.target.aliveInterval):
				misses++
			case <-ended:
				s.forget(c)
				return
			}
			if misses >= 3 { // OpenSSH's ServerAliveCountMax default
				c.Close()
			}
		}
	}
}

// forget closes c if it is still current, so the next use re-dials.
func (s *SSH) forget(c *ssh.Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == c {
		s.dropLocked()
	}
}

func (s *SSH) dial(ctx context.Context) (*ssh.Client, []io.Closer, error) {
	timeout := cmp.Or(s.opts.SSHDialTimeout, DefaultSSHDialTimeout)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	var closers []io.Closer
	var raw net.Conn
	if s.jump != nil {
		jc, err := s.handshake(ctx, *s.jump, nil, timeout)
		if err != nil {
			return nil, nil, fmt.Errorf("ssh %s: jump host %s: %w", s.uri, s.jump.addr(), err)
		}
		closers = append(closers, jc)
		raw, err = dialThrough(ctx, jc, s.target.addr(), timeout)
		if err != nil {
			jc.Close()
			return nil, nil, fmt.Errorf("ssh %s: through jump host %s to %s: %w", s.uri, s.jump.addr(), s.target.addr(), err)
		}
	}
	c, err := s.handshake(ctx, s.target, raw, timeout)
	if err != nil {
		for _, cl := range closers {
			cl.Close()
		}
		return nil, nil, fmt.Errorf("ssh %s: %w", s.uri, err)
	}
	return c, closers, nil
}

func dialThrough(ctx context.Context, jc *ssh.Client, addr string, timeout time.Duration) (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := jc.Dial("tcp", addr)
		ch <- res{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-time.After(timeout):
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, fmt.Errorf("timed out after %v", timeout)
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// handshake connects to t (over raw when given) with host key checking and
// the configured authentication, all bounded by timeout.
func (s *SSH) handshake(ctx context.Context, t sshTarget, raw net.Conn, timeout time.Duration) (*ssh.Client, error) {
	auth, problems, release, err := s.authMethods(t)
	if err != nil {
		return nil, err
	}
	defer release()
	hk, algos, err := s.hostKeyCheck(t)
	if err != nil {
		return nil, err
	}
	cfg := &ssh.ClientConfig{User: t.user, Auth: auth, HostKeyCallback: hk, HostKeyAlgorithms: algos, Timeout: timeout}
	if raw == nil {
		d := net.Dialer{Timeout: timeout}
		raw, err = d.DialContext(ctx, "tcp", t.addr())
		if err != nil {
			return nil, fmt.Errorf("connect to %s: %w", t.addr(), err)
		}
	}
	// The handshake has no context of its own: a deadline on the socket
	// keeps a silent host from hanging it.
	raw.SetDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Now()) })
	cc, chans, reqs, err := ssh.NewClientConn(raw, t.addr(), cfg)
	stop()
	if err != nil {
		raw.Close()
		if cerr := ctxDone(ctx); cerr != nil {
			err = cerr // the deadline we set says "i/o timeout"; the cause is the caller's
		} else if len(problems) > 0 && strings.Contains(err.Error(), "unable to authenticate") {
			err = fmt.Errorf("%w (also: %s)", err, strings.Join(problems, "; "))
		}
		return nil, fmt.Errorf("ssh handshake with %s as %s: %w", t.addr(), t.user, err)
	}
	raw.SetDeadline(time.Time{})
	return ssh.NewClient(cc, chans, reqs), nil
}

// authMethods offers ssh-agent keys (unless IdentitiesOnly) and identity
// files. An encrypted identity file is never prompted for: without another
// way in, it is a clear error.
//
// problems lists the identity files that could not be used, for the error
// message when the keys that could be used are all refused.
func (s *SSH) authMethods(t sshTarget) (methods []ssh.AuthMethod, problems []string, release func(), err error) {
	var signers []ssh.Signer
	release = func() {}
	if sock := os.Getenv("SSH_AUTH_SOCK"); sock != "" && !t.identitiesOnly {
		if conn, err := net.Dial("unix", sock); err == nil {
			// Agent keys sign during the handshake; the caller releases the
			// agent connection once it is done.
			release = func() { conn.Close() }
			if ss, err := agent.NewClient(conn).Signers(); err == nil {
				signers = append(signers, ss...)
			}
		}
	}
	for _, f := range t.identities {
		data, err := os.ReadFile(f)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) || s.opts.SSHIdentity != "" {
				problems = append(problems, fmt.Sprintf("identity file %s: %v", f, err))
			}
			continue
		}
		signer, err := ssh.ParsePrivateKey(data)
		var missing *ssh.PassphraseMissingError
		switch {
		case errors.As(err, &missing):
			problems = append(problems, fmt.Sprintf("identity file %s is encrypted; load it into ssh-agent (ssh-add %s) or use a key without a passphrase", f, f))
		case err != nil:
			problems = append(problems, fmt.Sprintf("identity file %s: %v", f, err))
		default:
			signers = append(signers, signer)
		}
	}
	if len(signers) == 0 {
		if len(problems) == 0 {
			problems = append(problems, fmt.Sprintf("no ssh-agent and none of %s exists", strings.Join(t.identities, ", ")))
		}
		release()
		return nil, nil, nil, fmt.Errorf("no usable key for %s@%s: %s", t.user, t.addr(), strings.Join(problems, "; "))
	}
	return []ssh.AuthMethod{ssh.PublicKeys(signers...)}, problems, release, nil
}

// hostKeyCheck verifies host keys against known_hosts, always. It also
// returns the key algorithms known_hosts holds for the host, so the server
// presents one of those (golang/go#29286) instead of another that would be
// wrongly reported as changed: for an @cert-authority line, the certificate
// algorithms (skeema/knownhosts knows which lines are CAs).
func (s *SSH) hostKeyCheck(t sshTarget) (ssh.HostKeyCallback, []string, error) {
	var existing []string
	for _, f := range t.knownHosts {
		if _, err := os.Stat(f); err == nil {
			if err := checkKnownHostsFile(f); err != nil {
				return nil, nil, err
			}
			existing = append(existing, f)
		}
	}
	hostname := knownhosts.Normalize(t.addr())
	var cb ssh.HostKeyCallback
	var algos []string
	if len(existing) > 0 {
		db, err := skeema.NewDB(existing...)
		if err != nil {
			return nil, nil, fmt.Errorf("read known_hosts %s: %w", strings.Join(existing, ", "), err)
		}
		cb, algos = db.HostKeyCallback(), db.HostKeyAlgorithms(hostname)
	} else {
		cb = func(string, net.Addr, ssh.PublicKey) error { return &knownhosts.KeyError{} }
	}
	check := func(host string, remote net.Addr, key ssh.PublicKey) error {
		err := cb(host, remote, key)
		var ke *knownhosts.KeyError
		var revoked *knownhosts.RevokedError
		if cert, ok := key.(*ssh.Certificate); ok && err != nil && !errors.As(err, &ke) && !errors.As(err, &revoked) {
			return fmt.Errorf("REFUSED: the host certificate of %s (signed by %s %s) is not trusted: %v; if you trust that CA, add a line \"@cert-authority %s <its public key>\" to %s",
				hostname, cert.SignatureKey.Type(), ssh.FingerprintSHA256(cert.SignatureKey), err, hostname, t.knownHosts[0])
		}
		if !errors.As(err, &ke) {
			return err
		}
		fp := ssh.FingerprintSHA256(key)
		if len(ke.Want) > 0 {
			return fmt.Errorf("REFUSED: the host key of %s has CHANGED (now %s %s; known_hosts has %s:%d). "+
				"This may be an attack. If the change is expected, remove the old entry with ssh-keygen -R '%s' and connect again",
				hostname, key.Type(), fp, ke.Want[0].Filename, ke.Want[0].Line, hostname)
		}
		if !s.opts.AcceptNewHostKey {
			return fmt.Errorf("the host key of %s is unknown (%s %s); check it, then run again with --accept-new-host-key to record it in %s, or add it with ssh-keyscan -p %d %s >> %s",
				hostname, key.Type(), fp, t.knownHosts[0], t.port, t.hostName, t.knownHosts[0])
		}
		if !recordableHost(t.hostName) {
			return fmt.Errorf("the host key of %s is unknown (%s %s), and %q is not a plain host name, so it is not recorded in %s; add the key by hand if you trust it",
				hostname, key.Type(), fp, t.hostName, t.knownHosts[0])
		}
		return appendKnownHost(t.knownHosts[0], hostname, key)
	}
	return check, algos, nil
}

// recordableHost reports whether accept-new may write host into
// known_hosts, where it becomes a pattern: wildcards, a list, a negation,
// brackets or a single colon (read back as host:port) would make the line
// vouch for other hosts, or for none.
func recordableHost(host string) bool {
	return host != "" && !strings.ContainsAny(host, "*?!,|#@[] \t\r\n\x00") && strings.Count(host, ":") != 1
}

// appendKnownHost records a newly accepted host key (OpenSSH accept-new).
func appendKnownHost(path, hostname string, key ssh.PublicKey) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("record host key in %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|openPrivateFlags, 0o600)
	if err != nil {
		return fmt.Errorf("record host key in %s: %w", path, err)
	}
	defer f.Close()
	line := knownhosts.Line([]string{hostname}, key) + "\n"
	// A last line without its newline would run into ours: its key would
	// stop parsing, and that host would become unknown.
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("record host key in %s: %w", path, err)
	}
	if st.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, st.Size()-1); err != nil {
			return fmt.Errorf("record host key in %s: %w", path, err)
		}
		if last[0] != '\n' {
			line = "\n" + line
		}
	}
	if _, err := io.WriteString(f, line); err != nil {
		return fmt.Errorf("record host key in %s: %w", path, err)
	}
	return nil
}

// Execute implements Env: one session on the shared connection runs the
// command under bash in its own process group, which a timeout kills whole.
func (s *SSH) Execute(ctx context.Context, command string, opts ExecOptions) (Result, error) {
	return runShell(ctx, sshShell{s}, command, opts)
}

// sshShell is the ssh connection as a shellTransport: a command is one
// session on it.
type sshShell struct{ s *SSH }

func (t sshShell) name() string     { return "ssh " + t.s.uri }
func (t sshShell) killGroup(pg int) { t.s.killGroup(pg) }

// acquire waits for one of the connection's sessions (SSHMaxSessions).
func (t sshShell) acquire(ctx context.Context) (func(), error) {
	select {
	case t.s.sessions <- struct{}{}:
		return sync.OnceFunc(func() { <-t.s.sessions }), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("ssh %s: waiting for a free session: %w", t.s.uri, ctx.Err())
	}
}

func (t sshShell) start(ctx context.Context, cmdline string, stdin []byte, stdout, stderr io.Writer) (shellProcess, error) {
	s := t.s
	p := &sshProcess{s: s}
	client, sess, err := s.session(ctx)
	if err != nil {
		return nil, err
	}
	p.client, p.sess = client, sess
	// Stdin is fed by hand: a command that exits without reading all of it
	// is not a transport failure (Session.Stdin would make Wait report one).
	in, err := sess.StdinPipe()
	if err != nil {
		p.close()
		return nil, fmt.Errorf("ssh %s: %w", s.uri, err)
	}
	sess.Stdout, sess.Stderr = stdout, stderr
	if err := sess.Start(cmdline); err != nil {
		s.forget(client)
		p.close()
		return nil, fmt.Errorf("ssh %s: start command: %w", s.uri, err)
	}
	go func() {
		in.Write(stdin)
		in.Close()
	}()
	return p, nil
}

// sshProcess is one command on its own session.
type sshProcess struct {
	s      *SSH
	client *ssh.Client
	sess   *ssh.Session
}

func (p *sshProcess) wait() (int, error) {
	err := p.sess.Wait()
	var exitErr *ssh.ExitError
	var missing *ssh.ExitMissingError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exitErr):
		if exitErr.Signal() != "" {
			return signalExitCode(exitErr.Signal()), nil
		}
		return exitErr.ExitStatus(), nil
	case errors.As(err, &missing):
		p.s.forget(p.client)
		return 0, fmt.Errorf("ssh %s: connection lost before the command finished", p.s.uri)
	default:
		p.s.forget(p.client)
		return 0, fmt.Errorf("ssh %s: %w", p.s.uri, err)
	}
}

func (p *sshProcess) close() {
	if p.sess != nil {
		p.sess.Close()
	}
}

// session opens a session on the shared connection. Nothing has been sent
// yet, so trying again is safe: a connection that died unnoticed is dropped
// and re-dialed once, and a refused channel (the server's MaxSessions can
// still count sessions we already closed) is retried with a short backoff
// until ctx ends.
func (s *SSH) session(ctx context.Context) (*ssh.Client, *ssh.Session, error) {
	redialed := false
	backoff := 20 * time.Millisecond
	for {
		client, err := s.conn(ctx)
		if err != nil {
			return nil, nil, err
		}
		sess, err := client.NewSession()
		if err == nil {
			return client, sess, nil
		}
		var oce *ssh.OpenChannelError
		switch {
		case errors.As(err, &oce):
			// The connection is healthy; the server refused this channel.
		case !redialed:
			s.forget(client)
			redialed = true
			continue
		default:
			s.forget(client)
			return nil, nil, fmt.Errorf("ssh %s: open session: %w", s.uri, err)
		}
		select {
		case <-time.After(backoff):
			backoff = min(2*backoff, time.Second)
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("ssh %s: open session: %w (last refusal: %v)", s.uri, ctx.Err(), err)
		}
	}
}

// killGroup kills a timed-out command's process group on the host, on a
// fresh session, waiting at most 10 s for one: sshd refuses it while the
// connection's other commands hold every session it allows.
func (s *SSH) killGroup(pgid int) {
	if pgid <= 1 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, sess, err := s.session(ctx)
	if err != nil {
		return
	}
	defer sess.Close()
	sess.Run(fmt.Sprintf("kill -KILL -- -%d 2>/dev/null", pgid))
}

// DialUnix implements StreamDialer with a direct-streamlocal channel on the
// shared connection; it is not a session, so MaxSessions does not limit it.
func (s *SSH) DialUnix(ctx context.Context, path string) (net.Conn, error) {
	for attempt := 0; ; attempt++ {
		c, err := s.dialUnixOnce(ctx, path)
		var oce *ssh.OpenChannelError
		if err == nil || attempt > 0 || errors.As(err, &oce) || ctx.Err() != nil {
			return c, err
		}
		// The connection died unnoticed: once more on a fresh one.
	}
}

func (s *SSH) dialUnixOnce(ctx context.Context, path string) (net.Conn, error) {
	client, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := client.Dial("unix", path)
		ch <- res{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			if oce := (*ssh.OpenChannelError)(nil); !errors.As(r.err, &oce) {
				s.forget(client)
			}
			return nil, fmt.Errorf("ssh %s: open stream to %s: %w", s.uri, path, r.err)
		}
		return withReadDeadlines(r.c), nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, fmt.Errorf("ssh %s: open stream to %s: %w", s.uri, path, ctx.Err())
	}
}
