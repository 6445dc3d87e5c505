package engine_test

import (
	"context"
	"os"
	"testing"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/enginetest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// sshEnv opens the ssh backend for u through an ssh config alias, with a
// private short temp dir on the "remote" side owned by u.
func sshEnv(t testing.TB, srv *sshdtest.Server, u *sshdtest.User, mutate func(*backends.Options)) *backends.SSH {
	t.Helper()
	tmp := enginetest.ShortTempDir(t)
	if err := os.Chown(tmp, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	opts := backends.Options{SSHConfig: srv.WriteSSHConfig(t, "kdbox", u), SSHTempDir: tmp}
	if mutate != nil {
		mutate(&opts)
	}
	env, err := backends.NewSSH("ssh://kdbox", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

// The whole lifecycle suite over a real sshd, for root and for a plain user,
// over the stream fast path and over plain Execute.
func TestSSHLifecycle(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	for _, name := range []string{"", "kdtest1"} {
		u := srv.User(t, name, sshdtest.UserOptions{})
		t.Run(u.Name+"/stream", func(t *testing.T) {
			enginetest.Lifecycle(t, func(t *testing.T) backends.Env { return sshEnv(t, srv, u, nil) })
		})
		t.Run(u.Name+"/execute", func(t *testing.T) {
			enginetest.Lifecycle(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(sshEnv(t, srv, u, nil)) })
		})
	}
}

// A server that forbids socket forwarding still runs kernels: the stream
// cannot be opened (OpenSSH answers "open failed", as for a dead socket), so
// every cell goes over plain Execute.
func TestSSHWithoutStreamForwarding(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{Config: []string{"AllowStreamLocalForwarding no"}})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	env := sshEnv(t, srv, u, nil)
	h := enginetest.New(t, env, nil)
	first := h.Run("a", "x = 20", 0)
	second := h.Run("a", "x * 2", 0)
	if second.Stdout != "40\n" || second.Kernel.PID != first.Kernel.PID || !second.Kernel.Reused {
		t.Fatalf("second cell: %q %+v", second.Stdout, second.Kernel)
	}
	if _, err := env.DialUnix(context.Background(), first.Kernel.Dir+"/sock"); err == nil {
		t.Fatal("the server was configured to refuse streams, but a stream opened: the test proves nothing")
	}
}

// The tool RPC suite over a real sshd: kernels on the remote side, tools on
// this machine, over the stream fast path and over plain Execute.
func TestSSHToolCalls(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	t.Run("stream", func(t *testing.T) {
		enginetest.ToolCalls(t, func(t *testing.T) backends.Env { return sshEnv(t, srv, u, nil) })
	})
	t.Run("execute", func(t *testing.T) {
		enginetest.ToolCalls(t, func(t *testing.T) backends.Env { return backends.ExecuteOnly(sshEnv(t, srv, u, nil)) })
	})
}

// One owner's kernel attacks another's of the same login over a real sshd,
// as a plain user (for whom being non-dumpable holds without Landlock) and
// as root.
func TestSSHIsolation(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	for _, name := range []string{"kdtest1", ""} {
		u := srv.User(t, name, sshdtest.UserOptions{})
		t.Run(u.Name, func(t *testing.T) {
			enginetest.Isolation(t, func(t *testing.T) backends.Env { return sshEnv(t, srv, u, nil) })
		})
	}
}

// Completion over a real sshd: the answer comes from the remote kernel's
// namespace, over a stream of its own.
func TestSSHCompletion(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	enginetest.Completion(t, sshEnv(t, srv, u, nil))
}

// input() in a kernel on a real sshd asks the caller here.
func TestSSHInput(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdtest1", sshdtest.UserOptions{})
	enginetest.Input(t, sshEnv(t, srv, u, nil))
}
