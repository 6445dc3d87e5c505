package fakeenv

import (
	"encoding/json"
	"fmt"
	"path"
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
	// ID is the kernel id. A registry kernel's dir is
	// <TempDir>/kerneldeck-<login>/<ID>; a transient (per-call) kernel's is
	// <TempDir>/kerneldeck-once-<ID>. Dir computes either.
	ID string
	// Transient marks the per-call shape: no kernel root, the dir directly
	// in the temp dir.
	Transient bool
	Python    string // interpreter learnt from an earlier spawn, or ""
	Sizes     [3]int // byte lengths of runner.py, runner.code and kerneldeck_tools.py on stdin
	Bootstrap []byte // what the start program reads first
	Runner    []byte
	Code      []byte // the compiled runner, or empty: Runner is then the source
	Tools     []byte
	// Config is the rest of stdin: the runner's config line, with the
	// kernel's secret.
	Config []byte
}

// Dir returns the kernel dir the script creates on a host where the login
// name (id -un) is login; a transient dir does not depend on it.
func (a SpawnArgs) Dir(login string) string {
	if a.Transient {
		return path.Join(a.TempDir, "kerneldeck-once-"+a.ID)
	}
	return path.Join(a.TempDir, "kerneldeck-"+login, a.ID)
}

// RunnerConfig is the config line a runner reads on its stdin.
type RunnerConfig struct {
	Secret   string  `json:"secret"`
	IdleExit float64 `json:"idle_exit"`
	Clip     int     `json:"clip"`
	SpillMax int     `json:"spill_max"`
	Confine  bool    `json:"confine"`
}

// RunnerConfig parses the config line; an error means the engine shipped
// something a runner cannot read.
func (a SpawnArgs) RunnerConfig() (RunnerConfig, error) {
	var c RunnerConfig
	line, rest, ok := strings.Cut(string(a.Config), "\n")
	if !ok || rest != "" {
		return c, fmt.Errorf("fakeenv: the config is not one line: %q", a.Config)
	}
	if err := json.Unmarshal([]byte(line), &c); err != nil {
		return c, fmt.Errorf("fakeenv: config line: %w", err)
	}
	return c, nil
}

var (
	spawnTemp = regexp.MustCompile(`(?m)^t=` + quoted + `$`)
	// A registry kernel's dir is under the per-login kernel root ...
	spawnID = regexp.MustCompile(`(?m)^kd="\$root/"` + quoted + `$`)
	// ... a transient one's directly in the temp dir.
	spawnOnceID = regexp.MustCompile(`(?m)^kd="\$t/kerneldeck-once-"` + quoted + `$`)
	spawnPython = regexp.MustCompile(`(?m)^py=` + quoted + `$`)
	// All of stdin is the runner's to read: the bootstrap (its size in the
	// start program), then (KERNELDECK_STDIN) runner.py, the code and the
	// tool stubs, then the config.
	spawnSizes = regexp.MustCompile(`KERNELDECK_STDIN='(\d+) (\d+) (\d+)' `)
	spawnBoot  = regexp.MustCompile(`while len\(b\)<(\d+):`)
)

// ParseSpawn reads a "# kerneldeck:spawn" script (either dir shape) and
// splits its stdin.
func ParseSpawn(command string, stdin []byte) (SpawnArgs, error) {
	var a SpawnArgs
	if Marker(command) != "spawn" {
		return a, fmt.Errorf("fakeenv: not a spawn script")
	}
	t, id, onceID, py, sz := spawnTemp.FindStringSubmatch(command), spawnID.FindStringSubmatch(command),
		spawnOnceID.FindStringSubmatch(command), spawnPython.FindStringSubmatch(command), spawnSizes.FindStringSubmatch(command)
	boot := spawnBoot.FindStringSubmatch(command)
	if (id == nil) == (onceID == nil) {
		return a, fmt.Errorf("fakeenv: cannot parse spawn script: want exactly one kernel dir shape (root=%v once=%v)", id != nil, onceID != nil)
	}
	if onceID != nil {
		id, a.Transient = onceID, true
	}
	if t == nil || py == nil || sz == nil || boot == nil {
		return a, fmt.Errorf("fakeenv: cannot parse spawn script (t=%v py=%v sizes=%v bootstrap=%v)", t != nil, py != nil, sz != nil, boot != nil)
	}
	a.TempDir, a.ID, a.Python = unq(t[1]), unq(id[1]), unq(py[1])
	total, _ := strconv.Atoi(boot[1])
	if len(stdin) < total {
		return a, fmt.Errorf("fakeenv: spawn stdin has %d bytes, the bootstrap alone %d", len(stdin), total)
	}
	a.Bootstrap, stdin = stdin[:total], stdin[total:]
	total = 0
	for i := range a.Sizes {
		a.Sizes[i], _ = strconv.Atoi(sz[i+1])
		total += a.Sizes[i]
	}
	if len(stdin) < total {
		return a, fmt.Errorf("fakeenv: spawn stdin has %d bytes, the script reads %d", len(stdin), total)
	}
	a.Runner, stdin = stdin[:a.Sizes[0]], stdin[a.Sizes[0]:]
	a.Code, stdin = stdin[:a.Sizes[1]], stdin[a.Sizes[1]:]
	a.Tools, a.Config = stdin[:a.Sizes[2]], stdin[a.Sizes[2]:]
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
	// Answers: stdin holds tool-call answers, lines "SEQ MAC JSON" (see
	// ParseAnswers), instead of the cell request.
	Answers bool
	// InterruptMAC is the MAC rung with the interrupt.
	InterruptMAC string
}

