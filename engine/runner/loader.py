# kerneldeck runner loader: runs the runner compiled once by the engine with
# this host's interpreter, which comes first on stdin, so that a spawn does
# not compile runner.py again (about 8 ms, and 3 MB the compiler leaves in
# the heap) and the code never becomes a file. Code made by another
# interpreter version is refused: the spawn is told NOCODE and the engine
# starts the runner from source instead.
import marshal
import os

try:
    from _frozen_importlib_external import MAGIC_NUMBER as _magic
except ImportError:
    _magic = b""
_code, _more, _why = bytearray(), b"", b""
try:
    _n = int(os.environ.get("KERNELDECK_STDIN", "").split()[0])
except (IndexError, ValueError):
    _n, _why = 0, b"FAILED no size for the compiled runner in KERNELDECK_STDIN\n"
while len(_code) < _n:
    _more = os.read(0, _n - len(_code))
    if not _more:
        _why = b"FAILED the compiled runner was cut short\n"
        break
    _code += _more
if _why or not _magic or _code[: len(_magic)] != _magic:
    try:
        os.write(3, _why or b"NOCODE\n")  # the spawn's ready channel
    finally:
        os._exit(2)
_code = marshal.loads(memoryview(_code)[len(_magic) :])
del _magic, _more, _n, _why
exec(_code)
