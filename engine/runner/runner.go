// Package runner embeds the Python runner that the engine ships to every host
// on stdin; it is never installed on the host by hand.
package runner

import (
	_ "embed"
	"fmt"
)

// Source is runner.py: one persistent Python namespace per kernel.
//
//go:embed runner.py
var Source []byte

// Loader is shipped as runner.py in place of Source when the engine has the
// runner compiled for the host's interpreter: it runs runner.code, the
// interpreter's magic number followed by the marshalled code of Source.
//
//go:embed loader.py
var Loader []byte

// Bootstrap is what a spawn's interpreter runs first: StartProgram reads
// it from stdin. Its one argument is the runner's path, <kernel dir>/
// runner.py. It makes the kernel dir (700; one already there, planted or
// not, is never used: "NODIR <why>" on fd 3 and exit status 75, so that
// nobody removes it) and, but for a per-call kernel's, marks it as made
// by this spawn in <root>/.made-<id> (the spawn's watcher removes only a
// marked dir), points fds 1 and 2 at its runner.log, reads
// runner.py (Source or Loader) from stdin, as many bytes as the first size
// in KERNELDECK_STDIN says, writes it there (0600), leaves the other sizes
// for the runner, and runs it as the script it would have been: in
// __main__, with __file__, sys.argv and sys.path[0] as for "python3
// <dir>/runner.py" (runner.py's own frames named by its path where it is
// the source). What else went wrong is told on fd 3, the spawn's ready
// channel, as "FAILED <why>". Doing these here, not with mkdir(1) and
// head(1) in the spawn script, saves two forks and execs.
const Bootstrap = `def _kd_boot():
    import sys
    p, s = sys.argv[1], os.environ.get("KERNELDECK_STDIN", "").split()
    def fail(word, why, status=2):
        try:
            os.write(3, ("%s %s\n" % (word, why)).encode())
        finally:
            os._exit(status)
    d = os.path.dirname(p)
    try:
        os.mkdir(d, 0o700)
    except OSError as e:
        fail("NODIR", "cannot create kernel dir %s (it may already exist): %s" % (d, e.strerror or e), 75)
    r, i = os.path.split(d)
    if not i.startswith("kerneldeck-once-"):
        try:
            os.close(os.open(os.path.join(r, ".made-" + i), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        except FileExistsError:
            pass  # the mark is there, as the watcher needs it
        except OSError as e:
            fail("FAILED", "cannot mark kernel dir %s as made: %s" % (d, e.strerror or e))
    try:
        fd = os.open(os.path.join(d, "runner.log"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    except OSError as e:
        fail("FAILED", "cannot open runner.log in %s: %s" % (d, e.strerror or e))
    n, b = int(s[0]) if s and s[0].isdigit() else -1, bytearray()
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            break
        b += c
    if n < 0:
        fail("FAILED", "no size for runner.py in KERNELDECK_STDIN")
    if len(b) < n:
        fail("FAILED", "runner.py was cut short: %d of %d bytes" % (len(b), n))
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            v = memoryview(b)
            while v:
                v = v[os.write(fd, v):]
        finally:
            os.close(fd)
    except OSError as e:
        fail("FAILED", "cannot write the runner files into %s: %s" % (d, e.strerror or e))
    os.environ["KERNELDECK_STDIN"] = " ".join(s[1:])
    sys.argv[:] = [p]
    sys.path.insert(0, os.path.dirname(p))
    # compile() would set up the AST's 119 Python types (~0.2 MB in every
    # kernel) to check it was not handed an AST. The loader needs no name
    # (the code it runs has its own); the source is compiled through the C
    # API, as the interpreter compiles a script.
    if s[1:2] != ["0"]:
        return p, bytes(b)
    try:
        import _ctypes as c
        class H:
            _handle = c.dlopen(None, getattr(os, "RTLD_NOW", 2))
        o = type("o", (c._SimpleCData,), {"_type_": "O"})
        f = type("f", (c.CFuncPtr,), {"_flags_": c.FUNCFLAG_CDECL | c.FUNCFLAG_PYTHONAPI, "_restype_": o})
        return p, f(("Py_CompileString", H))(bytes(b), p.encode(), 257)
    except (ImportError, AttributeError, TypeError, OSError):
        return p, compile(bytes(b), p, "exec", dont_inherit=True)
__file__, _kd_code = _kd_boot()
del _kd_boot, b
exec(_kd_code)
`

// StartFlags are the interpreter's flags for a runner, before -c
// StartProgram: isolated (-I: no PYTHON* variables, no user site dir, no
// cwd on the path), without site (-S: the runner does its work, skipping
// code its login can write), writing no bytecode (-B). Words for a shell.
const StartFlags = "-I -S -B"

// StartProgram is the program (for -c) a spawn starts the interpreter
// with: it reads Bootstrap from stdin and runs it. It is kept short, as it
// is what ps shows of every runner, before its path.
func StartProgram() string {
	n := len(Bootstrap)
	return fmt.Sprintf(`import os;b=b"";exec("while len(b)<%d:b+=os.read(0,%d-len(b))or os._exit(2)");exec(b)`, n, n)
}

// CompileProgram is the Python program (for -c) that compiles Source, read
// from stdin (as many bytes as its one argument says: some transports never
// close a command's stdin), into what Loader runs: it prints "KD:CODE " and
// the base64 of the interpreter's magic number followed by the marshalled
// code object, without docstrings (-OO: 50 KB less in every kernel). The
// code's file name is "kerneldeck/runner.py" (relative, so no module of a
// kernel's has it), which the runner drops from tracebacks. Then it prints
// "KD:EXE " and sys.executable, the path a runner's READY line reports, so
// the engine knows which interpreter's code it holds.
const CompileProgram = `import binascii, marshal, sys
from _frozen_importlib_external import MAGIC_NUMBER
n, src = int(sys.argv[1]), b""
while len(src) < n:
    more = sys.stdin.buffer.read(n - len(src))
    if not more:
        sys.exit("KD:ERR the runner's source was cut short: %d of %d bytes" % (len(src), n))
    src += more
code = compile(src, "kerneldeck/runner.py", "exec", dont_inherit=True, optimize=2)
sys.stdout.write("KD:CODE " + binascii.b2a_base64(MAGIC_NUMBER + marshal.dumps(code), newline=False).decode("ascii") + "\n")
if sys.executable and not any(c.isspace() for c in sys.executable):
    sys.stdout.write("KD:EXE " + sys.executable + "\n")
`
