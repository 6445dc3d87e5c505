package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/hosttools"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// The ssh users: light is a plain created user; heavy one whose ~/.bashrc
// sleeps for every shell sshd starts. The name and sleep are the engine
// tests' (engine/ssh_transport_test.go): sshdtest shares one user's
// .bashrc block between concurrent processes only when they ask for the
// same sleep, so a bench run beside `go test ./engine` must match them.
const (
	lightUser  = "kdtest1"
	heavyUser  = "kdheavy"
	heavySleep = 200 * time.Millisecond
)

// setupEnv is everything the phases measure.
type setupEnv struct {
	dir    string
	binDir string // holds python3 -> cfg.Python, first on PATH
	bin    string // the kerneldeck binary, built for the fresh-process rows

	local    *kdSubject
	jupyter  *jupyterSubject
	sshLight *kdSubject
	sshHeavy *kdSubject

	// latency subjects, in table order
	subjects []subject

	srv   *sshdtest.Server
	light *sshdtest.User
	heavy *sshdtest.User

	pythonVersion string
	sshdVersion   string
	skipped       map[string]string // "ssh", "jupyter" -> why
}

// noopTools is a registry with one trivial tool, "noop", that answers "ok".
func noopTools() *hosttools.Registry {
	reg := hosttools.NewRegistry()
	err := reg.Register(hosttools.Tool{Name: "noop", Description: "Answer at once.",
		Handler: func(context.Context, hosttools.Call) (hosttools.Result, error) {
			return hosttools.Result{Text: "ok"}, nil
		}})
	if err != nil {
		panic(err)
	}
	return reg
}

// kdConfig is the engine config of every kerneldeck subject: defaults, plus
// the noop tool allowed without asking (for the tool-call cells).
func kdConfig() engine.Config {
	return engine.Config{Tools: noopTools(), MaxToolCalls: 1000, Approvals: engine.Approvals{Default: engine.PolicyAllow}}
}

