package fakeenv

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/engine/runner"
	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
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
	// published, and after its tool calls): the cell command answers
	// KD:LOST.
	Crash bool
	// Calls are tool calls the cell makes before it finishes (or hangs, or
	// crashes), one at a time and in order, as kerneldeck_tools does: each
	// writes a request file rpc/SEQ.req, which the next cell command
	// forwards ("KD:RPC SEQ.req JSON" ... "KD:RPCWAIT") and removes; the
	// cell goes on once the engine's answer arrives on a cell command with
	// ans=1. A cell waiting for an answer stops at an interrupt, like Hang.
	Calls []ToolCall
}

// ToolCall is one tool call of a simulated cell. By default its request
// file is what the runner's RPC.call writes:
// {"tool":..., "args":..., "token":<the kernel's token>, "cell":<the cell id>, "seq":N}.
type ToolCall struct {
	Tool string
	Args any // marshalled to JSON; nil is {}
	// Seq is the request's sequence number; 0 takes the runner's next one.
	Seq int64
	// Token and Cell replace the kernel's token and the running cell's id in
	// the request ("" keeps them): a forged or left-over request.
	Token, Cell string
	// Raw, when set, is the whole request file, verbatim (Seq still names
	// the file).
	Raw string
	// NoWait: the cell does not wait for an answer to this request and goes
	// on (a planted or replayed request file).
	NoWait bool
}

// rpcFileMax mirrors the engine's maxRPCFile: the cell command reports a
// larger request file as KD:RPCBAD instead of forwarding it.
const rpcFileMax = 1<<20 + 64<<10

type rpcFile struct{ name, data string }

// CellRequest is one request the simulated runner received.
type CellRequest struct {
	ID      string
	Code    string
	Timeout float64 // seconds, the request's "timeout"
	Kernel  string  // kernel id
	PID     int
	Dir     string
	// Transient: the cell runs in a per-call kernel (the fallback after a
	// failed spawn), which is killed after it.
	Transient bool
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
	// Transient: a per-call kernel, spawned in <TempDir>/kerneldeck-once-<ID>.
	Transient bool
	Token     string // the kernel's secret, from the config line on stdin
	Tools     string // the shipped kerneldeck_tools.py
	Alive     bool   // the runner process lives
	DirGone   bool   // the kernel dir was removed (kill, or RemoveDir)
	Killed    bool   // a kill command reached it while its dir existed
	// ExecCount is the runner's execution_count.
	ExecCount int
	// Cells lists the cell ids published to this runner, in order.
	Cells []string
	// Rings lists the control lines rung on its wake FIFO ("int ID", "cfg N").
	Rings []string
	// Forwarded lists the request files cell commands forwarded (and
	// removed), as "NAME JSON", in order.
	Forwarded []string
	// Answers lists every answer line written into its rpc dir, in order,
	// including ones no call waited for.
	Answers []Answer

	rpcSeq   int64
	rpcFiles []rpcFile            // request files not yet forwarded
	waiting  map[int64]*cellState // calls waiting for an answer, by seq
}

// CellRecord is one published cell as the host saw it.
type CellRecord struct {
	CellRequest
	ExecutionCount int
	Interrupts     int
	Done           bool
	Status         string
	// Requests counts the tool-call request files the cell wrote.
	Requests int
	// Answers are the answers its calls received, in order.
	Answers []Answer
}

type cellState struct {
	k       *Kernel
	rec     CellRecord
	outcome Outcome
	result  *Frame
	next    int            // index of the next call in outcome.Calls
	waiting map[int64]bool // seqs of its calls waiting for an answer
	settled bool           // past its calls: finished, hanging or crashed
}

