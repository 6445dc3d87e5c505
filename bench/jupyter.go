package main

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

//go:embed jupyter_driver.py
var jupyterDriver []byte

// jupyterPackages are the Debian packages that give /usr/bin/python3
// jupyter_client and ipykernel.
var jupyterPackages = []string{"python3-jupyter-client", "python3-ipykernel"}

// jupyterSubject is a local ipykernel driven by jupyter_client, through a
// small Python driver (jupyter_driver.py) that times each cell itself and
// reports the timings as JSON.
type jupyterSubject struct {
	cmd       *exec.Cmd
	in        io.WriteCloser
	out       *bufio.Reader
	stderr    string // the driver's stderr file
	kernelPID int
	info      jupyterInfo
}

type jupyterInfo struct {
	Executable string            `json:"executable"`
	Versions   map[string]string `json:"versions"`
}

type driverAnswer struct {
	OK    bool      `json:"ok"`
	Error string    `json:"error"`
	Trace string    `json:"trace"`
	Lat   []float64 `json:"lat"`
	PID   int       `json:"pid"`
	jupyterInfo
}

// hasJupyter reports whether python imports jupyter_client and ipykernel.
func hasJupyter(python string) bool {
	return exec.Command(python, "-c", "import jupyter_client, ipykernel").Run() == nil
}

// ensureJupyter makes jupyter_client and ipykernel importable by python,
// installing the Debian packages when they are missing and install is set.
func ensureJupyter(python string, install bool, log io.Writer) error {
	if hasJupyter(python) {
		return nil
	}
	pkgs := strings.Join(jupyterPackages, " ")
	if python != "/usr/bin/python3" {
		return fmt.Errorf("%s cannot import jupyter_client and ipykernel; install them for it, or pass -python /usr/bin/python3 (the bench installs the Debian packages %s for that one), or pass -skip-jupyter", python, pkgs)
	}
	if !install {
		return fmt.Errorf("jupyter_client and ipykernel are not installed for %s: apt-get install %s, or drop -no-install, or pass -skip-jupyter", python, pkgs)
	}
	if err := aptInstall(log, jupyterPackages...); err != nil {
		return fmt.Errorf("%w; or pass -skip-jupyter", err)
	}
	if !hasJupyter(python) {
		return fmt.Errorf("installed %s, but %s still cannot import jupyter_client and ipykernel; pass -skip-jupyter to go on without it", pkgs, python)
	}
	return nil
}

// aptInstall installs Debian packages with apt-get (as root), running
// apt-get update first if the install fails on stale package lists.
func aptInstall(log io.Writer, pkgs ...string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s missing and installing it needs root: run the bench as root, or apt-get install %s yourself",
			strings.Join(pkgs, " "), strings.Join(pkgs, " "))
	}
	run := func(args ...string) error {
		fmt.Fprintf(log, "bench: %s\n", strings.Join(args, " "))
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(args, " "), err, tail(out.String(), 2000))
		}
		return nil
	}
	install := append([]string{"apt-get", "install", "-y", "--no-install-recommends"}, pkgs...)
	if run(install...) == nil {
		return nil
	}
	if err := run("apt-get", "update"); err != nil {
		return err
	}
	return run(install...)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// startJupyter starts the driver with python (binDir first on PATH, so the
// kernel spec's `python3` is the same interpreter) and its warm kernel.
func startJupyter(t *tb, python, binDir string) (*jupyterSubject, error) {
	dir := t.TempDir()
	script := filepath.Join(dir, "jupyter_driver.py")
	if err := os.WriteFile(script, jupyterDriver, 0o600); err != nil {
		return nil, err
	}
	errPath := filepath.Join(dir, "driver.stderr")
	errFile, err := os.Create(errPath)
	if err != nil {
		return nil, err
	}
	defer errFile.Close()
	cmd := exec.Command(python, "-u", script)
	cmd.Env = append(os.Environ(),
		"PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		"JUPYTER_RUNTIME_DIR="+filepath.Join(dir, "runtime"),
		"IPYTHONDIR="+filepath.Join(dir, "ipython"),
		"JUPYTER_PLATFORM_DIRS=1")
	cmd.Stderr = errFile
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the jupyter driver with %s: %w", python, err)
	}
	j := &jupyterSubject{cmd: cmd, in: in, out: bufio.NewReader(out), stderr: errPath}
	t.Cleanup(j.close)
	ans, err := j.call(map[string]any{"op": "start"}, 2*time.Minute)
	if err != nil {
		return nil, err
	}
	j.kernelPID, j.info = ans.PID, ans.jupyterInfo
	return j, nil
}

// call sends one command and waits for its answer.
func (j *jupyterSubject) call(cmd map[string]any, timeout time.Duration) (driverAnswer, error) {
	line, _ := json.Marshal(cmd)
	if _, err := j.in.Write(append(line, '\n')); err != nil {
		return driverAnswer{}, fmt.Errorf("jupyter driver: %v%s", err, j.stderrTail())
	}
	type got struct {
		line []byte
		err  error
	}
	ch := make(chan got, 1)
	go func() {
		l, err := j.out.ReadBytes('\n')
		ch <- got{l, err}
	}()
	var g got
	select {
	case g = <-ch:
	case <-time.After(timeout):
		j.cmd.Process.Kill()
		return driverAnswer{}, fmt.Errorf("jupyter driver: no answer to %s within %v%s", line, timeout, j.stderrTail())
	}
	if g.err != nil {
		return driverAnswer{}, fmt.Errorf("jupyter driver exited: %v%s", g.err, j.stderrTail())
	}
	var ans driverAnswer
	if err := json.Unmarshal(g.line, &ans); err != nil {
		return driverAnswer{}, fmt.Errorf("jupyter driver: bad answer %q: %v", g.line, err)
	}
	if !ans.OK {
		return ans, fmt.Errorf("jupyter driver: %s\n%s%s", ans.Error, ans.Trace, j.stderrTail())
	}
	return ans, nil
}

func (j *jupyterSubject) stderrTail() string {
	b, _ := os.ReadFile(j.stderr)
	if len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	return "\ndriver stderr:\n" + tail(string(b), 3000)
}

func (j *jupyterSubject) close() {
	done := make(chan struct{})
	go func() {
		j.call(map[string]any{"op": "quit"}, 30*time.Second)
		j.in.Close()
		j.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		j.cmd.Process.Kill()
	}
}

func (j *jupyterSubject) key() string              { return "jupyter" }
func (j *jupyterSubject) cpuRoots() []int          { return []int{j.cmd.Process.Pid} }
func (j *jupyterSubject) trips() (tripCount, bool) { return tripCount{}, false }

func (j *jupyterSubject) warm(_ context.Context, n int) ([]time.Duration, error) {
	ans, err := j.call(map[string]any{"op": "warm", "n": n}, time.Duration(n)*time.Second+time.Minute)
	if err != nil {
		return nil, err
	}
	return secs(ans.Lat), nil
}

func (j *jupyterSubject) cold(context.Context) (time.Duration, tripCount, error) {
	ans, err := j.call(map[string]any{"op": "cold", "n": 1}, 2*time.Minute)
	if err != nil {
		return 0, tripCount{}, err
	}
	if len(ans.Lat) != 1 {
		return 0, tripCount{}, fmt.Errorf("jupyter driver: %d cold timings, want 1", len(ans.Lat))
	}
	return secs(ans.Lat)[0], tripCount{}, nil
}

func secs(xs []float64) []time.Duration {
	out := make([]time.Duration, len(xs))
	for i, x := range xs {
		out[i] = time.Duration(x * float64(time.Second))
	}
	return out
}
