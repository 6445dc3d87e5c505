package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// ensureDir checks dir: a directory, ours, not a symlink, with exactly mode
// and, when gid >= 0, that group. A dir that does not exist is made so
// (its missing parents 0700); an existing one is never changed, only
// checked: it may be shared (never chmod /tmp).
func ensureDir(dir string, mode os.FileMode, gid int) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create dir %s: %w", dir, err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			return fmt.Errorf("chmod dir %s: %w", dir, err)
		}
		if gid >= 0 {
			if err := os.Chown(dir, -1, gid); err != nil {
				return fmt.Errorf("give dir %s to group %s: %w%s", dir, groupName(gid), err, notInGroup(err, gid))
			}
		}
	}
	return checkMode(dir, os.ModeDir, mode, gid)
}

// checkMode fails closed unless path (not followed) has type typ, is ours,
// has exactly mode and, when gid >= 0, group gid.
func checkMode(path string, typ, mode os.FileMode, gid int) error {
	st, err := os.Lstat(path)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case st.Mode().Type() != typ:
		return fmt.Errorf("%s is %v, not a %s; remove it or pick another --listen path", path, st.Mode().Type(), kind(typ))
	case !ok || int(sys.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to another user; pick another --listen path", path)
	case st.Mode().Perm() != mode:
		return fmt.Errorf("%s has mode %v, want %v; fix it with chmod %o or pick another --listen path", path, st.Mode().Perm(), mode, mode)
	case gid >= 0 && int(sys.Gid) != gid:
		return fmt.Errorf("%s has group %s, want %s: give it to %s (chgrp), or pick another --listen path%s",
			path, groupName(int(sys.Gid)), groupName(gid), groupName(gid), notInGroup(syscall.EPERM, gid))
	}
	return nil
}

// groupName is gid's name and number, as messages give a group.
func groupName(gid int) string {
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return fmt.Sprintf("%s (%d)", g.Name, gid)
	}
	return strconv.Itoa(gid)
}

// notInGroup is the fix for a chown to gid that err refused, when the
// engine's user is not in the group: say so, and how to put it there.
func notInGroup(err error, gid int) string {
	if !errors.Is(err, syscall.EPERM) || os.Geteuid() == 0 {
		return ""
	}
	groups, _ := os.Getgroups()
	if slices.Contains(groups, gid) || os.Getegid() == gid {
		return ""
	}
	login := "USER"
	if u, err := user.Current(); err == nil {
		login = u.Username
	}
	name := groupName(gid)
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		name = g.Name
	}
	return fmt.Sprintf("; the engine's user is not in group %s: add it (usermod -aG %s %s) and log in again, or serve as root", name, name, login)
}

func kind(typ os.FileMode) string {
	if typ == os.ModeDir {
		return "directory"
	}
	return "socket"
}

// reachable checks that members of gid can traverse every dir from / to
// dir: each has x for its group (when it is gid's) or for others.
func reachable(dir string, gid int) error {
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return err
		}
		sys, _ := st.Sys().(*syscall.Stat_t)
		perm := st.Mode().Perm()
		ok := perm&0o001 != 0 || (sys != nil && int(sys.Gid) == gid && perm&0o010 != 0)
		if !ok {
			return fmt.Errorf("%s is mode %v", d, perm)
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

func lookupGroup(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return -1, fmt.Errorf("no such group (create it with groupadd %s and add the agents' users to it)", name)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return -1, fmt.Errorf("group %s has a gid that is not a number: %q", name, g.Gid)
	}
	return gid, nil
}

// loginOf names uid, or "uidN" when it has no name.
func loginOf(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil && u.Username != "" {
		return u.Username
	}
	return "uid" + strconv.Itoa(uid)
}

// takeLock holds an exclusive flock on path for as long as the returned
// file is open, and writes our pid in it; a held lock is ErrInUse.
func takeLock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the lock %s: %w", path, err)
	}
	if err := checkFile(f, path); err != nil {
		f.Close()
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			sock := strings.TrimSuffix(path, ".lock")
			return nil, fmt.Errorf("%w at %s (pid %s): open a dashboard on it with 'kerneldeck --attach %s', connect an agent with 'kerneldeck headless --connect %s', or pick another --listen path",
				ErrInUse, sock, strings.TrimSpace(string(pid)), sock, sock)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

func checkFile(f *os.File, path string) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !st.Mode().IsRegular() || !ok || int(sys.Uid) != os.Geteuid() || st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("the lock %s must be a regular file of yours with mode 0600 (found %v); remove it", path, st.Mode())
	}
	return nil
}
