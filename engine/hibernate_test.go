package engine_test

import (
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

func TestLocalHibernation(t *testing.T) {
	enginetest.Hibernation(t, backends.NewLocal(enginetest.ShortTempDir(t)), richPython)
}
