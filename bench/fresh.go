package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// freshProcess is what an agent or a script waits for most often: a new
// `kerneldeck headless` (or `kerneldeck mcp`) process, from its start to
// the result of its first cell, with a state dir of its own kept from run
// to run as a user's is (so a run after the first finds what the earlier
// ones kept). It has no warm figure.
type freshProcess struct {
	name  string
	bin   string
	env   []string
	state string
	mcp   bool
}

func (f *freshProcess) key() string     { return f.name }
func (f *freshProcess) cpuRoots() []int { return nil }

func (f *freshProcess) trips() (tripCount, bool) { return tripCount{}, false }

func (f *freshProcess) warm(context.Context, int) ([]time.Duration, error) { return nil, nil }

func (f *freshProcess) cold(ctx context.Context) (time.Duration, tripCount, error) {
	if f.mcp {
		d, err := f.mcpFirst(ctx)
		return d, tripCount{}, err
	}
	d, err := f.headlessFirst(ctx)
	return d, tripCount{}, err
}

// newFreshProcess readies a fresh-process subject: its state dir, and one
// run to fill it, as the first run on a machine does.
func newFreshProcess(ctx context.Context, t *tb, name, bin string, env []string, mcpMode bool) (*freshProcess, error) {
	f := &freshProcess{name: name, bin: bin, mcp: mcpMode, state: filepath.Join(t.TempDir(), "state")}
	f.env = append(append([]string(nil), env...), "XDG_STATE_HOME="+filepath.Join(t.TempDir(), "xdg"))
	if _, _, err := f.cold(ctx); err != nil {
		return nil, fmt.Errorf("%s: the first run: %w", name, err)
	}
	return f, nil
}

func (f *freshProcess) headlessFirst(ctx context.Context) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, f.bin, "headless", "--state-dir", f.state)
	cmd.Env = f.env
	cmd.Stderr = io.Discard
	in, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer cmd.Wait()
	io.WriteString(in, `{"id":"1","op":"execute","code":"1"}`+"\n")
	in.Close()
	line, err := bufio.NewReader(out).ReadBytes('\n')
	d := time.Since(start)
	io.Copy(io.Discard, out)
	var ans struct{ Op, Stdout string }
	if err != nil || json.Unmarshal(line, &ans) != nil || ans.Op != "result" || ans.Stdout != "1\n" {
		return 0, fmt.Errorf("answer %q (%v)", line, err)
	}
	return d, nil
}

func (f *freshProcess) mcpFirst(ctx context.Context) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, f.bin, "mcp", "--state-dir", f.state)
	cmd.Env = f.env
	cmd.Stderr = io.Discard
	start := time.Now()
	c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "bench"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return 0, fmt.Errorf("kerneldeck mcp: %w", err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "python_exec", Arguments: map[string]any{"code": "1"}})
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	if out, _ := res.StructuredContent.(map[string]any); res.IsError || out["stdout"] != "1\n" {
		return 0, fmt.Errorf("python_exec answered %+v", res.StructuredContent)
	}
	return d, nil
}

// userPath is the PATH the bench was started with, before it put its own
// python3 first: the user's python3, a pyenv shim included.
var userPath = os.Getenv("PATH")
