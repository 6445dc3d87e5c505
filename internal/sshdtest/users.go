package sshdtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// UserOptions configures Server.User.
type UserOptions struct {
	// BashrcSleep, when positive, gives the user a heavy shell start-up: a
	// marked block running `sleep <seconds>` goes at the top of the user's
	// real ~/.bashrc (bash sources it for every command sshd runs, even
	// non-interactive ones) and is removed again when the last test using it
	// ends, in this or any other test process (flock-coordinated, so
	// packages tested in parallel can share a user such as kdheavy).
	// Concurrent users must ask for the same BashrcSleep. Allowed only for
	// users the helper creates, never for the current user's own rc file.
	BashrcSleep time.Duration
}

// User is an account that can log in to a Server with its own key.
type User struct {
	Name     string
	UID, GID int
	Home     string
	// KeyFile is the user's ed25519 private key in OpenSSH format (0600, in
	// the test's temp dir); KeyFile+".pub" holds the public key.
	KeyFile string
	Signer  ssh.Signer
	// Bashrc is the ~/.bashrc the helper edited for BashrcSleep, or "".
	Bashrc string
}

// PublicKey is the user's public key.
func (u *User) PublicKey() ssh.PublicKey { return u.Signer.PublicKey() }

// CanCreateUsers reports whether Server.User can create OS users (the tests
// run as root). Without it only the current user can log in.
func CanCreateUsers() bool { return os.Geteuid() == 0 }

var validName = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// usersMu serializes useradd/usermod within this process; other test
// processes doing the same are tolerated by re-checking after a failure.
var usersMu sync.Mutex

// User makes name able to log in to s with a fresh ed25519 key and returns
// it. name "" (or the current user's name) is the user running the tests,
// e.g. root. Any other name needs root: the account is created with
// `useradd -m -s /bin/bash` if it does not exist (and unlocked with
// `usermod -p '*'` if its password field is locked, since sshd without PAM
// refuses locked accounts even for public keys); without root the test is
// skipped. Calling User again for the same name adds another key; all of
// them work.
func (s *Server) User(t testing.TB, name string, opts UserOptions) *User {
	t.Helper()
	cur, err := user.Current()
	if err != nil {
		t.Fatalf("sshdtest: current user: %v", err)
	}
	if name == "" {
		name = cur.Username
	}
	if !validName.MatchString(name) {
		t.Fatalf("sshdtest: invalid user name %q", name)
	}
	isCurrent := name == cur.Username
	if !isCurrent {
		if !CanCreateUsers() {
			t.Skipf("sshdtest: user %q: creating OS users needs root (running as %s, whose sshd can let only %s in)", name, cur.Username, cur.Username)
		}
		if err := ensureOSUser(name); err != nil {
			t.Fatalf("sshdtest: user %q: %v", name, err)
		}
	}
	ou, err := user.Lookup(name)
	if err != nil {
		t.Fatalf("sshdtest: user %q: %v", name, err)
	}
	u := &User{Name: name, Home: ou.HomeDir}
	u.UID, _ = strconv.Atoi(ou.Uid)
	u.GID, _ = strconv.Atoi(ou.Gid)

	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatalf("sshdtest: %v", err)
	}
	u.KeyFile = filepath.Join(t.TempDir(), "id_ed25519_"+name)
	if _, err := writePrivateKey(u.KeyFile, priv, name+"@sshdtest"); err != nil {
		t.Fatalf("sshdtest: %v", err)
	}
	if u.Signer, err = ssh.NewSignerFromKey(priv); err != nil {
		t.Fatalf("sshdtest: %v", err)
	}
	if err := s.authorize(u); err != nil {
		t.Fatalf("sshdtest: authorize %q: %v", name, err)
	}

	if opts.BashrcSleep > 0 {
		if isCurrent {
			t.Fatalf("sshdtest: refusing to edit the current user's real ~/.bashrc (%s); use a created user for BashrcSleep", name)
		}
		u.Bashrc = filepath.Join(u.Home, ".bashrc")
		hold, err := useBashrc(u, opts.BashrcSleep)
		if err != nil {
			t.Fatalf("sshdtest: %v", err)
		}
		t.Cleanup(func() {
			if err := hold.release(u.Name); err != nil {
				t.Errorf("sshdtest: restore %s: %v", u.Bashrc, err)
			}
		})
	}
	return u
}

// authorize appends u's public key to its AuthorizedKeysFile in s.dir. The
// file belongs to the user (sshd opens it with the user's uid).
func (s *Server) authorize(u *User) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	path := filepath.Join(s.akDir, u.Name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(ssh.MarshalAuthorizedKey(u.PublicKey()))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		return os.Chown(path, u.UID, u.GID)
	}
	return nil
}

// ensureOSUser creates name if missing and unlocks it if locked.
func ensureOSUser(name string) error {
	usersMu.Lock()
	defer usersMu.Unlock()
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		if _, err := user.Lookup(name); err == nil {
			return unlockUser(name)
		}
		out, err := exec.Command("useradd", "-m", "-s", "/bin/bash", "-p", "*", name).CombinedOutput()
		if err == nil {
			return nil
		}
		// Another test process may have created it meanwhile, or hold the
		// passwd lock: look again, then retry.
		lastErr = fmt.Errorf("useradd: %v: %s", err, strings.TrimSpace(string(out)))
		time.Sleep(50 * time.Millisecond)
	}
	return lastErr
}

