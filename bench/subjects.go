package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/internal/backendtest"
)

// subject is one thing whose trivial-cell round trip is measured.
type subject interface {
	// key names its figures ("local", "jupyter", "floor.bash", ...).
	key() string
	// warm runs n trivial cells on an already running kernel (or n bare
	// commands, for a floor) and returns each one's latency.
	warm(ctx context.Context, n int) ([]time.Duration, error)
	// cold starts a new kernel and runs its first cell, timing both, and
	// returns the round trips that took (zero when trips reports none);
	// errNoCold when the subject has no cold start.
	cold(ctx context.Context) (time.Duration, tripCount, error)
	// cpuRoots are the processes (with their descendants) whose CPU counts
	// for this subject besides the bench's own.
	cpuRoots() []int
	// trips reports the backend round trips so far (kerneldeck only).
	trips() (tripCount, bool)
}

var errNoCold = errors.New("no cold start")

// tripCount is what the engine sent to its host so far: backend commands
// and cell exchanges on a runner's stream (from the --trace file for a
// traced subject, else from the Counting wrapper: its Execute calls and its
// "cell" frames) and, from the Counting wrapper, Execute calls and every
// stream frame.
type tripCount struct {
	Commands, Exchanges int
	Executes, Frames    int
}

func (a tripCount) sub(b tripCount) tripCount {
	return tripCount{a.Commands - b.Commands, a.Exchanges - b.Exchanges, a.Executes - b.Executes, a.Frames - b.Frames}
}

// kdSubject is kerneldeck's engine on one backend over the Counting wrapper
// of internal/backendtest; a traced one is also wrapped as the CLI's --trace
// wraps it (backends.Traced plus engine Config.Tracer).
type kdSubject struct {
	name    string
	eng     *engine.Engine
	count   backendtest.Counting
	trace   *traceCounter // nil: not traced
	roots   func() []int
	owner   string
	runner  int // pid of the warm kernel's runner
	coldSeq int
	spare   bool // its cold start waits for a spare runner
}

// newKD starts an engine on env (with a trace file in dir when traced, as
// --trace would: a record written per exchange, which a user pays only
// with --trace), and spawns the warm kernel (owner "warm") plus one
// throw-away kernel, so the engine knows the host's interpreter and holds
// its connection, as a running dashboard does. extraRoots adds processes
// whose CPU counts (the sshd listener).
func newKD(ctx context.Context, t *tb, name string, env backends.Env, dir string, cfg engine.Config, traced bool, extraRoots func() []int) (*kdSubject, error) {
	counting := backendtest.NewCounting(env)
	cfg.Backends = []backends.Env{counting}
	var trace *traceCounter
	if traced {
		tracePath := filepath.Join(dir, name+".trace")
		tracer, err := backends.OpenTracer(tracePath)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { tracer.Close() })
		cfg.Backends = []backends.Env{backends.Traced(counting, tracer)}
		cfg.Tracer = tracer
		trace = &traceCounter{path: tracePath}
	}
	cfg.StateDir = filepath.Join(dir, name+".state")
	if cfg.MaxKernels == 0 {
		cfg.MaxKernels = 16
	}
	eng, err := engine.New(cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { closeEngine(eng) })
	s := &kdSubject{name: name, eng: eng, count: counting, trace: trace, owner: "warm"}
	s.roots = func() []int {
		r := []int{s.runner}
		if extraRoots != nil {
			r = append(r, extraRoots()...)
		}
		return r
	}
	if _, err := kdRun(ctx, eng, engine.Request{Owner: "warmup", Code: "1"}, "1\n"); err != nil {
		return nil, fmt.Errorf("%s: first spawn: %w", name, err)
	}
	eng.ShutdownOwner(ctx, "warmup")
	res, err := kdRun(ctx, eng, engine.Request{Owner: s.owner, Code: "1"}, "1\n")
	if err != nil {
		return nil, fmt.Errorf("%s: spawn the warm kernel: %w", name, err)
	}
	s.runner = res.Kernel.PID
	return s, nil
}

func closeEngine(eng *engine.Engine) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eng.Close(ctx, false)
}

// kdRun executes req and checks that it succeeded with stdout want.
func kdRun(ctx context.Context, eng *engine.Engine, req engine.Request, want string) (*engine.Result, error) {
	if req.Timeout == 0 {
		req.Timeout = 60 * time.Second
	}
	res, err := eng.Execute(ctx, req)
	if err != nil {
		return nil, err
	}
	if res.Status != "success" || res.Fallback != "" || res.Kernel == nil || res.Stdout != want {
		return res, fmt.Errorf("cell %q: status %q fallback %q stdout %q (want %q) stderr %q traceback %q",
			req.Code, res.Status, res.Fallback, res.Stdout, want, res.Stderr, res.Traceback)
	}
	return res, nil
}

