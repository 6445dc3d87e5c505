// Package dockertest gives tests a real Docker Engine: a client (skipping,
// or failing under KERNELDECK_REQUIRE_DOCKER=1, when no daemon answers), a
// test image built without a registry from this machine's own files, and
// throwaway containers from it.
package dockertest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
)

// Users in the test image besides root, with their uids.
var Users = map[string]int{"alice": 1001, "bob": 1002}

// binaries are what the engine's scripts, the backend contract suite and
// the lifecycle suites run on a host, found on this machine.
var binaries = []string{
	"bash", "sh", "cat", "chmod", "cp", "cut", "date", "dirname", "basename", "env", "false", "find",
	"grep", "head", "id", "kill", "ln", "ls", "mkdir", "mkfifo", "mktemp", "mv", "nproc", "ps",
	"readlink", "echo", "printf", "rm", "rmdir", "sed", "seq", "setsid", "sha256sum", "sleep", "sort", "stat", "tail",
	"timeout", "touch", "tr", "true", "uname", "wc", "whoami", "xargs", "yes", "python3",
}

// pythonLib is the standard library shipped; the parts no kernel needs
// are left out (the image builds faster).
const pythonLib = "/usr/lib/python3.11"

var skipPython = []string{"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
	"site-packages", "dist-packages", "config-3.11-x86_64-linux-gnu"}

// hostPath is where binaries are looked up: the system's, not a user's
// shims (pyenv's python3 is a shell script calling a tree elsewhere).
const hostPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// entry is one file, directory or symlink of the image.
type entry struct {
	name   string // absolute path in the image
	mode   fs.FileMode
	link   string // symlink target
	size   int64
	mtime  time.Time
	source string // host file to copy
	data   []byte // or content
	uid    int
}

type imageSpec struct {
	entries map[string]*entry
}

func (s *imageSpec) add(e *entry) {
	if _, ok := s.entries[e.name]; !ok {
		s.entries[e.name] = e
	}
}

// addHost adds host path p (as referenced, through symlinks) to the image:
// each symlink on the way as a symlink, the file at its real place.
func (s *imageSpec) addHost(p string) error {
	p = filepath.Clean(p)
	if _, ok := s.entries[p]; ok {
		return nil
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil {
		return err
	}
	if dir != filepath.Dir(p) {
		// A symlinked directory (/lib -> usr/lib): the top-level links are
		// in the image already; the file goes to its real directory.
		return s.addHost(filepath.Join(dir, filepath.Base(p)))
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		s.add(&entry{name: p, mode: fs.ModeSymlink | 0o777, link: target, mtime: fi.ModTime()})
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		return s.addHost(target)
	case fi.Mode().IsRegular():
		s.add(&entry{name: p, mode: fi.Mode().Perm(), size: fi.Size(), mtime: fi.ModTime(), source: p})
	}
	return nil
}

var lddPath = regexp.MustCompile(`(?:=>\s*)?(/[^\s]+)\s+\(0x`)

// addLibs adds the shared libraries that file needs (ldd's list).
func (s *imageSpec) addLibs(file string) error {
	out, err := exec.Command("ldd", file).Output()
	if err != nil {
		return nil // not dynamic ("not a dynamic executable")
	}
	for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
		if err := s.addHost(m[1]); err != nil {
			return fmt.Errorf("library %s of %s: %w", m[1], file, err)
		}
	}
	return nil
}

// dataPackages are what DataImage adds: Debian's numpy and pandas, what
// pandas imports, and the time zone data pytz reads (relative paths are
// in distPackages).
var dataPackages = []string{"numpy", "pandas", "dateutil", "pytz", "six.py", "/usr/share/zoneinfo"}

// distPackages is where Debian's python3 packages are.
const distPackages = "/usr/lib/python3/dist-packages"

// buildSpec is the test image's files; extra names packages of
// distPackages to add (their tests left out).
func buildSpec(extra ...string) (*imageSpec, error) {
	s := &imageSpec{entries: map[string]*entry{}}
	now := time.Unix(0, 0)
	dir := func(name string, mode fs.FileMode) {
		s.add(&entry{name: name, mode: fs.ModeDir | mode, mtime: now})
	}
	for _, d := range []string{"/usr", "/usr/bin", "/usr/lib", "/usr/sbin", "/etc", "/home", "/root", "/proc", "/sys", "/dev", "/run", "/var"} {
		dir(d, 0o755)
	}
	dir("/root", 0o700)
	dir("/tmp", fs.ModeSticky|0o777)
	for _, top := range []string{"/bin", "/lib", "/lib64", "/sbin"} {
		if target, err := os.Readlink(top); err == nil {
			s.add(&entry{name: top, mode: fs.ModeSymlink | 0o777, link: target, mtime: now})
		}
	}
	t := os.Getenv("PATH")
	os.Setenv("PATH", hostPath)
	defer os.Setenv("PATH", t)
	for _, b := range binaries {
		p, err := exec.LookPath(b)
		if err != nil {
			return nil, fmt.Errorf("%s is needed in the test image but not installed here: %w", b, err)
		}
		if err := s.addHost(p); err != nil {
			return nil, err
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil, err
		}
		if err := s.addLibs(real); err != nil {
			return nil, err
		}
	}
	if err := s.addTree(pythonLib, now, skipPython); err != nil {
		return nil, err
	}
	// cloudpickle, where this machine has it (Debian's python3-cloudpickle):
	// kernels park lambdas and what cells define with it.
	if _, err := os.Stat(cloudpickleDir); err == nil {
		dir(filepath.Dir(distPackages), 0o755)
		dir(distPackages, 0o755)
		if err := s.addTree(cloudpickleDir, now, skipPython); err != nil {
			return nil, err
		}
	}
	for _, name := range extra {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(distPackages, name)
		}
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s is needed in the test image but not installed here: %w", p, err)
		}
		for d := filepath.Dir(p); d != "/"; d = filepath.Dir(d) {
			dir(d, 0o755)
		}
		if err := s.addTree(p, now, append(slices.Clone(skipPython), "tests")); err != nil {
			return nil, err
		}
	}
	passwd := "root:x:0:0:root:/root:/bin/bash\n"
	group := "root:x:0:\n"
	names := make([]string, 0, len(Users))
	for n := range Users {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		id := Users[n]
		passwd += fmt.Sprintf("%s:x:%d:%d:%s:/home/%s:/bin/bash\n", n, id, id, n, n)
		group += fmt.Sprintf("%s:x:%d:\n", n, id)
		s.add(&entry{name: "/home/" + n, mode: fs.ModeDir | 0o700, mtime: now, uid: id})
	}
	s.add(&entry{name: "/etc/passwd", mode: 0o644, data: []byte(passwd), mtime: now})
	s.add(&entry{name: "/etc/group", mode: 0o644, data: []byte(group), mtime: now})
	return s, nil
}