// unlockUser replaces a locked ("!...") shadow password with "*" (no
// password, not locked): with UsePAM no, sshd refuses locked accounts.
func unlockUser(name string) error {
	b, err := os.ReadFile("/etc/shadow")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) < 2 || f[0] != name {
			continue
		}
		if !strings.HasPrefix(f[1], "!") {
			return nil
		}
		if out, err := exec.Command("usermod", "-p", "*", name).CombinedOutput(); err != nil {
			return fmt.Errorf("unlock: usermod: %v: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	return nil
}

const (
	bashrcBegin = "# >>> kerneldeck sshdtest: heavy shell start-up, removed at test cleanup >>>\n"
	bashrcEnd   = "# <<< kerneldeck sshdtest <<<\n"
)

// BashrcBlock is the text User puts at the top of ~/.bashrc for BashrcSleep d.
func BashrcBlock(d time.Duration) string {
	return bashrcBegin + "sleep " + strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "\n" + bashrcEnd
}

// stripBashrcBlock removes a block written by BashrcBlock.
func stripBashrcBlock(s string) string {
	i := strings.Index(s, bashrcBegin)
	if i < 0 {
		return s
	}
	j := strings.Index(s[i:], bashrcEnd)
	if j < 0 {
		return s[:i]
	}
	return s[:i] + s[i+j+len(bashrcEnd):]
}

// bashrcLocks coordinates the users of one user's .bashrc block across
// tests and test processes (go test runs packages in parallel): every user
// of the block holds a shared flock on <tmp>/kerneldeck-sshdtest-<name>.users
// for as long as it needs it; the last one to leave (the one that can get
// it exclusively) removes the block. <name>.mutex serializes the edits. A
// crashed process drops its locks, so a block it left is replaced by the
// next user and removed by the last.
type bashrcHold struct {
	users *os.File
	path  string
}

func lockFile(name, suffix string) (*os.File, error) {
	return os.OpenFile(filepath.Join(os.TempDir(), "kerneldeck-sshdtest-"+name+suffix), os.O_RDWR|os.O_CREATE, 0o600)
}

// withMutex runs f while holding name's exclusive edit lock.
func withMutex(name string, f func() error) error {
	m, err := lockFile(name, ".mutex")
	if err != nil {
		return err
	}
	defer m.Close()
	if err := flock(m, syscall.LOCK_EX); err != nil {
		return err
	}
	return f()
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}

func useBashrc(u *User, d time.Duration) (*bashrcHold, error) {
	users, err := lockFile(u.Name, ".users")
	if err != nil {
		return nil, err
	}
	err = withMutex(u.Name, func() error {
		old, err := os.ReadFile(u.Bashrc)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		block := BashrcBlock(d)
		if flock(users, syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			// In use elsewhere: share it if it is the same block.
			if cur := currentBlock(string(old)); cur != "" && cur != block {
				return fmt.Errorf("user %q's .bashrc is in use by another test with a different BashrcSleep (%q; want %v): use another user name", u.Name, strings.TrimSpace(cur), d)
			}
		}
		if !strings.HasPrefix(string(old), block) {
			// First user (a block left by a crashed run is replaced, not
			// stacked), or someone removed it.
			if err := os.WriteFile(u.Bashrc, []byte(block+stripBashrcBlock(string(old))), 0o644); err != nil {
				return err
			}
			if err := os.Chown(u.Bashrc, u.UID, u.GID); err != nil {
				return err
			}
		}
		return flock(users, syscall.LOCK_SH)
	})
	if err != nil {
		users.Close()
		return nil, err
	}
	return &bashrcHold{users: users, path: u.Bashrc}, nil
}

// release drops h's share; the last holder removes the block.
func (h *bashrcHold) release(name string) error {
	defer h.users.Close()
	return withMutex(name, func() error {
		if flock(h.users, syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			return nil // others still use it
		}
		old, err := os.ReadFile(h.path)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rest := stripBashrcBlock(string(old))
		if rest == string(old) {
			return nil
		}
		if rest == "" {
			return os.Remove(h.path)
		}
		return os.WriteFile(h.path, []byte(rest), 0o644)
	})
}

// currentBlock returns the block at the top of a .bashrc, or "".
func currentBlock(s string) string {
	if !strings.HasPrefix(s, bashrcBegin) {
		return ""
	}
	j := strings.Index(s, bashrcEnd)
	if j < 0 {
		return ""
	}
	return s[:j+len(bashrcEnd)]
}

// OSUser makes sure the OS user name exists (root only: the test is
// skipped otherwise) and returns it, for tests that run a program as it.
func OSUser(t testing.TB, name string) *user.User {
	t.Helper()
	if !CanCreateUsers() {
		t.Skip("only root can make another OS user")
	}
	if !validName.MatchString(name) {
		t.Fatalf("sshdtest: bad user name %q", name)
	}
	if err := ensureOSUser(name); err != nil {
		t.Fatalf("sshdtest: user %s: %v", name, err)
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatalf("sshdtest: user %s: %v", name, err)
	}
	return u
}
