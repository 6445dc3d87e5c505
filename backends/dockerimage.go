package backends

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/kerneldeck/kerneldeck/internal/bytesize"
)

// Labels on the containers a docker-image backend creates.
const (
	LabelManaged = "io.kerneldeck.managed" // "1"
	LabelKey     = "io.kerneldeck.key"     // the kernel's key
	LabelEngine  = "io.kerneldeck.engine"  // host/pid/start of the engine's process
)

// Defaults of a per-kernel container.
const (
	DefaultContainerMemory = 512 << 20
	DefaultContainerPids   = 256
	defaultContainerTmp    = "size=256m"
)

// ImageSandbox is the docker-image://IMAGE backend: one container per kernel,
// created from IMAGE at the kernel's spawn with limits (no network, a
// memory and pids limit, no new privileges, no capabilities, a read-only
// root with a tmpfs /tmp), and removed when the kernel goes.
type ImageSandbox struct {
	uri    string
	image  string
	user   string
	memory int64
	cpus   int64 // nano CPUs; 0 is no limit
	pids   int64
	net    string
	engine string // this process, as the LabelEngine value
	cli    *client.Client
	orphan []string

	mu     sync.Mutex
	boxes  map[*sandboxBox]struct{}
	closed bool
}

// sandboxBox is one kernel's own container: a Docker host that can be
// disposed of and that can tell why its kernel died. Its streams go
// straight to the runner's socket through the container's root (this
// engine made the container, so it knows it is on this machine) and fall
// back to the relay exec where that root cannot be reached.
type sandboxBox struct {
	*Docker
	sandbox *ImageSandbox

	found  chan struct{}      // closed once root is settled
	root   *containerRoot     // nil: streams go through the relay
	cancel context.CancelFunc // ends the search for root
}

var (
	imageRef   = regexp.MustCompile(`^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?(@sha256:[a-f0-9]{64})?$`)
	netName    = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
	nameUnsafe = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)
)

// parseImageURI reads docker-image://IMAGE[?memory=512m&cpus=1&pids=256&network=none&user=U].
func parseImageURI(uri string) (*ImageSandbox, error) {
	usage := "want docker-image://IMAGE[?memory=512m&cpus=1&pids=256&network=none&user=USER]"
	rest, ok := strings.CutPrefix(uri, "docker-image://")
	if !ok {
		return nil, fmt.Errorf("backend %q: %s", uri, usage)
	}
	ref, query, _ := strings.Cut(rest, "?")
	if !imageRef.MatchString(ref) {
		return nil, fmt.Errorf("backend %q: %q is not an image reference (%s)", uri, ref, usage)
	}
	b := &ImageSandbox{uri: uri, image: ref, memory: DefaultContainerMemory, pids: DefaultContainerPids, net: "none"}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("backend %q: %v (%s)", uri, err, usage)
	}
	for k, v := range q {
		if len(v) != 1 {
			return nil, fmt.Errorf("backend %q: %s is given %d times", uri, k, len(v))
		}
		val := v[0]
		switch k {
		case "memory":
			n, err := bytesize.Parse(val)
			if err != nil || n < 6<<20 {
				return nil, fmt.Errorf("backend %q: memory must be a size of at least 6m such as 256m or 1g, got %q", uri, val)
			}
			b.memory = n
		case "cpus":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || f <= 0 || f > 1024 {
				return nil, fmt.Errorf("backend %q: cpus must be a number of CPUs such as 0.5 or 2, got %q", uri, val)
			}
			b.cpus = int64(f * 1e9)
		case "pids":
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil || n < 16 {
				return nil, fmt.Errorf("backend %q: pids must be a whole number of at least 16, got %q", uri, val)
			}
			b.pids = n
		case "network":
			if !netName.MatchString(val) || val == "host" || strings.HasPrefix(val, "container:") {
				return nil, fmt.Errorf("backend %q: network must be none, bridge or a network's name (not host), got %q", uri, val)
			}
			b.net = val
		case "user":
			if !userName.MatchString(val) {
				return nil, fmt.Errorf("backend %q: user must be one login name or uid, got %q", uri, val)
			}
			b.user = val
		default:
			return nil, fmt.Errorf("backend %q: unknown option %q; %s", uri, k, usage)
		}
	}
	return b, nil
}

// engineLabel names this process: host, pid and start time (a pid alone
// can be reused after the engine is gone).
func engineLabel() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), processStart(os.Getpid()))
}

