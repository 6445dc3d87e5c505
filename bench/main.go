// Command bench measures kerneldeck side by side with a Jupyter kernel and
// the raw transports, in one run on one machine, and prints a Markdown
// table (see BENCHMARKS.md for what each figure means):
//
//	go run ./bench            # full run, a few minutes; root for the ssh rows
//	go run ./bench -quick     # seconds: a smoke test of every figure
//	bench/run [flags]         # the same, from a built binary
//
// Every figure is the median over rounds, with the min and max; ratios
// against a peer are taken round by round from measurements interleaved in
// the same round. The ssh rows start a real OpenSSH sshd on loopback and
// create the test users kdtest1 and kdheavy (internal/sshdtest), which
// needs root; -skip-ssh leaves them out. The Jupyter rows need
// python3-jupyter-client and python3-ipykernel, which the bench installs
// with apt-get when they are missing (as root; -no-install stops it).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

// config is one run's shape.
type config struct {
	Quick      bool
	Rounds     int // repetitions of every measurement
	Warmup     int // unmeasured warm cells per subject before the first round
	Warm       int // warm cells per subject per round
	Blocks     int // warm cells run in this many interleaved blocks
	Cold       int // cold starts per subject per round
	HeavyFloor int // ssh execs per round for the heavy-rc floor (each costs the rc)
	ToolCells  int // cells of 100 tool calls per backend per round
	Owners     int // owners running cells at once on one ssh host
	OwnerCells int // warm cells per owner per round in the concurrent burst
	Kernels    int // registered kernels for the engine overhead figures
	// HostKernels are the real local kernels held idle, Storm the new
	// owners that come at once (the host phase).
	HostKernels, Storm int
	// RestartKernels are the kernels a killed serve leaves to the next.
	RestartKernels int
	// Sessions are the sessions held hibernated on one host, WakeCalls the
	// calls to random ones per round (the hibernate phase).
	Sessions, WakeCalls, WakeRate int
	ScaleCells                    int // warm cell pairs (with and without the kernels) per round
	Views                         int // dashboard View() calls per round
	// CPUSettle is the wait before a CPU window, for one-off work (the
	// replayed history, the first frames) to pass; CPUWindow, its length.
	CPUSettle, CPUWindow time.Duration
	SkipSSH              bool
	SkipDocker           bool
	SkipK8s              bool
	SkipJupyter          bool
	NoInstall            bool
	Python               string // interpreter for the local runners and the Jupyter kernel
	Date                 string // printed in the header (default: today)
	Phases               string // comma-separated phases to run (default all)
	Raw                  string // file to write every per-round value to, as JSON
}

// phaseNames are the phases, in run order.
var phaseNames = []string{"latency", "tools", "displays", "rss", "owners", "host", "hibernate", "scale", "serve", "restart", "dashboard"}

func fullConfig() config {
	return config{Rounds: 7, Warmup: 20, Warm: 200, Blocks: 8, Cold: 3, HeavyFloor: 16, ToolCells: 3, Owners: 50, OwnerCells: 10,
		Kernels: 10_000, HostKernels: 1_000, Storm: 200, RestartKernels: 100, Sessions: 10_000, WakeCalls: 1_500, WakeRate: wakeRate, ScaleCells: 200, Views: 20, CPUSettle: 2 * time.Second, CPUWindow: 10 * time.Second, Python: "/usr/bin/python3"}
}

func quickConfig() config {
	return config{Quick: true, Rounds: 2, Warmup: 5, Warm: 20, Blocks: 2, Cold: 1, HeavyFloor: 2, ToolCells: 1, Owners: 50, OwnerCells: 2,
		Kernels: 1_000, HostKernels: 40, Storm: 20, RestartKernels: 20, Sessions: 40, WakeCalls: 50, WakeRate: 10, ScaleCells: 20, Views: 3, CPUSettle: time.Second, CPUWindow: time.Second, Python: "/usr/bin/python3"}
}

