package engine_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

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

// TestKernelCPUTimeLimit: a kernel that spins past kernel_cpu_time is
// ended by the kernel (SIGXCPU) and reported as having used up its CPU
// time, on the local backend and over sshd.
func TestKernelCPUTimeLimit(t *testing.T) {
	limited := func(c *engine.Config) { c.KernelLimits = engine.KernelLimits{CPUTime: time.Second} }
	check := func(t *testing.T, env backends.Env) {
		h := enginetest.New(t, env, limited)
		h.Run("c", "x = 1", 0)
		res := h.Run("c", "while True:\n    pass", 30*time.Second)
		if res.Kernel == nil || !res.Kernel.StateLost || !strings.Contains(res.Kernel.Note, "SIGXCPU: it used up its CPU time (kernel_cpu_time)") {
			t.Fatalf("a spinning cell under a 1 s CPU limit: status %s kernel %+v", res.Status, res.Kernel)
		}
	}
	t.Run("local", func(t *testing.T) { check(t, backends.NewLocal(enginetest.ShortTempDir(t))) })
	t.Run("ssh", func(t *testing.T) {
		srv := sshdtest.Start(t, sshdtest.Options{})
		u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
		check(t, sshEnv(t, srv, u, nil))
	})
}

// TestKernelMaxProcsLimit: under kernel_max_procs a cell that starts
// processes without end is refused more (the host's RLIMIT_NPROC, which
// counts the login's processes; root is exempt, so over sshd as a user)
// and the kernel keeps its state.
func TestKernelMaxProcsLimit(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	h := enginetest.New(t, sshEnv(t, srv, u, nil), func(c *engine.Config) { c.KernelLimits = engine.KernelLimits{MaxProcs: 40} })
	first := h.Run("p", "x = 41", 0)
	res := h.Run("p", "import subprocess\nps = []\ntry:\n    for i in range(200):\n        ps.append(subprocess.Popen(['sleep', '60']))\n"+
		"    print('all', len(ps))\nexcept OSError as e:\n    print('refused after', len(ps), type(e).__name__)\nfinally:\n"+
		"    for p in ps:\n        p.kill()\n        p.wait()", 0)
	var n int
	var kind string
	if _, err := fmt.Sscanf(res.Stdout, "refused after %d %s", &n, &kind); err != nil || n >= 40 || kind != "BlockingIOError" {
		t.Fatalf("200 processes under a limit of 40: stdout %q traceback %q; want refused with BlockingIOError before 40", res.Stdout, res.Traceback)
	}
	after := h.Run("p", "print(x + 1)", 0)
	if after.Stdout != "42\n" || after.Kernel.PID != first.Kernel.PID || after.Kernel.StateLost {
		t.Fatalf("after the refusals: stdout %q kernel %+v; want the same kernel with its state", after.Stdout, after.Kernel)
	}
}
