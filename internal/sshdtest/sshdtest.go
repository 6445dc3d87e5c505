// Package sshdtest starts a real OpenSSH server (/usr/sbin/sshd) for tests:
// a generated config, fresh host keys, a free loopback port, public keys
// only, authorized keys in its own temp dir (never ~/.ssh).
//
//	srv := sshdtest.Start(t, sshdtest.Options{})
//	u := srv.User(t, "kdtest1", sshdtest.UserOptions{}) // root only; "" = current user
//	client := srv.Dial(t, u)                            // x/crypto/ssh, known_hosts checked
//	cfg := srv.WriteSSHConfig(t, "box", u)              // for ssh://box --ssh-config cfg
//
// Everything it started is killed at cleanup and its log shown on failure.
// Other users exist only as root (useradd). Without sshd it skips, or fails
// with KERNELDECK_REQUIRE_SSHD=1 (CI).
package sshdtest

import (
	"bufio"
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// SSHDPath is where the OpenSSH server must be installed (sshd re-executes
// itself, so it needs an absolute path).
const SSHDPath = "/usr/sbin/sshd"

// RequireEnv is the environment variable that, set to "1", turns a missing
// sshd from a skip into a test failure.
const RequireEnv = "KERNELDECK_REQUIRE_SSHD"

// EnvVar is set by sshd (SetEnv) in every session the server starts, to the
// server's Dir(). Processes started through the server inherit it, even
// when they detach, and cleanup kills every process that still carries it.
const EnvVar = "KERNELDECK_SSHDTEST"

// privsepDir is the privilege-separation chroot a root sshd insists on.
const privsepDir = "/run/sshd"

// bindAttempts is how many free ports Start tries before giving up.
const bindAttempts = 5

// KeyType names a host key algorithm family.
type KeyType string

// The host key types Start can generate.
const (
	ED25519 KeyType = "ed25519"
	RSA     KeyType = "rsa"   // 2048-bit; offered as rsa-sha2-512/256 and ssh-rsa
	ECDSA   KeyType = "ecdsa" // NIST P-256 (ecdsa-sha2-nistp256)
)

// Options configures Start. The zero value is a working server with one
// ed25519 host key.
type Options struct {
	// HostKeyTypes lists the host keys to generate, one HostKey line each, in
	// this order. Empty means {ED25519}. For host-key-algorithm tests, e.g.
	// {ED25519, RSA} with a known_hosts that lists only the RSA key.
	HostKeyTypes []KeyType

	// HostCertificates makes a host certificate for every host key, signed
	// by a CA of the server's own (CAKnownHostsLine vouches for it) for the
	// principal 127.0.0.1, and has sshd present it.
	HostCertificates bool

	// Config holds extra sshd_config lines, e.g. "MaxSessions 2" or
	// "ClientAliveInterval 1". sshd keeps the first value it reads for a
	// keyword, so these lines are written before the generated defaults and
	// override them (a SetEnv line would drop EnvVar). A line starting with
	// "Match" and every line after it go to the end of the file instead,
	// where Match blocks belong.
	Config []string

	// StartTimeout bounds the wait until the port answers with an SSH banner
	// (per attempt). Zero means 10 s.
	StartTimeout time.Duration

	// Hooks for this package's own tests.
	sshdPath string              // default SSHDPath
	pickPort func() (int, error) // default: listen on 127.0.0.1:0 and close
}

// Server is a running sshd. Its methods may be called from parallel tests.
type Server struct {
	dir        string // private temp dir, 0711 (users must reach authorized_keys)
	configPath string
	pidFile    string
	akDir      string // authorized_keys/, one file per user (%u)
	knownHosts string // known_hosts listing every host key, in dir
	port       int
	hostKeys   []hostKey
	ca         ssh.Signer // signs the host certificates, if any
	sshdPath   string
	timeout    time.Duration

	log logBuffer

	mu        sync.Mutex
	proc      *sshdProc   // current listener, nil while stopped
	detached  []procID    // per-connection processes of listeners stopped by Stop/Restart
	leftovers []procID    // user processes orphaned by KillSessions
	readers   []chan bool // closed when a listener's log pipe reaches EOF
}

type hostKey struct {
	typ  KeyType
	path string
	pub  ssh.PublicKey
	cert string // its certificate's path, or ""
}

// sshdProc is one listener process.
type sshdProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait returned
	err  error         // cmd.Wait's result, valid after done
}