// Host simulates a well-behaved kernel host at the protocol level. Its
// handlers mirror the engine's scripts: spawn answers "KD:SPAWNED <pid>
// <dir> <python>" with dir = <TempDir>/kerneldeck-<Login>/<kernel id>, or
// <TempDir>/kerneldeck-once-<kernel id> for a transient (per-call) kernel;
// a cell is published at most once per cell id (a repeated id only waits
// for its result, as the runner dedups), runs with an incrementing
// execution_count and answers "KD:RESULT {json}", after forwarding its tool
// calls (Outcome.Calls) and taking their answers; kill answers KD:KILLED,
// ring KD:OK, compile KD:CODE with FakeRunnerCode.
//
// Set the exported fields before the host answers its first command.
type Host struct {
	// Login names the kernel root (kerneldeck-<Login>). Default "tester".
	Login string
	// Python is the interpreter path spawn reports. Default /usr/bin/python3.
	Python string
	// Confinement is what spawned runners report ("landlock:6+userns" when empty).
	Confinement string
	// FirstPID is the pid of the first runner; later ones count up. Default 4242.
	FirstPID int
	// PendingDelay stands in for the host-side wait before KD:PENDING.
	// Default 2ms.
	PendingDelay time.Duration
	// OnCell decides what a published cell does, in a registry kernel or a
	// transient one (CellRequest.Transient); nil means every cell succeeds
	// with empty output. It runs under the host's lock: it must not call
	// the host.
	OnCell func(CellRequest) Outcome

	mu      sync.Mutex
	nextPID int
	kernels map[string]*Kernel // by dir
	order   []*Kernel
	cells   map[string]*cellState // by cellKey
	cellSeq []string
	files   map[string]string
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
		On("abandon", h.Abandon).Named("host abandon"),
		On("ring", h.Ring).Named("host ring"),
		On("fetch", h.Fetch).Named("host fetch"),
		On("compile", h.Compile).Named("host compile"),
	}
}

// FakeRunnerCode is what Compile answers as the compiled runner; spawns
// after it ship it as runner.code.
const FakeRunnerCode = "fake magic, fake marshalled runner"

