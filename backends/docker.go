package backends

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"
)

// DefaultDockerTimeout bounds reaching the Docker Engine and the checks
// made when a docker backend is opened.
const DefaultDockerTimeout = 15 * time.Second

// Docker runs kernels inside an existing, running container
// (docker://CONTAINER[?user=U]), through the Docker Engine API: a command is
// one exec with stdin attached; a stream is one long-lived exec relaying
// between its stdin/stdout and a Unix socket in the container.
type Docker struct {
	uri       string
	container string // name or id, as given
	id        string // the container's full id
	user      string
	tempDir   string
	cli       *client.Client
	ownClient bool

	mu     sync.Mutex
	relays map[*relayConn]struct{}
	closed bool
}

// containerName is what docker accepts as a container name or id.
var containerName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// userName is a login name or uid[:gid].
var userName = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9_.-]*(:[a-zA-Z0-9_][a-zA-Z0-9_.-]*)?$`)

// parseDockerURI splits docker://CONTAINER[?user=U].
func parseDockerURI(uri string) (name, user string, err error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "docker" || u.Opaque != "" {
		return "", "", fmt.Errorf("backend %q: want docker://CONTAINER[?user=USER]", uri)
	}
	if u.User != nil || u.Port() != "" || (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		return "", "", fmt.Errorf("backend %q: want docker://CONTAINER[?user=USER] (a container name or id, nothing else)", uri)
	}
	name = u.Hostname()
	if !containerName.MatchString(name) {
		return "", "", fmt.Errorf("backend %q: %q is not a container name or id", uri, name)
	}
	for k, v := range u.Query() {
		switch {
		case k == "user" && len(v) == 1 && userName.MatchString(v[0]):
			user = v[0]
		case k == "user":
			return "", "", fmt.Errorf("backend %q: user must be one login name or uid", uri)
		default:
			return "", "", fmt.Errorf("backend %q: unknown option %q; docker:// takes only user=", uri, k)
		}
	}
	return name, user, nil
}

// dockerClient connects to the Docker Engine as the docker CLI would:
// DOCKER_HOST (unix socket or tcp), TLS from DOCKER_CERT_PATH and
// DOCKER_TLS_VERIFY, the API version negotiated with the daemon.
func dockerClient(ctx context.Context) (*client.Client, error) {
	c, err := client.New(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker: %w (check DOCKER_HOST, DOCKER_CERT_PATH and DOCKER_TLS_VERIFY)", err)
	}
	if _, err := c.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		c.Close()
		return nil, fmt.Errorf("docker: cannot reach the Docker Engine at %s: %w; is dockerd running? (DOCKER_HOST selects another)", c.DaemonHost(), err)
	}
	return c, nil
}

// dialDocker connects to the Docker Engine for opening a backend, within
// opts.DockerTimeout; the caller cancels the context when done opening.
func dialDocker(opts Options) (context.Context, context.CancelFunc, *client.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(opts.DockerTimeout, DefaultDockerTimeout))
	c, err := dockerClient(ctx)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, cancel, c, nil
}

// NewDocker opens docker://CONTAINER[?user=U]: it checks that the container
// runs and reads its temp dir ($TMPDIR for the user, else /tmp).
func NewDocker(uri string, opts Options) (*Docker, error) {
	name, user, err := parseDockerURI(uri)
	if err != nil {
		return nil, err
	}
	ctx, cancel, c, err := dialDocker(opts)
	if err != nil {
		return nil, err
	}
	defer cancel()
	d, err := openContainer(ctx, c, uri, name, user, opts.DockerTempDir)
	if err != nil {
		c.Close()
		return nil, err
	}
	d.ownClient = true
	return d, nil
}

// openContainer is NewDocker on a client the caller owns.
func openContainer(ctx context.Context, c *client.Client, uri, name, user, tempDir string) (*Docker, error) {
	info, err := c.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if err != nil {
		return nil, fmt.Errorf("docker %s: container %q: %w ('docker ps' lists the running ones)", uri, name, err)
	}
	if st := info.Container.State; st == nil || !st.Running {
		status := "unknown"
		if st != nil {
			status = string(st.Status)
		}
		return nil, fmt.Errorf("docker %s: container %q is not running (%s); start it with 'docker start %s'", uri, name, status, name)
	}
	d := &Docker{uri: uri, container: name, id: info.Container.ID, user: user, cli: c, relays: map[*relayConn]struct{}{}}
	probe := `printf 'KDTMP %s\n' "${TMPDIR:-/tmp}"`
	if tempDir != "" {
		probe = `printf 'KDTMP %s\n' ` + ShellQuote(tempDir)
	}
	res, err := d.Execute(ctx, probe, ExecOptions{})
	if err != nil {
		return nil, err
	}
	line, _, _ := strings.Cut(res.Output, "\n")
	tmp, ok := strings.CutPrefix(line, "KDTMP ")
	if res.ReturnCode != 0 || !ok || !strings.HasPrefix(tmp, "/") {
		return nil, fmt.Errorf("docker %s: cannot run bash in container %q as %s (exit %d): %s", uri, name, cmp.Or(user, "its user"), res.ReturnCode, strings.TrimSpace(res.Output))
	}
	d.tempDir = tmp
	return d, nil
}

// URI implements Env.
func (d *Docker) URI() string { return d.uri }

// TempDir implements Env: the user's $TMPDIR in the container, else /tmp.
func (d *Docker) TempDir() string { return d.tempDir }

// ContainerID is the full id of the container the kernels run in.
func (d *Docker) ContainerID() string { return d.id }

// Close ends the streams still open (their relays exit with them) and
// releases the client.
func (d *Docker) Close() error {
	d.mu.Lock()
	d.closed = true
	relays := make([]*relayConn, 0, len(d.relays))
	for r := range d.relays {
		relays = append(relays, r)
	}
	d.mu.Unlock()
	for _, r := range relays {
		r.Close()
	}
	if d.ownClient {
		return d.cli.Close()
	}
	return nil
}

// Execute implements Env with one exec per command.
func (d *Docker) Execute(ctx context.Context, command string, opts ExecOptions) (Result, error) {
	return runShell(ctx, dockerShell{d}, command, opts)
}

// dockerShell is the container as a shellTransport.
type dockerShell struct{ d *Docker }

func (t dockerShell) name() string { return "docker " + t.d.uri }

// exec starts cmd in the container with stdin, stdout and stderr attached.
func (d *Docker) exec(ctx context.Context, cmd []string) (string, client.HijackedResponse, error) {
	ex, err := d.cli.ExecCreate(ctx, d.id, client.ExecCreateOptions{User: d.user, AttachStdin: true, AttachStdout: true, AttachStderr: true, Cmd: cmd})
	if err != nil {
		return "", client.HijackedResponse{}, d.execErr(ctx, err)
	}
	att, err := d.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return "", client.HijackedResponse{}, d.execErr(ctx, err)
	}
	return ex.ID, att.HijackedResponse, nil
}

// execErr says why an exec could not start, naming a container that is gone
// or stopped (the engine reports its kernels' state as lost).
func (d *Docker) execErr(ctx context.Context, err error) error {
	if info, ierr := d.cli.ContainerInspect(context.WithoutCancel(ctx), d.id, client.ContainerInspectOptions{}); cerrdefs.IsNotFound(ierr) {
		return fmt.Errorf("docker %s: container %s is gone (%w): %v", d.uri, d.container, ErrHostGone, err)
	} else if ierr == nil {
		if st := info.Container.State; st != nil && !st.Running {
			return fmt.Errorf("docker %s: container %s is not running (%s; %w): %v", d.uri, d.container, st.Status, ErrHostGone, err)
		}
	}
	return fmt.Errorf("docker %s: exec: %w", d.uri, err)
}

func (t dockerShell) start(ctx context.Context, cmdline string, stdin []byte, stdout, stderr io.Writer) (shellProcess, error) {
	d := t.d
	id, att, err := d.exec(ctx, []string{"bash", "--norc", "--noprofile", "-c", cmdline})
	if err != nil {
		return nil, err
	}
	p := &dockerProcess{d: d, execID: id, att: att, copied: make(chan error, 1)}
	go func() {
		// The exec's stdin ends with a half-close: the daemon then closes
		// the process's stdin and keeps the output coming (tested: the
		// output after EOF on stdin still arrives).
		if len(stdin) > 0 {
			att.Conn.Write(stdin)
		}
		att.CloseWrite()
	}()
	go func() {
		_, err := stdcopy.StdCopy(stdout, stderr, att.Reader)
		p.copied <- err
	}()
	return p, nil
}

// dockerProcess is one exec.
type dockerProcess struct {
	d      *Docker
	execID string
	att    client.HijackedResponse
	copied chan error
	once   sync.Once
}

func (p *dockerProcess) wait() (int, error) {
	if err := <-p.copied; err != nil && !errors.Is(err, net.ErrClosed) {
		return 0, fmt.Errorf("docker %s: reading the command's output: %w", p.d.uri, err)
	}
	// The output ends a moment before the daemon records the exit code.
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultDockerTimeout)
		info, err := p.d.cli.ExecInspect(ctx, p.execID, client.ExecInspectOptions{})
		cancel()
		if err != nil {
			return 0, fmt.Errorf("docker %s: inspect exec: %w", p.d.uri, err)
		}
		if !info.Running {
			return info.ExitCode, nil
		}
		if i == 200 {
			return 0, fmt.Errorf("docker %s: the command's output ended but the exec still runs", p.d.uri)
		}
		time.Sleep(time.Duration(min(i+1, 10)) * time.Millisecond)
	}
}

// close ends the hijacked connection: an unclosed one keeps its
// goroutines and the daemon's side alive.
func (p *dockerProcess) close() { p.once.Do(p.att.Close) }

func (t dockerShell) killGroup(pgid int) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultDockerTimeout)
	defer cancel()
	_, att, err := t.d.exec(ctx, []string{"bash", "--norc", "--noprofile", "-c", fmt.Sprintf("kill -KILL -- -%d 2>/dev/null", pgid)})
	if err != nil {
		return
	}
	defer att.Close()
	att.CloseWrite()
	io.Copy(io.Discard, att.Reader)
}

// relaySource is the stream relay run in the container: it connects to the
// socket, says so in a first line on stdout, ahead of anything from the
// socket, and copies both ways; it exits when either side ends, so a closed
// stream leaves no process behind. (On stderr the line could come after the
// peer's first bytes on stdout: the daemon interleaves the two as it reads
// them, and the stream's bytes would wait for a reader that waits for it.)
const relaySource = `import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as e:
    os.write(1, ("KDRELAY ERR %s\n" % e.strerror).encode())
    sys.exit(1)
