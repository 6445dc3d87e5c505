package engine

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/kerneldeck/kerneldeck/backends"
)

// No kernel is root. A root engine given a range of OS user ids
// (Config.KernelUIDs) runs the kernels of each of its owners on this
// machine as a uid of that owner's own, from the range, with a home of its
// own: owners are then kept apart by the OS's own checks (files, signals,
// ptrace, sockets with a path, the Docker socket), and no kernel can write
// what root owns. Members of the engine's group run as their login, as
// before. Which owner has which uid is kept in the state dir (uids.json,
// sealed), so an owner keeps its uid, and its files, across engines.

// UIDRange is a range of OS user ids, First to Last inclusive; the zero
// range is none.
type UIDRange struct{ First, Last uint32 }

// IsZero says whether the range is none.
func (r UIDRange) IsZero() bool { return r == UIDRange{} }

func (r UIDRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// DefaultKernelHomes is where the homes of kernel uids are made.
const DefaultKernelHomes = "/var/lib/kerneldeck/homes"

// ParseUIDRange reads "FIRST-LAST" (uids above 0, FIRST <= LAST).
func ParseUIDRange(s string) (UIDRange, error) {
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.ParseUint(a, 10, 32)
	last, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil || first == 0 || first > last || last == 1<<32-1 {
		return UIDRange{}, fmt.Errorf("%q is not a range of user ids: write FIRST-LAST, such as 200000-265535, above 0", s)
	}
	return UIDRange{uint32(first), uint32(last)}, nil
}

// checkUIDRange refuses a range that holds a user id of the passwd
// database, or that /etc/subuid or /etc/subgid gives to a user (whose
// containers could then act as a kernel's uid).
func checkUIDRange(r UIDRange) error {
	overlap := func(a, b uint64) bool { return a <= uint64(r.Last) && b >= uint64(r.First) }
	if f, err := os.Open("/etc/passwd"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Split(sc.Text(), ":")
			if len(fields) < 3 {
				continue
			}
			if uid, err := strconv.ParseUint(fields[2], 10, 32); err == nil && overlap(uid, uid) {
				return fmt.Errorf("kernel_uids %s holds uid %d, user %s's: give a range no user has", r, uid, fields[0])
			}
		}
	}
	for _, path := range []string{"/etc/subuid", "/etc/subgid"} {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Split(sc.Text(), ":")
			if len(fields) != 3 {
				continue
			}
			start, err1 := strconv.ParseUint(fields[1], 10, 32)
			n, err2 := strconv.ParseUint(fields[2], 10, 32)
			if err1 == nil && err2 == nil && n > 0 && overlap(start, start+n-1) {
				f.Close()
				return fmt.Errorf("kernel_uids %s overlaps %s's range for %s (%d-%d): give a range no one else is given", r, path, fields[0], start, start+n-1)
			}
		}
		f.Close()
	}
	return nil
}

// kernelUIDs hands out the range's uids to owners, one each, and keeps
// which is whose.
type kernelUIDs struct {
	rng   UIDRange
	homes string
	path  string // uids.json in the state dir
	key   []byte
	mu    sync.Mutex
	of    map[string]uint32
	made  map[uint32]bool // the homes this engine made or checked
}

const (
	uidsFile    = "uids.json"
	uidsKeyFile = "uids.key"
	uidsKind    = "kerneldeck kernel uids"
)

// openKernelUIDs checks the range and reads who has which uid.
func openKernelUIDs(r UIDRange, homes, stateDir string) (*kernelUIDs, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("kernel_uids %s: %w", r, backends.ErrNotRoot)
	}
	if stateDir == "" {
		return nil, errors.New("kernel_uids needs a state dir, to keep which owner has which uid")
	}
	if err := checkUIDRange(r); err != nil {
		return nil, err
	}
	key, err := stateKey(filepath.Join(stateDir, uidsKeyFile), "kernel uids key")
	if err != nil {
		return nil, err
	}
	u := &kernelUIDs{rng: r, homes: cmp.Or(homes, DefaultKernelHomes), path: filepath.Join(stateDir, uidsFile), key: key, of: map[string]uint32{}, made: map[uint32]bool{}}
	data, err := readPrivateFile(u.path, 64<<20)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("kernel uids: %w", err)
	default:
		if err := unseal(key, uidsKind, data, &u.of); err != nil {
			return nil, fmt.Errorf("kernel uids %s: %w; remove it, and owners get new uids", u.path, err)
		}
	}
	for owner, uid := range u.of {
		if uid < r.First || uid > r.Last {
			delete(u.of, owner) // the range changed: a new uid at the next call
		}
	}
	return u, nil
}

