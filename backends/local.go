package backends

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Local runs commands with bash as the current user on this machine.
type Local struct {
	tempDir string
}

// NewLocal returns the local backend. tempDir is where kernel roots go; empty
// means os.TempDir().
func NewLocal(tempDir string) *Local {
	if tempDir == "" {
		tempDir = os.TempDir()
	}
	return &Local{tempDir: tempDir}
}

// URI implements Env.
func (l *Local) URI() string { return "local" }

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
