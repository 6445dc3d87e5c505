package headless

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"os/user"
	"slices"
	"strconv"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
)

type server struct {
	eng     *engine.Engine
	w       *lineWriter
	pump    *pump
	peer    *Peer
	version string
	// refusals says a restricted peer's refused requests, a few at a time.
	refusals *engine.Refusals
}

func (s *server) handle(ctx context.Context, r *request) {
	restricted := s.peer.restricted()
	switch r.op {
	case opExecute:
		if s.allowedOwner(r) {
			s.execute(ctx, r)
		}
	case opKernels:
		s.kernels(r)
	case opLimits:
		if restricted {
			s.deny(r, "change the limits")
			return
		}
		if r.perOwner != nil {
			if err := s.eng.SetOwnerQuota(*r.perOwner); err != nil {
				s.w.writeError(&r.id, err.Error())
				return
			}
		}
		if r.maxKernels != nil || r.idleExit != nil {
			if err := s.eng.SetLimits(r.maxKernels, r.idleExit); err != nil {
				s.w.writeError(&r.id, err.Error())
				return
			}
		}
		s.w.write(okLine{ID: r.id, Op: "ok"})
	case opInterrupt:
		if s.ownsKernel(r, r.kernel, "interrupt") {
			s.answer(r, s.eng.Interrupt(ctx, r.kernel))
		}
	case opKill:
		if s.ownsKernel(r, r.kernel, "kill") {
			s.answer(r, s.eng.Kill(ctx, r.kernel))
		}
	case opShutdownOwner:
		if restricted && r.owner != s.peer.Owner {
			s.deny(r, fmt.Sprintf("shut down owner %q", r.owner))
			return
		}
		n := s.eng.ShutdownOwner(ctx, r.owner)
		s.w.write(killedLine{ID: r.id, Op: "ok", Killed: n})
	case opShutdownAll:
		if restricted {
			s.deny(r, "shut down every kernel (shutdown_owner shuts down yours)")
			return
		}
		s.w.write(killedLine{ID: r.id, Op: "ok", Killed: s.eng.ShutdownAll(ctx)})
	case opApprove:
		if restricted {
			s.deny(r, "answer a tool call's approval (the engine's own user answers them)")
			return
		}
		s.answer(r, s.eng.Approve(r.approval, r.decision))
	case opHello:
		s.hello(r)
	case opSubscribe:
		s.pump.subscribe(r)
	case opCells:
		s.cells(r)
	}
}

type okLine struct {
	ID string `json:"id"`
	Op string `json:"op"`
}

type killedLine struct {
	ID     string `json:"id"`
	Op     string `json:"op"`
	Killed int    `json:"killed"`
}

func (s *server) answer(r *request, err error) {
	if err != nil {
		s.w.writeError(&r.id, err.Error())
		return
	}
	s.w.write(okLine{ID: r.id, Op: "ok"})
}

type resultLine struct {
	ID              string            `json:"id"`
	Op              string            `json:"op"`
	Status          engine.CellStatus `json:"status"`
	Stdout          string            `json:"stdout"`
	Stderr          string            `json:"stderr"`
	Traceback       string            `json:"traceback"`
	StdoutClipped   bool              `json:"stdout_clipped"`
	StderrClipped   bool              `json:"stderr_clipped"`
	SpillPath       string            `json:"spill_path"`
	StderrSpillPath string            `json:"stderr_spill_path"`
	ToolCallsMade   int               `json:"tool_calls_made"`
	DurationMS      float64           `json:"duration_ms"`
	Fallback        string            `json:"fallback"`
	// Displays are the cell's rich outputs (images, HTML, …), in order;
	// DisplayNote says what of them was dropped or clipped.
	Displays    []engine.Display `json:"displays,omitempty"`
	DisplayNote string           `json:"display_note,omitempty"`
	Kernel      *kernelLine      `json:"kernel"`
	// Cell is the cell's id, as events and the cells op name it (protocol 2).
	Cell string `json:"cell"`
}

type kernelLine struct {
	ID             string `json:"id"`
	PID            int    `json:"pid"`
	Dir            string `json:"dir"`
	Backend        string `json:"backend"`
	Reused         bool   `json:"reused"`
	ExecutionCount int    `json:"execution_count"`
	StateLost      bool   `json:"state_lost"`
	StateReset     bool   `json:"state_reset"`
	Note           string `json:"note"`
}

// startedLine tells a streamed execute's cell id before any of its output
// or events.
type startedLine struct {
	ID   string `json:"id"`
	Op   string `json:"op"`
	Cell string `json:"cell"`
}

// outputLine is a chunk of a streamed cell's output (execute with stream).
type outputLine struct {
	ID     string `json:"id"`
	Op     string `json:"op"`
	Stream string `json:"stream"`
	Text   string `json:"text"`
}