func (s *kdSubject) key() string     { return s.name }
func (s *kdSubject) cpuRoots() []int { return s.roots() }

func (s *kdSubject) warm(ctx context.Context, n int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		res, err := kdRun(ctx, s.eng, engine.Request{Owner: s.owner, Code: "1"}, "1\n")
		lat = append(lat, time.Since(start))
		if err != nil {
			return lat, fmt.Errorf("%s warm cell: %w", s.name, err)
		}
		if !res.Kernel.Reused || res.Kernel.PID != s.runner {
			return lat, fmt.Errorf("%s warm cell ran in a new kernel (pid %d, reused %v; warm runner pid %d)", s.name, res.Kernel.PID, res.Kernel.Reused, s.runner)
		}
	}
	return lat, nil
}

// cold spawns a kernel for a new owner and runs its first cell; the kernel
// is shut down after the timing.
func (s *kdSubject) cold(ctx context.Context) (time.Duration, tripCount, error) {
	s.coldSeq++
	owner := fmt.Sprintf("cold-%d", s.coldSeq)
	for deadline := time.Now().Add(10 * time.Second); s.spare && s.eng.Spares() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return 0, tripCount{}, fmt.Errorf("%s: no spare runner ready within 10s", s.name)
		}
	}
	before, _ := s.trips()
	start := time.Now()
	res, err := kdRun(ctx, s.eng, engine.Request{Owner: owner, Code: "1"}, "1\n")
	d := time.Since(start)
	after, _ := s.trips()
	s.eng.ShutdownOwner(ctx, owner)
	if err != nil {
		return d, tripCount{}, fmt.Errorf("%s cold start: %w", s.name, err)
	}
	if res.Kernel.Reused {
		return d, tripCount{}, fmt.Errorf("%s cold start reused kernel %s", s.name, res.Kernel.ID)
	}
	return d, after.sub(before), nil
}

func (s *kdSubject) trips() (tripCount, bool) {
	c := tripCount{Executes: s.count.Executes(), Frames: s.count.Frames()}
	if s.trace == nil {
		c.Commands, c.Exchanges = c.Executes, s.count.FramesByOp("cell")
	} else {
		c.Commands, c.Exchanges = s.trace.count()
	}
	return c, true
}

// traceCounter counts the lines of a --trace file: plain commands, and
// "[stream] ..." records of exchanges on a runner's socket.
type traceCounter struct {
	path           string
	off            int64
	cmds, streamed int
}

func (c *traceCounter) count() (cmds, streamed int) {
	f, err := os.Open(c.path)
	if err != nil {
		return c.cmds, c.streamed
	}
	defer f.Close()
	if _, err := f.Seek(c.off, io.SeekStart); err != nil {
		return c.cmds, c.streamed
	}
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break // a partial last line is read next time
		}
		c.off += int64(len(line))
		if strings.Contains(line, `"command":"[stream] `) {
			c.streamed++
		} else {
			c.cmds++
		}
	}
	return c.cmds, c.streamed
}

// floor is what every floor subject shares: it counts no round trips and
// has no cold start.
type floor struct{}

func (floor) trips() (tripCount, bool) { return tripCount{}, false }
func (floor) cold(context.Context) (time.Duration, tripCount, error) {
	return 0, tripCount{}, errNoCold
}

// timeEach runs once n times and returns each run's latency, stopping at
// the first error.
func timeEach(n int, once func() error) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		err := once()
		lat = append(lat, time.Since(start))
		if err != nil {
			return lat, err
		}
	}
	return lat, nil
}

// bashFloor is one `bash -c true` on this machine: the least a cell can
// cost when every cell is a new process.
type bashFloor struct{ floor }

func (bashFloor) key() string     { return "floor.bash" }
func (bashFloor) cpuRoots() []int { return nil }

func (bashFloor) warm(ctx context.Context, n int) ([]time.Duration, error) {
	return timeEach(n, func() error {
		if err := exec.CommandContext(ctx, "bash", "-c", "true").Run(); err != nil {
			return fmt.Errorf("bash -c true: %w", err)
		}
		return nil
	})
}

// sshFloor is one x/crypto/ssh session exec of `true` on an open
// connection: the least a cell costs over ssh when every cell is a command.
// sshd starts the user's login shell, and so reads its rc file, each time.
type sshFloor struct {
	floor
	name   string
	client *ssh.Client
	roots  func() []int
}

func (f *sshFloor) key() string     { return f.name }
func (f *sshFloor) cpuRoots() []int { return f.roots() }

func (f *sshFloor) warm(ctx context.Context, n int) ([]time.Duration, error) {
	return timeEach(n, func() error {
		sess, err := f.client.NewSession()
		if err != nil {
			return fmt.Errorf("%s: new session: %w", f.name, err)
		}
		defer sess.Close()
		if err := sess.Run("true"); err != nil {
			return fmt.Errorf("%s: exec true: %w", f.name, err)
		}
		return nil
	})
}
