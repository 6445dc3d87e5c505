package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/client"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/server"
)

// The shared engine (issue 13): what a connection through `headless
// --connect` adds to a warm cell, what attached dashboards cost the engine,
// and whether ten of them slow a cell.

// dashboardRole, in the environment, makes the bench binary a dashboard's
// client of the engine at $KDBENCH_SOCK instead of the bench: what an
// attached dashboard asks of an engine (hello, a subscription with history
// and cell output, a kernels snapshot every second), in a process of its
// own so that its CPU is not the engine's. (The same options as
// `kerneldeck --attach`.)
const dashboardRole = "KDBENCH_ROLE_DASHBOARD"

// runDashboardRole is the bench binary in that role; it ends with stdin.
func runDashboardRole() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	conn, err := client.Dial(ctx, os.Getenv("KDBENCH_SOCK"), client.DialOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	c, err := client.New(ctx, conn, conn.Where, client.Options{Since: time.Hour, Output: true, Batch: 50 * time.Millisecond})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		for range c.Events() {
		}
	}()
	fmt.Println("attached")
	io.Copy(io.Discard, os.Stdin)
	c.Close()
	os.Exit(0)
}

// servePhase measures the shared engine.
func servePhase(ctx context.Context, cfg config, env *setupEnv, res *results, log io.Writer) {
	t := newTB("serve", log)
	defer t.close()
	connectOverhead(ctx, t, cfg, res, log)
	dashboardCost(ctx, t, cfg, res, log)
}

// lineProc is a kerneldeck process spoken to in JSON lines.
type lineProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
	n   int
}

func startLineProc(t *tb, env []string, bin string, args ...string) (*lineProc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	return &lineProc{cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20)}, nil
}

// cell runs one trivial cell and returns its round trip.
func (p *lineProc) cell() (time.Duration, error) {
	p.n++
	req := `{"id":"` + strconv.Itoa(p.n) + `","op":"execute","owner":"bench","code":"1"}` + "\n"
	start := time.Now()
	if _, err := io.WriteString(p.in, req); err != nil {
		return 0, err
	}
	line, err := p.out.ReadBytes('\n')
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	var ans struct{ Op, Stdout string }
	if json.Unmarshal(line, &ans) != nil || ans.Op != "result" || ans.Stdout != "1\n" {
		return 0, fmt.Errorf("answer %q", line)
	}
	return d, nil
}

// cellRunner runs one trivial warm cell and returns its round trip.
type cellRunner interface {
	cell() (time.Duration, error)
}

// mcpProc is `kerneldeck mcp` on stdio, driven by the MCP SDK's client.
type mcpProc struct {
	ctx context.Context
	cs  *mcp.ClientSession
}

func startMCPProc(ctx context.Context, t *tb, env []string, bin string, args ...string) (*mcpProc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stderr = io.Discard
	c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "bench"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return nil, fmt.Errorf("kerneldeck mcp: %w", err)
	}
	t.Cleanup(func() { cs.Close() })
	return &mcpProc{ctx: ctx, cs: cs}, nil
}

func (p *mcpProc) cell() (time.Duration, error) {
	start := time.Now()
	res, err := p.cs.CallTool(p.ctx, &mcp.CallToolParams{Name: "python_exec", Arguments: map[string]any{"code": "1"}})
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	out, _ := res.StructuredContent.(map[string]any)
	if res.IsError || out["stdout"] != "1\n" {
		return 0, fmt.Errorf("python_exec answered %+v", res.StructuredContent)
	}
	return d, nil
}

// buildKerneldeck builds the binary the phase runs.
func buildKerneldeck(t *tb) (string, error) {
	bin := filepath.Join(t.TempDir(), "kerneldeck")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/kerneldeck/kerneldeck").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v: %s", err, out)
	}
	return bin, nil
}

// connectOverhead: the same warm cell through an embedded `kerneldeck
// headless` and through `kerneldeck headless --connect` to `kerneldeck
// serve`, in alternating blocks; per round the difference of the p50s.
func connectOverhead(ctx context.Context, t *tb, cfg config, res *results, log io.Writer) {
	bin, err := buildKerneldeck(t)
	if err != nil {
		res.fail("serve: %v", err)
		return
	}
	dir := shortTempDir(t)
	env := append(os.Environ(), "TMPDIR="+dir, "XDG_RUNTIME_DIR=")
	embedded, err := startLineProc(t, env, bin, "headless", "--state-dir", filepath.Join(dir, "s1"))
	if err != nil {
		res.fail("serve: %v", err)
		return
	}
	sock := filepath.Join(dir, "run", "engine.sock")
	serve := exec.Command(bin, "serve", "--listen", sock, "--state-dir", filepath.Join(dir, "s2"))
	serve.Env = env
	if err := serve.Start(); err != nil {
		res.fail("serve: %v", err)
		return
	}
	t.Cleanup(func() { serve.Process.Signal(syscall.SIGTERM); serve.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			res.fail("serve: the engine never listened on %s", sock)
			return
		}
	}
	connected, err := startLineProc(t, env, bin, "headless", "--connect", sock)
	if err != nil {
		res.fail("serve: %v", err)
		return
	}
	handed, err := startLineProc(t, env, bin, "headless", "--connect", sock, "--no-reconnect")
	if err != nil {
		res.fail("serve: %v", err)
		return
	}
	mcpc, err := startMCPProc(ctx, t, env, bin, "mcp", "--owner", "bench", "--state-dir", filepath.Join(dir, "s3"))
	if err != nil {
		res.fail("serve: %v", err)
		return
	}
	subjects := []cellRunner{embedded, connected, mcpc, handed}
	for _, p := range subjects {
		for range cfg.Warmup {
			if _, err := p.cell(); err != nil {
				res.fail("serve: warm-up cell: %v", err)
				return
			}
		}
	}
	block := max(1, cfg.Warm/cfg.Blocks)
	for r := range cfg.Rounds {
		lat := make([][]float64, len(subjects))
		for b := range len(subjects) * cfg.Blocks {
			i := (b + r) % len(subjects)
			for range block {
				if ctx.Err() != nil {
					return
				}
				d, err := subjects[i].cell()
				if err != nil {
					res.fail("serve: cell: %v", err)
					return
				}
				lat[i] = append(lat[i], ms(d))
			}
		}
		e, c, m, h := quantile(lat[0], 0.5), quantile(lat[1], 0.5), quantile(lat[2], 0.5), quantile(lat[3], 0.5)
		res.add("serve.embedded.p50", e)
		res.add("serve.connect.p50", c)
		res.add("serve.connect.extra", c-e)
		res.add("serve.connect_no_reconnect.p50", h)
		res.add("serve.connect_no_reconnect.extra", h-e)
		res.add("serve.mcp.p50", m)
		res.add("serve.mcp.extra", m-e)
		fmt.Fprintf(log, "bench: serve round %d/%d: embedded %.3fms, --connect %.3fms (+%.3f), --no-reconnect %.3fms (+%.3f), mcp %.3fms (+%.3f)\n",
			r+1, cfg.Rounds, e, c, c-e, h, h-e, m, m-e)
	}
}