// displayLine is a display a streamed cell made, as it made it: an output
// line of stream "display" whose text is the display's label, so a client
// that knows only output lines shows the label.
type displayLine struct {
	outputLine
	Display engine.Display `json:"display"`
}

func (s *server) execute(ctx context.Context, r *request) {
	if r.stream {
		r.exec.OnStart = func(cell string) { s.w.write(startedLine{ID: r.id, Op: "started", Cell: cell}) }
		r.exec.OnOutput = func(stream, text string) {
			s.w.write(outputLine{ID: r.id, Op: "output", Stream: stream, Text: text})
		}
		r.exec.OnDisplay = func(d engine.Display) {
			s.w.write(displayLine{outputLine{ID: r.id, Op: "output", Stream: engine.StreamDisplay, Text: d.Label() + "\n"}, d})
		}
	}
	s.w.write(s.run(ctx, r))
}

func (s *server) run(ctx context.Context, r *request) any {
	res, err := s.eng.Execute(ctx, r.exec)
	if err != nil {
		return errorLine{ID: quote(r.id), Op: "error", Error: err.Error()}
	}
	line := resultLine{
		ID: r.id, Op: "result", Status: res.Status, Stdout: res.Stdout, Stderr: res.Stderr, Traceback: res.Traceback,
		StdoutClipped: res.StdoutClipped, StderrClipped: res.StderrClipped, SpillPath: res.SpillPath,
		StderrSpillPath: res.StderrSpillPath, ToolCallsMade: res.ToolCallsMade, DurationMS: millis(res.Duration),
		Fallback: res.Fallback, Cell: res.Cell, Displays: res.Displays, DisplayNote: res.DisplayNote,
	}
	if k := res.Kernel; k != nil {
		line.Kernel = &kernelLine{ID: k.ID, PID: k.PID, Dir: k.Dir, Backend: k.Backend, Reused: k.Reused,
			ExecutionCount: k.ExecutionCount, StateLost: k.StateLost, StateReset: k.StateReset, Note: k.Note}
	}
	return line
}

type kernelsLine struct {
	ID       string       `json:"id"`
	Op       string       `json:"op"`
	Count    int          `json:"count"`
	Cap      int          `json:"cap"`
	IdleExit float64      `json:"idle_exit"`
	Kernels  []kernelInfo `json:"kernels"`
	// Now is the engine's clock when it listed them (protocol 2), so a
	// client on another host can place the times on its own clock.
	Now time.Time `json:"now"`
	// Version names this listing (protocol 2): a kernels request that gives
	// it back as "unless_version" is answered with "unchanged" and no
	// kernels while nothing in the listing changed (idle times aside, which
	// follow from last_used), so a dashboard's refresh of an idle engine
	// costs it almost nothing.
	Version   string `json:"version"`
	Unchanged bool   `json:"unchanged,omitempty"`
	// Spares counts the runners started and idle, keyed to no one yet,
	// which count toward the cap (protocol 2; a dashboard's "spares N").
	Spares int `json:"spares"`
}

type kernelInfo struct {
	ID             string   `json:"id"`
	Owner          string   `json:"owner"`
	Task           string   `json:"task"`
	Backend        string   `json:"backend"`
	Child          string   `json:"child"`
	Tools          []string `json:"tools"`
	PID            int      `json:"pid"`
	Dir            string   `json:"dir"`
	Attached       bool     `json:"attached"`
	Queued         int      `json:"queued"`
	IdleS          float64  `json:"idle_s"`
	ExecutionCount int      `json:"execution_count"`
	// Added in protocol 2, for dashboards that attach.
	State        engine.KernelState `json:"state"`
	RunningCell  string             `json:"running_cell"`
	RunningSince *time.Time         `json:"running_since"`
	LastUsed     time.Time          `json:"last_used"`
	NextEvict    bool               `json:"next_evict"`
	Confinement  string             `json:"confinement"`
}

func (s *server) kernels(r *request) {
	maxKernels, idleExit := s.eng.Limits()
	infos := s.eng.Kernels()
	if s.peer.restricted() {
		infos = slices.DeleteFunc(infos, func(k engine.KernelInfo) bool { return k.Owner != s.peer.Owner })
	}
	spares := s.eng.Spares()
	line := kernelsLine{ID: r.id, Op: "kernels", Cap: maxKernels, IdleExit: idleExit.Seconds(), Now: time.Now(),
		Version: listingVersion(maxKernels, idleExit, spares, infos), Spares: spares}
	if r.version != "" && r.version == line.Version {
		line.Unchanged, line.Count, line.Kernels = true, len(infos), []kernelInfo{}
		s.w.write(line)
		return
	}
	line.Kernels = make([]kernelInfo, 0, len(infos))
	for _, k := range infos {
		tools := k.Tools
		if tools == nil {
			tools = []string{} // the contract promises an array, never null
		}
		ki := kernelInfo{
			ID: k.ID, Owner: k.Owner, Task: k.Task, Backend: k.Backend, Child: k.Child,
			Tools: tools, PID: k.PID, Dir: k.Dir, Attached: k.Attached, Queued: k.Queued,
			IdleS: math.Round(k.Idle.Seconds()*1000) / 1000, ExecutionCount: k.ExecutionCount,
			State: k.State, RunningCell: k.RunningCell, LastUsed: k.LastUsed, NextEvict: k.NextEvict, Confinement: k.Confinement,
		}
		if k.RunningCell != "" {
			since := k.RunningSince
			ki.RunningSince = &since
		}
		line.Kernels = append(line.Kernels, ki)
	}
	line.Count = len(line.Kernels)
	s.w.write(line)
}

