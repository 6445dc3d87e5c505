package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// Debian's python3 has cloudpickle, numpy and pandas (.ci/run installs
// them); PATH's may not.
const richPython = "/usr/bin/python3"

func TestLocalParking(t *testing.T) {
	enginetest.Parking(t, backends.NewLocal(enginetest.ShortTempDir(t)), enginetest.ParkingOptions{Python: richPython, Rich: true})
}

// Over ssh, the parked bytes come back to the engine over the runner's
// forwarded stream, and go out again to the new runner.
func TestSSHParking(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	enginetest.Parking(t, sshEnv(t, srv, u, nil), enginetest.ParkingOptions{Python: richPython, Rich: true})
}

// A kernel in a container of its own parks through the relay into its
// container, and comes back in a new container (the image has Debian's
// numpy and pandas for it).
func TestDockerImageParking(t *testing.T) {
	b, err := backends.NewImageSandbox("docker-image://"+dockertest.DataImage(t), backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	enginetest.Parking(t, b, enginetest.ParkingOptions{Rich: true})
}

// A kernel cannot reach the parked states nor the park key: they rest in
// the engine's state dir, which a confined runner cannot open, so no
// kernel of the login can read another's parked state, forge a MAC or
// plant a file for another key.
func TestAKernelCannotReachTheParkedStates(t *testing.T) {
	h := enginetest.New(t, backends.NewLocal(enginetest.ShortTempDir(t)), func(c *engine.Config) {
		c.Python, c.ParkDir = richPython, filepath.Join(c.StateDir, "parked")
	})
	first := h.Run("alice", "secret = 'alice-only'", 0)
	if _, err := h.Eng.Park(context.Background(), first.Kernel.ID); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.StateDir, "parked")
	res := h.Run("bob", fmt.Sprintf(`import os
out = []
for what, f in [("list", lambda: os.listdir(%[1]q)), ("key", lambda: open(%[1]q + "/park.key", "rb").read()),
                ("plant", lambda: open(%[1]q + "/planted.park", "wb").write(b"x"))]:
    try:
        f()
        out.append(what + " ok")
    except OSError as e:
        out.append(what + " " + type(e).__name__)
print(", ".join(out))`, dir), 0)
	bob, _ := h.Kernel("bob")
	if strings.HasPrefix(bob.Confinement, "none") {
		t.Skipf("runners are not confined here (%s): the state dir is not closed to kernels of the login", bob.Confinement)
	}
	// Hidden under an empty mount, or denied by Landlock alone.
	if res.Stdout != "list FileNotFoundError, key FileNotFoundError, plant FileNotFoundError\n" &&
		res.Stdout != "list PermissionError, key PermissionError, plant PermissionError\n" {
		t.Fatalf("bob's kernel reached the parked states: %q %q", res.Stdout, res.Traceback)
	}
	if again := h.Run("alice", "print(secret)", 0); again.Stdout != "alice-only\n" || !again.Kernel.StateRestored {
		t.Fatalf("alice after bob's try: %q %+v", again.Stdout, again.Kernel)
	}
}

// In a shared container (docker://, every kernel a process in it), as a
// user of the image: the bytes come out over the stream through the
// container, as for a container of its own.
func TestDockerParking(t *testing.T) {
	name := dockertest.Container(t, dockertest.ContainerOptions{})
	enginetest.Parking(t, dockerEnvOwnTemp(t, name, "alice"), enginetest.ParkingOptions{})
}
