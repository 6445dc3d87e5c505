package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
)

// setupDocker adds the container rows: kerneldeck on docker:// (a running
// test container, as root, /tmp on a tmpfs) and on docker-image:// (a container per kernel),
// and the floor a per-command design pays, one exec of `true` through the
// same API. The test image is built from this machine's files
// (internal/dockertest).
func (e *setupEnv) setupDocker(ctx context.Context, t *tb, log io.Writer) error {
	fmt.Fprintf(log, "bench: building the docker test image and starting a container\n")
	// /tmp on a tmpfs, as docker-image:// gives its containers: on this
	// machine's fuse-overlayfs root the files a cell writes cost ~2.5 ms.
	name := dockertest.Container(t, dockertest.ContainerOptions{TmpfsTmp: true})
	image := dockertest.Image(t)
	env, err := backends.NewDocker("docker://"+name, backends.Options{})
	if err != nil {
		return err
	}
	t.Cleanup(func() { env.Close() })
	// The runners' pids are the container's own: there is no host process
	// to read their CPU from, so the docker rows report the bench's only.
	none := func() []int { return nil }
	dk, err := newKD(ctx, t, "docker", env, e.dir, kdConfig(), false, none)
	if err != nil {
		return err
	}
	dk.roots = none
	sandbox, err := backends.NewImageSandbox("docker-image://"+image, backends.Options{})
	if err != nil {
		return err
	}
	t.Cleanup(func() { sandbox.Close() })
	di, err := newKD(ctx, t, "docker-image", sandbox, e.dir, kdConfig(), false, none)
	if err != nil {
		return err
	}
	di.roots = none
	e.subjects = append(e.subjects, dk, &dockerFloor{cli: dockertest.Client(t), container: name}, di, &hostFloor{name: "floor.docker.container", p: sandbox})

	// As an agent meets them: through `kerneldeck headless`, a sandboxed
	// kernel without a pool and with one, beside the local backend.
	for _, h := range []struct {
		name, backend string
		spares        int
	}{{"headless.local", "local", 0}, {"headless.docker-image", "docker-image://" + image, 0}, {"headless.docker-image.pool", "docker-image://" + image, 1}} {
		s, err := newHeadless(ctx, t, h.name, e.bin, h.backend, h.spares)
		if err != nil {
			return err
		}
		e.subjects = append(e.subjects, s)
	}
	return nil
}

// dockerFloor is one exec of `true` through the Docker Engine API (create,
// attach, read to the end, inspect): the least a cell costs in a container
// when every cell is a command.
type dockerFloor struct {
	floor
	cli       *client.Client
	container string
}

func (f *dockerFloor) key() string     { return "floor.docker" }
func (f *dockerFloor) cpuRoots() []int { return nil }

func (f *dockerFloor) warm(ctx context.Context, n int) ([]time.Duration, error) {
	return timeEach(n, func() error {
		if err := f.once(ctx); err != nil {
			return fmt.Errorf("docker exec true: %w", err)
		}
		return nil
	})
}

func (f *dockerFloor) once(ctx context.Context) error {
	ex, err := f.cli.ExecCreate(ctx, f.container, client.ExecCreateOptions{AttachStdout: true, AttachStderr: true, Cmd: []string{"true"}})
	if err != nil {
		return err
	}
	att, err := f.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return err
	}
	defer att.Close()
	if _, err := stdcopy.StdCopy(io.Discard, io.Discard, att.Reader); err != nil {
		return err
	}
	for {
		info, err := f.cli.ExecInspect(ctx, ex.ID, client.ExecInspectOptions{})
		if err != nil {
			return err
		}
		if !info.Running {
			if info.ExitCode != 0 {
				return fmt.Errorf("exit %d", info.ExitCode)
			}
			return nil
		}
		time.Sleep(time.Millisecond)
	}
}

// hostFloor is what a kernel's own host (a docker-image:// container, a
// k8s-image:// pod) costs before anything runs in it: its making through
// the API with the backend's own options, until it runs (its removal is
// not timed). A cold start only.
type hostFloor struct {
	floor
	name string
	p    backends.Provisioner
	seq  int
}

func (f *hostFloor) key() string     { return f.name }
func (f *hostFloor) cpuRoots() []int { return nil }

func (f *hostFloor) warm(context.Context, int) ([]time.Duration, error) { return nil, nil }

func (f *hostFloor) cold(ctx context.Context) (time.Duration, tripCount, error) {
	f.seq++
	start := time.Now()
	env, err := f.p.Provision(ctx, fmt.Sprintf("floor/%d", f.seq))
	d := time.Since(start)
	if err != nil {
		return d, tripCount{}, err
	}
	return d, tripCount{}, env.(backends.Disposer).Dispose(ctx)
}