type helloLine struct {
	ID          string   `json:"id"`
	Op          string   `json:"op"`
	Engine      string   `json:"engine"`
	Version     string   `json:"version"`
	Protocol    int      `json:"protocol"`
	PID         int      `json:"pid"`
	Backends    []string `json:"backends"`
	MaxKernels  int      `json:"max_kernels"`
	IdleExit    float64  `json:"idle_exit"`
	CellTimeout float64  `json:"cell_timeout"`
	You         youLine  `json:"you"`
	Ops         []string `json:"ops"`
}

// youLine is the caller as the engine sees it.
type youLine struct {
	UID   int    `json:"uid"`
	Login string `json:"login"`
	// Owner is the only owner the caller may act as; "" means any.
	Owner string `json:"owner"`
}

func (s *server) hello(r *request) {
	maxKernels, idleExit := s.eng.Limits()
	you := youLine{UID: os.Geteuid()}
	if u, err := user.Current(); err == nil {
		you.Login = u.Username
	}
	if p := s.peer; p != nil {
		you = youLine{UID: p.UID, Login: p.Login, Owner: p.Owner}
	}
	ops := make([]string, 0, len(opFields))
	for _, o := range []op{opExecute, opKernels, opLimits, opInterrupt, opKill, opShutdownOwner, opShutdownAll, opApprove,
		opHello, opSubscribe, opCells} {
		ops = append(ops, string(o))
	}
	s.w.write(helloLine{ID: r.id, Op: "hello", Engine: "kerneldeck", Version: s.version, Protocol: ProtocolVersion,
		PID: os.Getpid(), Backends: s.eng.Backends(), MaxKernels: maxKernels, IdleExit: idleExit.Seconds(),
		CellTimeout: s.eng.CellTimeout().Seconds(), You: you, Ops: ops})
}

type cellsLine struct {
	ID     string     `json:"id"`
	Op     string     `json:"op"`
	Kernel string     `json:"kernel"`
	Cells  []cellLine `json:"cells"`
}

type cellLine struct {
	engine.CellRecord
	DurationMS float64 `json:"duration_ms"`
}

func (s *server) cells(r *request) {
	recs := s.eng.Cells(r.kernel)
	if s.peer.restricted() {
		for _, rec := range recs {
			if rec.Owner != s.peer.Owner {
				s.deny(r, fmt.Sprintf("read the cells of kernel %s of owner %q", r.kernel, rec.Owner))
				return
			}
		}
		if !s.ownsKernel(r, r.kernel, "read the cells of") {
			return
		}
	}
	line := cellsLine{ID: r.id, Op: "cells", Kernel: r.kernel, Cells: make([]cellLine, len(recs))}
	for i, rec := range recs {
		line.Cells[i] = cellLine{CellRecord: rec, DurationMS: millis(rec.Duration)}
	}
	s.w.write(line)
}

// listingVersion hashes what a kernels listing says, but the idle times.
func listingVersion(maxKernels int, idleExit time.Duration, spares int, infos []engine.KernelInfo) string {
	h := fnv.New64a()
	var b []byte
	field := func(s string) { b = append(append(b, s...), 0) }
	num := func(n int64) { b = strconv.AppendInt(b, n, 10); b = append(b, 0) }
	num(int64(maxKernels))
	num(int64(idleExit))
	num(int64(spares))
	for _, k := range infos {
		b = b[:0]
		for _, s := range []string{k.ID, k.Owner, k.Task, k.Backend, k.Child, k.Dir, string(k.State), k.RunningCell, k.Confinement} {
			field(s)
		}
		for _, t := range k.Tools {
			field(t)
		}
		num(int64(k.PID))
		num(int64(k.Queued))
		num(int64(k.ExecutionCount))
		num(k.RunningSince.UnixNano())
		num(k.LastUsed.UnixNano())
		if k.Attached {
			field("a")
		}
		if k.NextEvict {
			field("n")
		}
		h.Write(b)
	}
	return strconv.FormatUint(h.Sum64(), 36)
}
