package fakeenv

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
)

// Outcome is what the simulated runner does with one cell.
type Outcome struct {
	Status    string // ok (the default), error, exit, interrupted
	Stdout    string
	Stderr    string
	Traceback string
	// SpillStdout, when set, is the full stdout: the result says stdout was
	// clipped and points at a spill file in the kernel's cells dir, which a
	// fetch command then returns.
	SpillStdout string
	// Hang: the cell does not finish; cell commands answer KD:PENDING until
	// it is interrupted (then the result has status "interrupted").
	Hang bool
	// IgnoreInterrupt (with Hang): not even an interrupt ends the cell.
	IgnoreInterrupt bool
	// Crash: the runner dies while running this cell (after it was
	// published): the cell command answers KD:LOST.
	Crash bool
}

// CellRequest is one request the simulated runner received.
type CellRequest struct {
	ID     string
	Code   string
	Kernel string // kernel id
	PID    int
	Dir    string
}

// Frame is a result as the runner writes it (cells/ID.res, KD:RESULT).
type Frame struct {
	Op             string  `json:"op"`
	ID             string  `json:"id"`
	Status         string  `json:"status"`
	Stdout         string  `json:"stdout"`
	Stderr         string  `json:"stderr"`
	StdoutClipped  bool    `json:"stdout_clipped"`
	StderrClipped  bool    `json:"stderr_clipped"`
	StdoutSpill    string  `json:"stdout_spill"`
	StderrSpill    string  `json:"stderr_spill"`
	Traceback      string  `json:"traceback"`
	ExecutionCount int     `json:"execution_count"`
	DurationMS     float64 `json:"duration_ms"`
}

// Kernel is the host-side record of one spawned runner.
type Kernel struct {
	ID      string
	PID     int
	Dir     string
	TempDir string
	Token   string // KERNELDECK_RPC_TOKEN from the shipped env file
	Tools   string // the shipped kerneldeck_tools.py
	Alive   bool   // the runner process lives
	DirGone bool   // the kernel dir was removed (kill, or RemoveDir)
	Killed  bool   // a kill command reached it while its dir existed
	// ExecCount is the runner's execution_count.
	ExecCount int
	// Cells lists the cell ids published to this runner, in order.
	Cells []string
	// Rings lists the control lines rung on its wake FIFO ("int ID", "cfg N").
	Rings []string
}

// CellRecord is one published cell as the host saw it.
type CellRecord struct {
	CellRequest
	ExecutionCount int
	Interrupts     int
	Done           bool
	Status         string
}

type cellState struct {
	rec     CellRecord
	outcome Outcome
	result  *Frame
}

// Host simulates a well-behaved kernel host at the protocol level. Its
// handlers mirror the engine's scripts: spawn answers "KD:SPAWNED <pid>
// <dir> <python>" with dir = <TempDir>/kerneldeck-<Login>/<kernel id>; a
// cell is published at most once per cell id (a repeated id only waits for
// its result, as the runner dedups), runs with an incrementing
// execution_count and answers "KD:RESULT {json}"; kill answers KD:KILLED,
// ring KD:OK, once a fresh KD:RESULT per call.
//
// Set the exported fields before the host answers its first command.
type Host struct {
	// Login names the kernel root (kerneldeck-<Login>). Default "tester".
	Login string
	// Python is the interpreter path spawn reports. Default /usr/bin/python3.
	Python string
	// FirstPID is the pid of the first runner; later ones count up. Default 4242.
	FirstPID int
	// PendingDelay stands in for the host-side wait before KD:PENDING.
	// Default 2ms.
	PendingDelay time.Duration
	// OnCell decides what a published cell does; nil means every cell
	// succeeds with empty output.
	OnCell func(CellRequest) Outcome
	// OnOnce decides what a per-call (fallback) run does; nil means it
	// succeeds and prints "per-call ran\n".
	OnOnce func(CellRequest) Outcome

	mu      sync.Mutex
	nextPID int
	kernels map[string]*Kernel // by dir
	order   []*Kernel
	cells   map[string]*cellState // by cellKey
	cellSeq []string
	files   map[string]string
	onces   []CellRequest
}

// NewHost returns a healthy host with the defaults above.
func NewHost() *Host {
	return &Host{Login: "tester", Python: "/usr/bin/python3", FirstPID: 4242, PendingDelay: 2 * time.Millisecond,
		kernels: map[string]*Kernel{}, cells: map[string]*cellState{}, files: map[string]string{}}
}

// Handlers returns the host's handlers for every marker.
func (h *Host) Handlers() []*Handler {
	return []*Handler{
		On("spawn", h.Spawn).Named("host spawn"),
		On("cell", h.Cell).Named("host cell"),
		On("kill", h.Kill).Named("host kill"),
		On("ring", h.Ring).Named("host ring"),
		On("fetch", h.Fetch).Named("host fetch"),
		On("once", h.Once).Named("host once"),
	}
}

func errResult(err error) (backends.Result, error) {
	return backends.Result{Output: "KD:ERR " + err.Error() + "\n", ReturnCode: 99}, nil
}

