package backends

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
	"time"
)

// Local runs commands with bash on this machine: as the current user, or,
// made by AsUser on a root engine, as another OS user.
type Local struct {
	tempDir string
	as      *osUser // nil: the engine's own user
}

// osUser is the OS user a Local made by AsUser runs commands as.
type osUser struct {
	login    string
	uid, gid uint32
	groups   []uint32
	home     string
}

// UserSwitcher is a backend that can run kernels as another OS user of its
// host, so that the OS keeps them from the engine's user and from each
// other: a root engine gives each member of its group kernels of their
// own uid there.
type UserSwitcher interface {
	// AsUser returns the backend as the OS user uid, whose URI says so.
	AsUser(uid int) (Env, error)
}

// ErrNotRoot means the engine cannot run commands as another user.
var ErrNotRoot = errors.New("only an engine running as root can run kernels as other users")

// AsUser implements UserSwitcher: commands run as uid, with its groups,
// its HOME and a plain PATH, none of the engine's environment. Kernel
// roots go in the shared temp dir: the engine's own may be closed to
// others.
func (l *Local) AsUser(uid int) (Env, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	if l.as != nil && int(l.as.uid) == uid {
		return l, nil // the member named its own
	}
	if l.as != nil || uid <= 0 {
		return nil, fmt.Errorf("local: no kernels as uid %d on %s", uid, l.URI())
	}
	u, err := user.LookupId(strconv.Itoa(uid))
	if err != nil {
		return nil, fmt.Errorf("local: uid %d: %w", uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("local: user %s: group id %q: %w", u.Username, u.Gid, err)
	}
	as := &osUser{login: u.Username, uid: uint32(uid), gid: uint32(gid), home: u.HomeDir}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("local: the groups of user %s: %w", u.Username, err)
	}
	for _, g := range ids {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			as.groups = append(as.groups, uint32(n))
		}
	}
	temp := l.tempDir
	if st, err := os.Stat(temp); err != nil || st.Mode().Perm()&0o002 == 0 || st.Mode()&os.ModeSticky == 0 {
		temp = "/tmp"
	}
	return &Local{tempDir: temp, as: as}, nil
}

// AsKernelUID returns the backend as uid, an OS user id of no login (one
// of a root engine's kernel_uids), whose URI says so (local?uid=N):
// commands run as uid, gid uid, no supplementary groups, in home (HOME)
// with a plain PATH and none of the engine's environment.
func (l *Local) AsKernelUID(uid uint32, home string) (Env, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	if l.as != nil || uid == 0 {
		return nil, fmt.Errorf("local: no kernels as uid %d on %s", uid, l.URI())
	}
	temp := l.tempDir
	if st, err := os.Stat(temp); err != nil || st.Mode().Perm()&0o002 == 0 || st.Mode()&os.ModeSticky == 0 {
		temp = "/tmp"
	}
	return &Local{tempDir: temp, as: &osUser{uid: uid, gid: uid, home: home}}, nil
}

// NewLocal returns the local backend. tempDir is where kernel roots go; empty
// means os.TempDir().
func NewLocal(tempDir string) *Local {
	if tempDir == "" {
		tempDir = os.TempDir()
	}
	return &Local{tempDir: tempDir}
}

// URI implements Env: local, or local?user=LOGIN for another OS user.
func (l *Local) URI() string {
	switch {
	case l.as == nil:
		return "local"
	case l.as.login == "":
		return fmt.Sprintf("local?uid=%d", l.as.uid)
	}
	return "local?user=" + l.as.login
}

// TempDir implements Env.
func (l *Local) TempDir() string { return l.tempDir }

// Execute implements Env by running `bash -c command` in its own process
// group, which is killed whole when ctx ends or the timeout passes.
func (l *Local) Execute(ctx context.Context, command string, opts ExecOptions) (Result, error) {
	parent := ctx
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, "bash", "-c", command)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if u := l.as; u != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
		login := cmp.Or(u.login, fmt.Sprintf("uid%d", u.uid))
		cmd.Env = []string{"HOME=" + u.home, "USER=" + login, "LOGNAME=" + login, "SHELL=/bin/bash",
			"PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C.UTF-8"}
		cmd.Dir = "/"
		if st, err := os.Stat(u.home); err == nil && st.IsDir() {
			cmd.Dir = u.home
		}
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A detached grandchild that kept our pipe open must not hold Wait forever.
	cmd.WaitDelay = 500 * time.Millisecond
	cmd.Stdin = bytes.NewReader(opts.Stdin)
	out := &cappedBuffer{limit: maxOutput}
	cmd.Stdout = out
	cmd.Stderr = out
	err := cmd.Run()
	res := Result{Output: out.String()}
	if ctx.Err() != nil {
		// The caller's own deadline or cancel is theirs, not our Timeout.
		if parent.Err() != nil {
			return res, fmt.Errorf("local: %w", parent.Err())
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return res, fmt.Errorf("local: %w after %v", ErrTimeout, opts.Timeout)
		}
		return res, fmt.Errorf("local: %w", ctx.Err())
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		res.ReturnCode = exitErr.ExitCode()
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.ReturnCode = 128 + int(ws.Signal())
		}
	case errors.Is(err, exec.ErrWaitDelay):
		// bash finished; only a detached child kept the pipe. The output is complete.
		res.ReturnCode = cmd.ProcessState.ExitCode()
	default:
		return res, fmt.Errorf("local: run bash: %w", err)
	}
	return res, nil
}

// DialUnix implements StreamDialer.
func (l *Local) DialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", path)
}
