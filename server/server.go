// Package server serves one engine on a Unix socket to any number of
// clients (agents speaking the headless protocol, attached dashboards),
// each connection checked by the kernel's account of its peer
// (SO_PEERCRED), never by what the client claims.
package server

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kerneldeck/kerneldeck/engine"
	"github.com/kerneldeck/kerneldeck/headless"
	"github.com/kerneldeck/kerneldeck/wire"
)

// MaxConns bounds the connections served at once; more are refused.
const MaxConns = 256

// Members of the --allow-group share what the engine serves: each uid may
// hold MaxConnsPerMember connections, and all of them together leave
// ownReserve for the engine's own user, so no member can lock it out.
const (
	MaxConnsPerMember = 32
	ownReserve        = 32
)

// defaultSilentTimeout is how long a new connection may stay silent: one
// that has sent nothing by then is closed, so idle connections cannot pile
// up. Every client of kerneldeck's speaks at once.
const defaultSilentTimeout = 10 * time.Second

// closeWait is how long Shutdown waits, once it has cut every connection,
// for their goroutines: a client cannot keep the engine from stopping.
const closeWait = 5 * time.Second

// writeTimeout is how long a client may leave its answers unread before
// it counts as gone (its cells still finish).
const writeTimeout = 30 * time.Second

// interruptWait is how long Shutdown waits for interrupted cells to answer.
const interruptWait = 5 * time.Second

// ErrInUse means another live engine serves at the path.
var ErrInUse = errors.New("another engine is serving there")

// Options tunes a Server.
type Options struct {
	// Path is the socket's path.
	Path string
	// AllowGroup also admits members of this group, each held to the owner
	// of their login name; "" admits only the engine's own user.
	AllowGroup string
	// Version is what hello reports.
	Version string
	// SilentTimeout is how long a new connection may send nothing before
	// it is closed (default 10 s).
	SilentTimeout time.Duration
}

// Server is an engine served on a socket.
type Server struct {
	eng     *engine.Engine
	opts    Options
	ln      *net.UnixListener
	lock    *os.File
	gid     int // of AllowGroup, or -1
	uid     int
	ns      userNS // the engine's own user namespace
	closing chan struct{}
	kill    context.CancelFunc
	connCtx context.Context

	mu    sync.Mutex
	conns map[*conn]struct{}
	byUID map[int]int // connections of each peer uid
	// refused says the refused connections of each uid, a few at a time.
	refused map[int]*engine.Refusals
	wg      sync.WaitGroup
	goodbye string
}

