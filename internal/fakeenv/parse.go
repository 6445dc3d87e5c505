package fakeenv

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Parsers for the engine's host scripts. They read the few values each
// script carries (paths, ids, pids, sizes); payloads are on stdin. A parse
// error means the engine's script changed shape and the fake needs updating.

// quoted matches one single-quoted bash word as the engine's shq writes it.
const quoted = `('(?:[^']|'\\'')*')`

// unq undoes shq.
func unq(s string) string {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "'"), "'")
	return strings.ReplaceAll(s, `'\''`, `'`)
}

// SpawnArgs are the values of a spawn script and the files on its stdin.
type SpawnArgs struct {
	TempDir string
	ID      string // the kernel id; the dir must be <TempDir>/kerneldeck-<login>/<ID>
	Python  string // interpreter learnt from an earlier spawn, or ""
	Sizes   [3]int // byte lengths of runner.py, kerneldeck_tools.py, kernel.env on stdin
	Runner  []byte
	Tools   []byte
	EnvFile []byte
}

// Env returns the value of name in the env file, and whether it is set.
func (a SpawnArgs) Env(name string) (string, bool) {
	for line := range strings.SplitSeq(string(a.EnvFile), "\n") {
		if v, ok := strings.CutPrefix(line, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

var (
	spawnTemp   = regexp.MustCompile(`(?m)^t=` + quoted + `$`)
	spawnID     = regexp.MustCompile(`(?m)^kd="\$root/"` + quoted + `$`)
	spawnPython = regexp.MustCompile(`(?m)^py=` + quoted + `$`)
	spawnSizes  = regexp.MustCompile(`head -c (\d+) >"\$kd/runner\.py" && head -c (\d+) >"\$kd/kerneldeck_tools\.py" && head -c (\d+) >"\$kd/kernel\.env"`)
)

// ParseSpawn reads a "# kerneldeck:spawn" script and splits its stdin.
func ParseSpawn(command string, stdin []byte) (SpawnArgs, error) {
	var a SpawnArgs
	if Marker(command) != "spawn" {
		return a, fmt.Errorf("fakeenv: not a spawn script")
	}
	t, id, py, sz := spawnTemp.FindStringSubmatch(command), spawnID.FindStringSubmatch(command),
		spawnPython.FindStringSubmatch(command), spawnSizes.FindStringSubmatch(command)
	if t == nil || id == nil || py == nil || sz == nil {
		return a, fmt.Errorf("fakeenv: cannot parse spawn script (t=%v kd=%v py=%v sizes=%v)", t != nil, id != nil, py != nil, sz != nil)
	}
	a.TempDir, a.ID, a.Python = unq(t[1]), unq(id[1]), unq(py[1])
	total := 0
	for i := range 3 {
		a.Sizes[i], _ = strconv.Atoi(sz[i+1])
		total += a.Sizes[i]
	}
	if len(stdin) < total {
		return a, fmt.Errorf("fakeenv: spawn stdin has %d bytes, the script reads %d", len(stdin), total)
	}
	a.Runner = stdin[:a.Sizes[0]]
	a.Tools = stdin[a.Sizes[0] : a.Sizes[0]+a.Sizes[1]]
	a.EnvFile = stdin[a.Sizes[0]+a.Sizes[1] : total]
	return a, nil
}

// CellArgs are the values of a cell script.
type CellArgs struct {
	Dir       string
	ID        string // the cell id
	PID       int
	Window    int // seconds the host waits for the result
	Publish   bool
	Interrupt bool
}

var cellVars = regexp.MustCompile(`(?m)^kd=` + quoted + `; id=` + quoted + `; pid=(\d+); w=(\d+); pub=([01]); intr=([01])$`)

// ParseCell reads a "# kerneldeck:cell" script.
func ParseCell(command string) (CellArgs, error) {
	var a CellArgs
	m := cellVars.FindStringSubmatch(command)
	if Marker(command) != "cell" || m == nil {
		return a, fmt.Errorf("fakeenv: cannot parse cell script")
	}
	a.Dir, a.ID = unq(m[1]), unq(m[2])
	a.PID, _ = strconv.Atoi(m[3])
	a.Window, _ = strconv.Atoi(m[4])
	a.Publish, a.Interrupt = m[5] == "1", m[6] == "1"
	return a, nil
}

// KillArgs are the values of a kill script.
type KillArgs struct {
	Dir string
	PID int
}

var (
	killVars = regexp.MustCompile(`(?m)^if \[ -d ` + quoted + ` \]; then\n\s*kill -KILL -- -(\d+) (\d+) `)
)

// ParseKill reads a "# kerneldeck:kill" script.
func ParseKill(command string) (KillArgs, error) {
	m := killVars.FindStringSubmatch(command)
	if Marker(command) != "kill" || m == nil || m[2] != m[3] {
		return KillArgs{}, fmt.Errorf("fakeenv: cannot parse kill script")
	}
	pid, _ := strconv.Atoi(m[2])
	return KillArgs{Dir: unq(m[1]), PID: pid}, nil
}

// RingArgs are the values of a ring script: the control line written to the
// runner's wake FIFO ("int CELL", "cfg SECONDS").
type RingArgs struct {
	Dir  string
	Line string
}

var ringVars = regexp.MustCompile(`(?m)^if \[ -p ` + quoted + `/wake \].* printf '%s\\n' ` + quoted + ` >&3`)

// ParseRing reads a "# kerneldeck:ring" script.
func ParseRing(command string) (RingArgs, error) {
	m := ringVars.FindStringSubmatch(command)
	if Marker(command) != "ring" || m == nil {
		return RingArgs{}, fmt.Errorf("fakeenv: cannot parse ring script")
	}
	return RingArgs{Dir: unq(m[1]), Line: unq(m[2])}, nil
}

var fetchVars = regexp.MustCompile(`(?m)^head -c (\d+) -- ` + quoted + `$`)

// ParseFetch reads a "# kerneldeck:fetch" script: the host path and the most
// bytes it prints.
func ParseFetch(command string) (path string, max int, err error) {
	m := fetchVars.FindStringSubmatch(command)
	if Marker(command) != "fetch" || m == nil {
		return "", 0, fmt.Errorf("fakeenv: cannot parse fetch script")
	}
	max, _ = strconv.Atoi(m[1])
	return unq(m[2]), max, nil
}

// OnceArgs are the values of a per-call (once) script and its stdin.
type OnceArgs struct {
	TempDir    string
	RunnerSize int
	Timeout    float64
	Runner     []byte
	Request    []byte // the request JSON after runner.py on stdin
}

var (
	onceTemp    = regexp.MustCompile(`mktemp -d ` + quoted + `/kerneldeck-once\.XXXXXXXX`)
	onceRunner  = regexp.MustCompile(`head -c (\d+) >"\$d/runner\.py"`)
	onceTimeout = regexp.MustCompile(`--once "\$d" ([0-9.e+-]+)`)
)

// ParseOnce reads a "# kerneldeck:once" script and splits its stdin.
func ParseOnce(command string, stdin []byte) (OnceArgs, error) {
	var a OnceArgs
	t, r, to := onceTemp.FindStringSubmatch(command), onceRunner.FindStringSubmatch(command), onceTimeout.FindStringSubmatch(command)
	if Marker(command) != "once" || t == nil || r == nil || to == nil {
		return a, fmt.Errorf("fakeenv: cannot parse once script")
	}
	a.TempDir = unq(t[1])
	a.RunnerSize, _ = strconv.Atoi(r[1])
	a.Timeout, _ = strconv.ParseFloat(to[1], 64)
	if len(stdin) < a.RunnerSize {
		return a, fmt.Errorf("fakeenv: once stdin has %d bytes, the script reads %d for runner.py", len(stdin), a.RunnerSize)
	}
	a.Runner, a.Request = stdin[:a.RunnerSize], stdin[a.RunnerSize:]
	return a, nil
}