// processStart is a process's start time in clock ticks since boot, from
// /proc; "" where it cannot be read.
func processStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		if f := strings.Fields(s[i+1:]); len(f) > 19 {
			return f[19]
		}
	}
	return ""
}

// engineGone reports whether the engine a LabelEngine value names ran on
// this host and is no longer running; engines of other hosts are not ours
// to judge.
func engineGone(label string) bool {
	host, _ := os.Hostname()
	parts := strings.Split(label, "/")
	if len(parts) != 3 || parts[0] != host {
		return false
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid <= 0 {
		return false
	}
	return processStart(pid) != parts[2]
}

// NewImageSandbox opens docker-image://IMAGE[?…]: it checks the image is
// there (nothing is pulled) and removes the containers an engine of this
// host that is gone left behind.
func NewImageSandbox(uri string, opts Options) (*ImageSandbox, error) {
	b, err := parseImageURI(uri)
	if err != nil {
		return nil, err
	}
	ctx, cancel, c, err := dialDocker(opts)
	if err != nil {
		return nil, err
	}
	defer cancel()
	if _, err := c.ImageInspect(ctx, b.image); err != nil {
		c.Close()
		return nil, fmt.Errorf("docker-image %s: image %q is not on the Docker Engine (%v); build or load it first, nothing is pulled", uri, b.image, err)
	}
	b.cli, b.engine, b.boxes = c, engineLabel(), map[*sandboxBox]struct{}{}
	if err := b.sweep(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return b, nil
}

// sweep removes the containers of engines on this host that are gone.
func (b *ImageSandbox) sweep(ctx context.Context) error {
	list, err := b.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", LabelManaged+"=1")})
	if err != nil {
		return fmt.Errorf("docker-image %s: list containers: %w", b.uri, err)
	}
	for _, s := range list.Items {
		if !engineGone(s.Labels[LabelEngine]) {
			continue
		}
		if _, err := b.cli.ContainerRemove(ctx, s.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("docker-image %s: remove the container %.12s left by a gone engine: %w", b.uri, s.ID, err)
		}
		name := strings.TrimPrefix(strings.Join(s.Names, ","), "/")
		b.orphan = append(b.orphan, fmt.Sprintf("container %s (kernel %s)", cmp.Or(name, s.ID[:12]), s.Labels[LabelKey]))
	}
	return nil
}

// OrphansRemoved implements OrphanReporter.
func (b *ImageSandbox) OrphansRemoved() []string { return b.orphan }

// URI implements Env.
func (b *ImageSandbox) URI() string { return b.uri }

// TempDir implements Env: every kernel's container has its tmpfs here.
func (b *ImageSandbox) TempDir() string { return "/tmp" }

// errNoHost is what commands on the backend itself get: only a kernel's
// container runs commands.
var errNoHost = errors.New("a docker-image backend runs commands only in a kernel's own container")

// Execute implements Env; commands run in kernels' containers (Provision).
func (b *ImageSandbox) Execute(context.Context, string, ExecOptions) (Result, error) {
	return Result{}, fmt.Errorf("docker-image %s: %w", b.uri, errNoHost)
}

// Provision implements Provisioner: a new container for the kernel key.
func (b *ImageSandbox) Provision(ctx context.Context, key string) (Env, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("docker-image %s: closed", b.uri)
	}
	suffix := make([]byte, 4)
	rand.Read(suffix)
	name := "kerneldeck-" + strings.Trim(nameUnsafe.ReplaceAllString(key, "-"), "-.")
	if len(name) > 48 {
		name = name[:48]
	}
	name += "-" + hex.EncodeToString(suffix)
	init, ro := true, true
	pids := b.pids
	hc := &container.HostConfig{
		Init:           &init,
		NetworkMode:    container.NetworkMode(b.net),
		ReadonlyRootfs: ro,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges:true"},
		Tmpfs:          map[string]string{"/tmp": "rw,nosuid,nodev,mode=1777," + defaultContainerTmp},
		Resources:      container.Resources{Memory: b.memory, MemorySwap: b.memory, NanoCPUs: b.cpus, PidsLimit: &pids},
	}
	cfg := &container.Config{
		Image:      b.image,
		User:       b.user,
		Entrypoint: []string{"sleep"},
		Cmd:        []string{"infinity"},
		Labels:     map[string]string{LabelManaged: "1", LabelKey: key, LabelEngine: b.engine},
	}
	res, err := b.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name, Config: cfg, HostConfig: hc})
	remove := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultDockerTimeout)
		defer cancel()
		b.cli.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true})
	}
	if err != nil {
		// A create given up (the engine closing) may have made it all the
		// same: its name is this call's alone.
		remove()
		return nil, fmt.Errorf("docker-image %s: create a container for %s: %w", b.uri, key, err)
	}
	if _, err := b.cli.ContainerStart(ctx, res.ID, client.ContainerStartOptions{}); err != nil {
		remove()
		return nil, fmt.Errorf("docker-image %s: start the container for %s: %w", b.uri, key, err)
	}
	d := &sandboxBox{Docker: &Docker{uri: b.uri + "#" + res.ID[:12], container: name, id: res.ID, user: b.user, tempDir: "/tmp",
		cli: b.cli, relays: map[*relayConn]struct{}{}}, sandbox: b, found: make(chan struct{})}
	b.mu.Lock()
	b.boxes[d] = struct{}{}
	b.mu.Unlock()
	// The container's pid is asked for while the caller spawns in it.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultDockerTimeout)
	d.cancel = cancel
	go d.findRoot(fctx)
	return d, nil
}