func (p *sshdProc) pid() int { return p.cmd.Process.Pid }

func (p *sshdProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// RequireSSHD skips the test when /usr/sbin/sshd is not installed, or fails
// it when KERNELDECK_REQUIRE_SSHD=1. Start calls it.
func RequireSSHD(t testing.TB) {
	t.Helper()
	requireSSHD(t, SSHDPath)
}

func requireSSHD(t testing.TB, sshdPath string) {
	t.Helper()
	st, err := os.Stat(sshdPath)
	if err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
		return
	}
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("sshd not installed at %s (%v), and %s=1 makes that a failure: apt-get install openssh-server", sshdPath, err, RequireEnv)
	}
	t.Skipf("sshd not installed: apt-get install openssh-server (set %s=1 to make this a failure)", RequireEnv)
}

// Start starts an sshd for the test and registers its cleanup. It fails the
// test (with the sshd log) if the server does not come up.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.sshdPath == "" {
		opts.sshdPath = SSHDPath
	}
	if opts.pickPort == nil {
		opts.pickPort = freePort
	}
	requireSSHD(t, opts.sshdPath)
	if os.Geteuid() == 0 {
		if err := ensurePrivsepDir(); err != nil {
			t.Fatalf("sshdtest: %v", err)
		}
	}
	dir, err := os.MkdirTemp("", "kerneldeck-sshd-")
	if err != nil {
		t.Fatalf("sshdtest: %v", err)
	}
	s := &Server{
		dir:        dir,
		configPath: filepath.Join(dir, "sshd_config"),
		pidFile:    filepath.Join(dir, "sshd.pid"),
		akDir:      filepath.Join(dir, "authorized_keys"),
		knownHosts: filepath.Join(dir, "known_hosts"),
		sshdPath:   opts.sshdPath,
		timeout:    opts.StartTimeout,
	}
	if s.timeout <= 0 {
		s.timeout = 10 * time.Second
	}
	// Registered first so it runs last: the log is complete by then.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sshd log (%s):\n%s", s.dir, s.Log())
		}
		os.RemoveAll(s.dir)
	})
	t.Cleanup(func() { s.shutdown(t) })

	if err := s.prepare(opts); err != nil {
		t.Fatalf("sshdtest: %v", err)
	}
	var lastErr error
	for attempt := 0; attempt < bindAttempts; attempt++ {
		port, err := opts.pickPort()
		if err != nil {
			t.Fatalf("sshdtest: pick a port: %v", err)
		}
		s.port = port
		if err := s.writeConfig(opts); err != nil {
			t.Fatalf("sshdtest: %v", err)
		}
		err = s.launch()
		if err == nil {
			return s
		}
		lastErr = err
		if !errors.Is(err, errBind) {
			break
		}
	}
	t.Fatalf("sshdtest: start sshd: %v", lastErr)
	return nil
}