var cellVars = regexp.MustCompile(`(?m)^kd=` + quoted + `; id=` + quoted + `; pid=(\d+); w=(\d+); pub=([01]); intr=([01]); ans=([01]); imac=` + quoted + `$`)

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
	a.Publish, a.Interrupt, a.Answers = m[5] == "1", m[6] == "1", m[7] == "1"
	a.InterruptMAC = unq(m[8])
	return a, nil
}

// Answer is one tool-call answer line of a cell script's stdin: the runner
// hands JSON (an object) to the call with sequence number Seq, if MAC is
// the engine's.
type Answer struct {
	Seq  int64
	JSON string
	MAC  string
}

var answerSeq = regexp.MustCompile(`^[0-9]{1,18}$`)

// ParseAnswers splits the stdin of a cell script with ans=1 into its answer
// lines. The host-side loop (while read -r line) silently skips a line with
// a malformed seq and drops a last line without its newline; here either is
// an error, as is a body that is not a JSON object (the runner only delivers
// objects): the engine must never send one.
func ParseAnswers(stdin []byte) ([]Answer, error) {
	s := string(stdin)
	if s == "" {
		return nil, fmt.Errorf("fakeenv: ans=1 with no answers on stdin")
	}
	if !strings.HasSuffix(s, "\n") {
		return nil, fmt.Errorf("fakeenv: the last answer line has no newline; the host would drop it")
	}
	var out []Answer
	for line := range strings.SplitSeq(strings.TrimSuffix(s, "\n"), "\n") {
		seq, signed, _ := strings.Cut(line, " ")
		mac, body, _ := strings.Cut(signed, " ")
		if !answerSeq.MatchString(seq) {
			return nil, fmt.Errorf("fakeenv: answer line %.80q has no valid seq; the host would skip it", line)
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &obj); err != nil || obj == nil {
			return nil, fmt.Errorf("fakeenv: answer %s is not a JSON object: %.80q", seq, body)
		}
		n, _ := strconv.ParseInt(seq, 10, 64)
		out = append(out, Answer{Seq: n, JSON: body, MAC: mac})
	}
	return out, nil
}

// KillArgs are the values of a kill script for one runner.
type KillArgs struct {
	Dir string
	PID int
}

var (
	killTarget = regexp.MustCompile(`(?m)^k ` + quoted + ` (\d+)$`)
	waitTarget = regexp.MustCompile(`(?m)^w ` + quoted + ` (\d+)$`)
)

// ParseKill reads a "# kerneldeck:kill" script: every runner it kills, each
// of which it also waits for.
func ParseKill(command string) ([]KillArgs, error) {
	kills, waits := killTarget.FindAllStringSubmatch(command, -1), waitTarget.FindAllStringSubmatch(command, -1)
	if Marker(command) != "kill" || len(kills) == 0 || len(kills) != len(waits) {
		return nil, fmt.Errorf("fakeenv: cannot parse kill script")
	}
	out := make([]KillArgs, len(kills))
	for i, m := range kills {
		if m[1] != waits[i][1] || m[2] != waits[i][2] {
			return nil, fmt.Errorf("fakeenv: kill script kills %s %s but waits for %s %s", m[1], m[2], waits[i][1], waits[i][2])
		}
		pid, _ := strconv.Atoi(m[2])
		out[i] = KillArgs{Dir: unq(m[1]), PID: pid}
	}
	return out, nil
}

var abandonArgs = regexp.MustCompile(`(?m)^t=` + quoted + `; id=` + quoted + `$`)

// ParseAbandon reads a "# kerneldeck:abandon" script: the temp dir and the
// id of the kernel whose given-up spawn it cleans up.
func ParseAbandon(command string) (tempDir, id string, err error) {
	m := abandonArgs.FindStringSubmatch(command)
	if Marker(command) != "abandon" || m == nil {
		return "", "", fmt.Errorf("fakeenv: cannot parse abandon script")
	}
	return unq(m[1]), unq(m[2]), nil
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

// RequestBody is the cell request a cell script's stdin publishes, without
// its MAC ("MAC JSON").
func RequestBody(stdin []byte) []byte {
	_, body, _ := strings.Cut(string(stdin), " ")
	return []byte(body)
}
