package engine_test

import (
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// Debian's python3 has cloudpickle, numpy and pandas (.ci/run installs
// them); PATH's may not.
const richPython = "/usr/bin/python3"

func TestLocalParking(t *testing.T) {
	enginetest.Parking(t, backends.NewLocal(enginetest.ShortTempDir(t)), enginetest.ParkingOptions{Python: richPython, Rich: true})
}
