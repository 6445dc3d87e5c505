package headless

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"os/user"
	"slices"
	"strconv"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/wire"
)

type server struct {
	eng     *engine.Engine
	w       *lineWriter
	pump    *pump
	peer    *Peer
	version string
	// refusals says a restricted peer's refused requests, a few at a time.
	refusals *engine.Refusals
	inputs   inputs
}

func (s *server) handle(ctx context.Context, r *request) {
	restricted := s.peer.restricted()
	switch r.op {
	case wire.OpExecute:
		if s.allowedOwner(r) {
			s.execute(ctx, r)
		}
	case wire.OpKernels:
		s.kernels(r)
	case wire.OpLimits:
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
		if r.hibernateAfter != nil {
			if err := s.eng.SetHibernateAfter(*r.hibernateAfter); err != nil {
				s.w.writeError(&r.id, err.Error())
				return
			}
		}
		s.w.write(wire.OK{Head: wire.Head{ID: r.id, Op: wire.OpOK}})
	case wire.OpInterrupt:
		if s.ownsKernel(r, r.kernel, "interrupt") {
			s.answer(r, s.eng.Interrupt(ctx, r.kernel))
		}
	case wire.OpKill:
		if s.ownsKernel(r, r.kernel, "kill") {
			s.answer(r, s.eng.Kill(ctx, r.kernel))
		}
	case wire.OpShutdownOwner:
		if restricted && r.owner != s.peer.Owner {
			s.deny(r, fmt.Sprintf("shut down owner %q", r.owner))
			return
		}
		n := s.eng.ShutdownOwner(ctx, r.owner)
		s.w.write(wire.Killed{Head: wire.Head{ID: r.id, Op: wire.OpOK}, Killed: n})
	case wire.OpShutdownAll:
		if restricted {
			s.deny(r, "shut down every kernel (shutdown_owner shuts down yours)")
			return
		}
		s.w.write(wire.Killed{Head: wire.Head{ID: r.id, Op: wire.OpOK}, Killed: s.eng.ShutdownAll(ctx)})
	case wire.OpApprove:
		if restricted {
			s.deny(r, "answer a tool call's approval (the engine's own user answers them)")
			return
		}
		s.answer(r, s.eng.Approve(r.approval, r.decision))
	case wire.OpHello:
		s.hello(r)
	case wire.OpSubscribe:
		s.pump.subscribe(r)
	case wire.OpCells:
		s.cells(r)
	case wire.OpComplete:
		if s.ownsKernel(r, r.kernel, "complete in") {
			c, err := s.eng.Complete(ctx, r.kernel, r.code, r.cursor)
			if err != nil {
				s.w.writeError(&r.id, err.Error())
				return
			}
			s.w.write(wire.Completions{Head: wire.Head{ID: r.id, Op: wire.OpCompletions}, Start: c.Start, Matches: c.Matches})
		}
	case wire.OpInputReply:
		s.reply(r)
	case wire.OpPark:
		if s.ownsKernel(r, r.kernel, "park") {
			p, err := s.eng.Park(ctx, r.kernel)
			if err != nil {
				s.w.writeError(&r.id, err.Error())
				return
			}
			s.w.write(wire.ParkDone{Head: wire.Head{ID: r.id, Op: wire.OpOK}, Parked: p})
		}
	case wire.OpDropParked:
		if restricted && r.owner != s.peer.Owner {
			s.deny(r, fmt.Sprintf("drop a parked state of owner %q", r.owner))
			return
		}
		d := r.exec
		ok, err := s.eng.DropParked(d.Owner, d.Backend, d.Task, d.Child, d.Tools)
		if err != nil {
			s.w.writeError(&r.id, err.Error())
			return
		}
		s.w.write(wire.Dropped{Head: wire.Head{ID: r.id, Op: wire.OpOK}, Dropped: ok})
	}
}

func (s *server) answer(r *request, err error) {
	if err != nil {
		s.w.writeError(&r.id, err.Error())
		return
	}
	s.w.write(wire.OK{Head: wire.Head{ID: r.id, Op: wire.OpOK}})
}

