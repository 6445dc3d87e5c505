package engine_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine (an engine sweep, a kill, a
// runner connection reader, a blocked fake command) outlives the tests; each
// fake-Env test also checks this right after its engine's Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