// Listen prepares the socket: its dir (0700, or 0750 of AllowGroup), a
// lock that only one engine holds, a stale socket of a dead engine
// replaced, the socket itself (0600, or 0660 of AllowGroup). It fails
// closed on anything it did not make, naming the path.
func Listen(eng *engine.Engine, o Options) (*Server, error) {
	if o.Path == "" || !filepath.IsAbs(o.Path) {
		return nil, fmt.Errorf("listen: the socket path %q must be absolute", o.Path)
	}
	if len(o.Path) >= 104 {
		return nil, fmt.Errorf("listen: the socket path %s is %d bytes, over the 103 a Unix socket allows; pick a shorter --listen path", o.Path, len(o.Path))
	}
	s := &Server{eng: eng, opts: o, gid: -1, uid: os.Geteuid(), closing: make(chan struct{}), conns: map[*conn]struct{}{}, byUID: map[int]int{}, refused: map[int]*engine.Refusals{}}
	ns, err := ownUserNS()
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s.ns = ns
	dirMode, sockMode := os.FileMode(0o700), os.FileMode(0o600)
	if o.AllowGroup != "" {
		gid, err := lookupGroup(o.AllowGroup)
		if err != nil {
			return nil, fmt.Errorf("listen: --allow-group %s: %w", o.AllowGroup, err)
		}
		s.gid, dirMode, sockMode = gid, 0o750, 0o660
	}
	dir := filepath.Dir(o.Path)
	if err := ensureDir(dir, dirMode, s.gid); err != nil {
		return nil, fmt.Errorf("listen on %s: %w", o.Path, err)
	}
	if s.gid >= 0 {
		if err := reachable(dir, s.gid); err != nil {
			return nil, fmt.Errorf("listen on %s: members of %s could not reach it: %w; pick a --listen path in a dir they can reach, e.g. /run/kerneldeck/%s",
				o.Path, o.AllowGroup, err, wire.SocketName)
		}
	}
	lock, err := takeLock(o.Path + ".lock")
	if err != nil {
		return nil, err
	}
	s.lock = lock
	fail := func(err error) (*Server, error) {
		lock.Close()
		return nil, err
	}
	if st, err := os.Lstat(o.Path); err == nil {
		if st.Mode().Type() != os.ModeSocket {
			return fail(fmt.Errorf("listen on %s: it exists and is not a socket (%v); remove it or pick another --listen path", o.Path, st.Mode()))
		}
		// We hold the lock, so an engine there would be one that does not
		// take it; a socket that answers is not ours to replace.
		if c, err := net.DialTimeout("unix", o.Path, time.Second); err == nil {
			c.Close()
			return fail(fmt.Errorf("listen on %s: %w (it answers, but holds no lock); stop it first", o.Path, ErrInUse))
		}
		if err := os.Remove(o.Path); err != nil {
			return fail(fmt.Errorf("listen on %s: remove the stale socket of a dead engine: %w", o.Path, err))
		}
	}
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: o.Path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return fail(fmt.Errorf("listen on %s: %w", o.Path, err))
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(o.Path, sockMode); err == nil && s.gid >= 0 {
		if err = os.Chown(o.Path, -1, s.gid); err != nil {
			err = fmt.Errorf("give it to group %s: %w%s", groupName(s.gid), err, notInGroup(err, s.gid))
		}
	}
	if err == nil {
		err = checkMode(o.Path, os.ModeSocket, sockMode, s.gid)
	}
	if err != nil {
		ln.Close()
		return fail(fmt.Errorf("listen on %s: %w", o.Path, err))
	}
	s.ln = ln
	s.connCtx, s.kill = context.WithCancel(context.Background())
	return s, nil
}

// Path is the socket's path.
func (s *Server) Path() string { return s.opts.Path }

// Serve accepts connections until Shutdown or Close.
func (s *Server) Serve() error {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			select {
			case <-s.closing:
				return nil
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept on %s: %w", s.opts.Path, err)
		}
		s.admit(c)
	}
}

// admit checks the peer and serves it, or refuses it with a line that
// says why.
func (s *Server) admit(uc *net.UnixConn) {
	cred, err := peerCred(uc)
	if err != nil {
		s.refuse(uc, nil, fmt.Sprintf("cannot tell who connected: %v", err))
		return
	}
	peer := &headless.Peer{UID: int(cred.Uid), Login: loginOf(int(cred.Uid))}
	switch {
	case int(cred.Uid) == s.uid:
	case s.gid >= 0 && inGroup(cred, s.gid):
		peer.Owner = peer.Login
	default:
		s.refuse(uc, peer, "it is neither the engine's user nor in its --allow-group")
		return
	}
	if err := checkPeerNS(uc, int(cred.Pid), s.ns); errors.Is(err, errOtherNamespace) {
		s.refuse(uc, peer, "it runs in a kernel (or in another user namespace, such as a container's): code in a kernel may not act on the engine")
		return
	} else if err != nil {
		s.refuse(uc, peer, fmt.Sprintf("cannot tell whether it runs in a kernel: %v", err))
		return
	}
	c := &conn{uc: uc, uid: peer.UID}
	s.mu.Lock()
	full := s.fullLocked(peer.UID)
	closed := s.goodbye != ""
	if full == "" && !closed {
		s.conns[c] = struct{}{}
		s.byUID[c.uid]++
		s.wg.Add(1)
	}
	s.mu.Unlock()
	switch {
	case closed:
		s.refuse(uc, nil, "the engine is shutting down")
		return
	case full != "":
		s.refuse(uc, nil, full)
		return
	}
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.conns, c)
			if s.byUID[c.uid]--; s.byUID[c.uid] == 0 {
				delete(s.byUID, c.uid)
			}
			s.mu.Unlock()
			c.close()
		}()
		s.serveConn(c, peer)
	}()
}

