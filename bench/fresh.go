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
// run to fill it, as the first run on a machine does; historyMB, when
// positive, is an event log of that many MB written in it first (a month
// of a busy host's history).
func newFreshProcess(ctx context.Context, t *tb, name, bin string, env []string, mcpMode bool, historyMB int) (*freshProcess, error) {
	f := &freshProcess{name: name, bin: bin, mcp: mcpMode, state: filepath.Join(t.TempDir(), "state")}
	f.env = append(append([]string(nil), env...), "XDG_STATE_HOME="+filepath.Join(t.TempDir(), "xdg"))
	if historyMB > 0 {
		if err := writeHistory(filepath.Join(f.state, "events"), historyMB); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	if _, _, err := f.cold(ctx); err != nil {
		return nil, fmt.Errorf("%s: the first run: %w", name, err)
	}
	return f, nil
}

// writeHistory writes mb MB of events into the event log dir, in segments
// of 12 MB, as engines of the last hour would have.
func writeHistory(dir string, mb int) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	os.Chmod(filepath.Dir(dir), 0o700)
	now := time.Now().UTC()
	n := 0
	for seg := 0; n*300 < mb<<20; seg++ {
		var b []byte
		for len(b) < 12<<20 && n*300 < mb<<20 {
			at := now.Add(-time.Hour + time.Duration(n)*time.Millisecond)
			b = fmt.Appendf(b, `{"type":"cell_finished","time":%q,"kernel":"k%012d","owner":"o%d","detail":"cell c%08x: success in 1ms%0180d"}`+"\n",
				at.Format(time.RFC3339Nano), n, n%50, n, 0)
			n++
		}
		name := filepath.Join(dir, fmt.Sprintf("events-%s-%03d.jsonl", now.Format("2006-01-02"), seg))
		if err := os.WriteFile(name, b, 0o600); err != nil {
			return err
		}
	}
	return nil
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
