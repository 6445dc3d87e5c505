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

// DieOnCell makes a runner die as a cell arrives on its socket, before it
// records or runs it: nothing on the host shows the cell came.
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

// serve is the runner's side of one stream: the handshake, then frames
// until either side ends it or the runner dies.
func (s *StreamEnv) serve(k *Kernel, c net.Conn) {
	defer c.Close()
	h := s.h
	send := func(v any) error {
		line, _ := json.Marshal(v)
		_, err := c.Write(append(line, '\n'))
		return err
	}
	br := bufio.NewReader(c)
	nonce := kernelauth.NewNonce()
	if send(map[string]string{"op": "hello", "nonce": nonce}) != nil {
		return
	}
	var auth struct{ Op, MAC, Nonce string }
	line, err := br.ReadBytes('\n')
	if err != nil || json.Unmarshal(line, &auth) != nil || auth.Op != "auth" || !kernelauth.Valid(k.Token, auth.MAC, kernelauth.Engine, nonce) {
		return // the runner drops a peer that cannot prove the secret
	}
	if send(map[string]string{"op": "auth_ok", "mac": kernelauth.MAC(k.Token, kernelauth.Runner, auth.Nonce)}) != nil {
		return
	}
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		for {
			l, err := br.ReadBytes('\n')
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
	var taken []*streamCell
	watch := ""
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		var frames []any
		drop := false
		select {
		case l, ok := <-lines:
			if !ok {
				return
			}
			var m struct {
				Op, ID, Code string
				Stream       bool
				Timeout      float64
				Seq          int64
				Result       json.RawMessage
			}
			if json.Unmarshal(l, &m) != nil {
				frames = append(frames, map[string]string{"op": "error", "error": "bad frame"})
				break
			}
			h.mu.Lock()
			switch m.Op {
			case "cell":
				s.mu.Lock()
				die := s.die
				s.mu.Unlock()
				if !k.Alive || die {
					k.Alive = false
					drop = true
					break
				}
				cs := h.cells[cellKey(k.Dir, m.ID)]
				if cs == nil {
					cs = h.publishLocked(k, CellRequest{ID: m.ID, Code: m.Code, Timeout: m.Timeout, Kernel: k.ID, PID: k.PID,
						Dir: k.Dir, Transient: k.Transient})
				}
				taken = append(taken, &streamCell{cs: cs, stream: m.Stream || watch == m.ID})
				s.mu.Lock()
				s.cells++
				drop = s.cut
				s.mu.Unlock()
			case "watch":
				watch = m.ID
				for _, t := range taken {
					t.stream = t.stream || t.cs.rec.ID == m.ID
				}
			case "interrupt":
				if cs := h.cells[cellKey(k.Dir, m.ID)]; cs != nil {
					h.interruptLocked(cs)
				}
			case "rpc_result":
				h.deliverLocked(k, []Answer{{Seq: m.Seq, JSON: string(m.Result)}})
			case "config":
			default:
				frames = append(frames, map[string]string{"op": "error", "error": "unknown op " + m.Op})
			}
			h.mu.Unlock()
		case <-tick.C:
		}
		if drop {
			return
		}
		h.mu.Lock()
		if !k.Alive || k.DirGone {
			h.mu.Unlock()
			return // a dead runner's socket ends
		}
		if len(taken) > 0 {
			for _, f := range k.rpcFiles {
				frames = append(frames, map[string]string{"op": "rpc", "name": f.name, "data": f.data})
				k.Forwarded = append(k.Forwarded, f.name+" "+f.data)
			}
			k.rpcFiles = nil
		}
		rest := taken[:0]
		for _, t := range taken {
			r := t.cs.result
			if r == nil {
				rest = append(rest, t)
				continue
			}
			if t.stream && r.Stdout != "" {
				frames = append(frames, map[string]string{"op": "output", "id": r.ID, "stream": "stdout", "text": r.Stdout})
			}
			frames = append(frames, *r)
		}
		taken = rest
		h.mu.Unlock()
		for _, f := range frames {
			if send(f) != nil {
				return
			}
		}
	}
}