func (s *server) execute(ctx context.Context, r *request) {
	if r.stream {
		head := wire.Head{ID: r.id, Op: wire.OpOutput}
		r.exec.OnStart = func(cell string) { s.w.write(wire.Started{Head: wire.Head{ID: r.id, Op: wire.OpStarted}, Cell: cell}) }
		r.exec.OnOutput = func(stream, text string) { s.w.write(wire.Output{Head: head, Stream: stream, Text: text}) }
		r.exec.OnDisplay = func(d engine.Display) {
			s.w.write(wire.DisplayOutput{Output: wire.Output{Head: head, Stream: engine.StreamDisplay, Text: d.Label() + "\n"}, Display: d})
		}
	}
	if r.input {
		r.exec.OnInput = s.asker(r.id)
	}
	s.w.write(s.run(ctx, r))
}

func (s *server) run(ctx context.Context, r *request) any {
	res, err := s.eng.Execute(ctx, r.exec)
	if err != nil {
		return wire.Error{ID: quote(r.id), Op: wire.OpError, Error: err.Error()}
	}
	return wire.ResultOf(r.id, res)
}

func (s *server) kernels(r *request) {
	maxKernels, idleExit := s.eng.Limits()
	infos := s.eng.Kernels()
	if s.peer.restricted() {
		infos = slices.DeleteFunc(infos, func(k engine.KernelInfo) bool { return k.Owner != s.peer.Owner })
	}
	spares := s.eng.Spares()
	parked := s.eng.Parked()
	if s.peer.restricted() {
		parked = slices.DeleteFunc(parked, func(p engine.ParkedKernel) bool { return p.Owner != s.peer.Owner })
	}
	if parked == nil {
		parked = []engine.ParkedKernel{}
	}
	hibernate := s.eng.HibernateAfter()
	line := wire.Kernels{Head: wire.Head{ID: r.id, Op: wire.OpKernels}, Cap: maxKernels, IdleExit: idleExit.Seconds(),
		HibernateAfter: hibernate.Seconds(), Now: time.Now(),
		Version: listingVersion(maxKernels, idleExit, hibernate, spares, infos, parked), Spares: spares, Parked: parked}
	if r.version != "" && r.version == line.Version {
		line.Unchanged, line.Count, line.Kernels = true, len(infos), []wire.Kernel{}
		s.w.write(line)
		return
	}
	line.Kernels = make([]wire.Kernel, len(infos))
	for i, k := range infos {
		line.Kernels[i] = wire.KernelOf(k)
	}
	line.Count = len(line.Kernels)
	s.w.write(line)
}

func (s *server) hello(r *request) {
	maxKernels, idleExit := s.eng.Limits()
	you := wire.You{UID: os.Geteuid()}
	if u, err := user.Current(); err == nil {
		you.Login = u.Username
	}
	if p := s.peer; p != nil {
		you = wire.You{UID: p.UID, Login: p.Login, Owner: p.Owner}
	}
	python, cwd := s.eng.LocalPlace()
	s.w.write(wire.Hello{Head: wire.Head{ID: r.id, Op: wire.OpHello}, Engine: "kerneldeck", Version: s.version, Protocol: wire.Protocol,
		PID: os.Getpid(), Backends: s.eng.Backends(), MaxKernels: maxKernels, IdleExit: idleExit.Seconds(),
		CellTimeout: s.eng.CellTimeout().Seconds(), You: you, Ops: wire.Ops(), Python: python, Cwd: cwd})
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
	line := wire.Cells{Head: wire.Head{ID: r.id, Op: wire.OpCells}, Kernel: r.kernel, Cells: make([]wire.Cell, len(recs))}
	for i, rec := range recs {
		line.Cells[i] = wire.CellOf(rec)
	}
	s.w.write(line)
}

// listingVersion hashes what a kernels listing says, but the idle times.
func listingVersion(maxKernels int, idleExit, hibernateAfter time.Duration, spares int, infos []engine.KernelInfo, parked []engine.ParkedKernel) string {
	h := fnv.New64a()
	var b []byte
	field := func(s string) { b = append(append(b, s...), 0) }
	num := func(n int64) { b = strconv.AppendInt(b, n, 10); b = append(b, 0) }
	num(int64(maxKernels))
	num(int64(idleExit))
	num(int64(hibernateAfter))
	num(int64(spares))
	h.Write(b)
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
	for _, p := range parked {
		b = b[:0]
		field(p.Key)
		field(p.Kernel)
		num(p.Parked.UnixNano())
		if p.Hibernated {
			field("h")
		}
		h.Write(b)
	}
	return strconv.FormatUint(h.Sum64(), 36)
}