// cloudpickleDir is Debian's cloudpickle for its python3.
const cloudpickleDir = "/usr/lib/python3/dist-packages/cloudpickle"

// addTree adds the Python tree (or file) at root: its dirs, files and the
// libraries its extension modules need, but the dirs skip names.
func (s *imageSpec) addTree(root string, now time.Time, skip []string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && slices.Contains(skip, d.Name()) {
				return filepath.SkipDir
			}
			s.add(&entry{name: p, mode: fs.ModeDir | 0o755, mtime: now})
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil // Debian links sitecustomize.py into /etc: not needed
		}
		if err := s.addHost(p); err != nil {
			return err
		}
		if strings.HasSuffix(p, ".so") {
			return s.addLibs(p)
		}
		return nil
	})
}

// hash names the spec's content: paths, modes, sizes and mtimes of the
// host files, so a changed python or bash makes a new image.
func (s *imageSpec) hash() string {
	h := sha256.New()
	for _, name := range s.sorted() {
		e := s.entries[name]
		fmt.Fprintf(h, "%s %v %s %d %d %d %x\n", e.name, e.mode, e.link, e.size, e.mtime.UnixNano(), e.uid, sha256.Sum256(e.data))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func (s *imageSpec) sorted() []string {
	names := make([]string, 0, len(s.entries))
	for n := range s.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// writeTar writes the image's root filesystem as a tar stream.
func (s *imageSpec) writeTar(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	tw := tar.NewWriter(bw)
	for _, name := range s.sorted() {
		e := s.entries[name]
		hdr := &tar.Header{Name: strings.TrimPrefix(e.name, "/"), Mode: int64(e.mode.Perm()), ModTime: e.mtime, Uid: e.uid, Gid: e.uid, Format: tar.FormatPAX}
		if e.mode&fs.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		switch {
		case e.mode&fs.ModeDir != 0:
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case e.mode&fs.ModeSymlink != 0:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.link
		default:
			hdr.Typeflag = tar.TypeReg
			if e.data != nil {
				hdr.Size = int64(len(e.data))
			} else {
				hdr.Size = e.size
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		if e.data != nil {
			if _, err := tw.Write(e.data); err != nil {
				return err
			}
			continue
		}
		f, err := os.Open(e.source)
		if err != nil {
			return err
		}
		_, err = io.CopyN(tw, f, e.size)
		f.Close()
		if err != nil {
			return fmt.Errorf("copy %s: %w", e.source, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

var (
	imageOnce sync.Once
	imageRef  string
	imageErr  error

	dataOnce sync.Once
	dataRef  string
	dataErr  error
)

// Image returns the test image's reference, building and importing it once
// per content hash (reused across runs while the host files are the same).
func Image(t testing.TB) string {
	t.Helper()
	c := Client(t)
	imageOnce.Do(func() { imageRef, imageErr = buildImage(c) })
	if imageErr != nil {
		t.Fatalf("build the docker test image: %v", imageErr)
	}
	return imageRef
}

// DataImage is Image with Debian's numpy and pandas: kernels that hold a
// DataFrame (the parking tests). Built on demand, once per content hash.
func DataImage(t testing.TB) string {
	t.Helper()
	c := Client(t)
	dataOnce.Do(func() { dataRef, dataErr = buildImage(c, dataPackages...) })
	if dataErr != nil {
		t.Fatalf("build the docker test image with numpy and pandas: %v", dataErr)
	}
	return dataRef
}

func buildImage(c *client.Client, extra ...string) (string, error) {
	spec, err := buildSpec(extra...)
	if err != nil {
		return "", err
	}
	ref := "kerneldeck-test:" + spec.hash()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := c.ImageInspect(ctx, ref); err == nil {
		return ref, nil
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(spec.writeTar(pw)) }()
	res, err := c.ImageImport(ctx, client.ImageImportSource{Source: pr, SourceName: "-"}, ref,
		client.ImageImportOptions{Changes: []string{`CMD ["/usr/bin/sleep", "infinity"]`, "ENV PATH=" + hostPath}})
	if err != nil {
		pr.CloseWithError(err)
		return "", fmt.Errorf("import %s: %w", ref, err)
	}
	defer res.Close()
	var out bytes.Buffer
	io.Copy(&out, res)
	if strings.Contains(out.String(), `"error"`) {
		return "", fmt.Errorf("import %s: %s", ref, out.String())
	}
	if _, err := c.ImageInspect(ctx, ref); err != nil {
		return "", fmt.Errorf("import %s: not there afterwards: %w (%s)", ref, err, out.String())
	}
	return ref, nil
}
