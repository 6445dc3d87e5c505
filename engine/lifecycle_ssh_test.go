package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
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

// A kernel on an ssh host works where its login works: it writes its home,
// /tmp and its cwd with the login's umask there (002 here, from its
// ~/.bashrc), and reads a file made in /tmp after it started.
func TestSSHKernelsWorkWhereTheirUserWorks(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	u := srv.User(t, "kdumask", sshdtest.UserOptions{})
	rc := filepath.Join(u.Home, ".bashrc")
	if err := os.WriteFile(rc, []byte("umask 002\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(rc) })
	h := enginetest.New(t, sshEnv(t, srv, u, nil), nil)
	h.Run("alice", "x = 1", 60*time.Second)
	late := filepath.Join("/tmp", fmt.Sprintf("kd-late-ssh-%d", os.Getpid()))
	if err := os.WriteFile(late, []byte("made after the kernel started"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(late)
	mine := fmt.Sprintf("kd-work-ssh-%d", os.Getpid())
	res := h.Run("alice", fmt.Sprintf(`import os
for p in [os.path.expanduser("~/.%[1]s"), "/tmp/%[1]s", "%[1]s"]:
    with open(p, "w") as f:
        f.write("x")
    print(oct(os.stat(p).st_mode & 0o777))
    os.remove(p)
print(open(%[2]q).read())
`, mine, late), 60*time.Second)
	if want := "0o664\n0o664\n0o664\nmade after the kernel started\n"; res.Status != engine.StatusSuccess || res.Stdout != want {
		k, _ := h.Kernel("alice")
		t.Errorf("confinement %s: the cell said %q %s, want %q", k.Confinement, res.Stdout, res.Traceback, want)
	}
}