func main() {
	if os.Getenv(dashboardRole) != "" {
		runDashboardRole() // a child of the serve phase, not the bench
	}
	quick := flag.Bool("quick", false, "a smoke run in seconds: 2 rounds of few samples, 1,000 registered kernels instead of 10,000")
	fs := flag.CommandLine
	var over config
	fs.IntVar(&over.Rounds, "rounds", 0, "rounds (default 7, quick 2)")
	fs.IntVar(&over.Warm, "warm", 0, "warm cells per subject per round (default 200, quick 20)")
	fs.IntVar(&over.Cold, "cold", 0, "cold starts per subject per round (default 3, quick 1)")
	fs.IntVar(&over.Owners, "owners", 0, "owners running cells at once on one ssh host (default 50)")
	fs.IntVar(&over.Kernels, "kernels", 0, "registered kernels for the engine overhead figures (default 10000, quick 1000)")
	fs.IntVar(&over.HostKernels, "host-kernels", 0, "real local kernels held idle in the host phase (default 1000, quick 40)")
	fs.IntVar(&over.Storm, "storm", 0, "new owners at once in the host phase (default 200, quick 20)")
	fs.IntVar(&over.Sessions, "sessions", 0, "sessions held hibernated in the hibernate phase (default 10000, quick 40)")
	fs.IntVar(&over.WakeCalls, "wake-calls", 0, "calls to random hibernated sessions per round (default 1500, quick 50)")
	fs.IntVar(&over.WakeRate, "wake-rate", 0, "calls a second to random hibernated sessions (default 50, the targets' rate; quick 10, within this 2-core host's pace)")
	fs.BoolVar(&over.SkipSSH, "skip-ssh", false, "leave out the ssh rows (they need root and /usr/sbin/sshd)")
	fs.BoolVar(&over.SkipDocker, "skip-docker", false, "leave out the container rows (they need a Docker Engine)")
	fs.BoolVar(&over.SkipK8s, "skip-k8s", false, "leave out the Kubernetes pod rows (they start a single-node cluster: root, the Docker Engine, Debian's etcd-server, containerd, runc and containernetworking-plugins, and go run ./internal/k8stest/k8sbuild)")
	fs.BoolVar(&over.SkipJupyter, "skip-jupyter", false, "leave out the Jupyter rows and the ratios against them")
	fs.BoolVar(&over.NoInstall, "no-install", false, "never apt-get install missing packages (python3-jupyter-client, python3-ipykernel, openssh-server)")
	fs.StringVar(&over.Python, "python", "", "interpreter for kerneldeck's local runners and the Jupyter kernel (default /usr/bin/python3, which the Debian packages serve)")
	fs.StringVar(&over.Date, "date", "", "date printed in the header (default today, UTC)")
	fs.StringVar(&over.Phases, "phases", "", "run only these phases, comma-separated: "+strings.Join(phaseNames, ","))
	fs.StringVar(&over.Raw, "raw", "", "also write every figure's per-round values to this file, as JSON")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: go run ./bench [flags]\n\nMeasures kerneldeck against a Jupyter kernel and the raw transports and prints a Markdown table.\nSee BENCHMARKS.md.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "bench: unexpected argument %q (flags only; see -h)\n", flag.Arg(0))
		os.Exit(2)
	}
	cfg := fullConfig()
	if *quick {
		cfg = quickConfig()
	}
	cfg = merge(cfg, over)
	// A closed stdout (bench/run | head) must not kill the bench before it
	// has killed its kernels and sshd: writes just fail instead.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// merge overrides base with the non-zero fields of over.