// ensurePrivsepDir creates /run/sshd (root-owned, 0755) if it is missing: a
// root sshd refuses to start without its privilege-separation directory.
func ensurePrivsepDir() error {
	if err := os.MkdirAll(privsepDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", privsepDir, err)
	}
	st, err := os.Stat(privsepDir)
	if err != nil {
		return err
	}
	sys := st.Sys().(*syscall.Stat_t)
	if sys.Uid != 0 || st.Mode().Perm()&0o022 != 0 {
		if err := os.Chown(privsepDir, 0, 0); err != nil {
			return err
		}
		return os.Chmod(privsepDir, 0o755)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// prepare makes the dir layout and the host keys.
func (s *Server) prepare(opts Options) error {
	// Users' sshd children open their authorized_keys file as that user, so
	// the dir must be traversable; nothing in it is listable by them.
	if err := os.Chmod(s.dir, 0o711); err != nil {
		return err
	}
	if err := os.Mkdir(s.akDir, 0o711); err != nil {
		return err
	}
	types := opts.HostKeyTypes
	if len(types) == 0 {
		types = []KeyType{ED25519}
	}
	seen := map[KeyType]bool{}
	for _, typ := range types {
		if seen[typ] {
			return fmt.Errorf("host key type %q listed twice", typ)
		}
		seen[typ] = true
		priv, err := generateKey(typ)
		if err != nil {
			return err
		}
		path := filepath.Join(s.dir, "ssh_host_"+string(typ)+"_key")
		pub, err := writePrivateKey(path, priv, "sshdtest host key")
		if err != nil {
			return err
		}
		hk := hostKey{typ: typ, path: path, pub: pub}
		if opts.HostCertificates {
			if hk.cert, err = s.certify(path, pub); err != nil {
				return err
			}
		}
		s.hostKeys = append(s.hostKeys, hk)
	}
	return nil
}

// certify signs pub as a host certificate of 127.0.0.1 with the server's CA
// (made on first use) and writes it beside the key; it returns its path.
func (s *Server) certify(keyPath string, pub ssh.PublicKey) (string, error) {
	if s.ca == nil {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return "", err
		}
		if s.ca, err = ssh.NewSignerFromKey(k); err != nil {
			return "", err
		}
	}
	cert := &ssh.Certificate{Key: pub, Serial: 1, CertType: ssh.HostCert, KeyId: "sshdtest host",
		ValidPrincipals: []string{"127.0.0.1"}, ValidAfter: uint64(time.Now().Add(-time.Hour).Unix()),
		ValidBefore: uint64(time.Now().Add(24 * time.Hour).Unix())}
	if err := cert.SignCert(rand.Reader, s.ca); err != nil {
		return "", err
	}
	path := keyPath + "-cert.pub"
	return path, os.WriteFile(path, ssh.MarshalAuthorizedKey(cert), 0o644)
}

// CAKnownHostsLine is a known_hosts line trusting the server's host
// certificate authority for its address; "" without HostCertificates.
func (s *Server) CAKnownHostsLine() string {
	if s.ca == nil {
		return ""
	}
	return "@cert-authority " + knownhosts.Normalize(s.Addr()) + " " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.ca.PublicKey())))
}

func generateKey(typ KeyType) (crypto.PrivateKey, error) {
	switch typ {
	case ED25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	case RSA:
		return rsa.GenerateKey(rand.Reader, 2048)
	case ECDSA:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	return nil, fmt.Errorf("unknown key type %q (want ed25519, rsa or ecdsa)", typ)
}

// writePrivateKey writes priv in OpenSSH format (0600) to path and its public
// half to path+".pub", and returns the public key.
func writePrivateKey(path string, priv crypto.PrivateKey, comment string) (ssh.PublicKey, error) {
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, err
	}
	pub := signer.PublicKey()
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))) + " " + comment + "\n"
	if err := os.WriteFile(path+".pub", []byte(line), 0o644); err != nil {
		return nil, err
	}
	return pub, nil
}

