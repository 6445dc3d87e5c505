package engine_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine (an engine sweep, a kill, a
// runner connection reader, a blocked fake command) outlives the tests; each
// fake-Env test also checks this right after its engine's Close.
//
// client-go's WebSocket exec keeps a heartbeat goroutine until its next
// ping (within 5 s) after a stream closed from this side: bounded, and not
// the engine's.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("k8s.io/client-go/tools/remotecommand.(*heartbeat).start"))
}