// fullLocked says why one more connection of uid is refused, or "".
func (s *Server) fullLocked(uid int) string {
	if len(s.conns) >= MaxConns {
		return fmt.Sprintf("%d clients are connected, the most one engine serves", MaxConns)
	}
	if uid == s.uid {
		return ""
	}
	if s.byUID[uid] >= MaxConnsPerMember {
		return fmt.Sprintf("this user has %d connections open, the most one member of the group may have; close some", MaxConnsPerMember)
	}
	members := len(s.conns) - s.byUID[s.uid]
	if members >= MaxConns-ownReserve {
		return fmt.Sprintf("members of the group hold %d connections, the most they may share (the rest is kept for the engine's user)", members)
	}
	return ""
}

// A client that hands the engine its own stdin and stdout (SCM_RIGHTS)
// rather than relaying them, `headless --connect` on this machine, sends
// {"op":"stdio","events":BOOL} with the two descriptors first. The engine
// then reads and writes the agent's pipes itself, so the connection adds no
// hop to a cell, and ends with {"op":"ended","goodbye":REASON} on the
// socket.

// serveConn serves one admitted connection: the headless protocol on the
// socket, or on the pipes a stdio client handed over.
func (s *Server) serveConn(c *conn, peer *headless.Peer) {
	uc := c.uc
	opts := headless.Options{Peer: peer, Version: s.opts.Version, Drain: s.closing, Goodbye: s.goodbyeReason}
	buf := make([]byte, 64<<10)
	oob := make([]byte, syscall.CmsgSpace(2*4))
	silent := cmp.Or(s.opts.SilentTimeout, defaultSilentTimeout)
	uc.SetReadDeadline(time.Now().Add(silent))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	fds := receivedFDs(oob[:oobn])
	if err != nil {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			uc.SetWriteDeadline(time.Now().Add(time.Second))
			fmt.Fprintf(uc, "{\"id\":null,\"op\":\"error\",\"error\":%q}\n",
				fmt.Sprintf("closed: the connection sent nothing for %v; send a request (or a blank line) once connected", silent))
		}
		return
	}
	uc.SetReadDeadline(time.Time{})
	first := buf[:n]
	if events, rest, ok := parseHandover(first, len(fds)); ok {
		opts.Events = events
		// Polled, so that a client that never reads its stdout (or hands
		// over a blocking pipe) cannot hold a write, or Shutdown, forever.
		syscall.SetNonblock(fds[0], true)
		syscall.SetNonblock(fds[1], true)
		in, out := os.NewFile(uintptr(fds[0]), "client stdin"), os.NewFile(uintptr(fds[1]), "client stdout")
		if !c.hold(in, out) {
			return // Shutdown has already cut this connection
		}
		// The client's end of the control socket closing (it was killed)
		// ends the reading, as the end of its input would.
		go func() {
			io.Copy(io.Discard, uc)
			in.Close()
		}()
		headless.Serve(s.connCtx, s.eng, io.MultiReader(bytes.NewReader(rest), in), deadlineFile{out}, opts)
		fmt.Fprintf(uc, "{\"op\":\"ended\",\"goodbye\":%q}\n", s.goodbyeIfClosing())
		return
	}
	for _, fd := range fds {
		syscall.Close(fd) // not a stdio hello: fds are not ours to keep
	}
	headless.Serve(s.connCtx, s.eng, io.MultiReader(bytes.NewReader(first), uc), deadlineWriter{uc}, opts)
}

// goodbyeIfClosing is the goodbye reason once Shutdown began, else "".
func (s *Server) goodbyeIfClosing() string {
	select {
	case <-s.closing:
		return s.goodbyeReason()
	default:
		return ""
	}
}

