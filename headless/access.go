package headless

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/kerneldeck/kerneldeck/engine"
)

// Peer is who is on the other end of a connection, as the kernel told the
// server (SO_PEERCRED), never as the client claims.
type Peer struct {
	UID   int
	Login string
	// Owner, when set, is the only owner this peer acts as and sees: a
	// member of an allowed group, not the engine's own user. Such a peer
	// cannot change limits, shut down everyone or answer approvals.
	Owner string
}

// restricted reports whether p is held to its own owner.
func (p *Peer) restricted() bool { return p != nil && p.Owner != "" }

// errDenied marks an answer that refused a peer something it may not do.
var errDenied = errors.New("not allowed")

// deny refuses r, says so in an event, and answers with an error.
func (s *server) deny(r *request, what string) {
	p := s.peer
	s.refusals.Refused(fmt.Sprintf("refused user %s (uid %d), who may act only as owner %s: %s", p.Login, p.UID, p.Owner, what))
	s.w.writeError(&r.id, fmt.Sprintf("%v: %s; connections of user %s act only as owner %q", errDenied, what, p.Login, p.Owner))
}

// allowedOwner applies the peer's owner to an execute: an empty owner
// becomes theirs, another owner is refused. It reports whether to go on.
func (s *server) allowedOwner(r *request) bool {
	if !s.peer.restricted() {
		return true
	}
	switch r.exec.Owner {
	case "", s.peer.Owner:
		r.exec.Owner, r.exec.Member = s.peer.Owner, true
	default:
		s.deny(r, fmt.Sprintf("execute as owner %q", r.exec.Owner))
		return false
	}
	// Elsewhere its kernel would run as the engine's user, which the OS
	// does not keep from the engine's other kernels, files and socket.
	backend := cmp.Or(r.exec.Backend, s.eng.DefaultBackend())
	mine, err := s.eng.MemberBackend(backend, s.peer.UID)
	if errors.Is(err, engine.ErrUnknownBackend) {
		s.w.writeError(&r.id, err.Error())
		return false
	}
	if err != nil {
		s.deny(r, fmt.Sprintf("run a kernel on %s: %v; %s", backend, err, MemberBackends(s.eng.MemberBackends())))
		return false
	}
	r.exec.Backend = mine
	return true
}

// MemberBackends says where members of an --allow-group may run kernels:
// on backends that give each kernel a host of its own, and, on a root
// engine, as their own OS users.
func MemberBackends(where []string) string {
	if len(where) == 0 {
		return "members of the engine's --allow-group may run kernels only as their own OS users (the engine must run as root) " +
			"or on backends that give each kernel a container or pod of its own, and this engine offers neither: " +
			"run it as root, or start it with --backend docker-image://IMAGE or k8s-image://IMAGE?namespace=NS as well"
	}
	return "members of the engine's --allow-group may run kernels only on " + strings.Join(where, ", ") +
		" (give it as the request's backend); on local, a root engine runs them as the member's own OS user"
}

// ownsKernel reports whether the peer may act on kernel id: restricted
// peers only on their own owner's kernels (a kernel that does not exist
// is theirs to be told about).
func (s *server) ownsKernel(r *request, id, what string) bool {
	if !s.peer.restricted() {
		return true
	}
	for _, k := range s.eng.Kernels() {
		if k.ID == id && k.Owner != s.peer.Owner {
			s.deny(r, fmt.Sprintf("%s kernel %s of owner %q", what, id, k.Owner))
			return false
		}
	}
	return true
}

// sees reports whether an event may reach the peer.
func (p *Peer) sees(ev engine.Event) bool {
	return !p.restricted() || ev.Owner == p.Owner || ev.Type == engine.EventMissed
}
