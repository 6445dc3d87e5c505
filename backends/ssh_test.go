package backends_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
	"github.com/kerneldeck/kerneldeck/internal/proctest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// newSSH opens the ssh backend for u on srv through a generated ssh config
// alias, as an operator would set it up.
func newSSH(t *testing.T, srv *sshdtest.Server, u *sshdtest.User) *backends.SSH {
	t.Helper()
	cfg := srv.WriteSSHConfig(t, "kdbox", u)
	env, err := backends.NewSSH("ssh://kdbox", backends.Options{SSHConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

func TestSSHContract(t *testing.T) {
	srv := sshdtest.Start(t, sshdtest.Options{})
	for _, name := range []string{"", "kdtest1"} {
		u := srv.User(t, name, sshdtest.UserOptions{})
		t.Run("user="+u.Name, func(t *testing.T) {
			backendtest.Contract(t, func(t *testing.T) backends.Env { return newSSH(t, srv, u) })
		})
	}
}

// sshHeld opens the ssh backend with maxSessions sessions, on an sshd with
// the given config lines, and starts a command that holds a session for
// hold; it returns once that command runs, with the channel of its error.
func sshHeld(t *testing.T, maxSessions int, config []string, hold time.Duration) (*backends.SSH, <-chan error) {
	t.Helper()
	srv := sshdtest.Start(t, sshdtest.Options{Config: config})
	u := srv.User(t, "", sshdtest.UserOptions{})
	cfg := srv.WriteSSHConfig(t, "kdbox", u)
	env, err := backends.NewSSH("ssh://kdbox", backends.Options{SSHConfig: cfg, SSHMaxSessions: maxSessions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	started := filepath.Join(t.TempDir(), "started")
	holding := make(chan error, 1)
	go func() {
		_, err := env.Execute(context.Background(), fmt.Sprintf(": >%s; sleep %g", backends.ShellQuote(started), hold.Seconds()), backends.ExecOptions{})
		holding <- err
	}()
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(started); err == nil {
			return env, holding
		}
		if time.Now().After(end) {
			t.Fatal("the holding command did not start within 20 s")
		}
	}
}

// A command's Timeout bounds the command, not its wait behind the
// connection's other commands for a free session (SSHMaxSessions): under a
// burst, a spawn that queued must not time out before it ran. The caller's
// ctx still bounds the wait, and a wait it ends says the command never
// reached the host.
func TestSSHTimeoutStartsWithTheSession(t *testing.T) {
	env, holding := sshHeld(t, 1, nil, 8*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := env.Execute(ctx, "echo late", backends.ExecOptions{}); !errors.Is(err, backends.ErrNotStarted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a caller's deadline that ended the wait for a session: %v; want its deadline and ErrNotStarted", err)
	}
	start := time.Now()
	res, err := env.Execute(context.Background(), "echo queued", backends.ExecOptions{Timeout: 4 * time.Second})
	if err != nil || strings.TrimSpace(res.Output) != "queued" {
		t.Fatalf("a command with Timeout 4s queued behind an 8 s one (waited %v): %v, %q; want it run", time.Since(start), err, res.Output)
	}
	if err := <-holding; err != nil {
		t.Fatal(err)
	}
}

// A timed-out command's process group is killed even while sshd refuses a
// new session (MaxSessions 2: another command and the timed-out one hold
// both): the kill waits for one to free up, instead of leaving the group
// to run on.
func TestSSHTimeoutKillsTheGroupWhenSessionsAreScarce(t *testing.T) {
	env, holding := sshHeld(t, 2, []string{"MaxSessions 2"}, 8*time.Second)
	pidFile := filepath.Join(t.TempDir(), "pid")
	_, err := env.Execute(context.Background(), "sleep 60 & echo $! >"+backends.ShellQuote(pidFile)+"; wait", backends.ExecOptions{Timeout: 3 * time.Second})
	if !errors.Is(err, backends.ErrTimeout) {
		t.Fatalf("sleep 60 with Timeout 3s: %v; want ErrTimeout", err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pid file %q", b)
	}
	proctest.WaitDead(t, pid, 20*time.Second)
	if err := <-holding; err != nil {
		t.Fatal(err)
	}
}
