package engine_test

import (
	"strings"
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// TestKernelMemoryLimit: with kernel_memory set, a cell allocating past it
// gets MemoryError and the kernel keeps its state, on the local backend,
// over sshd and in a container.
func TestKernelMemoryLimit(t *testing.T) {
	limited := func(c *engine.Config) { c.KernelLimits = engine.KernelLimits{Memory: 256 << 20} }
	check := func(t *testing.T, env backends.Env) {
		h := enginetest.New(t, env, limited)
		first := h.Run("m", "x = 41", 0)
		big := h.Run("m", "b = bytearray(1 << 30)", 0)
		if big.Status != engine.StatusError || !strings.Contains(big.Traceback, "MemoryError") {
			t.Fatalf("a 1 GiB allocation under a 256 MiB limit: status %s traceback %q", big.Status, big.Traceback)
		}
		after := h.Run("m", "print(x + 1)", 0)
		if after.Stdout != "42\n" || after.Kernel.PID != first.Kernel.PID || after.Kernel.StateLost {
			t.Fatalf("after the MemoryError: stdout %q kernel %+v; want the same kernel with its state", after.Stdout, after.Kernel)
		}
		if small := h.Run("m", "s = bytearray(16 << 20); print(len(s))", 0); small.Stdout != "16777216\n" {
			t.Fatalf("16 MiB under the limit: %q %q", small.Stdout, small.Traceback)
		}
	}
	t.Run("local", func(t *testing.T) { check(t, backends.NewLocal(enginetest.ShortTempDir(t))) })
	t.Run("ssh", func(t *testing.T) {
		srv := sshdtest.Start(t, sshdtest.Options{})
		u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
		check(t, sshEnv(t, srv, u, nil))
	})
	t.Run("docker", func(t *testing.T) {
		check(t, dockerEnv(t, dockertest.Container(t, dockertest.ContainerOptions{}), "alice"))
	})
}
