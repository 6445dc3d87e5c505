// Package runner embeds the Python runner that the engine ships to every host
// on stdin; it is never installed on the host by hand.
package runner

import _ "embed"

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
