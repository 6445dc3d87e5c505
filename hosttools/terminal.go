package hosttools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// TerminalResult is terminal's value.
type TerminalResult struct {
	ExitCode      int    `json:"exit_code"` // 128+N when killed by signal N
	Output        string `json:"output"`    // stdout and stderr interleaved
	TimedOut      bool   `json:"timed_out"`
	OutputClipped bool   `json:"output_clipped,omitempty"`
}

// pipeGrace bounds how long output is drained after the command's process
// group is gone: only a process that left the group (setsid) can still
// hold the pipe, and it must not hold the call.
const pipeGrace = 500 * time.Millisecond

// terminal runs `bash -c command` in the workspace. terminal is arbitrary
// code execution on the host by design; the operator's approval policy is
// its control, and cwd confinement only keeps relative paths meaning what
// the agent expects.
func (b *Builtins) terminal(ctx context.Context, call Call) (Result, error) {
	command, err := call.Args.Str("command", "")
	if err != nil {
		return Result{}, err
	}
	if strings.TrimSpace(command) == "" {
		return Result{}, fmt.Errorf("command is empty; send the bash command to run: %w", ErrInvalidArgs)
	}
	timeout, err := durationArg(call.Args, "timeout",
		orDefault(b.TerminalTimeout, DefaultTerminalTimeout), orDefault(b.TerminalMaxTimeout, MaxTerminalTimeout))
	if err != nil {
		return Result{}, err
	}
	dir := b.Workspace.root
	if cwd, err := call.Args.Str("cwd", ""); err != nil {
		return Result{}, err
	} else if cwd != "" {
		if dir, err = b.Workspace.Resolve(cwd); err != nil {
			return Result{}, err
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return Result{}, fmt.Errorf("cwd %s is not an existing directory in the workspace %s", dir, b.Workspace.root)
		}
	}
	out, err := runGroup(ctx, command, dir, timeout, orDefault(b.OutputLimit, DefaultOutputLimit))
	if err != nil {
		return Result{}, err
	}
	res := Result{Value: out}
	if out.TimedOut {
		res.addNote(fmt.Sprintf("timed out after %v; the command and everything it started were killed", timeout))
	}
	if out.OutputClipped {
		res.addNote(fmt.Sprintf("output clipped to its first %d bytes; redirect it to a file in the workspace and read_file it in parts", orDefault(b.OutputLimit, DefaultOutputLimit)))
	}
	return res, nil
}

// durationArg reads a timeout in seconds, refusing values out of (0, max].
func durationArg(args Args, name string, def, max time.Duration) (time.Duration, error) {
	secs, err := args.Num(name, def.Seconds())
	if err != nil {
		return 0, err
	}
	if !(secs > 0) || secs > max.Seconds() || math.IsInf(secs, 0) {
		return 0, fmt.Errorf("%s %v is out of range; send seconds greater than 0 and at most %v (default %v): %w",
			name, secs, max.Seconds(), def.Seconds(), ErrInvalidArgs)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// runGroup runs command in its own process group and kills the whole group
// at the timeout, on ctx's end, and also once bash has exited: a tool call
// must not leave background jobs behind (the same reason terminal drops
// background parameters).
func runGroup(ctx context.Context, command, dir string, timeout time.Duration, limit int) (TerminalResult, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return TerminalResult{}, fmt.Errorf("run command: output pipe: %w", err)
	}
	defer pr.Close()
	cmd := terminalCommand(command)
	cmd.Dir = dir
	cmd.Env = childEnv(os.Environ())
	cmd.Stdout, cmd.Stderr = pw, pw // one pipe: the output stays interleaved as written
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	pw.Close() // the child holds its own copy
	if err != nil {
		return TerminalResult{}, fmt.Errorf("run command: start bash: %w", err)
	}
	out := &capBuffer{limit: limit}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		io.Copy(out, pr) // ends when every holder of the write end is gone, or pr is closed
	}()
	exited := make(chan func() error, 1)
	go func() { exited <- awaitExit(cmd) }()

	pgid := cmd.Process.Pid
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var timedOut bool
	var reap func() error
	// Stopping asks the reaper first (it kills what escaped the group),
	// then kills the group.
	stopAll := func() {
		syscall.Kill(pgid, syscall.SIGTERM)
		select {
		case reap = <-exited:
		case <-time.After(2 * time.Second):
			syscall.Kill(-pgid, syscall.SIGKILL)
			reap = <-exited
		}
	}
	select {
	case reap = <-exited:
	case <-timer.C:
		timedOut = true
		stopAll()
	case <-ctx.Done():
		stopAll()
	}
	// bash has exited but is not reaped yet (see awaitExit), so the group
	// id cannot have been reused: this kill reaches only what it left behind.
	syscall.Kill(-pgid, syscall.SIGKILL)
	waitErr := reap()
	select {
	case <-copied:
	case <-time.After(pipeGrace):
		pr.Close() // an escaped (setsid) process still holds the pipe
		<-copied
	}
	if ctx.Err() != nil {
		return TerminalResult{}, fmt.Errorf("run command: %w", ctx.Err())
	}
	res := TerminalResult{Output: strings.ToValidUTF8(out.buf.String(), "\uFFFD"), TimedOut: timedOut, OutputClipped: out.dropped}
	var exitErr *exec.ExitError
	switch {
	case waitErr == nil:
	case errors.As(waitErr, &exitErr):
		res.ExitCode = exitErr.ExitCode()
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.ExitCode = 128 + int(ws.Signal())
		}
	default:
		return TerminalResult{}, fmt.Errorf("run command: wait for bash: %w", waitErr)
	}
	return res, nil
}

// childEnv is the host environment minus every KERNELDECK_ variable
// (compared case-insensitively): the RPC token and any other engine secret
// must never reach a command a kernel asked for.
func childEnv(environ []string) []string {
	env := make([]string, 0, len(environ))
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if len(name) >= len("KERNELDECK_") && strings.EqualFold(name[:len("KERNELDECK_")], "KERNELDECK_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// capBuffer keeps the first limit bytes written and discards the rest,
// still accepting them so the writer never blocks on a full pipe.
type capBuffer struct {
	buf     strings.Builder
	limit   int
	dropped bool
}

func (c *capBuffer) Write(p []byte) (int, error) {
	if room := c.limit - c.buf.Len(); room < len(p) {
		c.dropped = true
		c.buf.Write(p[:max(room, 0)])
	} else {
		c.buf.Write(p)
	}
	return len(p), nil
}
