package engine_test

import (
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// Runners killed while idle, at random moments before the next cell, on
// every backend and through both doors: no cell runs twice, and no call
// fails for a cell that never started (issue 40).
func TestIdleDeathsNeverCostACall(t *testing.T) {
	t.Run("local/stream", func(t *testing.T) {
		enginetest.IdleDeaths(t, func(t *testing.T) backends.Env { return backends.NewLocal(enginetest.ShortTempDir(t)) }, 20)
	})
	t.Run("local/execute", func(t *testing.T) {
		enginetest.IdleDeaths(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(backends.NewLocal(t.TempDir())) }, 20)
	})
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	t.Run("ssh/stream", func(t *testing.T) {
		enginetest.IdleDeaths(t, func(t *testing.T) backends.Env { return sshEnv(t, srv, u, nil) }, 10)
	})
	t.Run("ssh/execute", func(t *testing.T) {
		enginetest.IdleDeaths(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(sshEnv(t, srv, u, nil)) }, 10)
	})
	name := dockertest.Container(t, dockertest.ContainerOptions{TmpfsTmp: true})
	t.Run("docker/stream", func(t *testing.T) {
		enginetest.IdleDeaths(t, func(t *testing.T) backends.Env { return dockerEnvOwnTemp(t, name, "") }, 10)
	})
	t.Run("docker/execute", func(t *testing.T) {
		enginetest.IdleDeaths(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(dockerEnvOwnTemp(t, name, "")) }, 10)
	})
}