// findRoot opens the container's root through its first process, or
// leaves root nil (another machine's daemon, a process this user may not
// look into).
func (d *sandboxBox) findRoot(ctx context.Context) {
	defer close(d.found)
	defer d.cancel()
	info, err := d.cli.ContainerInspect(ctx, d.id, client.ContainerInspectOptions{})
	if err != nil || info.Container.State == nil || !info.Container.State.Running {
		return
	}
	if r, err := openContainerRoot(info.Container.State.Pid, d.id); err == nil {
		d.root = r
	}
}

// DialUnix implements StreamDialer: straight to the socket through the
// container's root, else through a relay exec.
func (d *sandboxBox) DialUnix(ctx context.Context, path string) (net.Conn, error) {
	select {
	case <-d.found:
	case <-ctx.Done():
		return nil, fmt.Errorf("docker-image %s: open stream to %s: %w", d.uri, path, ctx.Err())
	}
	if d.root != nil {
		if c, err := d.root.DialUnix(ctx, path); err == nil {
			return c, nil
		}
	}
	return d.Docker.DialUnix(ctx, path)
}

// Containers are the ids of the containers of kernels now (for tests that
// check nothing is left).
func (b *ImageSandbox) Containers() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ids []string
	for d := range b.boxes {
		ids = append(ids, d.id)
	}
	return ids
}

// Close removes the containers still there and releases the client.
func (b *ImageSandbox) Close() error {
	b.mu.Lock()
	b.closed = true
	boxes := make([]*sandboxBox, 0, len(b.boxes))
	for d := range b.boxes {
		boxes = append(boxes, d)
	}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, d := range boxes {
		errs = append(errs, d.Dispose(ctx))
	}
	errs = append(errs, b.cli.Close())
	return errors.Join(errs...)
}

// Dispose implements Disposer for a kernel's own container: it is removed,
// with everything running in it.
func (d *sandboxBox) Dispose(ctx context.Context) error {
	d.Close()
	d.cancel()
	<-d.found
	if d.root != nil {
		d.root.Close()
	}
	_, err := d.cli.ContainerRemove(ctx, d.id, client.ContainerRemoveOptions{Force: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("docker-image %s: remove container %s: %w", d.sandbox.uri, d.container, err)
	}
	d.sandbox.mu.Lock()
	delete(d.sandbox.boxes, d)
	d.sandbox.mu.Unlock()
	return nil
}

// Place implements Placement: the container, by name.
func (d *sandboxBox) Place() Place { return Place{Kind: "container", Name: d.container} }

// DeathCause implements DeathExplainer for a kernel's own container: the
// kernel OOM killer's work, or the container's end.
func (d *sandboxBox) DeathCause(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultDockerTimeout)
	defer cancel()
	info, err := d.cli.ContainerInspect(ctx, d.id, client.ContainerInspectOptions{})
	switch {
	case err != nil:
		return "its container is gone"
	case info.Container.State == nil:
		return ""
	case info.Container.State.OOMKilled:
		return fmt.Sprintf("out of memory: killed for exceeding its container's memory limit of %dm", d.sandbox.memory>>20)
	case !info.Container.State.Running:
		return fmt.Sprintf("its container stopped (%s, exit %d)", info.Container.State.Status, info.Container.State.ExitCode)
	}
	if cgroupOOMKilled(ctx, d) {
		return fmt.Sprintf("out of memory: killed for exceeding its container's memory limit of %dm", d.sandbox.memory>>20)
	}
	return ""
}