os.write(1, b"KDRELAY OK\n")
def up():
    while True:
        b = os.read(0, 65536)
        if not b:
            os._exit(0)
        s.sendall(b)
threading.Thread(target=up, daemon=True).start()
while True:
    b = s.recv(65536)
    if not b:
        os._exit(0)
    os.write(1, b)
`

// DialUnix implements StreamDialer: one exec running the relay, its stdin
// and stdout the stream.
func (d *Docker) DialUnix(ctx context.Context, path string) (net.Conn, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("docker %s: closed", d.uri)
	}
	id, att, err := d.exec(ctx, []string{"python3", "-I", "-S", "-c", relaySource, path})
	if err != nil {
		return nil, err
	}
	local, remote := net.Pipe()
	r := &relayConn{Conn: local, d: d, execID: id, att: att, remote: remote}
	stderr := &headWriter{max: 300} // why an exec that never ran the relay failed
	copied := make(chan struct{})
	go func() {
		stdcopy.StdCopy(remote, stderr, att.Reader)
		remote.Close()
		close(copied)
	}()
	ack := make(chan string, 1)
	go func() { ack <- relayAck(local) }()
	select {
	case line := <-ack:
		if line != "KDRELAY OK" {
			r.Close()
			msg := strings.TrimPrefix(line, "KDRELAY ERR ")
			if msg == "" {
				select {
				case <-copied:
				case <-ctx.Done():
				}
				msg, _, _ = strings.Cut(strings.TrimSpace(stderr.String()), "\n")
			}
			return nil, fmt.Errorf("docker %s: open stream to %s: %s", d.uri, path, cmp.Or(msg, "the relay ended"))
		}
	case <-ctx.Done():
		r.Close()
		return nil, fmt.Errorf("docker %s: open stream to %s: %w", d.uri, path, ctx.Err())
	}
	d.mu.Lock()
	d.relays[r] = struct{}{}
	d.mu.Unlock()
	return r, nil
}

// headWriter keeps the first max bytes written to it and drops the rest.
type headWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (w *headWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := w.max - len(w.buf); room > 0 {
		w.buf = append(w.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (w *headWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}

// relayAck reads the relay's first line from the stream, byte by byte, so
// that nothing after it is taken from the caller; at most 512 bytes.
func relayAck(c net.Conn) string {
	var line []byte
	b := make([]byte, 1)
	for len(line) < 512 {
		n, err := c.Read(b)
		if n == 1 && b[0] == '\n' {
			break
		}
		line = append(line, b[:n]...)
		if err != nil {
			break
		}
	}
	return strings.TrimSpace(string(line))
}

// relayConn is a stream through the relay exec: reads come from the
// relay's demultiplexed stdout (through a pipe, for deadlines), writes go
// to its stdin.
type relayConn struct {
	net.Conn // the local end of the pipe: Read and read deadlines
	d        *Docker
	execID   string
	att      client.HijackedResponse
	remote   net.Conn
	once     sync.Once
}

func (r *relayConn) Write(p []byte) (int, error) { return r.att.Conn.Write(p) }

func (r *relayConn) SetDeadline(t time.Time) error {
	r.att.Conn.SetWriteDeadline(t)
	return r.Conn.SetDeadline(t)
}

func (r *relayConn) SetWriteDeadline(t time.Time) error { return r.att.Conn.SetWriteDeadline(t) }

// Close ends the relay: its stdin closes and it exits.
func (r *relayConn) Close() error {
	r.once.Do(func() {
		r.att.Close()
		r.Conn.Close()
		r.remote.Close()
		r.d.mu.Lock()
		delete(r.d.relays, r)
		r.d.mu.Unlock()
	})
	return nil
}

// RelayExecs are the exec ids of the streams open now (for tests that check
// nothing is left running).
func (d *Docker) RelayExecs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []string
	for r := range d.relays {
		ids = append(ids, r.execID)
	}
	return ids
}
