package engine_test

import (
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
)

// The lifecycle suite on the real local backend, once over the socket fast
// path and once over plain Execute, which every backend must support.
func TestLocalLifecycle(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		enginetest.Lifecycle(t, func(t *testing.T) backends.Env { return backends.NewLocal(enginetest.ShortTempDir(t)) })
	})
	t.Run("execute", func(t *testing.T) {
		enginetest.Lifecycle(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(backends.NewLocal(t.TempDir())) })
	})
}

func TestLocalStreamsOutput(t *testing.T) {
	enginetest.StreamsOutput(t, backends.NewLocal(enginetest.ShortTempDir(t)))
}

// The tool RPC suite on the real local backend, over both doors.
func TestLocalToolCalls(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		enginetest.ToolCalls(t, func(t *testing.T) backends.Env { return backends.NewLocal(enginetest.ShortTempDir(t)) })
	})
	t.Run("execute", func(t *testing.T) {
		enginetest.ToolCalls(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(backends.NewLocal(t.TempDir())) })
	})
}

func TestLocalIsolation(t *testing.T) {
	enginetest.Isolation(t, func(t *testing.T) backends.Env { return backends.NewLocal(enginetest.ShortTempDir(t)) })
}

// What an onlooker (a dashboard, a subscriber) sees of an agent's cell.
func TestLocalWatching(t *testing.T) {
	enginetest.Watching(t, backends.NewLocal(enginetest.ShortTempDir(t)))
}

func TestLocalCompletion(t *testing.T) {
	enginetest.Completion(t, backends.NewLocal(enginetest.ShortTempDir(t)))
}

// input() asks the caller over both doors: the stream and, without one,
// the request files that the host-side wait forwards.
func TestLocalInput(t *testing.T) {
	t.Run("stream", func(t *testing.T) { enginetest.Input(t, backends.NewLocal(enginetest.ShortTempDir(t))) })
	t.Run("execute", func(t *testing.T) {
		enginetest.Input(t, backends.ExecuteOnly(backends.NewLocal(enginetest.ShortTempDir(t))))
	})
}
