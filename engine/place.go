package engine

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/kerneldeck/kerneldeck/backends"
	"github.com/kerneldeck/kerneldeck/interp"
)

// Place is where a client works: its directory, the interpreter python3
// resolves to there, and its umask. A kernel made for its request runs
// there, on this machine's local backends (a shared engine's kernels once
// ran in the serve's directory); the zero Place is the engine's own.
type Place struct {
	// Dir is the client's working directory, the kernel's first cwd.
	Dir string
	// Python is the interpreter to run, an absolute path.
	Python string
	// Umask is what the kernel's cells create files with; nil is the
	// engine's.
	Umask *int
}

// ErrBadPlace means a Place that is not a place on this machine.
var ErrBadPlace = errors.New("bad place")

// Check says what is wrong with p, if anything.
func (p Place) Check() error {
	for _, f := range []struct{ name, v string }{{"dir", p.Dir}, {"python", p.Python}} {
		if f.v == "" {
			continue
		}
		if !filepath.IsAbs(f.v) || len(f.v) > 4096 || strings.ContainsFunc(f.v, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return fmt.Errorf("%w: %s %.100q must be an absolute path of at most 4096 bytes, without control characters", ErrBadPlace, f.name, f.v)
		}
	}
	if p.Umask != nil && (*p.Umask < 0 || *p.Umask > 0o777) {
		return fmt.Errorf("%w: umask %d must be from 0 to 0777 (511)", ErrBadPlace, *p.Umask)
	}
	return nil
}

// IsZero says whether p is the engine's own place.
func (p Place) IsZero() bool { return p.Dir == "" && p.Python == "" && p.Umask == nil }

// PlaceHere is this process's place: its working directory, what python
// ("": python3) resolves to here (interp), and its umask.
func PlaceHere(python string) Place {
	here := interp.Here()
	p := Place{Dir: here.Dir}
	if exe, err := interp.Resolve(python, here); err == nil && filepath.IsAbs(exe) {
		p.Python = exe
	}
	u := processUmask()
	p.Umask = &u
	if p.Check() != nil {
		return Place{} // a dir with a newline in its name: the engine's own place then
	}
	return p
}

// LocalPlace is where the engine's own local kernels run for a request
// that does not say where its client works: the interpreter python3 (or
// Config.Python) resolves to now, and this process's directory; "" for
// what it cannot tell.
func (e *Engine) LocalPlace() (python, dir string) {
	if env, ok := e.env("local"); ok {
		python = e.python(env)
	}
	return python, e.cwd
}

// umaskFor is the umask a runner on env gives its cells at its start: the
// engine's on this machine, none (the login's there) on another host.
func (e *Engine) umaskFor(env backends.Env) *int {
	if _, local := backends.Find[*backends.Local](env); !local {
		return nil
	}
	return &e.umask
}

// placeFor is the part of p that applies to a kernel on env: all of it on
// this machine's local backends (the engine's user, a member's login, a
// kernel uid), none elsewhere, where the backend's own defaults apply.
func placeFor(p Place, env backends.Env) Place {
	if _, local := backends.Find[*backends.Local](env); !local {
		return Place{}
	}
	return p
}

// placeFrame is the part of a kernel's place its runner applies before its
// first cell: a spare runner started before anyone asked.
type placeFrame struct {
	Dir   string `json:"dir,omitempty"`
	Umask *int   `json:"umask,omitempty"`
}

// firstPlaceLocked is what k's next cell carries for its runner to apply,
// once per runner, or nil.
func (k *Kernel) firstPlaceLocked() *placeFrame {
	if !k.placePending {
		return nil
	}
	k.placePending = false
	return &placeFrame{Dir: k.place.Dir, Umask: k.place.Umask}
}