// Spawn answers a spawn script: it records the kernel and reports its pid and dir.
func (h *Host) Spawn(_ context.Context, c Call) (backends.Result, error) {
	a, err := ParseSpawn(c.Command, c.Stdin)
	if err != nil {
		return errResult(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.nextPID == 0 {
		h.nextPID = h.FirstPID
	}
	dir := path.Join(a.TempDir, "kerneldeck-"+h.Login, a.ID)
	if k := h.kernels[dir]; k != nil && !k.DirGone {
		return backends.Result{Output: "KD:ERR cannot create kernel dir " + dir + " (it may already exist)\n", ReturnCode: 3}, nil
	}
	token, _ := a.Env("KERNELDECK_RPC_TOKEN")
	k := &Kernel{ID: a.ID, PID: h.nextPID, Dir: dir, TempDir: a.TempDir, Token: token, Tools: string(a.Tools), Alive: true}
	h.nextPID++
	h.kernels[dir] = k
	h.order = append(h.order, k)
	return backends.Result{Output: fmt.Sprintf("KD:SPAWNED %d %s %s\n", k.PID, k.Dir, h.Python)}, nil
}

// Cell answers a cell script the way cellScript and the runner behave.
func (h *Host) Cell(ctx context.Context, c Call) (backends.Result, error) {
	a, err := ParseCell(c.Command)
	if err != nil {
		return errResult(err)
	}
	h.mu.Lock()
	k := h.kernels[a.Dir]
	if k == nil || k.DirGone {
		h.mu.Unlock()
		return Reply("KD:GONE\n")(ctx, c)
	}
	cs := h.cells[cellKey(a.Dir, a.ID)]
	if a.Publish && cs == nil {
		if !k.Alive {
			h.mu.Unlock()
			return Reply("KD:DEAD\n")(ctx, c)
		}
		var req struct {
			ID   string `json:"id"`
			Code string `json:"code"`
		}
		if err := json.Unmarshal(c.Stdin, &req); err != nil || req.ID != a.ID {
			h.mu.Unlock()
			return Reply("fakeenv: bad cell request on stdin\nKD:PUBFAIL\n")(ctx, c)
		}
		cs = h.publishLocked(k, CellRequest{ID: a.ID, Code: req.Code, Kernel: k.ID, PID: k.PID, Dir: k.Dir})
	}
	if a.Interrupt {
		k.Rings = append(k.Rings, "int "+a.ID)
		if cs != nil {
			h.interruptLocked(cs)
		}
	}
	if out, ok := h.answerLocked(k, cs); ok {
		h.mu.Unlock()
		return Reply(out)(ctx, c)
	}
	delay := h.PendingDelay
	h.mu.Unlock()
	// The host waits (here: briefly) for the result, then answers again.
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return backends.Result{}, fmt.Errorf("%w: %w", ErrTransport, ctx.Err())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if out, ok := h.answerLocked(k, cs); ok {
		return Reply(out)(ctx, c)
	}
	return Reply("KD:PENDING\n")(ctx, c)
}

func (h *Host) answerLocked(k *Kernel, cs *cellState) (string, bool) {
	if cs != nil && cs.result != nil {
		line, _ := json.Marshal(cs.result)
		return "KD:RESULT " + string(line) + "\n", true
	}
	if !k.Alive || k.DirGone {
		return "KD:LOST\n", true
	}
	return "", false
}

func (h *Host) publishLocked(k *Kernel, req CellRequest) *cellState {
	out := Outcome{Status: "ok"}
	if h.OnCell != nil {
		out = h.OnCell(req)
	}
	k.ExecCount++
	k.Cells = append(k.Cells, req.ID)
	cs := &cellState{rec: CellRecord{CellRequest: req, ExecutionCount: k.ExecCount}, outcome: out}
	h.cells[cellKey(k.Dir, req.ID)] = cs
	h.cellSeq = append(h.cellSeq, cellKey(k.Dir, req.ID))
	switch {
	case out.Crash:
		k.Alive = false
	case !out.Hang:
		h.finishLocked(cs, out.Status)
	}
	return cs
}

func (h *Host) finishLocked(cs *cellState, status string) {
	out := cs.outcome
	f := &Frame{Op: "result", ID: cs.rec.ID, Status: cmpOr(status, "ok"), Stdout: out.Stdout, Stderr: out.Stderr,
		Traceback: out.Traceback, ExecutionCount: cs.rec.ExecutionCount, DurationMS: 1}
	if out.SpillStdout != "" {
		f.StdoutClipped = true
		f.StdoutSpill = cs.rec.Dir + "/cells/" + cs.rec.ID + ".out"
		h.files[f.StdoutSpill] = out.SpillStdout
	}
	if status == "interrupted" && f.Traceback == "" {
		f.Traceback = "KeyboardInterrupt\n"
	}
	cs.result = f
	cs.rec.Done, cs.rec.Status = true, f.Status
}

func (h *Host) interruptLocked(cs *cellState) {
	cs.rec.Interrupts++
	if cs.result == nil && cs.outcome.Hang && !cs.outcome.IgnoreInterrupt {
		h.finishLocked(cs, "interrupted")
	}
}

// cellKey names a cell on one runner: the runner dedups ids in its own dir.
func cellKey(dir, id string) string { return dir + "\x00" + id }

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Kill answers a kill script: the runner dies and its dir goes.
func (h *Host) Kill(_ context.Context, c Call) (backends.Result, error) {
	a, err := ParseKill(c.Command)
	if err != nil {
		return errResult(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if k := h.kernels[a.Dir]; k != nil && !k.DirGone && k.PID == a.PID {
		k.Alive, k.DirGone, k.Killed = false, true, true
	}
	return backends.Result{Output: "KD:KILLED\n"}, nil
}

// Ring answers a ring script: "int ID" interrupts that cell if it runs.
func (h *Host) Ring(_ context.Context, c Call) (backends.Result, error) {
	a, err := ParseRing(c.Command)
	if err != nil {
		return errResult(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	k := h.kernels[a.Dir]
	if k == nil || k.DirGone || !k.Alive {
		return backends.Result{Output: "KD:DEAD\n"}, nil
	}
	k.Rings = append(k.Rings, a.Line)
	if id, ok := strings.CutPrefix(a.Line, "int "); ok {
		if cs := h.cells[cellKey(k.Dir, id)]; cs != nil {
			h.interruptLocked(cs)
		}
	}
	return backends.Result{Output: "KD:OK\n"}, nil
}

// Fetch answers a fetch script with a spill file's content.
func (h *Host) Fetch(_ context.Context, c Call) (backends.Result, error) {
	p, max, err := ParseFetch(c.Command)
	if err != nil {
		return errResult(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	data, ok := h.files[p]
	if !ok {
		return backends.Result{Output: "head: cannot open '" + p + "' for reading: No such file or directory\n", ReturnCode: 1}, nil
	}
	if len(data) > max {
		data = data[:max]
	}
	return backends.Result{Output: data}, nil
}

// Once answers a per-call script with a fresh result (execution_count 1).
func (h *Host) Once(_ context.Context, c Call) (backends.Result, error) {
	a, err := ParseOnce(c.Command, c.Stdin)
	if err != nil {
		return errResult(err)
	}
	var req struct {
		ID   string `json:"id"`
		Code string `json:"code"`
	}
	if err := json.Unmarshal(a.Request, &req); err != nil {
		return errResult(fmt.Errorf("bad request on stdin: %w", err))
	}
	r := CellRequest{ID: req.ID, Code: req.Code}
	out := Outcome{Status: "ok", Stdout: "per-call ran\n"}
	if h.OnOnce != nil {
		out = h.OnOnce(r)
	}
	status := cmpOr(out.Status, "ok")
	if out.Hang {
		status = "interrupted" // the runner's alarm fires at the timeout
	}
	h.mu.Lock()
	h.onces = append(h.onces, r)
	h.mu.Unlock()
	f := Frame{Op: "result", ID: req.ID, Status: status, Stdout: out.Stdout, Stderr: out.Stderr,
		Traceback: out.Traceback, ExecutionCount: 1, DurationMS: 1}
	line, _ := json.Marshal(f)
	return backends.Result{Output: "KD:RESULT " + string(line) + "\n"}, nil
}

// Crash makes the runner with pid die (as kill -9 would) without removing
// its dir.
func (h *Host) Crash(pid int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range h.order {
		if k.PID == pid {
			k.Alive = false
		}
	}
}

// RemoveDir makes the runner with pid die and its dir vanish (as when it
// exits idle and cleans up).
func (h *Host) RemoveDir(pid int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range h.order {
		if k.PID == pid {
			k.Alive, k.DirGone = false, true
		}
	}
}

// Kernels returns a copy of every kernel ever spawned, in spawn order.
func (h *Host) Kernels() []Kernel {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Kernel, len(h.order))
	for i, k := range h.order {
		out[i] = *k
		out[i].Cells = slices.Clone(k.Cells)
		out[i].Rings = slices.Clone(k.Rings)
	}
	return out
}

// Kernel returns the kernel with the given id or pid (pass 0 or "" for the
// other), and whether there is one.
func (h *Host) Kernel(id string, pid int) (Kernel, bool) {
	for _, k := range h.Kernels() {
		if (id != "" && k.ID == id) || (pid != 0 && k.PID == pid) {
			return k, true
		}
	}
	return Kernel{}, false
}

// Cells returns every published cell in publication order.
func (h *Host) Cells() []CellRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]CellRecord, len(h.cellSeq))
	for i, key := range h.cellSeq {
		out[i] = h.cells[key].rec
	}
	return out
}

// Runs returns how many times code was published to a runner (each
// publication runs it once).
func (h *Host) Runs(code string) int {
	n := 0
	for _, c := range h.Cells() {
		if c.Code == code {
			n++
		}
	}
	return n
}

// Onces returns the per-call requests, in order.
func (h *Host) Onces() []CellRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.onces)
}