// writeConfig writes sshd_config and KnownHostsFile for the current port.
func (s *Server) writeConfig(opts Options) error {
	if err := os.WriteFile(s.knownHosts, []byte(s.KnownHostsLine()+"\n"), 0o644); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("# generated by kerneldeck internal/sshdtest\n")
	var match []string
	for i, l := range opts.Config {
		f := strings.Fields(l)
		if len(f) > 0 && strings.EqualFold(f[0], "Match") {
			match = opts.Config[i:]
			break
		}
		b.WriteString(l + "\n")
	}
	fmt.Fprintf(&b, "ListenAddress 127.0.0.1:%d\n", s.port)
	for _, k := range s.hostKeys {
		fmt.Fprintf(&b, "HostKey %s\n", k.path)
		if k.cert != "" {
			fmt.Fprintf(&b, "HostCertificate %s\n", k.cert)
		}
	}
	fmt.Fprintf(&b, "PidFile %s\n", s.pidFile)
	fmt.Fprintf(&b, "AuthorizedKeysFile %s/%%u\n", s.akDir)
	fmt.Fprintf(&b, "SetEnv %s=%s\n", EnvVar, s.dir)
	b.WriteString(`AuthorizedPrincipalsFile none
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
PermitRootLogin prohibit-password
PermitEmptyPasswords no
LogLevel VERBOSE
AllowStreamLocalForwarding yes
AllowTcpForwarding yes
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
PermitUserEnvironment no
Subsystem sftp internal-sftp
`)
	for _, l := range match {
		b.WriteString(l + "\n")
	}
	return os.WriteFile(s.configPath, []byte(b.String()), 0o600)
}

// errBind marks a start that failed because the port was taken.
var errBind = errors.New("sshd could not bind its port")

// launch starts a listener on s.port and waits until it sends its banner.
func (s *Server) launch() error {
	from := s.log.Len()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command(s.sshdPath, "-D", "-e", "-f", s.configPath)
	// Giving sshd the pipe's *os.File (not an io.Writer) keeps cmd.Wait from
	// waiting for EOF, which per-connection children holding the pipe would
	// delay until they end.
	cmd.Stdout = w
	cmd.Stderr = w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return err
	}
	w.Close()
	eof := make(chan bool)
	go func() {
		defer close(eof)
		defer r.Close()
		br := bufio.NewReader(r)
		for {
			line, err := br.ReadBytes('\n')
			s.log.Write(line)
			if err != nil {
				return
			}
		}
	}()
	p := &sshdProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.readers = append(s.readers, eof)
	s.proc = p
	s.mu.Unlock()

	err = waitBanner(s.Addr(), p, s.timeout)
	if err == nil {
		return nil
	}
	// Did not come up: make sure it is gone, then tell why.
	syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
	s.mu.Lock()
	s.proc = nil
	s.mu.Unlock()
	select {
	case <-eof:
	case <-time.After(2 * time.Second):
	}
	log := s.log.String()[from:]
	if strings.Contains(log, "Address already in use") || strings.Contains(log, "Cannot bind any address") {
		return fmt.Errorf("%w: port %d: %v", errBind, s.port, err)
	}
	return fmt.Errorf("%v; sshd log:\n%s", err, log)
}

// waitBanner waits until addr accepts a TCP connection and sends an SSH
// identification line, the listener exits, or d passes.
func waitBanner(addr string, p *sshdProc, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("sshd exited before listening: %v", p.err)
		}
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			// Something else may hold the port (sshd then fails to bind
			// and exits): stop waiting for a banner when sshd exits.
			read := make(chan struct{})
			go func() {
				select {
				case <-p.done:
					c.Close()
				case <-read:
				}
			}()
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			line, rerr := bufio.NewReader(c).ReadString('\n')
			close(read)
			c.Close()
			if strings.HasPrefix(line, "SSH-") {
				return nil
			}
			last = fmt.Errorf("no SSH banner from %s (got %q, %v)", addr, line, rerr)
		} else {
			last = err
		}
		select {
		case <-p.done:
		case <-time.After(25 * time.Millisecond):
		}
	}
	return fmt.Errorf("sshd not ready on %s after %v: %v", addr, d, last)
}

// Addr is the listen address, "127.0.0.1:<port>".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the listen port; it stays the same across Restart.
func (s *Server) Port() int { return s.port }

// Dir is the server's private temp dir (config, host keys, authorized_keys,
// pid file, known_hosts); it is removed at cleanup.
func (s *Server) Dir() string { return s.dir }

// ConfigPath is the generated sshd_config.
func (s *Server) ConfigPath() string { return s.configPath }

