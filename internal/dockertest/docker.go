package dockertest

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/kerneldeck/kerneldeck/backends"
)

// RequireEnv, set to 1, makes a missing or unreachable Docker Engine a test
// failure instead of a skip (CI sets it where the daemon runs).
const RequireEnv = "KERNELDECK_REQUIRE_DOCKER"

// Client returns a client for the Docker Engine DOCKER_HOST names (the
// local socket by default), or skips the test when no daemon answers.
func Client(t testing.TB) *client.Client {
	t.Helper()
	c, err := client.New(client.FromEnv, client.WithAPIVersionNegotiation())
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = c.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
		cancel()
	}
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("no Docker Engine answers (%v), and %s=1 makes that a failure: start dockerd", err, RequireEnv)
		}
		t.Skipf("no Docker Engine answers: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ContainerOptions shape a test container.
type ContainerOptions struct {
	// Memory limits the container (bytes); 0 is none.
	Memory int64
	// Labels are set on the container.
	Labels map[string]string
	// TmpfsTmp mounts a tmpfs on /tmp (where kernels live): the image's
	// root may be on a slow storage driver (fuse-overlayfs here).
	TmpfsTmp bool
}

// Container starts a container from the test image (sleep infinity under
// docker's init, so orphans are reaped) and removes it when the test ends.
// It returns the container's name.
func Container(t testing.TB, opts ContainerOptions) string {
	t.Helper()
	c := Client(t)
	image := Image(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "kerneldeck-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	init := true
	hc := &container.HostConfig{Init: &init, NetworkMode: "none", Resources: container.Resources{Memory: opts.Memory}}
	if opts.TmpfsTmp {
		hc.Tmpfs = map[string]string{"/tmp": "rw,mode=1777,size=256m"}
	}
	res, err := c.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name:       name,
		Config:     &container.Config{Image: image, Labels: opts.Labels},
		HostConfig: hc,
	})
	if err != nil {
		t.Fatalf("create a test container: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c.ContainerRemove(ctx, res.ID, client.ContainerRemoveOptions{Force: true})
	})
	if _, err := c.ContainerStart(ctx, res.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatalf("start the test container: %v", err)
	}
	return name
}

// Managed lists the containers a docker-image backend of this process
// made (label io.kerneldeck.engine naming this pid), running or not.
func Managed(t testing.TB) []container.Summary {
	t.Helper()
	return ManagedBy(t, os.Getpid())
}

// ManagedBy lists the containers a docker-image backend of process pid made.
func ManagedBy(t testing.TB, pid int) []container.Summary {
	t.Helper()
	c := Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := c.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", "io.kerneldeck.managed=1")})
	if err != nil {
		t.Fatalf("list containers: %v", err)
	}
	host, _ := os.Hostname()
	mine := host + "/" + strconv.Itoa(pid) + "/"
	var out []container.Summary
	for _, s := range list.Items {
		if strings.HasPrefix(s.Labels["io.kerneldeck.engine"], mine) {
			out = append(out, s)
		}
	}
	return out
}

// Env opens docker://name[?user=U] (the container's own temp dir unless
// tempDir is set) and closes it when the test ends.
func Env(t testing.TB, name, user, tempDir string) *backends.Docker {
	t.Helper()
	uri := "docker://" + name
	if user != "" {
		uri += "?user=" + user
	}
	env, err := backends.NewDocker(uri, backends.Options{DockerTempDir: tempDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}
