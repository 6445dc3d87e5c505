package engine_test

import (
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
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
// container, and comes back in a new container.
func TestDockerImageParking(t *testing.T) {
	enginetest.Parking(t, imageSandbox(t, ""), enginetest.ParkingOptions{})
}
