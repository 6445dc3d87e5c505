package fakeenv

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
)

// StreamEnv is an Env whose runners also answer on their sockets, as the
// real runner does: DialUnix makes the engine use its stream door, and the
// cells, interrupts and tool-call answers sent there reach the same Host
// records as the Execute door's (one runner, two doors, each cell id run
// at most once).
type StreamEnv struct {
	*Env
	h *Host

	mu sync.Mutex
	// refuse: dials fail, as when the socket is not there.
	refuse bool
	// cut: the stream drops right after the runner takes a cell, which
	// runs on.
	cut bool
	// die: the runner dies as a cell arrives on its socket, before it
	// records or runs it.
	die   bool
	dials int
	cells int
	live  sync.WaitGroup
}

// HealthyStreams returns a StreamEnv answered by a new healthy Host.
func HealthyStreams() (*StreamEnv, *Host) {
	e, h := Healthy()
	return &StreamEnv{Env: e, h: h}, h
}

// Refuse makes later dials fail (true) or succeed again (false).
func (s *StreamEnv) Refuse(on bool) { s.mu.Lock(); s.refuse = on; s.mu.Unlock() }

// CutAfterCell makes every stream drop right after its runner takes a cell.
func (s *StreamEnv) CutAfterCell(on bool) { s.mu.Lock(); s.cut = on; s.mu.Unlock() }

// DieOnCell makes the next runner a cell reaches on its socket die before
// it takes it (no ack): nothing on the host shows the cell came.
func (s *StreamEnv) DieOnCell(on bool) { s.mu.Lock(); s.die = on; s.mu.Unlock() }

// Dials counts the streams opened.
func (s *StreamEnv) Dials() int { s.mu.Lock(); defer s.mu.Unlock(); return s.dials }

// StreamCells counts the cell frames the runners took on their streams.
func (s *StreamEnv) StreamCells() int { s.mu.Lock(); defer s.mu.Unlock(); return s.cells }

// Wait waits until every stream served has ended.
func (s *StreamEnv) Wait() { s.live.Wait() }

// DialUnix implements backends.StreamDialer: path is a kernel's dir + "/sock".
func (s *StreamEnv) DialUnix(ctx context.Context, path string) (net.Conn, error) {
	dir, ok := strings.CutSuffix(path, "/sock")
	s.mu.Lock()
	refuse := s.refuse
	s.mu.Unlock()
	s.h.mu.Lock()
	k := s.h.kernels[dir]
	alive := k != nil && k.Alive && !k.DirGone
	s.h.mu.Unlock()
	if !ok || !alive || refuse {
		return nil, fmt.Errorf("fakeenv: dial %s: %w", path, syscall.ECONNREFUSED)
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "fakeenv-sock")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	s.dials++
	s.mu.Unlock()
	s.live.Add(1)
	go func() {
		defer s.live.Done()
		s.serve(k, conns[1])
	}()
	return conns[0], nil
}

// streamCell is a cell taken on one stream, until its result is sent.
type streamCell struct {
	cs     *cellState
	stream bool // send its stdout as an output frame before the result
}

// runnerSide is the runner's end of one stream.
type runnerSide struct {
	s     *StreamEnv
	k     *Kernel
	c     net.Conn
	br    *bufio.Reader
	taken []*streamCell
	watch string // a cell watched before it came
}

// frame is one line the engine sends a runner.
type frame struct {
	Op, ID, Code string
	Stream       bool
	Timeout      float64
	Seq          int64
	Result       json.RawMessage
}

func (r *runnerSide) send(v any) error {
	line, _ := json.Marshal(v)
	_, err := r.c.Write(append(line, '\n'))
	return err
}