// receivedFDs are the file descriptors an SCM_RIGHTS message carried.
func receivedFDs(oob []byte) []int {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := syscall.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

// deadlineFile gives writes to a client's stdout writeTimeout, when the
// pipe is pollable.
type deadlineFile struct{ f *os.File }

func (w deadlineFile) Write(p []byte) (int, error) {
	w.f.SetWriteDeadline(time.Now().Add(writeTimeout))
	return w.f.Write(p)
}

func (s *Server) refuse(uc *net.UnixConn, peer *headless.Peer, why string) {
	if peer != nil {
		who := fmt.Sprintf("user %s (uid %d)", peer.Login, peer.UID)
		s.mu.Lock()
		r := s.refused[peer.UID]
		if r == nil {
			r = s.eng.NewRefusals(who+" on "+s.opts.Path, "")
			s.refused[peer.UID] = r
		}
		s.mu.Unlock()
		r.Refused(fmt.Sprintf("refused a connection from %s on %s: %s", who, s.opts.Path, why))
	}
	uc.SetWriteDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(uc, "{\"id\":null,\"op\":\"error\",\"error\":%q}\n", "refused: "+why)
	uc.Close()
}

func (s *Server) goodbyeReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.goodbye
}

// Shutdown stops accepting, tells every client why, lets running requests
// finish until ctx ends, then cuts what is left (its cells see a cancelled
// context). It removes the socket and releases the lock.
func (s *Server) Shutdown(ctx context.Context, reason string) error {
	s.mu.Lock()
	if s.goodbye != "" {
		s.mu.Unlock()
		return nil
	}
	s.goodbye = reason
	s.mu.Unlock()
	close(s.closing)
	s.ln.Close()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		// Out of time: interrupt the cells still running, give them a
		// moment to answer, then cut the connections.
		for _, k := range s.eng.Kernels() {
			if k.RunningCell != "" {
				ictx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				s.eng.Interrupt(ictx, k.ID)
				cancel()
			}
		}
		select {
		case <-done:
		case <-time.After(interruptWait):
		}
		err = fmt.Errorf("shut down %s: %w; the cells still running were interrupted", s.opts.Path, ctx.Err())
		s.kill()
		s.mu.Lock()
		for c := range s.conns {
			c.close()
		}
		s.mu.Unlock()
		select {
		case <-done:
		case <-time.After(closeWait):
			err = fmt.Errorf("shut down %s: %w; the cells still running were interrupted, and some connections did not end in %v", s.opts.Path, ctx.Err(), closeWait)
		}
	}
	s.kill()
	s.mu.Lock()
	for _, r := range s.refused {
		r.Close()
	}
	s.mu.Unlock()
	// The lock file stays: removing it could let two engines each lock a
	// file of that name.
	s.lock.Close()
	return err
}

// conn is one admitted connection, with the pipes its client handed over.
type conn struct {
	uc  *net.UnixConn
	uid int

	mu     sync.Mutex
	files  []*os.File
	closed bool
}

// hold keeps files to close with the connection, or closes them at once
// (and says false) when it is already closed.
func (c *conn) hold(files ...*os.File) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		for _, f := range files {
			f.Close()
		}
		return false
	}
	c.files = append(c.files, files...)
	return true
}

// close ends the connection and the pipes it handed over, which unblocks
// whatever reads or writes them.
func (c *conn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.uc.Close()
	for _, f := range c.files {
		f.Close()
	}
	c.files = nil
}

// deadlineWriter gives every write writeTimeout: a client that stops
// reading counts as gone instead of stalling its cells' output.
type deadlineWriter struct{ uc *net.UnixConn }

func (w deadlineWriter) Write(p []byte) (int, error) {
	w.uc.SetWriteDeadline(time.Now().Add(writeTimeout))
	return w.uc.Write(p)
}

func peerCred(uc *net.UnixConn) (*syscall.Ucred, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// inGroup reports whether the peer process belongs to gid: its primary
// group or one of its supplementary groups, as its /proc status says.
func inGroup(cred *syscall.Ucred, gid int) bool {
	if int(cred.Gid) == gid {
		return true
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(int(cred.Pid)) + "/status")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "Groups:"); ok {
			for _, g := range strings.Fields(rest) {
				if g == strconv.Itoa(gid) {
					return true
				}
			}
		}
	}
	return false
}