// Compile answers a compile script with FakeRunnerCode.
func (h *Host) Compile(_ context.Context, c Call) (backends.Result, error) {
	if !bytes.Equal(c.Stdin, runner.Source) {
		return errResult(fmt.Errorf("fakeenv: compile stdin is %d bytes, not the runner's source", len(c.Stdin)))
	}
	return backends.Result{Output: "KD:CODE " + base64.StdEncoding.EncodeToString([]byte(FakeRunnerCode)) + "\n"}, nil
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
	dir := a.Dir(h.Login)
	if k := h.kernels[dir]; k != nil && !k.DirGone {
		return backends.Result{Output: "KD:ERR cannot create kernel dir " + dir + " (it already exists)\n", ReturnCode: 3}, nil
	}
	cfg, err := a.RunnerConfig()
	if err != nil {
		return errResult(err)
	}
	token := cfg.Secret
	k := &Kernel{ID: a.ID, PID: h.nextPID, Dir: dir, TempDir: a.TempDir, Transient: a.Transient, Token: token,
		Tools: string(a.Tools), Alive: true, waiting: map[int64]*cellState{}}
	h.nextPID++
	h.kernels[dir] = k
	h.order = append(h.order, k)
	return backends.Result{Output: fmt.Sprintf("KD:SPAWNED %d %s %s %s\n", k.PID, k.Dir, cmpOr(h.Python, "-"), cmpOr(h.Confinement, "landlock:6+userns"))}, nil
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
	if a.Publish && a.Answers {
		h.mu.Unlock()
		// The script's publish would read all of stdin: the answers are lost.
		return errResult(fmt.Errorf("cell script with pub=1 and ans=1"))
	}
	cs := h.cells[cellKey(a.Dir, a.ID)]
	if a.Publish && cs == nil {
		if !k.Alive {
			h.mu.Unlock()
			return Reply("KD:DEAD\n")(ctx, c)
		}
		var req struct {
			ID      string  `json:"id"`
			Code    string  `json:"code"`
			Timeout float64 `json:"timeout"`
		}
		mac, body, _ := strings.Cut(string(c.Stdin), " ")
		if !kernelauth.Valid(k.Token, mac, kernelauth.Request, body) {
			h.mu.Unlock()
			// The runner refuses an unsigned request: nothing runs.
			return Reply("fakeenv: cell request not signed by the engine\nKD:PENDING\n")(ctx, c)
		}
		if err := json.Unmarshal([]byte(body), &req); err != nil || req.ID != a.ID {
			h.mu.Unlock()
			return Reply("fakeenv: bad cell request on stdin\nKD:PUBFAIL\n")(ctx, c)
		}
		cs = h.publishLocked(k, CellRequest{ID: a.ID, Code: req.Code, Timeout: req.Timeout, Kernel: k.ID, PID: k.PID,
			Dir: k.Dir, Transient: k.Transient})
	}
	if a.Answers {
		answers, err := ParseAnswers(c.Stdin)
		if err == nil {
			for _, an := range answers {
				if !kernelauth.Valid(k.Token, an.MAC, kernelauth.Answer, fmt.Sprint(an.Seq), an.JSON) {
					err = fmt.Errorf("fakeenv: answer %d not signed by the engine", an.Seq)
				}
			}
		}
		if err != nil {
			h.mu.Unlock()
			return errResult(err)
		}
		h.deliverLocked(k, answers)
	}
	if a.Interrupt && kernelauth.Valid(k.Token, a.InterruptMAC, kernelauth.Interrupt, a.ID) {
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

// answerLocked is the cell script's wait loop, one pass: the result, else
// every pending request file (then KD:RPCWAIT), else KD:LOST if the runner
// is gone.
func (h *Host) answerLocked(k *Kernel, cs *cellState) (string, bool) {
	if cs != nil && cs.result != nil {
		line, _ := json.Marshal(cs.result)
		return "KD:RESULT " + kernelauth.MAC(k.Token, kernelauth.Result, string(line)) + " " + string(line) + "\n", true
	}
	if len(k.rpcFiles) > 0 {
		var b strings.Builder
		for _, f := range k.rpcFiles {
			if len(f.data) > rpcFileMax {
				fmt.Fprintf(&b, "KD:RPCBAD %s oversized:-more-than-%d-bytes\n", f.name, rpcFileMax)
			} else {
				fmt.Fprintf(&b, "KD:RPC %s %s\n", f.name, strings.NewReplacer("\n", " ", "\r", " ").Replace(f.data))
			}
			k.Forwarded = append(k.Forwarded, f.name+" "+f.data)
		}
		k.rpcFiles = nil
		b.WriteString("KD:RPCWAIT\n")
		return b.String(), true
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
	cs := &cellState{k: k, rec: CellRecord{CellRequest: req, ExecutionCount: k.ExecCount}, outcome: out, waiting: map[int64]bool{}}
	h.cells[cellKey(k.Dir, req.ID)] = cs
	h.cellSeq = append(h.cellSeq, cellKey(k.Dir, req.ID))
	h.advanceLocked(cs)
	return cs
}

// advanceLocked runs cs as far as it goes without an answer: it writes the
// request of each call it reaches (stopping at one that waits), and after
// the last call finishes, hangs or crashes.
func (h *Host) advanceLocked(cs *cellState) {
	k, out := cs.k, cs.outcome
	for cs.result == nil && k.Alive && len(cs.waiting) == 0 && cs.next < len(out.Calls) {
		call := out.Calls[cs.next]
		cs.next++
		seq := call.Seq
		if seq == 0 {
			seq = k.rpcSeq + 1
		}
		k.rpcSeq = max(k.rpcSeq, seq)
		data := call.Raw
		if data == "" {
			args := call.Args
			if args == nil {
				args = map[string]any{}
			}
			argsJSON, err := json.Marshal(args)
			if err != nil {
				panic("fakeenv: tool call args: " + err.Error())
			}
			cell := cmpOr(call.Cell, cs.rec.ID)
			token := call.Token
			if token == "" {
				token = kernelauth.MAC(k.Token, kernelauth.RPC, fmt.Sprint(seq), cell, call.Tool, string(argsJSON))
			}
			tool, _ := json.Marshal(call.Tool)
			cellJSON, _ := json.Marshal(cell)
			data = fmt.Sprintf(`{"tool":%s,"args":%s,"token":%q,"cell":%s,"seq":%d}`, tool, argsJSON, token, cellJSON, seq)
		}
		k.rpcFiles = append(k.rpcFiles, rpcFile{name: fmt.Sprintf("%d.req", seq), data: data})
		cs.rec.Requests++
		if !call.NoWait {
			cs.waiting[seq] = true
			k.waiting[seq] = cs
		}
	}
	if cs.result != nil || cs.settled || len(cs.waiting) > 0 || cs.next < len(out.Calls) {
		return
	}
	cs.settled = true
	switch {
	case out.Crash:
		k.Alive = false
	case !out.Hang:
		h.finishLocked(cs, out.Status)
	}
}

// deliverLocked writes answers into k's rpc dir: the runner hands each to
// the call waiting for its seq (and drops one nobody waits for), and that
// cell goes on.
func (h *Host) deliverLocked(k *Kernel, answers []Answer) {
	k.Answers = append(k.Answers, answers...)
	for _, a := range answers {
		cs := k.waiting[a.Seq]
		if cs == nil || !k.Alive {
			continue
		}
		delete(k.waiting, a.Seq)
		delete(cs.waiting, a.Seq)
		cs.rec.Answers = append(cs.rec.Answers, a)
		h.advanceLocked(cs)
	}
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
	// A call still waiting ends with the cell: a late answer is dropped.
	for seq := range cs.waiting {
		delete(cs.k.waiting, seq)
	}
	clear(cs.waiting)
}

func (h *Host) interruptLocked(cs *cellState) {
	cs.rec.Interrupts++
	blocked := cs.outcome.Hang || len(cs.waiting) > 0
	if cs.result == nil && cs.k.Alive && blocked && !cs.outcome.IgnoreInterrupt {
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

// Kill answers a kill script: its runners die and their dirs go.
func (h *Host) Kill(_ context.Context, c Call) (backends.Result, error) {
	targets, err := ParseKill(c.Command)
	if err != nil {
		return errResult(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range targets {
		if k := h.kernels[a.Dir]; k != nil && !k.DirGone && k.PID == a.PID {
			k.Alive, k.DirGone, k.Killed = false, true, true
		}
	}
	return backends.Result{Output: "KD:KILLED\n"}, nil
}

// Abandon answers an abandon script: the kernel with that id in that temp
// dir dies and its dir goes, whatever its pid.
func (h *Host) Abandon(_ context.Context, c Call) (backends.Result, error) {
	tempDir, id, err := ParseAbandon(c.Command)
	if err != nil {
		return errResult(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range h.kernels {
		if k.ID == id && k.TempDir == tempDir && !k.DirGone {
			k.Alive, k.DirGone, k.Killed = false, true, true
		}
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
	verb, rest, _ := strings.Cut(a.Line, " ")
	arg, mac, _ := strings.Cut(rest, " ")
	if !kernelauth.Valid(k.Token, mac, kernelauth.Kind(verb), arg) {
		return backends.Result{Output: "KD:OK\n"}, nil // written, and refused by the runner
	}
	line := verb + " " + arg
	k.Rings = append(k.Rings, line)
	if id, ok := strings.CutPrefix(line, "int "); ok {
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
		out[i].Forwarded = slices.Clone(k.Forwarded)
		out[i].Answers = slices.Clone(k.Answers)
		out[i].rpcFiles, out[i].waiting = nil, nil
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
		out[i].Answers = slices.Clone(out[i].Answers)
	}
	return out
}

// Runs returns how many times code was published to a runner, registry or
// transient (each publication runs it once).
func (h *Host) Runs(code string) int {
	n := 0
	for _, c := range h.Cells() {
		if c.Code == code {
			n++
		}
	}
	return n
}

// PerCallCells returns the cells published to transient (per-call)
// kernels, in publication order.
func (h *Host) PerCallCells() []CellRecord {
	var out []CellRecord
	for _, c := range h.Cells() {
		if c.Transient {
			out = append(out, c)
		}
	}
	return out
}
