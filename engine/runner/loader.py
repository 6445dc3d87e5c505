# kerneldeck runner loader: runs runner.code, the runner compiled once by the
# engine with this host's interpreter, so that a spawn does not compile
# runner.py again (about 8 ms, and 3 MB the compiler leaves in the heap).
# Code made by another interpreter version is refused: the spawn is told
# NOCODE and the engine starts the runner from source instead.
import marshal
import os

try:
    from _frozen_importlib_external import MAGIC_NUMBER as _magic
except ImportError:
    _magic = b""
_dir = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_dir, "runner.code"), "rb") as _f:
    _code = _f.read()
if not _magic or _code[: len(_magic)] != _magic:
    try:
        _fd = os.open(os.path.join(_dir, "ready"), os.O_WRONLY | os.O_NONBLOCK)
        os.write(_fd, b"NOCODE\n")
    finally:
        os._exit(2)
_code = marshal.loads(memoryview(_code)[len(_magic) :])
del _f, _dir, _magic
exec(_code)