// uidOf is owner's uid, given now if it has none; its home is made.
func (u *kernelUIDs) uidOf(owner string) (uint32, string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	uid, ok := u.of[owner]
	if !ok {
		taken := make(map[uint32]bool, len(u.of))
		for _, v := range u.of {
			taken[v] = true
		}
		for c := uint64(u.rng.First); c <= uint64(u.rng.Last); c++ {
			if !taken[uint32(c)] {
				uid, ok = uint32(c), true
				break
			}
		}
		if !ok {
			return 0, "", fmt.Errorf("kernel_uids %s: every uid is some owner's already; widen the range", u.rng)
		}
		u.of[owner] = uid
		data, err := seal(u.key, uidsKind, u.of)
		if err == nil {
			err = WritePrivateFile(u.path, data)
		}
		if err != nil {
			delete(u.of, owner)
			return 0, "", fmt.Errorf("kernel uids: %w", err)
		}
	}
	home, err := u.homeLocked(uid)
	return uid, home, err
}

// homeLocked is uid's home, made (and checked) once per engine: a cell's
// call asks for it every time.
func (u *kernelUIDs) homeLocked(uid uint32) (string, error) {
	home := filepath.Join(u.homes, strconv.FormatUint(uint64(uid), 10))
	if !u.made[uid] {
		if err := makeHome(u.homes, home, uid); err != nil {
			return "", err
		}
		u.made[uid] = true
	}
	return home, nil
}

// makeHome makes a kernel uid's home: the homes dir root's and 0755, the
// home uid's and 0700, neither a link.
func makeHome(homes, home string, uid uint32) error {
	if err := os.MkdirAll(homes, 0o755); err != nil {
		return fmt.Errorf("kernel homes: %w", err)
	}
	if st, err := os.Lstat(homes); err != nil || !st.IsDir() || st.Sys().(*syscall.Stat_t).Uid != 0 || st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("kernel homes %s must be a directory of root's that others cannot write", homes)
	}
	if err := os.Mkdir(home, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("kernel home: %w", err)
	}
	st, err := os.Lstat(home)
	if err != nil || !st.IsDir() {
		return fmt.Errorf("kernel home %s is not a directory", home)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != uid {
		if sys.Uid != 0 {
			return fmt.Errorf("kernel home %s belongs to uid %d, not %d; remove it", home, sys.Uid, uid)
		}
		if err := os.Lchown(home, int(uid), int(uid)); err != nil {
			return fmt.Errorf("kernel home: %w", err)
		}
	}
	return nil
}

// ownerBackend is the backend URI owner's kernels run on when its request
// names backend: on a root engine with kernel_uids, this machine's local
// backend as the owner's uid (local?uid=N); else backend itself. A
// member's kernels run as its login (MemberBackend) instead.
func (e *Engine) ownerBackend(owner, backend string, member bool) (string, error) {
	if e.uids == nil || member {
		return backend, nil
	}
	env, ok := e.env(backend)
	if !ok {
		return backend, nil
	}
	local, ok := backends.Find[*backends.Local](env)
	if !ok || local.URI() != "local" {
		return backend, nil
	}
	uid, home, err := e.uids.uidOf(owner)
	if err != nil {
		return "", err
	}
	mine, err := local.AsKernelUID(uid, home)
	if err != nil {
		return "", err
	}
	return e.addBackend(mine).URI(), nil
}

// addBackend registers env, a backend made for a user (a member, a kernel
// uid), unless one of its URI is there already, and returns the one that is.
func (e *Engine) addBackend(env backends.Env) backends.Env {
	e.backendsMu.Lock()
	defer e.backendsMu.Unlock()
	if have, ok := e.backends[env.URI()]; ok {
		return have
	}
	e.backends[env.URI()] = env
	return env
}

// rebuiltEnv is the backend of uri where an engine that is gone made it for
// an owner or a member (local?uid=N, local?user=LOGIN), made again from
// this engine's local backend, so that their kernels are taken back.
func (e *Engine) rebuiltEnv(uri string) (backends.Env, bool) {
	if env, ok := e.env(uri); ok {
		return env, true
	}
	base, ok := e.env("local")
	if !ok {
		return nil, false
	}
	local, ok := backends.Find[*backends.Local](base)
	if !ok {
		return nil, false
	}
	var env backends.Env
	var err error
	switch q, _ := strings.CutPrefix(uri, "local?"); {
	case strings.HasPrefix(q, "uid="):
		n, perr := strconv.ParseUint(strings.TrimPrefix(q, "uid="), 10, 32)
		if perr != nil || e.uids == nil || uint32(n) < e.uids.rng.First || uint32(n) > e.uids.rng.Last {
			return nil, false
		}
		e.uids.mu.Lock()
		home, herr := e.uids.homeLocked(uint32(n))
		e.uids.mu.Unlock()
		if herr != nil {
			return nil, false
		}
		env, err = local.AsKernelUID(uint32(n), home)
	case strings.HasPrefix(q, "user="):
		u, lerr := user.Lookup(strings.TrimPrefix(q, "user="))
		if lerr != nil {
			return nil, false
		}
		uid, _ := strconv.Atoi(u.Uid)
		env, err = local.AsUser(uid)
	default:
		return nil, false
	}
	if err != nil || env.URI() != uri {
		return nil, false
	}
	return e.addBackend(env), true
}