func merge(base, over config) config {
	pick := func(b, o int) int {
		if o > 0 {
			return o
		}
		return b
	}
	base.Rounds = pick(base.Rounds, over.Rounds)
	base.Warm = pick(base.Warm, over.Warm)
	base.Cold = pick(base.Cold, over.Cold)
	base.Owners = pick(base.Owners, over.Owners)
	base.Kernels = pick(base.Kernels, over.Kernels)
	base.HostKernels = pick(base.HostKernels, over.HostKernels)
	base.Storm = pick(base.Storm, over.Storm)
	base.Sessions = pick(base.Sessions, over.Sessions)
	base.WakeCalls = pick(base.WakeCalls, over.WakeCalls)
	base.WakeRate = pick(base.WakeRate, over.WakeRate)
	base.SkipSSH = base.SkipSSH || over.SkipSSH
	base.SkipDocker = base.SkipDocker || over.SkipDocker
	base.SkipK8s = base.SkipK8s || over.SkipK8s
	base.SkipJupyter = base.SkipJupyter || over.SkipJupyter
	base.NoInstall = base.NoInstall || over.NoInstall
	if over.Python != "" {
		base.Python = over.Python
	}
	if over.Date != "" {
		base.Date = over.Date
	}
	if over.Phases != "" {
		base.Phases = over.Phases
	}
	if over.Raw != "" {
		base.Raw = over.Raw
	}
	base.Blocks = max(1, min(base.Blocks, base.Warm))
	return base
}

// run measures everything cfg asks for, printing progress to log and the
// table to out. It returns an error when a measurement failed (the table is
// still printed with what was measured) or could not start.
func run(ctx context.Context, cfg config, out, log io.Writer) error {
	start := time.Now()
	want := map[string]bool{}
	if cfg.Phases == "" {
		cfg.Phases = strings.Join(phaseNames, ",")
	}
	for _, p := range strings.Split(cfg.Phases, ",") {
		if !slices.Contains(phaseNames, strings.TrimSpace(p)) {
			return fmt.Errorf("-phases: unknown phase %q; the phases are %s", p, strings.Join(phaseNames, ","))
		}
		want[strings.TrimSpace(p)] = true
	}
	if cfg.Date == "" {
		cfg.Date = start.UTC().Format("2006-01-02")
	}
	m := machineInfo()
	t := newTB("bench", log)
	defer func() {
		if err := t.close(); err != nil {
			fmt.Fprintf(log, "bench: cleanup: %v\n", err)
		}
	}()
	env, err := setup(ctx, t, cfg, log)
	if err != nil {
		return err
	}
	res := newResults()
	phases := []struct {
		name string
		f    func(context.Context, config, *setupEnv, *results, io.Writer)
	}{
		{"latency", latencyPhase},
		{"tools", toolsPhase},
		{"displays", displaysPhase},
		{"rss", rssPhase},
		{"owners", ownersPhase},
		{"host", hostPhase},
		{"hibernate", hibernatePhase},
		{"scale", scalePhase},
		{"serve", servePhase},
		{"restart", restartPhase},
		{"dashboard", dashboardPhase},
	}
	for _, p := range phases {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !want[p.name] {
			res.note(p.name, "not run: -phases")
			continue
		}
		fmt.Fprintf(log, "bench: %s...\n", p.name)
		pstart := time.Now()
		if err, _ := guard(func() { p.f(ctx, cfg, env, res, log) }); err != nil {
			res.fail("%s: %v", p.name, err)
		}
		fmt.Fprintf(log, "bench: %s done in %v\n", p.name, time.Since(pstart).Round(time.Millisecond))
	}
	m.loadEnd = loadAvg()
	m.elapsed = time.Since(start)
	report(out, cfg, m, env, res)
	if cfg.Raw != "" {
		if err := res.writeJSON(cfg.Raw); err != nil {
			res.fail("-raw: %v", err)
		}
	}
	if len(res.errors) > 0 {
		return fmt.Errorf("%d measurement(s) failed:\n  %s", len(res.errors), joinLines(res.errors))
	}
	return nil
}

func joinLines(xs []string) string {
	s := ""
	for i, x := range xs {
		if i > 0 {
			s += "\n  "
		}
		s += x
	}
	return s
}
