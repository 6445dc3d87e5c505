package backends_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/goleak"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
)

// newDocker opens docker://NAME[?user=U] on a test container.
func newDocker(t *testing.T, name, user string) *backends.Docker {
	return dockertest.Env(t, name, user, "")
}

// The backend contract in a real container, as root and as a plain user.
func TestDockerContract(t *testing.T) {
	name := dockertest.Container(t, dockertest.ContainerOptions{})
	for _, user := range []string{"", "alice"} {
		t.Run("user="+user, func(t *testing.T) {
			backendtest.Contract(t, func(t *testing.T) backends.Env { return newDocker(t, name, user) })
		})
	}
}

// TestDockerHalfClose: the output a command prints after its stdin ended
// (the exec's write side half-closed) still arrives, with the exit code;
// moby#36516 and moby#38457 are daemons where the half-close ended both
// directions or hung.
func TestDockerHalfClose(t *testing.T) {
	env := newDocker(t, dockertest.Container(t, dockertest.ContainerOptions{}), "")
	ctx := context.Background()
	for _, stdin := range []string{"", "payload\n"} {
		res, err := env.Execute(ctx, `cat >/dev/null; sleep 0.3; echo after-eof; exit 7`, backends.ExecOptions{Stdin: []byte(stdin), Timeout: 20 * time.Second})
		if err != nil || res.Output != "after-eof\n" || res.ReturnCode != 7 {
			t.Errorf("stdin %q: %q exit %d, %v; want the output after EOF and exit 7", stdin, res.Output, res.ReturnCode, err)
		}
	}
}

// TestDockerNoLeaks: commands, timeouts and streams leave no goroutine
// and no connection of a hijacked exec behind (nomad#24244 was such a leak).
func TestDockerNoLeaks(t *testing.T) {
	name := dockertest.Container(t, dockertest.ContainerOptions{})
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fds := openFDs(t)
	env, err := backends.NewDocker("docker://"+name, backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 5 {
		if res, err := env.Execute(ctx, "echo hi", backends.ExecOptions{}); err != nil || res.Output != "hi\n" {
			t.Fatalf("echo: %q %v", res.Output, err)
		}
	}
	if _, err := env.Execute(ctx, "sleep 30", backends.ExecOptions{Timeout: 300 * time.Millisecond}); err == nil {
		t.Fatal("sleep 30 with a 300ms timeout did not time out")
	}
	if _, err := env.DialUnix(ctx, "/nonexistent/sock"); err == nil || !strings.Contains(err.Error(), "No such file") {
		t.Errorf("a stream to a missing socket: %v", err)
	}
	env.Close()
	if after := openFDs(t); after > fds {
		t.Errorf("%d file descriptors open after, %d before: hijacked connections left open", after, fds)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestDockerOpenErrors: a bad URI, a container that does not exist, and a
// daemon that does not answer each give a clear error, and no hang.
func TestDockerOpenErrors(t *testing.T) {
	dockertest.Client(t)
	for _, tc := range []struct{ uri, want string }{
		{"docker://", "is not a container name or id"},
		{"docker://box?memory=1g", `unknown option "memory"`},
		{"docker://box/path", "nothing else"},
		{"docker://user@box", "nothing else"},
		{"docker://box?user=a%20b", "user must be one login name"},
		{"docker://kerneldeck-no-such-container", `container "kerneldeck-no-such-container"`},
	} {
		if _, err := backends.Open(tc.uri, backends.Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q) = %v, want an error with %q", tc.uri, err, tc.want)
		}
	}
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	_, err := backends.Open("docker://box", backends.Options{DockerTimeout: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "cannot reach the Docker Engine at unix:///nonexistent/docker.sock") {
		t.Errorf("unreachable daemon: %v", err)
	}
}

// TestTracedSandboxHosts: --trace records the commands run in a kernel's
// own container, not only those of the backend itself.
func TestTracedSandboxHosts(t *testing.T) {
	b, err := backends.NewImageSandbox("docker-image://"+dockertest.Image(t), backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	path := filepath.Join(t.TempDir(), "trace")
	tr, err := backends.OpenTracer(path)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	p, ok := backends.Find[backends.Provisioner](backends.Traced(b, tr))
	if !ok {
		t.Fatal("a traced docker-image backend is no Provisioner")
	}
	env, err := p.Provision(context.Background(), "t/default@x")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := env.Execute(context.Background(), "echo traced-in-the-box", backends.ExecOptions{}); err != nil || res.Output != "traced-in-the-box\n" {
		t.Fatalf("echo in the box: %q %v", res.Output, err)
	}
	tr.Close()
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), "echo traced-in-the-box") {
		t.Errorf("the trace lacks the command run in the kernel's container:\n%s", data)
	}
}

// The backend contract on kernels' own containers (docker-image://), one
// container per subtest, with the safe defaults (read-only root, tmpfs
// /tmp, no capabilities).
func TestDockerImageContract(t *testing.T) {
	b, err := backends.NewImageSandbox("docker-image://"+dockertest.Image(t), backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	backendtest.Contract(t, func(t *testing.T) backends.Env {
		env, err := b.Provision(context.Background(), "contract/"+t.Name())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { env.(backends.Disposer).Dispose(context.Background()) })
		return env
	})
	if left := b.Containers(); len(left) != 0 {
		t.Errorf("containers left: %v", left)
	}
}

// A container create whose answer never came (the engine closing just as
// its warm pool refilled) may have made the container: the backend
// removes it by name.
func TestDockerImageCreateWithoutAnAnswerLeavesNoContainer(t *testing.T) {
	b, err := backends.NewImageSandbox("docker-image://"+dockertest.Image(t), backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := backends.LoseContainerCreateAnswers(b); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Provision(context.Background(), "spare-lost"); err == nil || !strings.Contains(err.Error(), "the answer was lost") {
		t.Fatalf("Provision: %v, want the lost answer", err)
	}
	if left := dockertest.Managed(t); len(left) != 0 {
		for _, c := range left {
			dockertest.Client(t).ContainerRemove(context.Background(), c.ID, client.ContainerRemoveOptions{Force: true})
		}
		t.Fatalf("a create without an answer left %d containers: %v", len(left), left[0].Names)
	}
}