// serve is the runner's side of one stream: the handshake, then frames
// until either side ends it or the runner dies.
func (s *StreamEnv) serve(k *Kernel, c net.Conn) {
	defer c.Close()
	r := &runnerSide{s: s, k: k, c: c, br: bufio.NewReader(c)}
	if !r.handshake() {
		return
	}
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		for {
			l, err := r.br.ReadBytes('\n')
			if err != nil {
				return
			}
			lines <- l
		}
	}()
	defer func() {
		c.Close()
		for range lines { // let the reader end
		}
	}()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		var out []any
		select {
		case l, ok := <-lines:
			if !ok {
				return
			}
			var f frame
			if json.Unmarshal(l, &f) != nil {
				out = append(out, map[string]string{"op": "error", "error": "bad frame"})
				break
			}
			reply, drop := r.take(f)
			out = append(out, reply...)
			if drop {
				for _, f := range out {
					r.send(f) // what the runner said before its stream ended (an ack)
				}
				return
			}
		case <-tick.C:
		}
		due, alive := r.due()
		if !alive {
			return // a dead runner's socket ends
		}
		for _, f := range append(out, due...) {
			if r.send(f) != nil {
				return
			}
		}
	}
}

// handshake proves each side holds the kernel's secret, as the runner does;
// a peer that cannot is dropped.
func (r *runnerSide) handshake() bool {
	nonce := kernelauth.NewNonce()
	if r.send(map[string]string{"op": "hello", "nonce": nonce}) != nil {
		return false
	}
	var auth struct{ Op, MAC, Nonce string }
	line, err := r.br.ReadBytes('\n')
	if err != nil || json.Unmarshal(line, &auth) != nil || auth.Op != "auth" || !kernelauth.Valid(r.k.Token, auth.MAC, kernelauth.Engine, nonce) {
		return false
	}
	return r.send(map[string]string{"op": "auth_ok", "mac": kernelauth.MAC(r.k.Token, kernelauth.Runner, auth.Nonce)}) == nil
}

// take acts on one frame from the engine; drop: the stream ends here.
func (r *runnerSide) take(f frame) (reply []any, drop bool) {
	s, h, k := r.s, r.s.h, r.k
	s.mu.Lock()
	die, cut := s.die, s.cut
	s.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	switch f.Op {
	case "cell":
		if !k.Alive || die {
			k.Alive = false
			s.mu.Lock()
			s.die = false // one runner dies; the next one lives
			s.mu.Unlock()
			return nil, true
		}
		cs := h.cells[cellKey(k.Dir, f.ID)]
		if cs == nil {
			cs = h.publishLocked(k, CellRequest{ID: f.ID, Code: f.Code, Timeout: f.Timeout, Kernel: k.ID, PID: k.PID,
				Dir: k.Dir, Transient: k.Transient})
		}
		r.taken = append(r.taken, &streamCell{cs: cs, stream: f.Stream || r.watch == f.ID})
		s.mu.Lock()
		s.cells++
		s.mu.Unlock()
		// Taken, before it runs, as the runner says it.
		return []any{map[string]string{"op": "ack", "id": f.ID}}, cut
	case "watch":
		r.watch = f.ID
		for _, t := range r.taken {
			t.stream = t.stream || t.cs.rec.ID == f.ID
		}
	case "interrupt":
		if cs := h.cells[cellKey(k.Dir, f.ID)]; cs != nil {
			h.interruptLocked(cs)
		}
	case "rpc_result":
		h.deliverLocked(k, []Answer{{Seq: f.Seq, JSON: string(f.Result)}})
	case "config":
	default:
		return []any{map[string]string{"op": "error", "error": "unknown op " + f.Op}}, false
	}
	return nil, false
}

// due is what the runner has to send now: the tool requests of its cells,
// and the results of those that finished (their stdout first, if
// streamed). alive=false: the runner died.
func (r *runnerSide) due() (out []any, alive bool) {
	h, k := r.s.h, r.k
	h.mu.Lock()
	defer h.mu.Unlock()
	if !k.Alive || k.DirGone {
		return nil, false
	}
	if len(r.taken) > 0 {
		for _, f := range k.rpcFiles {
			out = append(out, map[string]string{"op": "rpc", "name": f.name, "data": f.data})
			k.Forwarded = append(k.Forwarded, f.name+" "+f.data)
		}
		k.rpcFiles = nil
	}
	rest := r.taken[:0]
	for _, t := range r.taken {
		res := t.cs.result
		if res == nil {
			rest = append(rest, t)
			continue
		}
		if t.stream && res.Stdout != "" {
			out = append(out, map[string]string{"op": "output", "id": res.ID, "stream": "stdout", "text": res.Stdout})
		}
		out = append(out, *res)
	}
	r.taken = rest
	return out, true
}