// shortTempDir is a private temp dir with a short path (Unix socket paths
// under it must stay within 108 bytes), removed at cleanup.
func shortTempDir(t *tb) string {
	dir, err := os.MkdirTemp("", "kdb")
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func setup(ctx context.Context, t *tb, cfg config, log io.Writer) (*setupEnv, error) {
	e := &setupEnv{skipped: map[string]string{}}
	var err error
	if guardErr, _ := guard(func() { err = e.setup(ctx, t, cfg, log) }); guardErr != nil {
		return nil, guardErr
	}
	return e, err
}

func (e *setupEnv) setup(ctx context.Context, t *tb, cfg config, log io.Writer) error {
	if cfg.SkipSSH {
		e.skipped["ssh"] = "-skip-ssh"
	}
	if cfg.SkipJupyter {
		e.skipped["jupyter"] = "-skip-jupyter"
	}
	if cfg.SkipDocker {
		e.skipped["docker"] = "-skip-docker"
	}
	if cfg.SkipK8s {
		e.skipped["k8s"] = "-skip-k8s"
	}
	// Refuse early, before anything slow, when a requested part cannot run.
	if !cfg.SkipSSH && os.Geteuid() != 0 {
		return fmt.Errorf("the ssh rows create the OS users %s and %s, which needs root: run as root (sudo go run ./bench), or pass -skip-ssh", lightUser, heavyUser)
	}
	if !cfg.SkipSSH {
		if err := ensureSSHD(!cfg.NoInstall, log); err != nil {
			return err
		}
	}
	if !cfg.SkipJupyter {
		if err := ensureJupyter(cfg.Python, !cfg.NoInstall, log); err != nil {
			return err
		}
	}

	e.dir = t.TempDir()
	// kerneldeck's local runners and the Jupyter kernel run the same
	// interpreter: a python3 symlink first on PATH.
	ver, err := exec.Command(cfg.Python, "-c", "import sys; assert sys.version_info >= (3, 8); print(sys.version.split()[0])").Output()
	if err != nil {
		return fmt.Errorf("-python %s does not run Python 3.8 or newer (%v); pass -python with one that does", cfg.Python, err)
	}
	e.pythonVersion = strings.TrimSpace(string(ver)) + " (" + cfg.Python + ")"
	e.binDir = filepath.Join(e.dir, "bin")
	if err := os.Mkdir(e.binDir, 0o755); err != nil {
		return err
	}
	if err := os.Symlink(cfg.Python, filepath.Join(e.binDir, "python3")); err != nil {
		return err
	}
	t.Setenv("PATH", e.binDir+string(os.PathListSeparator)+os.Getenv("PATH"))

	fmt.Fprintf(log, "bench: starting kerneldeck on the local backend\n")
	e.local, err = newKD(ctx, t, "local", backends.NewLocal(shortTempDir(t)), e.dir, kdConfig(), false, nil)
	if err != nil {
		return err
	}
	e.subjects = append(e.subjects, e.local)
	// The same with --trace's wrapping: what tracing costs a cell, and the
	// trace's count of round trips beside the transport's.
	localTraced, err := newKD(ctx, t, "local.traced", backends.NewLocal(shortTempDir(t)), e.dir, kdConfig(), true, nil)
	if err != nil {
		return err
	}
	e.subjects = append(e.subjects, localTraced)
	spareCfg := kdConfig()
	spareCfg.SpareKernels = map[string]int{"local": 1}
	localSpare, err := newKD(ctx, t, "local.spare", backends.NewLocal(shortTempDir(t)), e.dir, spareCfg, false, nil)
	if err != nil {
		return err
	}
	localSpare.spare = true
	e.subjects = append(e.subjects, localSpare)

	if !cfg.SkipJupyter {
		fmt.Fprintf(log, "bench: starting an ipykernel through jupyter_client\n")
		e.jupyter, err = startJupyter(t, cfg.Python, e.binDir)
		if err != nil {
			return fmt.Errorf("%w\n(pass -skip-jupyter to go on without the Jupyter rows)", err)
		}
		e.subjects = append(e.subjects, e.jupyter)
	}
	e.subjects = append(e.subjects, bashFloor{})
	floor, err := startPyloop(t, cfg.Python)
	if err != nil {
		return err
	}
	e.subjects = append(e.subjects, floor, spawnChainFloor{python: cfg.Python})

	// A fresh process to its first result, with the bench's python3 first on
	// PATH, with the PATH the bench was started with (a pyenv shim, say),
	// and as an MCP server.
	bin, err := buildKerneldeck(t)
	if err != nil {
		return err
	}
	e.bin = bin
	benchPath := os.Environ()
	withUserPath := append(os.Environ(), "PATH="+userPath)
	historyMB := 190
	if cfg.Quick {
		historyMB = 8 // the same path, written in a moment
	}
	for _, f := range []struct {
		name      string
		env       []string
		mcp       bool
		historyMB int
	}{{"fresh.headless", benchPath, false, 0}, {"fresh.headless.userpath", withUserPath, false, 0}, {"fresh.mcp", benchPath, true, 0},
		{"fresh.headless.history", benchPath, false, historyMB}} {
		s, err := newFreshProcess(ctx, t, f.name, bin, f.env, f.mcp, f.historyMB)
		if err != nil {
			return err
		}
		e.subjects = append(e.subjects, s)
	}

	if !cfg.SkipSSH {
		if err := e.setupSSH(ctx, t, log); err != nil {
			return fmt.Errorf("%w\n(pass -skip-ssh to go on without the ssh rows)", err)
		}
	}
	if !cfg.SkipDocker {
		if err := e.setupDocker(ctx, t, log); err != nil {
			return fmt.Errorf("%w\n(pass -skip-docker to go on without the docker rows)", err)
		}
	}
	if !cfg.SkipK8s {
		if cfg.SkipDocker {
			return fmt.Errorf("the Kubernetes rows load their image from the Docker Engine: pass -skip-k8s with -skip-docker")
		}
		if err := e.setupK8s(ctx, t, log); err != nil {
			return fmt.Errorf("%w\n(pass -skip-k8s to go on without the Kubernetes rows)", err)
		}
	}
	return nil
}

// ensureSSHD installs openssh-server when sshd is missing and install is set.
func ensureSSHD(install bool, log io.Writer) error {
	if _, err := os.Stat(sshdtest.SSHDPath); err == nil {
		return nil
	}
	if !install {
		return fmt.Errorf("%s is missing: apt-get install openssh-server, or drop -no-install, or pass -skip-ssh", sshdtest.SSHDPath)
	}
	if err := aptInstall(log, "openssh-server"); err != nil {
		return fmt.Errorf("%w; or pass -skip-ssh", err)
	}
	return nil
}

func (e *setupEnv) setupSSH(ctx context.Context, t *tb, log io.Writer) error {
	fmt.Fprintf(log, "bench: starting sshd on loopback with users %s and %s (~/.bashrc sleeps %v)\n", lightUser, heavyUser, heavySleep)
	e.srv = sshdtest.Start(t, sshdtest.Options{})
	if out, err := exec.Command(sshdtest.SSHDPath, "-V").CombinedOutput(); len(out) > 0 {
		e.sshdVersion = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
		_ = err // sshd -V exits non-zero after printing its version
	}
	e.light = e.srv.User(t, lightUser, sshdtest.UserOptions{})
	e.heavy = e.srv.User(t, heavyUser, sshdtest.UserOptions{BashrcSleep: heavySleep})
	listener := func() []int { return []int{e.srv.PID()} }
	var err error
	e.sshLight, err = newKD(ctx, t, "ssh.light", e.sshEnv(t, e.light), e.dir, kdConfig(), false, listener)
	if err != nil {
		return err
	}
	e.sshHeavy, err = newKD(ctx, t, "ssh.heavy", e.sshEnv(t, e.heavy), e.dir, kdConfig(), false, listener)
	if err != nil {
		return err
	}
	e.subjects = append(e.subjects,
		e.sshLight, &sshFloor{name: "floor.ssh.light", client: e.srv.Dial(t, e.light), roots: listener},
		e.sshHeavy, &sshFloor{name: "floor.ssh.heavy", client: e.srv.Dial(t, e.heavy), roots: listener})
	echoDir := shortTempDir(t)
	if err := os.Chown(echoDir, e.light.UID, e.light.GID); err != nil {
		return err
	}
	floor, err := startStreamlocal(t, e.srv.Dial(t, e.light), echoDir, listener)
	if err != nil {
		return err
	}
	e.subjects = append(e.subjects, floor)
	return nil
}

// sshEnv is a new ssh backend (its own connection) for u through an ssh
// config alias, with a short private temp dir owned by u.
func (e *setupEnv) sshEnv(t *tb, u *sshdtest.User) *backends.SSH {
	tmp := shortTempDir(t)
	if err := os.Chown(tmp, u.UID, u.GID); err != nil {
		t.Fatalf("bench: %v", err)
	}
	env, err := backends.NewSSH("ssh://kdbox", backends.Options{SSHConfig: e.srv.WriteSSHConfig(t, "kdbox", u), SSHTempDir: tmp})
	if err != nil {
		t.Fatalf("bench: ssh backend for %s: %v", u.Name, err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

// machine describes where the run happened.
type machine struct {
	cores, gomaxprocs int
	cpuModel          string
	memory            string
	kernel            string
	loadStart         string
	loadEnd           string
	elapsed           time.Duration
}

func machineInfo() machine {
	m := machine{cores: runtime.NumCPU(), gomaxprocs: runtime.GOMAXPROCS(0), loadStart: loadAvg()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = "Linux " + strings.TrimSpace(string(b))
	}
	m.cpuModel = procField("/proc/cpuinfo", "model name")
	if kb := procField("/proc/meminfo", "MemTotal"); kb != "" {
		var n int
		fmt.Sscanf(kb, "%d", &n)
		m.memory = fmt.Sprintf("%.1f GiB", float64(n)/(1<<20))
	}
	return m
}

// loadAvg is the 1, 5 and 15 minute load average from /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// procField is the value of the first "key: value" line of a /proc file.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