// cpuSeconds is this process's CPU time so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// servedFleet is an engine in this process holding n registered kernels
// (fake host) besides its local backend, served on a socket (its path).
func servedFleet(ctx context.Context, t *tb, n int) (*engine.Engine, string, error) {
	eng, err := scaleEngine(ctx, t, n)
	if err != nil {
		return nil, "", err
	}
	if err := register(ctx, eng, n); err != nil {
		return nil, "", err
	}
	sock := filepath.Join(shortTempDir(t), "engine.sock")
	srv, err := server.Listen(eng, server.Options{Path: sock})
	if err != nil {
		return nil, "", err
	}
	go srv.Serve()
	t.Cleanup(func() { srv.Shutdown(context.Background(), "bench over") })
	return eng, sock, nil
}

// dashboardCost: an engine in this process holding 1,000 kernels, served on
// a socket; its CPU over a window with no dashboard, one and ten attached
// (each a process of its own); and a warm cell with none and with ten.
func dashboardCost(ctx context.Context, t *tb, cfg config, res *results, log io.Writer) {
	eng, sock, err := servedFleet(ctx, t, 1000)
	if err != nil {
		res.fail("serve: %v", err)
		return
	}
	self, err := os.Executable()
	if err != nil {
		res.fail("serve: %v", err)
		return
	}
	type dashboardProc struct {
		cmd *exec.Cmd
		in  io.WriteCloser
	}
	var attached []dashboardProc
	attach := func(n int) error {
		for range n {
			// Killed with the bench's context, so a child that never
			// attaches cannot hold the read below for ever.
			cmd := exec.CommandContext(ctx, self)
			cmd.Env = append(os.Environ(), dashboardRole+"=1", "KDBENCH_SOCK="+sock)
			in, _ := cmd.StdinPipe()
			out, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				return err
			}
			attached = append(attached, dashboardProc{cmd, in})
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil || strings.TrimSpace(line) != "attached" {
				return fmt.Errorf("a dashboard client did not attach: %q %v", line, err)
			}
		}
		return nil
	}
	detachAll := func() {
		for _, d := range attached {
			d.in.Close()
			d.cmd.Wait()
		}
		attached = nil
	}
	t.Cleanup(detachAll)
	cpu := func() float64 {
		// A dashboard that attaches first gets the last hour replayed (the
		// kernels' registration here): a one-off, let it pass.
		select {
		case <-time.After(cfg.CPUSettle):
		case <-ctx.Done():
		}
		start, c0 := time.Now(), cpuSeconds()
		select {
		case <-time.After(cfg.CPUWindow):
		case <-ctx.Done():
		}
		return 100 * (cpuSeconds() - c0) / time.Since(start).Seconds()
	}
	warm := func() (float64, error) {
		var xs []float64
		for range cfg.ScaleCells {
			s := time.Now()
			if _, err := kdRun(ctx, eng, engine.Request{Owner: "warm", Code: "1"}, "1\n"); err != nil {
				return 0, err
			}
			xs = append(xs, ms(time.Since(s)))
		}
		return quantile(xs, 0.5), nil
	}
	for r := range cfg.Rounds {
		idle := cpu()
		c0, err := warm()
		if err != nil {
			res.fail("serve: warm cell: %v", err)
			return
		}
		if err := attach(1); err != nil {
			res.fail("serve: %v", err)
			return
		}
		one := cpu()
		if err := attach(9); err != nil {
			res.fail("serve: %v", err)
			return
		}
		ten := cpu()
		c10, err := warm()
		if err != nil {
			res.fail("serve: warm cell: %v", err)
			return
		}
		detachAll()
		res.add("serve.cpu.idle", idle)
		res.add("serve.cpu.one", one-idle)
		res.add("serve.cpu.ten", ten-idle)
		res.add("serve.cell.none", c0)
		res.add("serve.cell.ten", c10)
		res.add("serve.cell.ten.extra", c10-c0)
		fmt.Fprintf(log, "bench: serve round %d/%d: engine CPU %.2f%% idle, +%.2f%% with one dashboard, +%.2f%% with ten; warm cell %.3f → %.3f ms\n",
			r+1, cfg.Rounds, idle, one-idle, ten-idle, c0, c10)
	}
}