// PID is the current listener's process id (also its process group), or 0
// while stopped.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.pid()
}

// Log returns everything sshd has written to stderr so far (LogLevel VERBOSE,
// including the per-connection processes' lines).
func (s *Server) Log() string { return s.log.String() }

// Stop stops the listener the way a service manager does (SIGTERM, then
// SIGKILL after 5 s). Like a real sshd stop, established connections survive:
// combine with KillSessions to drop them. New connections are refused until
// Restart.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(); err != nil {
		t.Fatalf("sshdtest: stop: %v", err)
	}
}

func (s *Server) stopLocked() error {
	p := s.proc
	if p == nil {
		return nil
	}
	tree := scanProcs()
	// Its connections outlive it (reparented away): remember them for
	// KillSessions and cleanup.
	for _, c := range tree.children(p.pid()) {
		s.detached = append(s.detached, tree.id(c))
	}
	syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-p.pid(), syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("sshd pid %d did not exit after SIGKILL", p.pid())
		}
	}
	s.proc = nil
	return nil
}

// Restart stops the listener (if running) and starts a new one on the same
// port with the same config and host keys. Established connections survive,
// as they do when a real sshd service restarts.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	err := s.stopLocked()
	s.mu.Unlock()
	if err != nil {
		t.Fatalf("sshdtest: restart: %v", err)
	}
	// The port is free again at once (sshd binds with SO_REUSEADDR); retry
	// in case a stray connect raced us for it.
	for attempt := 0; ; attempt++ {
		err = s.launch()
		if err == nil {
			return
		}
		if !errors.Is(err, errBind) || attempt >= bindAttempts {
			t.Fatalf("sshdtest: restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shutdown kills everything still running under the listener or under
// connections it ever served, then the listener, and waits for them and for
// the log. The listener is kept alive (between SIGSTOPs) until its children
// are killed so that it reaps them, rather than leaving them to pid 1 (which
// in some containers is no real init and reaps late or never).
func (s *Server) shutdown(t testing.TB) {
	s.mu.Lock()
	defer s.mu.Unlock()
	listener := s.proc
	roots := append(append([]procID(nil), s.detached...), s.leftovers...)
	var victims []procID
	for round := 0; round < 50; round++ {
		if listener != nil {
			// A stopped listener accepts and forks nothing: its children
			// can be listed exactly.
			syscall.Kill(-listener.pid(), syscall.SIGSTOP)
			waitState(listener.pid(), 'T', time.Second)
			pt := scanProcs()
			for _, c := range pt.children(listener.pid()) {
				roots = append(roots, pt.id(c))
			}
		}
		if len(roots) == 0 {
			// Last, whatever detached from the tree meanwhile.
			if roots = s.tagged(); len(roots) == 0 {
				break
			}
		}
		frozen := freezeTrees(roots, nil)
		for _, v := range frozen {
			v.kill()
		}
		victims = append(victims, frozen...)
		roots = nil
		if listener != nil {
			syscall.Kill(-listener.pid(), syscall.SIGCONT)
			waitReaped(frozen, listener.pid(), 2*time.Second)
		}
	}
	if listener != nil {
		syscall.Kill(-listener.pid(), syscall.SIGKILL)
		select {
		case <-listener.done:
		case <-time.After(10 * time.Second):
			t.Errorf("sshdtest: sshd pid %d did not exit after SIGKILL", listener.pid())
		}
		s.proc = nil
	}
	if err := waitGone(victims, 10*time.Second); err != nil {
		t.Errorf("sshdtest: %v", err)
	}
	for _, eof := range s.readers {
		select {
		case <-eof:
		case <-time.After(5 * time.Second):
			t.Logf("sshdtest: sshd log pipe still open 5s after cleanup (a process inherited it)")
		}
	}
}

// logBuffer is a bytes.Buffer safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) {
	b.mu.Lock()
	b.buf.Write(p)
	b.mu.Unlock()
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}
