"""kerneldeck session kernel runner (stdlib only, Python >= 3.8).

One runner is one persistent Python namespace. It is started detached by the
engine's spawn command and takes cells from two doors:

* the wake FIFO: a line "cell ID" after the engine wrote cells/ID.req
  (the portable path over plain Execute), "int ID" to interrupt, "cfg SECONDS"
  to change idle_exit;
* a Unix socket (the fast path): JSON lines {"op": "cell"|"interrupt"|"config"|"ping"|"rpc_result"|
  "park"|"restore_data"|"restore"}.

Who reads the doors: the main thread while no cell runs, so that a cell it
reads runs at once, with no hand-over between threads; the io thread while a
cell runs, from IO_DELAY into it (a short cell never wakes it: a woken thread
takes the GIL from the cell). A tool call from the cell's own thread reads
the doors itself until its answer comes.

Tool calls (kerneldeck_tools) go the other way: over the running cell's
socket when it has one; else the call writes rpc/SEQ.req (0600, tmp +
rename) and rings the wake FIFO with "rpc", and whoever reads the doors
forwards every request file in rpc/ to the engine over that socket and
removes it; with no socket it rings the done FIFO so that the engine's
host-side wait collects the files instead. The engine validates each request
(its MAC, seq, cell) and answers over the socket ("rpc_result") or by
writing rpc/SEQ.res and ringing "rpcres SEQ". No polling on either side.

Every door authenticates the engine with the kernel's secret, which reaches
the runner on its stdin and lives only in its memory (see Auth): a socket
must answer a challenge, and request files, answer files and control lines
carry a MAC. Other processes of the same login, other kernels included, can
neither drive this runner nor read it: it is non-dumpable and, where the
host offers Landlock, confined away from every other kernel's dir.

Each cell id runs at most once, whatever door or how often it is sent: a
repeated id only waits for (or returns) the one result. A result sent over a
socket is written to cells/ID.res (0600, tmp + rename) only when a door
needs it: the Execute door asks, or the socket breaks before the next cell;
a byte is then written to the done FIFO so that a shell waiting on the host
wakes up. Waiting for work blocks in epoll/poll; nothing polls while the
kernel is idle.
"""

import builtins
import codecs
import io
import os
from _collections import deque  # builtin; _queue is a shared library of 28 KB resident
import select
import _signal as signal  # the C module: signal.py imports enum, functools and collections (8 ms, 0.6 MB)
import _socket  # the C module: socket.py (enums and all) weighs 600 KB in every kernel
import _struct as struct
import sys
import _thread  # the C module: threading.py weighs 270 KB in every kernel
import time
from stat import S_ISDIR as stat_is_dir
from stat import S_ISFIFO as stat_is_fifo
from stat import S_ISLNK as stat_is_link
from stat import S_ISREG as stat_is_regular

# Not re, json, linecache, ctypes, threading, signal nor types: with
# tokenize, enum, functools and collections they would weigh 2 MB in every
# kernel and take 13 ms of its start (see JSON, LibC, CellSources, Flag).
ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
RPC_NAME_CHARS = ID_CHARS | {"."}
LOWER_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
PRINTABLE = frozenset(map(chr, range(32, 127)))


def valid_name(s, chars, most):
    """s is 1 to most characters, all of chars."""
    return isinstance(s, str) and 0 < len(s) <= most and chars.issuperset(s)


def only_chars(s, chars, repl=""):
    """s with every run of characters outside chars replaced by repl."""
    out, outside = [], False
    for ch in s:
        if ch in chars:
            out.append(ch)
            outside = False
        elif not outside:
            out.append(repl)
            outside = True
    return "".join(out)


class Flag:
    """threading.Event's set, is_set and wait, on one _thread lock: held
    until set."""

    __slots__ = ("_lock", "_set")

    def __init__(self):
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False

    def is_set(self):
        return self._set

    def set(self):
        if not self._set:
            self._set = True
            try:
                self._lock.release()
            except RuntimeError:
                pass  # another set() released it first

    def wait(self, timeout=None):
        if self._set:
            return True
        if self._lock.acquire(True, -1 if timeout is None else min(max(0.0, timeout), _thread.TIMEOUT_MAX)):
            self._lock.release()  # for the next waiter
            return True
        return self._set


class JSON:
    """json.dumps and json.loads (their defaults) on _json, the C half of
    the json package, which json itself wraps in regular expressions. Where
    _json is missing or answers otherwise, the json package."""

    class _Context:  # what _json's scanner reads off a JSONDecoder
        strict = True
        object_hook = object_pairs_hook = None
        parse_float, parse_int, parse_constant = float, int, float  # NaN, Infinity

    @staticmethod
    def _not_serializable(o):
        raise TypeError("Object of type %s is not JSON serializable" % type(o).__name__)

    @classmethod
    def setup(cls):
        try:
            import _json

            scan = _json.make_scanner(cls._Context())

            def dumps(obj):
                return "".join(_json.make_encoder(
                    {}, cls._not_serializable, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True)(obj, 0))

            def loads(s):
                if not isinstance(s, str):
                    s = bytes(s).decode("utf-8")
                t = s.strip(" \t\n\r")
                try:
                    obj, end = scan(t, 0)
                    if end == len(t):
                        return obj
                except Exception:
                    pass
                # Not JSON: the json package says why (_json alone cannot
                # before json.decoder is imported).
                import json

                return json.loads(s)

            sample = {"a": [1, -2.5e-7, "\u00e9\n\"", None, True, {}], "b": float("inf")}
            if dumps(sample) != '{"a": [1, -2.5e-07, "\\u00e9\\n\\"", null, true, {}], "b": Infinity}' or (
                    loads(" " + dumps(sample) + "\n") != sample):
                raise ValueError("_json answers otherwise")
        except Exception:
            import json

            dumps, loads = json.dumps, json.loads
        cls.dumps, cls.loads = staticmethod(dumps), staticmethod(loads)


JSON.setup()


class CellSources:
    """The cells' sources, for tracebacks and inspect: linecache's cache
    holds them once something imports linecache; until then they wait here,
    and a finder (first on sys.meta_path only until then) puts them in when
    it is imported."""

    def __init__(self):
        self.waiting = {}
        self.finder = None
        # Cells that defined no code of their own (no function, class,
        # lambda or comprehension): only a traceback kept from them needs
        # their source later, so only the latest PLAIN_SOURCES_KEEP are kept
        # (all of them cost ~300 bytes a cell, without bound).
        self.plain = []

    def settle(self, filename, defines_code):
        """Called when a cell has run: forgets the oldest plain cell's source
        once more than PLAIN_SOURCES_KEEP are kept."""
        if defines_code:
            return
        self.plain.append(filename)
        old = drop_oldest(self.plain, PLAIN_SOURCES_KEEP)
        if not old:
            return
        lc = sys.modules.get("linecache")
        cache = getattr(lc, "cache", None) if lc is not None else None
        for name in old:
            self.waiting.pop(name, None)
            if isinstance(cache, dict):
                cache.pop(name, None)

    def add(self, filename, code):
        entry = (len(code), None, code.splitlines(True), filename)
        lc = sys.modules.get("linecache")
        if lc is not None and isinstance(getattr(lc, "cache", None), dict):
            self.hand_over(lc)
            lc.cache[filename] = entry
            return
        self.waiting[filename] = entry
        if self.finder is None:
            self.finder = LinecacheFinder(self)
            sys.meta_path.insert(0, self.finder)

    def hand_over(self, linecache):
        """Moves the waiting sources into linecache's cache, and the finder
        off every later import."""
        linecache.cache.update(self.waiting)
        self.waiting.clear()
        if self.finder is not None:
            try:
                sys.meta_path.remove(self.finder)
            except ValueError:
                pass
            self.finder = None


class LinecacheFinder:
    """Hands the waiting cell sources to linecache as it is imported: finds
    its spec with the other finders and runs its loader, then fills the
    cache."""

    def __init__(self, sources):
        self.sources = sources

    def find_spec(self, name, path=None, target=None):
        if name != "linecache":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = LinecacheLoader(spec.loader, self.sources)
                return spec
        return None


class LinecacheLoader:
    def __init__(self, loader, sources):
        self.loader, self.sources = loader, sources

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.sources.hand_over(module)


CELL_SOURCES = CellSources()


def drop_oldest(items, keep):
    """Removes and returns the oldest entries of the list items once it holds
    more than twice keep, leaving the latest keep (a trim every keep
    appends, not one per append)."""
    if len(items) <= 2 * keep:
        return ()
    old = items[:-keep]
    del items[:-keep]
    return old


def has_code(code):
    """Whether compiled cell code holds code of its own that may outlive it."""
    for c in code.co_consts:
        if type(c) is CODE_TYPE:
            return True
    return False


def simple_ctype(c, code):
    """The _ctypes simple type of struct code code (ctypes.c_int for "i")."""
    return type("c_" + code, (c._SimpleCData,), {"_type_": code})


def source_compiler():
    """compile() for source text, through the C API where _ctypes reaches it
    (a compile's result is the same): the builtin first checks whether it
    was handed an AST, and that check creates the AST's 119 Python types
    (~0.2 MB) in every kernel."""
    try:
        import _ctypes as c

        py_object, c_int = simple_ctype(c, "O"), simple_ctype(c, "i")

        class CompilerFlags(c.Structure):  # PyCompilerFlags, Python >= 3.8
            _fields_ = [("cf_flags", c_int), ("cf_feature_version", c_int)]

        class Self:
            _handle = c.dlopen(None, getattr(os, "RTLD_NOW", 2))

        api = type("PyAPI", (c.CFuncPtr,), {"_flags_": c.FUNCFLAG_CDECL | c.FUNCFLAG_PYTHONAPI, "_restype_": py_object})
        compile_object = api(("Py_CompileStringObject", Self))
        # What the builtin passes for a str: PyCF_SOURCE_IS_UTF8 and
        # PyCF_IGNORE_COOKIE (a coding: line cannot re-decode the text).
        flags = c.byref(CompilerFlags(0x0100 | 0x0800, sys.version_info[1]))
        starts = {"single": 256, "exec": 257, "eval": 258}

        def compile_source(src, filename, mode):
            try:
                if "\0" not in src:  # C would cut the text there
                    return compile_object(src.encode(), py_object(filename), starts[mode], flags, -1)
            except UnicodeEncodeError:
                pass
            return compile(src, filename, mode)  # and its error

        probe, ns = compile_source("x = '\u00e9' * 2", "<probe>", "exec"), {}
        exec(probe, ns)
        if probe.co_filename != "<probe>" or ns.get("x") != "\u00e9\u00e9":
            raise ValueError("the C API compiles otherwise")
        return compile_source
    except (ImportError, AttributeError, TypeError, ValueError, OSError):
        return compile


COMPILE_SOURCE = source_compiler()


def _print_instruction():
    """The instruction "single" mode puts after an expression statement to
    show its value (PRINT_EXPR; CALL_INTRINSIC_1 1 from Python 3.12): where
    compiling "_" in "single" and "exec" mode differs. None where they
    differ otherwise (the cell is then split on the AST)."""
    single = COMPILE_SOURCE("_", "<probe>", "single").co_code
    plain = COMPILE_SOURCE("_", "<probe>", "exec").co_code
    at = [i for i in range(0, len(single), 2) if single[i : i + 2] != plain[i : i + 2]]
    if len(single) != len(plain) or len(at) != 1:
        return None
    return single[at[0] : at[0] + 2]


PRINT_INSTRUCTION = _print_instruction()
# A last statement opening with one of these is compound: never an
# expression, and "single" mode would show the expressions inside it.
COMPOUND_WORDS = frozenset(("if", "for", "while", "with", "try", "def", "class", "async"))
CLAUSE_WORDS = frozenset(("else", "elif", "except", "finally"))  # never start a statement


def compile_cell(src, filename):
    """A cell's code as (head, tail, shown): head (None: nothing) runs first,
    then tail, its last statement, whose value is shown as the interactive
    interpreter shows it when shown is true. Compile errors are those of
    the whole cell."""
    split = split_by_lines(src, filename)
    return split if split is not None else split_by_ast(src, filename)


def split_by_lines(src, filename):
    """compile_cell without the AST, or None where the lines do not tell
    for sure where the last statement starts: the AST's Python objects
    bring ~0.3 MB of the interpreter's code into every kernel. The last
    line of code in column 0 (an else: or except: goes on to the one
    before, a def takes its decorators) starts the last statement when the
    lines before it compile on their own (they then end outside any
    bracket, string or continuation) and the rest compiles on its own."""
    if PRINT_INSTRUCTION is None or "__future__" in src or "\r" in src or "\f" in src:
        return None
    lines = src.split("\n")
    at, word = len(lines), None
    while word is None or word in CLAUSE_WORDS:  # an else: goes on its if
        at, word = last_code_line(lines, at)
        if at < 0:
            return None
    while True:  # decorators go with their def or class
        above, _ = last_code_line(lines, at)
        if above < 0 or lines[above][0] != "@":
            break
        at = above
    if word in ("match", "case"):  # soft keywords: a statement or a name
        return None
    tail = "\n".join(lines[at:])
    if ";" in tail:  # several statements on a line: only the last is shown
        return None
    first = lines[at]
    compound = word in COMPOUND_WORDS or first[0] == "@"
    try:
        # Padded with newlines: line numbers are the cell's own.
        tail_code = COMPILE_SOURCE("\n" * at + tail, filename, "exec" if compound else "single")
        head_code = COMPILE_SOURCE("\n".join(lines[:at]), filename, "exec") if at else None
    except (SyntaxError, ValueError):
        return None  # the AST tells, and raises the whole cell's error
    if compound:
        return head_code, tail_code, False
    # A simple statement shows at most its own value.
    code, shows, i = tail_code.co_code, 0, -1
    while True:
        i = code.find(PRINT_INSTRUCTION, i + 1)
        if i < 0:
            break
        shows += i % 2 == 0
    if shows > 1:
        return None
    return head_code, tail_code, shows == 1


def last_code_line(lines, before):
    """The last of lines[:before] with code in column 0, and the word it
    opens with; (-1, None) where there is none."""
    at = before - 1
    while at >= 0 and lines[at][:1] in ("", " ", "\t", "#"):
        at -= 1
    if at < 0:
        return -1, None
    line, end = lines[at], 0
    while end < len(line) and (line[end].isalnum() or line[end] == "_"):
        end += 1
    return at, line[:end]


def split_by_ast(src, filename):
    """compile_cell on the AST: the last statement is shown when it is an
    expression."""
    import _ast  # the C module: what compile() builds, without ast.py's helpers

    tree = compile(src, filename, "exec", _ast.PyCF_ONLY_AST)
    if tree.body and isinstance(tree.body[-1], _ast.Expr):
        last = _ast.Interactive(body=[tree.body.pop()])
        head = compile(tree, filename, "exec") if tree.body else None
        return head, compile(last, filename, "single"), True
    return None, compile(tree, filename, "exec"), False


class LibC:
    """The few libc calls the runner makes (prctl, syscall, timerfd_*), with
    ctypes' C types and functions taken from _ctypes itself where it can:
    the ctypes package around them weighs 350 KB in every kernel."""

    def __init__(self):
        try:
            import _ctypes as c

            self.long, self.size_t, self.int, self.uint32, self.uint64, self.int32 = (
                simple_ctype(c, code) for code in "lLiIQi")
            self.Structure, self.byref, self.get_errno = c.Structure, c.byref, c.get_errno
            self._func = type("CFunc", (c.CFuncPtr,), {
                "_flags_": c.FUNCFLAG_CDECL | c.FUNCFLAG_USE_ERRNO, "_restype_": self.int})
            self._handle = c.dlopen(None, getattr(os, "RTLD_NOW", 2))
            if self.func("getpid")() != os.getpid():
                raise OSError("_ctypes answers otherwise")
        except (ImportError, AttributeError, TypeError, ValueError, OSError):
            import ctypes  # ImportError: no ctypes at all, for the caller

            self.long, self.size_t, self.int = ctypes.c_long, ctypes.c_size_t, ctypes.c_int
            self.uint32, self.uint64, self.int32 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32
            self.Structure, self.byref, self.get_errno = ctypes.Structure, ctypes.byref, ctypes.get_errno
            lib = ctypes.CDLL(None, use_errno=True)
            self._func, self._handle = lib._FuncPtr, lib._handle

    def func(self, name, restype=None):
        """libc's function name (AttributeError when there is none)."""
        f = self._func((name, self))
        if restype is not None:
            f.restype = restype
        return f


def load_libc():
    """A LibC, or None where there is no ctypes."""
    try:
        return LibC()
    except (ImportError, OSError, AttributeError):
        return None


# A cell's output goes to these files in the cells dir (fds 1 and 2 while it
# runs); a clipped one is renamed to the cell's id and a suffix.
OUTPUT_STREAMS = ("stdout", "stderr")


COMPLETE_MAX = 1 << 20  # code sent for completion
PENDING_CODE_MAX = 64 << 10  # characters of a pending cell's code told in a status frame
COMPLETE_MATCHES = 200
JEDI = {}  # "loading" once the import started, "module" once it is done


def load_jedi():
    try:
        import jedi
    except Exception:
        return
    JEDI["module"] = jedi


def complete(ns, code, cursor):
    """Completions at cursor in code, computed in the kernel's namespace:
    with jedi where the interpreter has it, else names, attributes, dict
    keys and paths as rlcompleter and glob find them. Returns the offset
    the matches replace from, and the matches."""
    import re  # here, not at start: most kernels never complete
    before = code[:cursor]
    if not re.search(r"""[\w.]$|["'][^"'\n]*$""", before):
        return cursor, []  # an empty word: everything would match
    # jedi, where the interpreter has it, is imported on a thread of its
    # own the first time: its import can take seconds, and a tab must not
    # wait for it (rlcompleter answers until it is there).
    jedi = JEDI.get("module")
    if not JEDI:
        JEDI["loading"] = True
        _thread.start_new_thread(load_jedi, ())
    if jedi is not None:
        try:
            lines = before.split("\n")
            found = jedi.Interpreter(code, [ns]).complete(len(lines), len(lines[-1]))
            if found:
                n = len(found[0].name) - len(found[0].complete)
                return cursor - n, sorted({c.name for c in found})
        except Exception:
            pass
    # A path in an open string: '...or "... with a / or ~ in it.
    m = re.search(r"""(["'])([^"'\n]*)$""", before)
    if m and ("/" in m.group(2) or m.group(2).startswith(("~", "."))) and before.count(m.group(1)) % 2 == 1:
        import glob
        text = m.group(2)
        out = []
        for p in sorted(glob.glob(glob.escape(os.path.expanduser(text)) + "*"))[:COMPLETE_MATCHES]:
            if text.startswith("~"):
                p = "~" + p[len(os.path.expanduser("~")):]
            out.append(p + ("/" if os.path.isdir(os.path.expanduser(p)) else ""))
        return cursor - len(text), out
    # A key of a dict named by a dotted name: d["ke or d['ke.
    m = re.search(r"""([A-Za-z_][\w.]*)\[(["'])([^"'\]]*)$""", before)
    if m:
        try:
            obj = eval(m.group(1), ns)
        except Exception:
            return cursor, []
        if isinstance(obj, dict):
            # With the quotes, as jedi gives them: the key is whole.
            q = m.group(2)
            keys = sorted(q + k + q for k in obj if isinstance(k, str) and k.startswith(m.group(3)) and q not in k)
            return cursor - len(m.group(3)) - 1, keys
        return cursor, []
    m = re.search(r"[A-Za-z_][\w.]*$", before)
    if not m:
        return cursor, []
    text = m.group(0)
    import rlcompleter
    c = rlcompleter.Completer(ns)
    out = []
    for i in range(10000):
        w = c.complete(text, i)
        if w is None:
            break
        if w not in out:
            out.append(w)
    return cursor - len(text), sorted(out)


def tail_text(fd, end, n):
    """The last n characters or so of an output file, from a character's
    start."""
    data = os.pread(fd, 4 * n, max(0, end - 4 * n))
    while data and 0x80 <= data[0] < 0xC0:  # inside a character
        data = data[1:]
    return data.decode("utf-8", "replace")[-n:]


def head_and_tail(head, tail, size):
    """A clipped output as its head and its tail, each cut at a line's end
    where one is near, joined by a line that says how much is not shown."""
    nl = head.rfind("\n")
    if nl >= len(head) * 3 // 4:
        head = head[: nl + 1]
    nl = tail.find("\n")
    if 0 <= nl < len(tail) // 4:
        tail = tail[nl + 1 :]
    shown = len((head + tail).encode("utf-8", "replace"))
    if not head.endswith("\n"):
        head += "\n"
    return "%s[... %s bytes not shown; the whole output is in the spill file ...]\n%s" % (
        head, format(max(0, size - shown), ","), tail)
OUTPUT_FILES = ("_stdout", "_stderr")
OUTPUT_SUFFIXES = (".out", ".err")
OUTPUT_KEEP = 16 << 10  # bytes of earlier cells' output the files may hold before they are emptied
STREAM_EVERY = 0.1  # seconds between output chunks while a cell runs
SOCK_PATH_MAX = 104  # bytes; sun_path holds 108 on Linux and 104 on BSDs, NUL included
RPC_FILE_MAX = (1 << 20) + (64 << 10)  # bytes of one request file forwarded; the engine rejects more
INPUT_TOOL = "kerneldeck:input"  # not a tool name: the engine asks the cell's caller
RPC_SLACK = 5.0  # seconds a tool call waits past its cell's timeout for the engine's interrupt
TURN_MAIN, TURN_IO = "main", "io"  # which thread reads the doors (Runner.turn)
RECV_CHUNK = 64 << 10  # bytes one read of an engine connection takes at most
RECV_FIRST = 4 << 10  # bytes of a connection's first reads: its buffer grows to RECV_CHUNK once one fills it
AUTH_LINE_MAX = 4 << 10  # bytes a peer may send before it answered the challenge
IO_DELAY = 0.002  # seconds into a cell when the io thread takes the doors
# The file the runner's own frames name: runner.py's path when it runs from
# source, "kerneldeck/runner.py" when the engine shipped it compiled
# (loader.py).
RUNNER_FILE = (lambda: None).__code__.co_filename
CODE_TYPE = type((lambda: None).__code__)
PLAIN_SOURCES_KEEP = 100  # sources of cells that defined no code, kept for tracebacks
SEEN_KEEP = 256  # cell ids kept for exactly-once, at least (an engine re-sends only the running one)


try:  # the builtin module is far cheaper to import than hashlib (OpenSSL)
    from _sha2 import sha256 as _sha256
except ImportError:
    try:
        from _sha256 import sha256 as _sha256
    except ImportError:
        from hashlib import sha256 as _sha256


class Auth:
    """HMAC-SHA256 under the kernel's secret, as internal/kernelauth computes
    it: kind, a NUL, then each part as "LEN:" and its bytes."""

    def __init__(self, secret):
        key = bytes(secret)
        if len(key) > 64:
            key = _sha256(key).digest()
        key = key.ljust(64, b"\0")
        self._inner = bytes(b ^ 0x36 for b in key)
        self._outer = bytes(b ^ 0x5C for b in key)
        self.ok = bool(secret)

    def mac(self, kind, *parts):
        h = _sha256(self._inner)
        h.update(kind.encode() + b"\0")
        for p in parts:
            if isinstance(p, str):
                p = p.encode("utf-8", "surrogateescape")
            h.update(b"%d:" % len(p))
            h.update(p)
        return _sha256(self._outer + h.digest()).hexdigest()

    def valid(self, mac, kind, *parts):
        if not self.ok or not isinstance(mac, str) or not mac:
            return False
        return _compare(mac.encode(), self.mac(kind, *parts).encode())

    def sign(self, kind, body):
        """A file's content: its MAC, a space, the body (one line)."""
        return (self.mac(kind, body) + " ").encode() + body

    def open_signed(self, data, kind, *prefix):
        """The body of a signed file, or None if its MAC is wrong."""
        mac, sep, body = data.partition(b" ")
        if not sep or not self.valid(mac.decode("ascii", "replace"), kind, *(prefix + (body,))):
            return None
        return body


def _compare(a, b):
    """Constant-time equality of two byte strings."""
    if len(a) != len(b):
        return False
    diff = 0
    for x, y in zip(a, b):
        diff |= x ^ y
    return diff == 0


# ---- display data (IPython's display protocol) ---------------------------

# The _repr_*_ methods a bundle is made of, in IPython's order.
MIME_REPRS = (
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)
BINARY_MIMES = ("image/png", "image/jpeg", "image/gif")
MAX_DISPLAYS = 100  # per cell; the rest are counted, not kept
MAX_VALUE = 24 << 20  # one representation larger than this is dropped (base64 counted)


def _is_figure(obj):
    return type(obj).__module__.startswith("matplotlib.figure") and hasattr(obj, "savefig")


def _is_pil(obj):
    return type(obj).__module__.startswith("PIL.") and hasattr(obj, "save") and hasattr(obj, "size")


# The values a cell's last expression is most often: none has a rich repr,
# and looking up nine methods on each costs more than the rest of the cell.
PLAIN_TYPES = frozenset((int, float, complex, bool, str, bytes, list, tuple, dict, set, frozenset, range))


def has_rich_repr(obj):
    if type(obj) in PLAIN_TYPES or isinstance(obj, type):
        return False
    if _is_figure(obj) or _is_pil(obj):
        return True
    return any(callable(getattr(obj, m, None)) for m, _ in MIME_REPRS + (("_repr_mimebundle_", ""),))


def _as_value(mime, value):
    """A representation as the string the result carries, or None."""
    if value is None:
        return None
    if mime in BINARY_MIMES:
        import base64  # only displays need it: an idle kernel does without

        if isinstance(value, str):
            try:
                base64.b64decode(value, validate=True)
            except Exception:
                return None
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            return base64.b64encode(bytes(value)).decode("ascii")
        return None
    if mime == "application/json" and not isinstance(value, str):
        try:
            return JSON.dumps(value)
        except Exception:
            return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return None


def mime_bundle(obj):
    """Returns (data, metadata, notes): text/plain always, and what the object
    offers through _repr_mimebundle_ and the _repr_*_ methods."""
    data, meta, notes = {}, {}, []
    if not isinstance(obj, type):
        mb = getattr(obj, "_repr_mimebundle_", None)
        if callable(mb):
            try:
                got = mb(include=None, exclude=None)
                if isinstance(got, tuple) and len(got) == 2:
                    got, md = got
                    if isinstance(md, dict):
                        meta.update(md)
                if isinstance(got, dict):
                    for mime, value in got.items():
                        v = _as_value(mime, value) if isinstance(mime, str) else None
                        if v is not None:
                            data[mime] = v
            except Exception as e:
                notes.append("_repr_mimebundle_ failed: %s" % type(e).__name__)
        for method, mime in MIME_REPRS:
            if mime in data:
                continue
            fn = getattr(obj, method, None)
            if not callable(fn):
                continue
            try:
                value = fn()
            except Exception as e:
                notes.append("%s failed: %s" % (method, type(e).__name__))
                continue
            if isinstance(value, tuple) and len(value) == 2:
                value, md = value
                if isinstance(md, dict):
                    meta[mime] = md
            v = _as_value(mime, value)
            if v is None and value is not None:
                notes.append("%s returned what %s cannot hold" % (method, mime))
            elif v is not None:
                data[mime] = v
        if "image/png" not in data and (_is_figure(obj) or _is_pil(obj)):
            import base64

            buf = io.BytesIO()
            try:
                if _is_figure(obj):
                    obj.savefig(buf, format="png")
                else:
                    obj.save(buf, format="PNG")
                data["image/png"] = base64.b64encode(buf.getvalue()).decode("ascii")
            except Exception as e:
                notes.append("rendering a PNG failed: %s" % type(e).__name__)
    try:
        data["text/plain"] = repr(obj)
    except Exception as e:
        data["text/plain"] = "<%s object>" % type(obj).__name__
        notes.append("repr failed: %s" % type(e).__name__)
    return data, meta, notes


def close_figure(fig):
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        try:
            plt.close(fig)
        except Exception:
            pass


class MplBackendFinder:
    """Makes "kerneldeck_mpl" importable, as matplotlib's backend for kernels:
    Agg for drawing, and a show() that turns the open figures into displays
    (no window, no "non-interactive" warning). Loaded only when matplotlib
    asks for it."""

    def __init__(self, runner):
        self.runner = runner

    def find_spec(self, name, path=None, target=None):
        if name != "kerneldeck_mpl":
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(name, self)

    def create_module(self, spec):
        return None

    def exec_module(self, mod):
        from matplotlib.backends import backend_agg

        for k in dir(backend_agg):
            if not k.startswith("__"):
                setattr(mod, k, getattr(backend_agg, k))
        runner = self.runner

        def show(*args, **kwargs):
            runner.flush_figures()

        mod.show = show


class GetpassFinder:
    """Makes getpass.getpass ask as input() does, with what is typed not
    shown, from the moment getpass is imported (a cell's "from getpass
    import getpass" takes the kernel's)."""

    def __init__(self, runner):
        self.runner = runner
        self.loader = None

    def find_spec(self, name, path=None, target=None):
        if name != "getpass" or self.loader is not None:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            self.loader = spec.loader
            spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, mod):
        try:
            self.loader.exec_module(mod)
        finally:
            self.loader = None
        mod.getpass = self.runner.getpass


def write_private(path, data):
    """Publish data at path atomically with mode 0600."""
    tmp = path + ".tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # A failed write (disk full) leaves no partial file behind.
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Poller:
    """What the io thread needs of selectors' EpollSelector: file descriptors
    waited on for reading, each with its data (selectors and what it
    imports weigh 250 KB in every kernel)."""

    def __init__(self):
        # epoll (close-on-exec) where there is one; poll on the BSDs.
        self.epoll = hasattr(select, "epoll")
        self.ep = select.epoll() if self.epoll else select.poll()
        self.data = {}

    def register(self, fd, data):
        self.ep.register(fd, select.EPOLLIN if self.epoll else select.POLLIN)
        self.data[fd] = data

    def unregister(self, fd):
        self.data.pop(fd, None)
        try:
            self.ep.unregister(fd)
        except (OSError, ValueError):
            pass

    def select(self, timeout):
        """The data of the descriptors ready to read (or closed), waiting at
        most timeout seconds (None: for ever)."""
        if timeout is None:
            events = self.ep.poll(-1 if self.epoll else None)
        else:
            events = self.ep.poll(timeout if self.epoll else timeout * 1000)
        return [self.data[fd] for fd, _ in events if fd in self.data]


class Alarm:
    """A descriptor that becomes readable a set time after arm(): how the
    main thread asks the io thread to take the doors only once a cell has
    run for IO_DELAY, so that a short cell never wakes it (a woken thread
    takes the GIL from the cell). A timerfd where there is one; elsewhere
    a pipe, written at once."""

    def __init__(self, libc):
        self.settime = None
        self.due = None  # when an armed timerfd fires (time.monotonic)
        if hasattr(os, "timerfd_create"):  # Python >= 3.13
            self.fd = os.timerfd_create(time.CLOCK_MONOTONIC, flags=os.TFD_NONBLOCK | os.TFD_CLOEXEC)
            self.settime = lambda delay: os.timerfd_settime(self.fd, initial=delay)
            return
        try:
            fd = libc.func("timerfd_create")(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
            timerfd_settime = libc.func("timerfd_settime")
        except AttributeError:  # no libc (None), or no timerfd in it
            fd = -1
        if fd >= 0:
            self.fd = fd

            class ITimerSpec(libc.Structure):  # {interval, value}: each {seconds, nanoseconds}
                _fields_ = [("interval_s", libc.long), ("interval_ns", libc.long), ("s", libc.long), ("ns", libc.long)]

            specs = {}

            def settime(delay):
                spec = specs.get(delay)
                if spec is None:
                    spec = specs[delay] = libc.byref(ITimerSpec(0, 0, int(delay), int(delay % 1 * 1e9)))
                timerfd_settime(fd, 0, spec, None)

            self.settime = settime
            return
        self.fd, self.pipe_w = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self.pipe_w, False)

    def arm(self, delay):
        if self.settime is not None:
            self.settime(delay)
            self.due = time.monotonic() + delay
            return
        try:
            os.write(self.pipe_w, b"a")
        except OSError:
            pass  # full: it is readable already

    def pending(self, left=0):
        """Whether the alarm is armed and fires more than left seconds from now."""
        return self.due is not None and self.due - time.monotonic() > left

    def clear(self):
        try:
            os.read(self.fd, 4096)
        except OSError:
            pass


class Conn:
    """One engine connection: JSON lines in both directions. Nothing but the
    challenge is answered until the peer proved it holds the secret."""

    def __init__(self, sock):
        self.sock = sock
        # Reads go into one buffer of the connection's: a new 1 MB object
        # per read cost ~0.1 ms (mapped, faulted, unmapped). It starts
        # small, as a bytearray is resident whole, and grows to RECV_CHUNK
        # on the first read that fills it (a large cell).
        self.new_read_buffer(RECV_FIRST)
        self.parts = []  # the start of a line not yet ended
        self.pending = 0  # bytes received before authentication
        self.wlock = _thread.allocate_lock()
        self.alive = True
        self.authed = False
        self.nonce = os.urandom(16).hex()
        self.watch_next = None  # a cell id watched before it came
        # A parked state the engine sends (restore_data): raw bytes after
        # its line, read into restoring through raw_view until raw_left is 0.
        self.restoring = None
        self.raw_view, self.raw_at, self.raw_left = None, 0, 0

    def new_read_buffer(self, size):
        """A new read buffer of size bytes, and the view reads are cut from."""
        self.rbuf = bytearray(size)
        self.view = memoryview(self.rbuf)

    def send_raw(self, frame, parts):
        """Send one frame, then parts as raw bytes (its "n" says how many);
        False if the connection is gone."""
        head = (JSON.dumps(frame) + "\n").encode()
        with self.wlock:
            if not self.alive:
                return False
            try:
                self.sock.sendall(head)
                for part in parts:
                    self.sock.sendall(part)
                return True
            except OSError:
                self.alive = False
                return False

    def send(self, frame):
        """Send one frame; False if the connection is gone."""
        data = (JSON.dumps(frame) + "\n").encode()
        with self.wlock:
            if not self.alive:
                return False
            try:
                # One write first: the socket is non-blocking underneath
                # (it has a timeout), and sendall would poll before it.
                try:
                    n = os.write(self.sock.fileno(), data)  # -1 once closed: EBADF
                except BlockingIOError:
                    n = 0
                if n < len(data):
                    self.sock.sendall(memoryview(data)[n:])
                return True
            except OSError:
                self.alive = False
                return False


class Cell:
    def __init__(self, cid, code, stream, timeout=None, place=None):
        self.id = cid
        self.code = code
        self.stream = stream
        # Where the kernel's client works, applied before the cell: a dict
        # with "dir" and "umask", from the engine (its first cell's).
        self.place = place if isinstance(place, dict) else None
        try:
            self.timeout = float(timeout) if timeout is not None else 300.0
        except (TypeError, ValueError):
            self.timeout = 300.0
        if not self.timeout > 0:
            self.timeout = 300.0


class RPC:
    """The kernel side of tool calls, registered as module kerneldeck_runtime."""

    def __init__(self, runner):
        self.runner = runner
        self.lock = _thread.allocate_lock()
        self.seq = 0
        self.calls = {}  # seq -> [Flag, response]

    def call(self, tool, args):
        """Ask the host to run tool with args; returns the engine's answer
        (a dict with "ok") or raises TimeoutError."""
        r = self.runner
        try:
            args_json = JSON.dumps(args)
            tool_json = JSON.dumps(tool)
        except (TypeError, ValueError) as e:
            return {"ok": False, "error": "the arguments are not JSON-serializable: %s" % e}
        with self.lock:
            self.seq += 1
            seq = self.seq
            waiter = [Flag(), None]
            self.calls[seq] = waiter
        cell = r.running or ""
        # The MAC covers the fields as written, args byte for byte.
        token = r.auth.mac("rpc", str(seq), cell, tool, args_json)
        text = '{"seq": %d, "tool": %s, "args": %s, "cell": %s, "token": "%s"}' % (
            seq, tool_json, args_json, JSON.dumps(cell), token)
        try:
            # Straight over the running cell's socket when it has one (no
            # file, no hand-over to the io thread); else as a request file
            # that the io thread or the Execute door's wait forwards. Request
            # files written by other means (kernel code may write them) go
            # first, the same way, so the engine judges them before this
            # call is answered.
            name = "%d.req" % seq
            conns = r.cell_conns()
            if conns and not os.listdir(r.rpc_dir) and conns[0].send({"op": "rpc", "name": name, "data": text}):
                pass
            else:
                write_private(os.path.join(r.kdir, "rpc", name), text.encode())
                os.write(r.wake_fd, b"rpc\n")
            wait = max(1.0, r.cell_deadline - time.monotonic() + RPC_SLACK)
            if not r.await_answer(waiter[0], wait):
                raise TimeoutError(
                    "no answer from the host for tool %s within %.0fs; is kerneldeck still running?" % (tool, wait))
            return waiter[1]
        finally:
            with self.lock:
                self.calls.pop(seq, None)

    def deliver(self, seq, response):
        if not isinstance(seq, int) or not isinstance(response, dict):
            return
        with self.lock:
            waiter = self.calls.get(seq)
        if waiter is not None and not waiter[0].is_set():
            waiter[1] = response
            waiter[0].set()


class Runner:
    def __init__(self, kdir, idle_exit, margin, clip, spill_max):
        self.kdir = kdir
        self.cells = os.path.join(kdir, "cells")
        self.idle_exit = idle_exit
        self.margin = margin
        self.clip = clip
        self.spill_max = spill_max
        self.lock = _thread.allocate_lock()
        # Cell ids already submitted, for exactly-once. Only the latest
        # SEEN_KEEP to 2 * SEEN_KEEP are kept (~120 bytes an id: 4,096 of
        # them were half a megabyte in every busy kernel): an engine only
        # re-sends the cell it is running, and an older cell's request file
        # is gone once the next cell came.
        self.seen = set()
        self.seen_order = []
        self.pending = set()  # submitted, result not yet written
        # The pending cells' code, for an engine that takes this kernel over
        # while one runs (its record then shows what runs).
        self.pending_code = {}
        # Files of the latest cell (its .req written by the Execute door,
        # its .res, its spilled output), removed when the next one comes.
        self.cell_files = []
        self.out_fds = [None, None]  # the output files (OUTPUT_FILES), open
        self.out_start = [0, 0]  # where the running cell's output starts in them
        self.out_end = [0, 0]  # where the latest cell's output ended in them
        # A cell that came over a socket has no .req record and its result no
        # .res file until a door needs them: the Execute door asks (its
        # cellScript rings "cell ID" again, which files it), or the socket the
        # result went to closes before the next cell acknowledges it.
        self.unfiled = None  # (cell id, frame) sent over a socket, not filed
        self.file_wanted = None  # the id whose result must be filed however it is sent
        self.waiters = {}  # cell id -> [Conn]
        self.streamers = []  # Conns that asked for output of the running cell
        # Where streaming stopped in each output file; the io thread streams
        # on a tick and finish() streams the rest before the result.
        self.stream_lock = _thread.allocate_lock()
        self.stream_offsets = {}
        # The cell whose output the files hold from out_start on, while it
        # runs (set and cleared under stream_lock): self.running is set
        # before redirect() moves out_start, and a stream of the new id from
        # the old start sent the previous cell's last lines again.
        self.out_cell = None
        self.last = None  # (cell id, result frame) of the latest finished cell
        # Cells for the main thread, which takes them one by one (append and
        # popleft are atomic); it sleeps in its poller, not on this.
        self.work = deque()
        self.running = None
        self.pending_interrupt = None
        self.in_user_code = False
        self.execution_count = 0
        self.last_activity = time.monotonic()
        self.ns = {"__name__": "__main__", "__builtins__": builtins}
        self.main_ident = _thread.get_ident()
        self.log_fd = None
        self.auth = Auth(b"")
        self.confinement = "none:not-tried"
        self.unmapped_uid = -1  # the overflow uid, once in a user namespace of our own
        self.landlock_alone = None  # (deny, kernel dir) where Landlock alone hides (guard_note)
        self.park_ready = False  # import the unpickler once ready (a spare of an engine that parks)
        self.cell_deadline = 0.0
        self.rpc = RPC(self)
        self.rpc_dir = os.path.join(kdir, "rpc")
        self.display_max = 5 << 20
        self.stdout = sys.stdout  # the runner's own, unless a cell replaces it
        self.libc = None  # LibC, set by main
        self.start_displays(None)

    # ---- lifecycle -------------------------------------------------------

    def log(self, msg):
        """A line for runner.log: never into a cell's output, which fd 1 is
        while a cell runs."""
        fd = self.log_fd if self.log_fd is not None else 1
        try:
            os.write(fd, ("kerneldeck runner: %s\n" % msg).encode("utf-8", "replace"))
        except OSError:
            pass

    def idle_deadline(self):
        return self.last_activity + self.idle_exit + self.margin

    def touch(self):
        self.last_activity = time.monotonic()

    def serve(self):
        self.log_fd = os.dup(1)
        self.listener = None
        sock_path = os.path.join(self.kdir, "sock")
        if len(sock_path.encode()) <= SOCK_PATH_MAX:
            self.listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            self.listener.bind(sock_path)
            os.chmod(sock_path, 0o600)
            self.listener.listen(16)
        else:
            # Too long for sun_path: the engine uses the FIFO door only.
            self.log("%s is too long for a socket; FIFO only" % sock_path)
        self.wake_fd = os.open(os.path.join(self.kdir, "wake"), os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self.wake_buf = b""
        # Who reads the doors: the main thread while no cell runs (a cell
        # then costs no hand-over between threads), the io thread while one
        # does. Each has its own poller over the same descriptors; only the
        # thread whose turn it is reads them. The io thread handles under
        # door_lock, and the turn changes under it.
        self.pollers = {TURN_MAIN: Poller(), TURN_IO: Poller()}
        self.turn = TURN_MAIN
        self.door_lock = _thread.allocate_lock()
        self.io_active = False  # the io thread is reading the doors
        self.alarm = Alarm(self.libc)  # wakes the io thread when its turn comes
        self.kick_r, self.kick_w = os.pipe()  # ends the io thread's wait when its turn ends
        os.set_blocking(self.kick_r, False)
        os.set_blocking(self.kick_w, False)
        self.pollers[TURN_IO].register(self.kick_r, "kick")
        if self.listener is not None:
            self.watch(self.listener.fileno(), "listen")
        self.watch(self.wake_fd, "wake")
        _thread.start_new_thread(self.io_loop, ())
        self.signal_ready()
        if self.park_ready:
            # A spare, once ready: a hibernated kernel's wake should not wait
            # for the unpickler's imports (functools, collections: 5 ms cold).
            import _pickle  # noqa: F401
        main = self.pollers[TURN_MAIN]
        while True:
            try:
                if not self.work:
                    wait = self.idle_deadline() - time.monotonic()
                    if wait <= 0 and self.running is None:
                        self.exit_idle()
                        return
                    for data in main.select(max(wait, 0.01)):
                        self.on_ready(data)
                    continue
                cell = self.work.popleft()
                if cell is None:
                    continue  # a new idle timer (configure)
                if isinstance(cell, Job):
                    # Pickling runs the user's code, for as long as it
                    # takes: the io thread reads the doors meanwhile.
                    self.hand_over()
                    try:
                        cell.run()
                    finally:
                        self.take_back()
                    continue
                self.hand_over()
                try:
                    self.run_cell(cell)
                finally:
                    self.take_back()
                    with self.stream_lock:
                        self.stream_offsets.clear()
                        self.out_cell = None
            except KeyboardInterrupt:
                # A stray interrupt between cells never ends the kernel.
                continue

    def hand_over(self, delay=IO_DELAY, keep=False):
        """The io thread reads the doors while the main thread runs a cell,
        from delay into it, or from half of it on when the alarm armed for
        an earlier cell is due by then; with keep, from when the alarm
        already armed fires, if it has not yet."""
        with self.door_lock:
            self.turn = TURN_IO
        # The turn is the io thread's before the check: an alarm that fires
        # after it finds the turn handed over. An alarm still due at least
        # delay/2 from now is left as it is: a run of short cells sets it
        # once every delay/2, not once a cell (through ctypes a
        # timerfd_settime is ~4 us of the ~70 a trivial cell takes here).
        if not self.alarm.pending(0 if keep else delay / 2):
            self.alarm.arm(delay)

    def take_back(self):
        """The main thread reads the doors again: the io thread is done with
        what it was handling, and stops waiting on them. The alarm stays
        armed: when it fires after the cell, it finds the turn taken. That
        costs the io thread a wake-up once a run of cells ends (the next
        cell's arm moves it on), and spares a timerfd_settime per cell."""
        with self.door_lock:
            self.turn = TURN_MAIN
            active = self.io_active
        if active:
            try:
                os.write(self.kick_w, b"k")
            except OSError:
                pass  # full: the io thread has a kick to read already

    def await_answer(self, answered, timeout):
        """Waits up to timeout for a tool call's answer (Event answered). The
        main thread, calling from its cell, reads the doors itself meanwhile:
        the answer then costs no hand-over between threads. An interrupt
        that comes during the wait is raised here, after the doors' work."""
        if _thread.get_ident() != self.main_ident or self.turn != TURN_IO:
            return answered.wait(timeout)
        end = time.monotonic() + timeout
        with self.lock:
            self.in_user_code = False  # no KeyboardInterrupt amid the doors' handling
        # The alarm is left as it is, and set again only if it fired: a
        # timerfd_settime fewer per tool call. The io thread then takes the
        # doors IO_DELAY into the cell, not into the call; the next call's
        # take_back stops it again.
        self.take_back()
        interrupted = False
        try:
            sel = self.pollers[TURN_MAIN]
            while not answered.is_set() and not interrupted:
                left = end - time.monotonic()
                if left <= 0:
                    break
                for data in sel.select(min(left, STREAM_EVERY) if self.streamers else left):
                    self.on_ready(data)
                with self.stream_lock:
                    self.stream_running()
                with self.lock:
                    interrupted = self.pending_interrupt is not None and self.pending_interrupt == self.running
        finally:
            self.hand_over(keep=True)
            with self.lock:
                self.in_user_code = True
                if interrupted:
                    self.pending_interrupt = None
        if interrupted:
            raise KeyboardInterrupt
        return answered.is_set()

    def watch(self, fd, data):
        for poller in self.pollers.values():
            poller.register(fd, data)

    def unwatch(self, fd):
        for poller in self.pollers.values():
            poller.unregister(fd)

    def signal_ready(self):
        # sys.executable lets the engine skip PATH wrappers (pyenv shims)
        # on the next spawn; a path with blanks is not reported.
        exe = sys.executable if sys.executable and " " not in sys.executable else "-"
        tell_spawn("READY %d %s %s" % (os.getpid(), exe, self.confinement))

    def exit_idle(self):
        # The spawn's watcher removes the dir once it has kept the exit status.
        self.log("idle for %ds, exiting" % self.idle_exit)
        os._exit(0)

    # ---- I/O thread ------------------------------------------------------

    def io_loop(self):
        sel = self.pollers[TURN_IO]
        idle = Poller()
        idle.register(self.alarm.fd, "alarm")
        while True:
            idle.select(None)
            self.alarm.clear()
            with self.door_lock:
                if self.turn != TURN_IO:
                    continue  # the cell ended first
                self.io_active = True
            try:
                while True:
                    # Tick only while someone waits for a cell's output; else block.
                    ready = sel.select(STREAM_EVERY if self.streamers else None)
                    with self.door_lock:
                        if self.turn != TURN_IO:
                            self.drain_kicks()
                            break
                        for data in ready:
                            self.on_ready(data)
                        with self.stream_lock:
                            self.stream_running()
            finally:
                with self.door_lock:
                    self.io_active = False

    def drain_kicks(self):
        try:
            os.read(self.kick_r, 4096)
        except OSError:
            pass

    def on_ready(self, data):
        """Handles one descriptor ready to read, for the thread whose turn it is."""
        if data == "listen":
            self.accept()
        elif data == "wake":
            try:
                chunk = os.read(self.wake_fd, 65536)
            except BlockingIOError:
                return
            self.wake_buf += chunk
            while b"\n" in self.wake_buf:
                line, self.wake_buf = self.wake_buf.split(b"\n", 1)
                self.on_wake(line.decode("utf-8", "replace").strip())
        elif data == "kick":
            self.drain_kicks()
        else:
            self.on_conn(data)

    def accept(self):
        try:
            fd, _ = self.listener._accept()  # close-on-exec, as socket.accept's
        except OSError:
            return
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, fd)
        # Only our own user (or root: a root engine runs members' kernels
        # as their users) may drive this kernel, even though the 0700
        # directory already keeps co-tenants away from the socket. In the
        # runner's own user namespace root is unmapped: the overflow uid.
        try:
            creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
            if uid not in (os.getuid(), 0, self.unmapped_uid):
                sock.close()
                return
        except (OSError, AttributeError):
            pass
        sock.settimeout(30)
        conn = Conn(sock)
        self.watch(sock.fileno(), conn)
        conn.send({"op": "hello", "nonce": conn.nonce})

    def on_conn(self, conn):
        try:
            # The poller said it is readable: read without the poll that
            # recv_into makes first on a socket with a timeout. The rest of
            # a raw payload (restore_data) is read straight into its buffer.
            target = conn.raw_view[conn.raw_at:] if conn.raw_left else conn.rbuf
            n = os.readv(conn.sock.fileno(), [target])
        except BlockingIOError:
            return
        except OSError:
            n = 0
        if not n:
            self.unwatch(conn.sock.fileno())
            conn.alive = False
            conn.sock.close()
            # A result sent over a socket that broke may not have arrived:
            # the engine's Execute door finds it as a file.
            with self.lock:
                self.file_unfiled_locked()
            return
        if conn.raw_left:
            conn.raw_at += n
            conn.raw_left -= n
            return
        data = bytes(conn.view[:n])
        if n == len(conn.rbuf) < RECV_CHUNK:
            conn.new_read_buffer(RECV_CHUNK)
        if not conn.authed:
            # Until the peer proved it holds the secret, what it may make us
            # keep is bounded: an endless line would otherwise grow the
            # runner's memory without limit.
            conn.pending += n
            if conn.pending > AUTH_LINE_MAX and b"\n" not in data:
                self.refuse(conn, "sent %d bytes without answering the challenge" % conn.pending)
                return
        if b"\n" not in data:
            conn.parts.append(data)
            return
        if conn.parts:
            conn.parts.append(data)
            data = b"".join(conn.parts)
            conn.parts = []
        at = 0
        while at < len(data):
            if conn.raw_left:
                # A raw payload began in this read: its bytes go to its
                # buffer, and what follows them is lines again.
                k = min(conn.raw_left, len(data) - at)
                conn.raw_view[conn.raw_at:conn.raw_at + k] = data[at:at + k]
                conn.raw_at += k
                conn.raw_left -= k
                at += k
                continue
            nl = data.find(b"\n", at)
            if nl < 0:
                conn.parts = [data[at:]]
                return
            line = data[at:nl]
            at = nl + 1
            try:
                msg = JSON.loads(line)
                if not isinstance(msg, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                if not conn.authed:
                    self.refuse(conn, "sent a bad frame before answering the challenge")
                    return
                conn.send({"op": "error", "error": "bad frame: %s" % e})
                continue
            if not conn.authed:
                if not self.authenticate(msg, conn):
                    self.refuse(conn, "did not answer the challenge")
                    return
                continue
            self.on_message(msg, conn)

    def refuse(self, conn, why):
        self.log("refused a connection that " + why)
        self.unwatch(conn.sock.fileno())
        conn.alive = False
        conn.sock.close()

    def authenticate(self, msg, conn):
        """The engine answers our challenge with the MAC of our nonce and sends
        its own, whose MAC we return: both sides prove they hold the secret."""
        if msg.get("op") != "auth" or not self.auth.valid(msg.get("mac"), "engine", conn.nonce):
            return False
        theirs = msg.get("nonce")
        if not isinstance(theirs, str) or not 16 <= len(theirs) <= 128:
            return False
        conn.authed = True
        conn.send({"op": "auth_ok", "mac": self.auth.mac("runner", theirs)})
        return True

    def on_message(self, msg, conn):
        op = msg.get("op")
        if op == "cell":
            cid, code = msg.get("id"), msg.get("code")
            if not valid_name(cid, ID_CHARS, 64) or not isinstance(code, str):
                conn.send({"op": "error", "id": cid, "error": "cell needs an id and code"})
                return
            # A watch can come before its cell (a subscriber came between
            # the engine's choice not to stream and the cell's arrival).
            watched = conn.watch_next == cid
            conn.watch_next = None
            self.submit(Cell(cid, code, bool(msg.get("stream")) or watched, msg.get("timeout"), msg.get("place")), conn)
        elif op == "interrupt":
            self.interrupt(msg.get("id"))
        elif op == "watch":
            # Stream the cell to this socket from now on: the running one, or
            # one submitted on it that has not started yet (the watch came in
            # the same read as the cell).
            with self.lock:
                if msg.get("id") in self.pending and conn in self.waiters.get(msg.get("id"), []):
                    if conn not in self.streamers:
                        self.streamers.append(conn)
                elif valid_name(msg.get("id"), ID_CHARS, 64):
                    conn.watch_next = msg.get("id")
        elif op == "config":
            self.configure(msg.get("idle_exit"))
        elif op == "ping":
            conn.send(self.status_frame("pong"))
        elif op == "complete":
            cid, code, cursor = msg.get("id"), msg.get("code"), msg.get("cursor")
            if not valid_name(cid, ID_CHARS, 64) or not isinstance(code, str) or len(code) > COMPLETE_MAX \
                    or not isinstance(cursor, int) or not 0 <= cursor <= len(code):
                conn.send({"op": "error", "id": cid, "error": "complete needs an id, code and a cursor within it"})
                return
            # Off the reading thread: jedi may take a while the first time,
            # and an interrupt must still get through.
            _thread.start_new_thread(self.complete, (cid, code, cursor, conn))
        elif op == "rpc_result":
            self.rpc.deliver(msg.get("seq"), msg.get("result"))
        elif op == "park":
            max_bytes = msg.get("max_bytes")
            if not valid_name(msg.get("id"), ID_CHARS, 64) or not isinstance(max_bytes, int) or max_bytes <= 0:
                conn.send({"op": "error", "id": msg.get("id"), "error": "park needs an id and max_bytes"})
                return
            if self.running is not None or self.work:
                conn.send({"op": "error", "id": msg["id"], "error": "a cell is running or queued"})
                return
            self.work.append(Job(msg["id"], conn, self.park, msg["id"], max_bytes, conn, msg.get("whole") is True))
        elif op == "restore_data":
            # The parked state follows this line as n raw bytes.
            n = msg.get("n")
            if conn.restoring is not None or not isinstance(n, int) or n < 0:
                conn.send({"op": "error", "id": msg.get("id"), "error": "restore_data comes once, with n bytes"})
                return
            conn.restoring = bytearray(n)
            conn.raw_view, conn.raw_at, conn.raw_left = memoryview(conn.restoring), 0, n
        elif op == "restore":
            self.work.append(Job(msg.get("id"), conn, self.restore, msg, conn))
        else:
            conn.send({"op": "error", "error": "unknown op %r" % (op,)})

    # ---- parking ---------------------------------------------------------

    def park(self, pid, max_bytes, conn, whole=False):
        """Sends the engine the namespace, name by name, as park_data frames
        then one parked frame that says what was saved and what was not.
        Each name is pickled alone: one that fails is named with its reason
        and the rest are saved (names that shared an object each get a copy).
        A whole park (to hibernate) sends nothing unless all of the kernel
        comes through: no name fails and no thread of its own runs."""
        if whole:
            # Threads a cell started come through threading (the runner's
            # own use _thread); unimported, there are none.
            th = sys.modules.get("threading")
            threads = [t.name for t in th.enumerate()
                       if t is not th.main_thread() and not isinstance(t, th._DummyThread) and t.is_alive()] if th else []
            if threads:
                conn.send({"op": "error", "id": pid, "incomplete": True,
                           "error": "threads of its own run (%s)" % ", ".join(threads[:4])[:PARK_REASON_MAX]})
                return
        held = [] if whole else None  # a whole park's frames, sent once all pickled
        # Most values pickle as they are (the C pickler, 0.6 ms to import);
        # cloudpickle or dill (24 ms to import here) only for those that
        # do not: lambdas, and the classes and functions cells define. Any
        # pickle loads what either wrote (restore).
        import _pickle  # not at the start: most kernels never park
        kind, by_value = "pickle", None
        saved, skipped, modules = [], [], []
        total = 0
        module_type = type(sys)
        for name, value in list(self.ns.items()):
            if name.startswith("__") and name.endswith("__"):
                continue  # __builtins__, __name__: the new kernel has its own
            if isinstance(value, module_type):
                modules.append([name, value.__name__])
                continue
            why = None
            if isinstance(value, io.IOBase) and not isinstance(value, (io.BytesIO, io.StringIO)):
                # cloudpickle would save a file open for reading as a copy
                # of its text: not the file the kernel had.
                why = "open file"
            else:
                try:
                    data = _pickle.dumps(value, protocol=4)
                except Exception:  # the user's objects can raise anything
                    if by_value is None:
                        kind, by_value = park_pickler()
                    try:
                        data = by_value.dumps(value, protocol=4)
                    except Exception as e:
                        why = unsaved_kind(value) or ("%s: %s" % (type(e).__name__, e))[:PARK_REASON_MAX]
            if why is not None:
                skipped.append([name, type(value).__name__, why])
                continue
            entry = park_entry(name, data)
            total += len(entry) + len(data)
            if total > max_bytes:
                conn.send({"op": "error", "id": pid, "error": "the namespace is over %d bytes" % max_bytes, "bytes": total})
                return
            saved.append(name)
            frame = ({"op": "park_data", "id": pid, "n": len(entry) + len(data)}, (entry, data))
            if held is not None:
                held.append(frame)
            elif not conn.send_raw(*frame):
                return
            del data, frame
        if whole:
            if skipped:
                conn.send({"op": "error", "id": pid, "incomplete": True, "error": "; ".join(
                    "%s (%s)" % (name, why) for name, _, why in skipped[:4])[:PARK_REASON_MAX]})
                return
            for frame, parts in held:
                if not conn.send_raw(frame, parts):
                    return
        conn.send({"op": "parked", "id": pid, "pickler": kind, "names": saved, "skipped": skipped,
                   "modules": modules, "execution_count": self.execution_count, "bytes": total})

    def restore(self, msg, conn):
        """Loads a parked state the engine sent (restore_data frames, then
        this one) into the namespace, before any cell ran here; answers
        with the names that came back and those that did not, and why."""
        rid = msg.get("id")
        blob, conn.restoring, conn.raw_view = conn.restoring, None, None
        if self.execution_count or self.running is not None or blob is None or conn.raw_left:
            conn.send({"op": "error", "id": rid, "error": "a parked state is restored only into a new kernel"})
            return
        # What cloudpickle or plain pickle wrote, the C unpickler loads (it
        # imports cloudpickle itself where a name needs it); dill's own
        # unpickler reads what dill wrote.
        import _pickle
        loads = _pickle.loads
        if msg.get("pickler") == "dill":
            _, dill = park_pickler("dill")
            loads = dill.loads if dill is not None else None
        names, failed = [], []
        try:
            entries = list(park_entries(blob))
        except ValueError as e:
            conn.send({"op": "error", "id": rid, "error": str(e)})
            return
        for name, data in entries:
            if loads is None:
                failed.append([name, "dill is not installed in this kernel's interpreter"])
                continue
            try:
                self.ns[name] = loads(data)
                names.append(name)
            except Exception as e:
                failed.append([name, ("%s: %s" % (type(e).__name__, e))[:PARK_REASON_MAX]])
        for pair in msg.get("modules") or []:
            try:
                name, module = pair
                __import__(module)
                self.ns[name] = sys.modules[module]
                names.append(name)
            except Exception as e:
                failed.append([str(pair[0]) if pair else "?", ("%s: %s" % (type(e).__name__, e))[:PARK_REASON_MAX]])
        count = msg.get("execution_count")
        if isinstance(count, int) and count > 0:
            self.execution_count = count
        conn.send({"op": "restored", "id": rid, "names": names, "failed": failed, "execution_count": self.execution_count})

    def on_wake(self, line):
        verb, _, rest = line.partition(" ")
        arg, _, mac = rest.partition(" ")
        if verb == "cell" and valid_name(arg, ID_CHARS, 64):
            try:
                with open(os.path.join(self.cells, arg + ".req"), "rb") as f:
                    body = self.auth.open_signed(f.read(), "req")
                if body is None:
                    self.log("refused request %s: not signed by the engine" % arg)
                    return
                req = JSON.loads(body)
                code = req["code"]
                if not isinstance(code, str) or req.get("id") != arg:
                    raise ValueError("code is not a string, or the id is not the file's")
            except (OSError, ValueError, KeyError, TypeError) as e:
                self.log("bad request %s: %s" % (arg, e))
                return
            self.submit(Cell(arg, code, False, req.get("timeout"), req.get("place")), None)
        elif verb == "rpc":
            self.sweep_rpc()
        elif verb == "rpcres" and arg.isdigit():
            path = os.path.join(self.rpc_dir, arg + ".res")
            try:
                with open(path, "rb") as f:
                    body = self.auth.open_signed(f.read(), "ans", arg)
                os.unlink(path)
                if body is None:
                    self.log("refused tool answer %s: not signed by the engine" % arg)
                    return
                response = JSON.loads(body)
            except (OSError, ValueError) as e:
                self.log("bad tool response %s: %s" % (arg, e))
                return
            self.rpc.deliver(int(arg), response)
        elif verb in ("int", "cfg"):
            if not self.auth.valid(mac, verb, arg):
                self.log("refused %s: not signed by the engine" % verb)
                return
            if verb == "int":
                self.interrupt(arg)
            else:
                self.configure(arg)

    def cell_conns(self):
        """The live sockets waiting for the running cell's result."""
        with self.lock:
            return [c for c in self.waiters.get(self.running, []) if c.alive] if self.running else []

    def sweep_rpc(self):
        """Forward every request file in rpc/ to the engine over the running
        cell's socket, removing each; the engine authenticates them. Without
        a live socket, wake the engine's host-side wait, which collects them."""
        conns = self.cell_conns()
        if not conns:
            self.ring_done()
            return
        try:
            names = sorted(os.listdir(self.rpc_dir))
        except OSError:
            return
        for name in names:
            if not name.endswith(".req"):
                continue
            path = os.path.join(self.rpc_dir, name)
            frame = {"op": "rpc", "name": name if valid_name(name, RPC_NAME_CHARS, 80) else "?"}
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                try:
                    if not stat_is_regular(os.fstat(fd).st_mode):
                        frame["error"] = "not a regular file"
                    else:
                        data = os.read(fd, RPC_FILE_MAX + 1)
                        more = os.read(fd, 1) if len(data) == RPC_FILE_MAX + 1 else b""
                        if len(data) > RPC_FILE_MAX or more:
                            frame["error"] = "oversized: more than %d bytes" % RPC_FILE_MAX
                        else:
                            frame["data"] = data.decode("utf-8", "replace")
                finally:
                    os.close(fd)
            except OSError as e:
                frame["error"] = "unreadable: %s" % e.strerror
            if not conns[0].send(frame):
                # The engine is gone from this socket: leave the file (and
                # the rest) for the host-side wait of the Execute path.
                self.ring_done()
                return
            try:
                os.unlink(path)
            except OSError:
                pass

    def ring_done(self):
        try:
            fd = os.open(os.path.join(self.kdir, "done"), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # nobody waits on the host side
        try:
            # Several bytes, not one: a waiter orphaned by a dropped
            # connection can still hold the FIFO, and bash's read -t does a
            # blocking read() after select(), so a waiter whose byte was
            # taken would block past its window. Spare bytes only cause a
            # spurious wake-up, which re-checks the result file.
            os.write(fd, b"x" * 16)
        except OSError:
            pass
        finally:
            os.close(fd)

    def status_frame(self, op):
        return {
            "op": op,
            "pid": os.getpid(),
            "running": self.running,
            # Submitted and not finished: a cell an engine that went away
            # sent (the engine runs one at a time, so at most one).
            "pending": sorted(self.pending),
            # The first pending cell's code (the one resume collects),
            # bounded: the frame goes on one line.
            "pending_code": self.pending_code.get(min(self.pending), "")[:PENDING_CODE_MAX] if self.pending else "",
            "last": self.last[0] if self.last is not None else None,
            "execution_count": self.execution_count,
        }

    def complete(self, cid, code, cursor, conn):
        try:
            start, matches = complete(self.ns, code, cursor)
        except Exception as e:  # the user's namespace can raise anything
            conn.send({"op": "error", "id": cid, "error": "completion failed: %s: %s" % (type(e).__name__, e)})
            return
        conn.send({"op": "completions", "id": cid, "start": start, "matches": matches[:COMPLETE_MATCHES]})

    def configure(self, idle_exit):
        try:
            value = float(idle_exit)
        except (TypeError, ValueError):
            return
        if value > 0:
            self.idle_exit = value
            self.margin = min(30.0, max(1.0, value / 4))
            self.touch()
            self.work.append(None)  # re-arm the main loop's idle timer

    def submit(self, cell, conn):
        with self.lock:
            if cell.id in self.seen:
                # Exactly once: a repeated id never runs again.
                if conn is None:
                    # The Execute door wants the cell: its result as a file.
                    self.file_wanted = cell.id
                    self.took(cell.id)
                    self.file_unfiled_locked(cell.id)
                    return
                if self.last is not None and self.last[0] == cell.id:
                    conn.send(self.last[1])
                elif cell.id in self.pending:
                    self.waiters.setdefault(cell.id, []).append(conn)
                    if cell.stream:
                        self.streamers.append(conn)
                    conn.send({"op": "ack", "id": cell.id})  # had already
                else:
                    conn.send({"op": "error", "id": cell.id, "collected": True,
                               "error": "cell %s already ran and its result was collected" % cell.id})
                return
            self.seen.add(cell.id)
            self.seen_order.append(cell.id)
            self.seen.difference_update(drop_oldest(self.seen_order, SEEN_KEEP))
            self.pending.add(cell.id)
            self.pending_code[cell.id] = cell.code
            self.touch()
            # Publishing a new cell acknowledges the earlier ones: the engine
            # runs one cell at a time per kernel, so their results are
            # collected (an unfiled one never needs its file now).
            self.unfiled = None
            self.file_wanted = cell.id if conn is None else None
            for path in self.cell_files:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            self.cell_files = []
            if conn is None:
                self.took(cell.id)
            if conn is not None:
                self.waiters.setdefault(cell.id, []).append(conn)
                if cell.stream:
                    self.streamers.append(conn)
                # Taken, before any of its code runs: a stream that ends
                # without this tells the engine the cell never ran here.
                conn.send({"op": "ack", "id": cell.id})
            self.work.append(cell)

    def took(self, cid):
        """Marks cell cid taken, before any of its code runs, for the
        Execute door: its record (.req) becomes .took, which needs no room
        on a full disk. A runner found dead with the record unmarked never
        ran the cell."""
        req = os.path.join(self.cells, cid + ".req")
        path = os.path.join(self.cells, cid + ".took")
        try:
            os.rename(req, path)
        except OSError as e:
            self.log("could not mark cell %s taken: %s" % (cid, e.strerror))
            self.cell_files.append(req)
            return
        self.cell_files.append(path)

    def interrupt(self, cid):
        with self.lock:
            if not cid or (self.last is not None and self.last[0] == cid):
                return  # unknown or already finished
            if cid == self.running and self.in_user_code:
                signal.pthread_kill(self.main_ident, signal.SIGINT)
            else:
                # Not started yet (queued, or even not yet published): the
                # cell is interrupted as it starts, before any of its code runs.
                self.pending_interrupt = cid

    def stream_running(self):
        """Sends what the running cell wrote since the last call, if anyone
        asked for it (stream_lock held)."""
        if self.out_cell is not None and self.streamers:
            self.stream_output(self.out_cell)

    def stream_output(self, cid):
        """Sends what cell cid wrote since the last call (stream_lock held)."""
        offsets = self.stream_offsets
        for i, name in enumerate(OUTPUT_STREAMS):
            fd = self.out_fds[i]
            key = (cid, name)
            start = self.out_start[i]
            pos, dec = offsets.get(key, (start, codecs.getincrementaldecoder("utf-8")("replace")))
            if pos - start >= self.spill_max or fd is None:
                continue
            try:
                data = os.pread(fd, min(1 << 20, self.spill_max - (pos - start)), pos)
            except OSError:
                continue
            offsets[key] = (pos + len(data), dec)
            text = dec.decode(data)
            if text:
                frame = {"op": "output", "id": cid, "stream": name, "text": text}
                for conn in list(self.streamers):
                    conn.send(frame)

    # ---- cells (main thread) ---------------------------------------------

    # ---- display data (main thread, while a cell runs) -------------------

    def start_displays(self, cid):
        self.display_cell = cid
        self.displays = []
        self.displays_dropped = 0
        self.display_bytes = 0

    def add_display(self, obj):
        """Adds obj's MIME bundle to the running cell's displays: kept in the
        result up to display_max bytes in all, larger parts spilled to 0600
        files in the cells dir, beyond MAX_DISPLAYS counted only."""
        if self.display_cell is None:
            return
        if len(self.displays) >= MAX_DISPLAYS:
            self.displays_dropped += 1
            return
        data, meta, notes = mime_bundle(obj)
        plain = data.pop("text/plain", "")
        if len(plain) > self.clip:
            plain = plain[: self.clip]
            notes.append("text/plain clipped to %d characters" % self.clip)
        spill = {}
        n = len(self.displays)
        for mime in list(data):
            value = data[mime]
            if len(value) > MAX_VALUE:
                del data[mime]
                notes.append("%s of %d MB dropped (over %d MB)" % (mime, len(value) >> 20, MAX_VALUE >> 20))
            elif self.display_bytes + len(value) > self.display_max:
                del data[mime]
                ext = mime.split("/")[-1].split("+")[0]
                path = os.path.join(self.cells, "%s.d%d.%s" % (self.display_cell, n, only_chars(ext, LOWER_ALNUM) or "bin"))
                try:
                    import base64

                    raw = base64.b64decode(value) if mime in BINARY_MIMES else value.encode("utf-8", "replace")
                    write_private(path, raw)
                    spill[mime] = path
                    with self.lock:
                        self.cell_files.append(path)
                except Exception as e:
                    notes.append("%s could not be spilled: %s" % (mime, type(e).__name__))
            else:
                self.display_bytes += len(value)
        data["text/plain"] = plain
        entry = {"data": data}
        if meta:
            try:
                JSON.dumps(meta)
                entry["metadata"] = meta
            except Exception:
                notes.append("metadata dropped: not JSON")
        if spill:
            entry["spill"] = spill
        if notes:
            entry["note"] = "; ".join(notes)
        self.displays.append(entry)
        self.stream_display(n, entry)

    def stream_display(self, n, entry):
        """Sends a display to the cell's streamers as it is made, after the
        output written before it (the result carries it again)."""
        with self.stream_lock:
            if not self.streamers:
                return
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            self.stream_output(self.display_cell)
            frame = {"op": "display", "id": self.display_cell, "index": n, "display": entry}
            for conn in list(self.streamers):
                conn.send(frame)

    def input(self, prompt=""):
        """The kernel's input(): whoever runs the cell is asked for the line
        (the engine's caller: a REPL, the dashboard, a headless client),
        over the tool-call channel, as Jupyter's input_request does."""
        return self.ask_input(prompt, False)

    def getpass(self, prompt="Password: ", stream=None):
        """getpass.getpass(): as input(), with what is typed not shown."""
        return self.ask_input(prompt, True)

    def ask_input(self, prompt, password):
        if self.running is None:
            raise EOFError("input() outside a cell has no one to ask")
        # What the cell printed so far reaches its caller before the prompt.
        self.flush_streams()
        with self.stream_lock:
            self.stream_running()
        resp = self.rpc.call(INPUT_TOOL, {"prompt": str(prompt), "password": bool(password)})
        value = resp.get("value") if resp.get("ok") else None
        if not isinstance(value, str):
            raise EOFError(resp.get("error") or "no answer")
        return value

    def display(self, *objs, **_):
        """The kernel's display(): each object becomes a display of the cell."""
        for obj in objs:
            self.add_display(obj)

    def displayhook(self, value):
        """The last expression: shown as the interactive interpreter shows it,
        and also as a display when it has rich representations."""
        if value is None:
            return
        if sys.stdout is self.stdout:
            # As sys.__displayhook__, in one write instead of two (the value,
            # then a newline): the stream is unbuffered.
            builtins._ = None
            self.stdout.write(repr(value) + "\n")
            builtins._ = value
        else:
            sys.__displayhook__(value)
        if has_rich_repr(value):
            self.add_display(value)
            if _is_figure(value):
                close_figure(value)

    def flush_figures(self):
        """Open matplotlib figures become displays and are closed, as Jupyter's
        inline backend does after each cell (plt.show() or not)."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            for num in plt.get_fignums():
                fig = plt.figure(num)
                self.add_display(fig)
                plt.close(fig)
        except Exception as e:
            self.log("flushing figures failed: %r" % (e,))

    def run_cell(self, cell):
        start = time.monotonic()
        self.cell_deadline = start + cell.timeout
        self.running = cell.id
        with self.stream_lock:
            self.redirect()
            self.out_cell = cell.id
        self.execution_count += 1
        self.start_displays(cell.id)
        if cell.place:
            enter_place(cell.place)
        try:
            status, tb = self.exec_user(cell)
        except KeyboardInterrupt:
            status, tb = "interrupted", "KeyboardInterrupt\n"
        try:
            self.flush_figures()
        except BaseException:
            pass
        displays, dropped = self.displays, self.displays_dropped
        self.start_displays(None)
        self.flush_streams()
        # The rest of the output goes before the result, so a streamer gets
        # all of it (up to spill_max).
        with self.stream_lock:
            self.out_cell = None
            if self.streamers:
                self.stream_output(cell.id)
        frame = {
            "op": "result",
            "id": cell.id,
            "status": status,
            "execution_count": self.execution_count,
            "duration_ms": round((time.monotonic() - start) * 1000, 3),
        }
        # Empty and false fields are left out: the engine reads them as such.
        if tb:
            frame["traceback"] = tb
        if displays:
            frame["displays"] = displays
        if dropped:
            frame["displays_dropped"] = dropped
        for i, name in enumerate(OUTPUT_STREAMS):
            fd, start = self.out_fds[i], self.out_start[i]
            end = self.out_end[i] = os.lseek(fd, 0, os.SEEK_END)
            size = end - start
            data = os.pread(fd, min(size, self.spill_max + 1), start) if size > 0 else b""
            more = len(data) > self.spill_max
            text = data[: self.spill_max].decode("utf-8", "replace")
            clipped = more or len(text) > self.clip
            if clipped:
                # The head and the tail: the last lines are usually the ones
                # that matter (the error, the total), and past spill_max
                # they are read from the end of the file itself.
                tail = text[-(self.clip // 2):]
                if more:
                    tail = tail_text(fd, end, self.clip // 2)
                text = head_and_tail(text[: self.clip - self.clip // 2], tail, size)
            if text:
                frame[name] = text
            if clipped:
                frame[name + "_clipped"] = True
                # The whole output (up to spill_max) becomes the cell's own
                # file, for the engine to fetch; the next cell gets a new one.
                path = os.path.join(self.cells, cell.id + OUTPUT_SUFFIXES[i])
                with self.stream_lock:
                    try:
                        if start:  # earlier cells' output comes first in the file
                            write_private(path, data[: self.spill_max])
                        else:
                            if more:
                                os.ftruncate(fd, self.spill_max)
                            os.rename(os.path.join(self.cells, OUTPUT_FILES[i]), path)
                            os.close(fd)
                            self.out_fds[i] = None
                            # Fd 1 or 2 still writes into the spill file:
                            # what comes before the next cell goes to a new one.
                            self.open_output(i)
                        frame[name + "_spill"] = path
                    except OSError as e:
                        self.log("cannot keep the whole %s of %s: %s" % (name, cell.id, e))
                if name + "_spill" in frame:
                    with self.lock:
                        self.cell_files.append(path)
        self.finish(cell.id, frame)

    def redirect(self):
        """Starts a cell's output where the kernel's two output files end.
        Fds 1 and 2 point at them from the first cell on, not back at the
        log between cells: a cell costs no file creation, two dup2 and no
        lseek. A cell's output starts where the previous one's ended
        (out_end, found when its result was made): what a thread or process
        left running by an earlier cell writes between cells shows at the
        start of the next cell's output, as in a terminal, instead of being
        lost; what it writes during a cell shows in that cell, as in
        Jupyter. The files are emptied only once they hold OUTPUT_KEEP
        bytes, since an ftruncate costs more than the rest of a trivial
        cell."""
        for i in range(2):
            if self.out_fds[i] is None:
                self.open_output(i)
            else:
                # Again for every cell: an earlier one may have closed or
                # moved fd 1 or 2 (a library silencing C output that never
                # put it back). A dup2 costs less than telling by an fstat.
                os.dup2(self.out_fds[i], 1 + i)
            size = self.out_end[i]
            # Emptied only when nothing came after the latest cell's output:
            # what was written between cells is shown first.
            if size > OUTPUT_KEEP and os.lseek(self.out_fds[i], 0, os.SEEK_END) == size:
                os.ftruncate(self.out_fds[i], 0)
                size = 0
            self.out_start[i] = size

    def open_output(self, i):
        """Opens output file i (stdout, stderr) and points fd 1 + i at it."""
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = self.out_fds[i] = os.open(os.path.join(self.cells, OUTPUT_FILES[i]), flags, 0o600)
        self.out_end[i] = os.lseek(fd, 0, os.SEEK_END)
        os.dup2(fd, 1 + i)

    def flush_streams(self):
        """Flushes what the cell left in sys.stdout and sys.stderr."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass

    def exec_user(self, cell):
        """Run one cell in the persistent namespace; returns (status, traceback)."""
        filename = "<cell-%d>" % (self.execution_count)
        CELL_SOURCES.add(filename, cell.code)
        defines_code = False
        try:
            with self.lock:
                if self.pending_interrupt == cell.id:
                    self.pending_interrupt = None
                    raise KeyboardInterrupt
                self.in_user_code = True
            head, tail, shown = compile_cell(cell.code, filename)
            defines_code = (head is not None and has_code(head)) or has_code(tail)
            if head is not None:
                exec(head, self.ns)
            if shown:
                # Like the interactive interpreter: show the last expression's value.
                hook = sys.displayhook
                sys.displayhook = self.displayhook
                try:
                    exec(tail, self.ns)
                finally:
                    sys.displayhook = hook
            else:
                exec(tail, self.ns)
            return "ok", ""
        except KeyboardInterrupt:
            return "interrupted", self.format_exc()
        except SystemExit as e:
            if e.code is None or e.code == 0:
                return "exit", ""
            return "exit", "SystemExit: %s\n" % (e.code,)
        except BaseException:
            return "error", self.format_exc() + self.guard_note(sys.exc_info()[1])
        finally:
            self.in_user_code = False
            CELL_SOURCES.settle(filename, defines_code)

    def guard_note(self, err):
        """Where Landlock alone hides (no mount namespace here), the dirs
        above what it hides take no new files: a PermissionError there is
        the guard's doing, and the cell's result says so and what to do."""
        if self.landlock_alone is None or not isinstance(err, PermissionError) or not isinstance(err.filename, str):
            return ""
        deny, kdir = self.landlock_alone
        path = os.path.abspath(err.filename)
        root = os.path.dirname(kdir)
        temp = os.path.dirname(root)

        def under(p, d):
            return p == d or p.startswith(d.rstrip("/") + "/")

        first = path[len(temp):].lstrip("/").split("/")[0] if under(path, temp) else ""
        trees = deny + [root, temp + "/kerneldeck-"]  # what confine denies lies in these
        if any(under(path, d) for d in deny) or (under(path, root) and not under(path, kdir)) or \
                (first.startswith("kerneldeck-") and not under(path, root)):
            why = "hides %s" % path
        elif any(t.startswith(os.path.dirname(path).rstrip("/") + "/") for t in trees):
            why = "the dirs above what it hides, %s among them, take no new files" % os.path.dirname(path)
        else:
            return ""
        return ("kerneldeck: the guard did this, not your user's permissions: this host gives kernels no mount "
                "namespace, so Landlock alone keeps the engine's files and other kernels' dirs from them, and %s. "
                "Write under $TMPDIR (%s) or in a dir made before the kernel started; on a host that allows "
                "unprivileged user namespaces, kernels write wherever their user may.\n"
                % (why, os.environ.get("TMPDIR", "?")))

    @staticmethod
    def format_exc():
        import traceback  # only a cell that fails needs it

        etype, value, tb = sys.exc_info()
        # Drop the runner's own frames: the user sees only their cell.
        frames = [f for f in traceback.extract_tb(tb) if f.filename != RUNNER_FILE]
        lines = ["Traceback (most recent call last):\n"] if frames else []
        lines += traceback.StackSummary.from_list(frames).format()
        lines += traceback.format_exception_only(etype, value)
        return "".join(lines)

    def finish(self, cid, frame):
        with self.lock:
            self.last = (cid, frame)
            self.pending.discard(cid)
            self.pending_code.pop(cid, None)
            self.running = None
            self.streamers = []
            waiters = [c for c in self.waiters.pop(cid, []) if c.alive]
            self.touch()
            if waiters and cid != self.file_wanted:
                self.unfiled = (cid, frame)
            else:
                self.file_result_locked(cid, frame)
        sent = False
        for conn in waiters:
            sent = conn.send(frame) or sent
        if waiters and not sent:
            with self.lock:
                self.file_unfiled_locked(cid)

    def file_result_locked(self, cid, frame):
        """Writes cell cid's result file, for the Execute door, and wakes a
        host-side wait for it (self.lock held)."""
        data = JSON.dumps(frame).encode()
        path = os.path.join(self.cells, cid + ".res")
        self.cell_files.append(path)
        try:
            write_private(path, self.auth.sign("res", data))
        except OSError as e:
            # The only door left to the result is shut (a full disk): end,
            # so that the engine tells the cell's caller at once.
            self.log("cannot write the result of %s: %s; exiting" % (cid, e))
            os._exit(1)
        if self.unfiled is not None and self.unfiled[0] == cid:
            self.unfiled = None
        self.ring_done()

    def file_unfiled_locked(self, cid=None):
        """Files the result sent over a socket but not yet acknowledged (of
        cid, when given): that socket broke, or the Execute door asks."""
        if self.unfiled is not None and (cid is None or self.unfiled[0] == cid):
            self.file_result_locked(*self.unfiled)


# ---- parking: a kernel's namespace saved before eviction, restored after --

PARK_REASON_MAX = 200  # characters of an exception kept as the reason a name was not saved
PARK_PICKLERS = ("cloudpickle", "dill")  # by value: lambdas, and classes and functions of cells


class Job:
    """A park or a restore, queued for the main thread as a cell is (it runs
    the user's pickling code); what it raises, an interrupt included, is
    its answer to conn."""

    def __init__(self, jid, conn, fn, *args):
        self.jid, self.conn, self.fn, self.args = jid, conn, fn, args

    def run(self):
        try:
            self.fn(*self.args)
        except BaseException as e:
            self.conn.send({"op": "error", "id": self.jid, "error": ("%s: %s" % (type(e).__name__, e))[:PARK_REASON_MAX]})


def park_pickler(want=None):
    """The pickler this interpreter has: cloudpickle or dill where one is
    installed (they save lambdas and what cells define), else pickle; want
    asks for the one a parked state was written with."""
    for name in (want,) if want else PARK_PICKLERS + ("pickle",):
        try:
            return name, __import__(name)
        except Exception:
            continue
    return None, None


def unsaved_kind(value):
    """Says in words what a value that did not pickle is, where it is a kind
    no pickler saves (an open file, a thread), or None."""
    threading = sys.modules.get("threading")
    if threading is not None and isinstance(value, threading.Thread):
        return "thread"
    if isinstance(value, io.IOBase):
        return "open file"
    if isinstance(value, _socket.socket):
        return "socket"
    kind = type(value).__name__
    if kind in ("generator", "coroutine", "async_generator"):
        return kind
    return None


def park_entry(name, data):
    """One saved name as it is laid out in a parked state: the name's
    length and the data's, then both."""
    raw = name.encode("utf-8")
    return struct.pack("<IQ", len(raw), len(data)) + raw


def park_entries(blob):
    """The (name, data) pairs of a parked state, as park_entry laid them."""
    view, at = memoryview(blob), 0
    while at < len(view):
        if at + 12 > len(view):
            raise ValueError("a parked state ends inside an entry's header")
        n, m = struct.unpack_from("<IQ", view, at)
        at += 12
        if at + n + m > len(view):
            raise ValueError("a parked state ends inside an entry")
        yield bytes(view[at:at + n]).decode("utf-8"), view[at + n:at + n + m]
        at += n + m


def on_sigint(signum, frame):
    # Only a running cell is interrupted; the runner's own bookkeeping never is.
    if RUNNER is not None and RUNNER.in_user_code:
        raise KeyboardInterrupt


RUNNER = None
SPAWN_FD = None  # the spawn's ready channel until READY is told (see tell_spawn)


def settle_alone(temp):
    """On a host of its own, whose root may be read-only, a kernel gets a
    home and a working dir it can write: in the temp dir (bounded as that
    is), where its HOME or its cwd cannot be written."""
    for name in ("home", "work"):
        path = os.path.join(temp, name)
        current = os.environ.get("HOME", "") if name == "home" else os.getcwd()
        if current.startswith("/") and os.access(current, os.W_OK):
            continue
        try:
            os.makedirs(path, 0o700, exist_ok=True)
            if name == "home":
                os.environ["HOME"] = path
            else:
                os.chdir(path)
        except OSError:
            pass


def is_umask(v):
    """Whether v, from JSON, is a umask."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 0o777


def enter_place(place):
    """Work where the kernel's client works: its dir and its umask. A dir
    the kernel's user cannot enter (another login's, or hidden) is said on
    the cell's stderr, and the kernel stays where it is."""
    umask = place.get("umask")
    if is_umask(umask):
        os.umask(umask)
    path = place.get("dir")
    if isinstance(path, str) and path.startswith("/") and "\0" not in path:
        try:
            os.chdir(path)
        except OSError as e:
            sys.stderr.write("kerneldeck: this kernel cannot work in %s, its client's directory (%s); it works in %s\n"
                             % (path, e.strerror or e, os.getcwd()))


def setup_streams():
    # Unbuffered text streams over fds 1 and 2, so Python output and output of
    # subprocesses land in the cell's files in the order they were written.
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stdin = open(os.devnull)
    # The cwd is importable, as in the interactive interpreter, but last:
    # it is shared by every kernel of the login, so a module another
    # kernel writes there cannot stand in for one the interpreter has.
    sys.path.append("")


def read_exactly(fd, n):
    """n bytes from fd, or fewer where it ends first."""
    data = bytearray()
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def write_tools(kdir):
    """Writes kerneldeck_tools.py, shipped on stdin after the compiled code
    (the loader took that), into the kernel dir: 0600, never through
    anything planted there. Returns why it could not, or None."""
    sizes = os.environ.pop("KERNELDECK_STDIN", "").split()
    try:
        n = int(sizes[1]) if len(sizes) == 2 else -1
    except ValueError:
        n = -1
    if n < 0:
        return "no size for kerneldeck_tools.py in KERNELDECK_STDIN"
    data = read_exactly(0, n)
    if len(data) < n:
        return "kerneldeck_tools.py was cut short: %d of %d bytes" % (len(data), n)
    try:
        fd = os.open(os.path.join(kdir, "kerneldeck_tools.py"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
    except OSError as e:
        return "cannot write kerneldeck_tools.py into %s: %s" % (kdir, e.strerror or e)
    return None


# The spawn's ready channel: a pipe on fd 3 that only this runner holds
# (its watcher let go of it), read by the spawn until READY or EOF.
READY_FD = 3


def ready_channel():
    """READY_FD if it is the spawn's pipe, else None (a runner started by
    hand: fd 3 is then closed, or something else that must not be written)."""
    try:
        if not stat_is_fifo(os.fstat(READY_FD).st_mode):
            return None
        os.set_inheritable(READY_FD, False)
        return READY_FD
    except OSError:
        return None


def tell_spawn(line):
    """Says line (READY, or why this runner cannot start) to the spawn, once:
    the channel is closed after it, so no process a cell starts holds it."""
    global SPAWN_FD
    fd, SPAWN_FD = SPAWN_FD, None
    if fd is None:
        return
    try:
        os.write(fd, line.encode("utf-8", "replace") + b"\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def make_private_dirs(kdir):
    """Makes the kernel dir's cells/ and rpc/ dirs and its wake and done
    FIFOs, and checks that the dirs, the kernel root's too, are owner-only
    directories (700, this uid, no symlink), putting a mode right where
    that is all that is wrong (a default ACL, a root made by hand). The
    spawn made kdir itself. Returns why it could not, or None."""
    try:
        for d in ("cells", "rpc"):
            os.mkdir(os.path.join(kdir, d), 0o700)
    except OSError as e:
        return "cannot create private dirs under %s: %s" % (kdir, e.strerror or e)
    dirs = [kdir, os.path.join(kdir, "cells"), os.path.join(kdir, "rpc")]
    if not os.path.basename(kdir).startswith("kerneldeck-once-"):
        dirs.insert(0, os.path.dirname(kdir))  # a per-call kernel's is the shared temp dir
    uid = os.geteuid()

    def bad():
        for d in dirs:
            try:
                st = os.lstat(d)
            except OSError as e:
                return "cannot check modes under %s: %s" % (dirs[0], e.strerror or e)
            kind = "directory" if stat_is_dir(st.st_mode) else "symbolic link" if stat_is_link(st.st_mode) else "not a directory"
            if kind != "directory" or st.st_uid != uid or st.st_mode & 0o7777 != 0o700:
                return "not owner-only (want 700 %d directory): %o %d %s:%s" % (uid, st.st_mode & 0o7777, st.st_uid, kind, d)
        return None

    why = bad()
    if why is not None:
        for d in dirs:
            try:
                st = os.lstat(d)
                if stat_is_dir(st.st_mode) and st.st_uid == uid:
                    os.chmod(d, 0o700)
            except OSError:
                pass
        why = bad()
        if why is not None:
            return why
    try:
        for f in ("wake", "done"):
            os.mkfifo(os.path.join(kdir, f), 0o600)
    except OSError as e:
        return "cannot create FIFOs in %s: %s" % (kdir, e.strerror or e)
    return None


def read_config():
    """The engine's config line, the rest of the spawn command's stdin: the
    kernel's secret and settings. stdin is then /dev/null, so nothing of it
    stays reachable through this process's fds."""
    data = b""
    while not data.endswith(b"\n") and len(data) < 4096:
        try:
            chunk = os.read(0, 4096 - len(data))
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        cfg = JSON.loads(data)
        if not isinstance(cfg, dict):
            raise ValueError("not an object")
    except ValueError:
        cfg = {}
    return cfg


def _num(cfg, name, default, kind=float):
    v = cfg.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        return default
    return kind(v)


# Landlock access rights (linux/landlock.h), by the ABI that added them.
_LL_FS_ABI1 = (1 << 13) - 1  # execute .. make_sym
_LL_FS_REFER, _LL_FS_TRUNCATE, _LL_FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_LL_SCOPE_ABSTRACT_UNIX, _LL_SCOPE_SIGNAL = 1, 2
_LL_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | _LL_FS_TRUNCATE | _LL_FS_IOCTL_DEV


def _unconfined(why):
    return "none:" + only_chars(why, RPC_NAME_CHARS, "-")[:60]


def confine(kdir, libc, deny=(), hidden=False):
    """Confine this process (and what it starts) with Landlock, before any
    thread exists: no mount or unmount, no ptrace or /proc/<pid>/mem of
    processes outside the domain, and from ABI 6 no signals or abstract
    sockets leave it. Where hide has covered what the kernel must not see
    (hidden), every path stays reachable. Otherwise Landlock hides by
    itself, as a fallback: everything stays reachable but the other
    kernels' dirs under the kernel root (and the temp dir's other
    kerneldeck-* dirs) and the whole of each dir in deny (the engine's
    state dir); the price is that the dirs above those lose what was
    created in them after the start. Returns "landlock:ABI" or
    "none:reason"."""
    if libc is None:
        return _unconfined("no ctypes")
    sc = libc.func("syscall", libc.long)
    abi = sc(libc.long(444), None, libc.size_t(0), libc.uint32(1))
    if abi < 0:
        return _unconfined(os.strerror(libc.get_errno()))
    fs = _LL_FS_ABI1 | (_LL_FS_REFER if abi >= 2 else 0) | (_LL_FS_TRUNCATE if abi >= 3 else 0) | (
        _LL_FS_IOCTL_DEV if abi >= 5 else 0)
    scoped = (_LL_SCOPE_ABSTRACT_UNIX | _LL_SCOPE_SIGNAL) if abi >= 6 else 0

    class RulesetAttr(libc.Structure):
        _fields_ = [("fs", libc.uint64), ("net", libc.uint64), ("scoped", libc.uint64)]

    class PathBeneath(libc.Structure):
        _pack_ = 1
        _fields_ = [("allowed", libc.uint64), ("fd", libc.int32)]

    attr = RulesetAttr(fs, 0, scoped)
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    rs = sc(libc.long(444), libc.byref(attr), libc.size_t(size), libc.uint32(0))
    if rs < 0:
        return _unconfined("create ruleset: " + os.strerror(libc.get_errno()))
    try:
        def finish():
            if libc.func("prctl")(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
                return _unconfined("no_new_privs: " + os.strerror(libc.get_errno()))
            if sc(libc.long(446), libc.int(rs), libc.uint32(0)) != 0:
                return _unconfined("restrict self: " + os.strerror(libc.get_errno()))
            return "landlock:%d" % abi

        # One rule and one set of C arguments for every path: a temp dir
        # can hold thousands of entries, each a rule (20 us apiece when each
        # call built its own ctypes objects).
        rule = PathBeneath(0, -1)
        add_rule = (libc.long(445), libc.int(rs), libc.int(1), libc.byref(rule), libc.uint32(0))
        file_rights = fs & _LL_FILE_RIGHTS

        def allow(name, follow=False, dir_fd=None):
            flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
            try:
                fd = os.open(name, flags, dir_fd=dir_fd)
            except OSError:
                return
            try:
                mode = os.fstat(fd).st_mode
                if stat_is_link(mode):
                    return  # a planted link must not open another kernel's dir
                rule.allowed = fs if stat_is_dir(mode) else file_rights
                rule.fd = fd
                sc(*add_rule)
            finally:
                os.close(fd)

        if hidden:
            allow("/", follow=True)
            return finish()
        # Walk from / to the kernel dir and to each denied dir: at each
        # level allow every entry but the next ones on the way. In the temp
        # dir no kerneldeck-* dir is allowed, and in the kernel root nothing
        # (its entries are kernels).
        target = os.path.realpath(kdir)
        parent = os.path.dirname(target)
        transient = os.path.basename(target).startswith("kerneldeck-once-")
        temp = parent if transient else os.path.dirname(parent)
        denied = []
        for d in deny:
            d = os.path.realpath(d) if isinstance(d, str) and d.startswith("/") else ""
            # A dir that holds the kernel's cannot be denied without it; one
            # among the kernels' is denied already.
            if d and d != "/" and not (target + "/").startswith(d.rstrip("/") + "/") and \
                    not d.startswith(temp + "/kerneldeck-") and not d.startswith(parent + "/"):
                denied.append(d)

        def walk(here, paths):
            """Allows what is under here but the paths (absolute, below
            here); the kernel dir's path fails the walk where it cannot be
            listed, a denied one only ends there (its user cannot list it
            either)."""
            nexts = {}
            for p in paths:
                rest = p[len(here):].lstrip("/")
                name = rest.split("/", 1)[0]
                nexts.setdefault(name, []).append(p)
            if transient or here != parent:  # the kernel root: nothing of it
                try:
                    dfd = os.open(here, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                except OSError as e:
                    return "list %s: %s" % (here, e.strerror) if target in paths else None
                try:
                    for e in os.listdir(dfd):
                        if e in nexts or (here == temp and e.startswith("kerneldeck-")):
                            continue
                        allow(e, dir_fd=dfd)
                finally:
                    os.close(dfd)
            for name, ps in nexts.items():
                below = os.path.join(here, name)
                if target in ps and below == target:
                    allow(target, follow=True)
                    ps = [p for p in ps if p != target]
                if below in ps:
                    continue  # a denied dir: nothing in it, at any depth
                if ps:
                    err = walk(below, ps)
                    if err:
                        return err
            return None

        err = walk("/", [target] + denied)
        if err:
            return _unconfined(err)
        return finish()
    finally:
        os.close(rs)


def set_limits(cfg, runner):
    """The kernel's resource limits, soft and hard alike, so that kernel code
    (unless root) cannot lift them: address space (a cell allocating past it
    gets MemoryError), CPU seconds (SIGXCPU, then SIGKILL 5 s later) and the
    processes of this login."""
    limits = []
    mem = _num(cfg, "memory_limit", 0, int)
    cpu = _num(cfg, "cpu_limit", 0, int)
    procs = _num(cfg, "procs_limit", 0, int)
    if not (mem or cpu or procs):
        return
    import resource

    for name, value, hard in (("RLIMIT_AS", mem, mem), ("RLIMIT_CPU", cpu, cpu + 5), ("RLIMIT_NPROC", procs, procs)):
        if value > 0:
            try:
                resource.setrlimit(getattr(resource, name), (value, hard))
                limits.append("%s=%d" % (name, value))
            except (ValueError, OSError) as e:
                runner.log("cannot set %s to %d: %s" % (name, value, e))
    runner.log("limits: %s" % " ".join(limits))


def trusted_site():
    """What the interpreter's site module does at start (the runner starts
    with -I -S), but code that this login can write is not run: a .pth
    file's import lines and a sitecustomize module in a place the runner
    could change, where another kernel of the login could have planted
    them, are skipped (a .pth file's paths are still added). -I already
    keeps out PYTHON* variables, the user site dir with its
    usercustomize, and the cwd. Returns what was skipped, for runner.log."""
    import site

    skipped = []
    add_package, exec_sitecustomize = site.addpackage, site.execsitecustomize

    def ours(path):
        return os.access(path, os.W_OK) or os.access(os.path.dirname(path) or ".", os.W_OK)

    def addpackage(sitedir, name, known_paths):
        full = os.path.join(sitedir, name)
        if not ours(full):
            return add_package(sitedir, name, known_paths)
        reset = known_paths is None
        if reset:
            known_paths = set(site._init_pathinfo())
        try:
            with open(full, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return None if reset else known_paths
        for line in lines:
            if line.startswith("#") or not line.strip():
                continue
            if line.startswith(("import ", "import\t")):
                if full not in skipped:
                    skipped.append(full)
                continue
            d, case = site.makepath(sitedir, line.rstrip())
            if case not in known_paths and os.path.exists(d):
                sys.path.append(d)
                known_paths.add(case)
        return None if reset else known_paths

    def execsitecustomize():
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec("sitecustomize")
        if spec is None or not spec.origin:
            return
        if ours(spec.origin):
            skipped.append(spec.origin)
            return
        exec_sitecustomize()

    site.addpackage, site.execsitecustomize = addpackage, execsitecustomize
    try:
        site.main()
    finally:
        site.addpackage, site.execsitecustomize = add_package, exec_sitecustomize
    return skipped


CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE = 32, 4096, 16384, 1 << 19


def own_namespaces(libc):
    """Moves this runner into a user namespace of its own that maps only its
    own uid and gid, with a mount namespace of its own in it, before any
    thread exists and while it is still dumpable (its /proc files are its
    own to write). Nothing it or anything it starts does, however it
    detaches, can leave the namespace: an engine socket tells it from the
    engine's user by that (and refuses it), and no process outside can be
    ptraced or have its fds, /proc/<pid>/root included, taken from in here.
    Returns "+userns", or "" where the host allows none (a container's
    seccomp profile): the engine then cannot tell this kernel's processes
    from its user's; and whether the mount namespace holds (hide needs it)."""
    if libc is None:
        return "", False
    uid, gid = os.geteuid(), os.getegid()
    try:
        unshare = libc.func("unshare")
    except AttributeError:
        return "", False
    mountns = unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0
    if not mountns and unshare(CLONE_NEWUSER) != 0:
        return "", False
    for name, line in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)), ("gid_map", "%d %d 1" % (gid, gid))):
        try:
            fd = os.open("/proc/self/" + name, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as e:
            if name != "setgroups":  # older kernels have no setgroups file
                # Unmapped, this process is nobody to itself: it cannot go on.
                tell_spawn("FAILED cannot map uid %d in the runner's user namespace: %s" % (uid, e.strerror or e))
                os._exit(2)
    return "+userns", mountns


def hide(libc, kdir, paths):
    """Hides what this kernel must not see, in its own mount namespace,
    before any cell: an empty read-only tmpfs over each dir in paths (the
    engine's state dir, its socket's dir, the login's control sockets'),
    an empty read-only file over each other path, over the temp dir's other
    kerneldeck-* dirs, and over the kernel root, in which only this
    kernel's own dir is put back. Everything else stays as its user sees
    it. Returns None, or why it could not (what it covered stays covered)."""
    mount = libc.func("mount")
    flags = libc.long

    def call(source, target, fstype, how, data=None):
        if mount(source, target.encode(), fstype, flags(how), data) != 0:
            raise OSError(libc.get_errno(), "mount %s: %s" % (target, os.strerror(libc.get_errno())))

    sealed = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC

    def cover(path):
        try:
            st = os.stat(path)
        except OSError:
            return  # nothing there to see
        if stat_is_dir(st.st_mode):
            call(b"kerneldeck", path, b"tmpfs", sealed, b"size=4k,nr_inodes=1,mode=0555")
        else:
            call(b"/dev/null", path, None, MS_BIND)
            call(None, path, None, MS_REMOUNT | MS_BIND | sealed)

    try:
        # Nothing mounted here goes back out to the host's namespace.
        call(None, "/", None, MS_REC | MS_SLAVE)
        target = os.path.realpath(kdir)
        root, own = os.path.split(target)
        transient = own.startswith("kerneldeck-once-")
        temp = root if transient else os.path.dirname(root)
        for p in paths:
            if isinstance(p, str) and p.startswith("/"):
                p = os.path.realpath(p)
                if (target + "/").startswith(p.rstrip("/") + "/"):
                    return "%s holds the kernel's own dir" % p
                cover(p)
        for e in os.listdir(temp):
            p = os.path.join(temp, e)
            if e.startswith("kerneldeck-") and p not in (target, root):
                cover(p)
        if not transient:
            # The kernel root, with only this kernel's dir in it: the dir
            # is bound back from a handle taken before the root is covered.
            fd = os.open(target, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                call(b"kerneldeck", root, b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=4k,nr_inodes=2,mode=0700")
                os.mkdir(target, 0o700)
                call(("/proc/self/fd/%d" % fd).encode(), target, None, MS_BIND)
            finally:
                os.close(fd)
            call(None, root, None, MS_REMOUNT | sealed)
    except OSError as e:
        return e.strerror or str(e)
    return None


def drop_capabilities(libc):
    """Gives up every capability this runner holds in its own namespaces, for
    good: nothing a cell starts, setuid or root in here included, can get
    one back, so no cell can unmount what hide covered or mount anything."""
    if libc is None:
        return
    prctl = libc.func("prctl")
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP

    class Header(libc.Structure):
        _fields_ = [("version", libc.uint32), ("pid", libc.int32)]

    class Data(libc.Structure):  # two of linux's __user_cap_data_struct, all zero
        _fields_ = [(name, libc.uint32) for name in ("e0", "p0", "i0", "e1", "p1", "i1")]

    data = Data()
    libc.func("syscall")(libc.long(126), libc.byref(Header(0x20080522, 0)), libc.byref(data))  # capset, v3


def not_dumpable(libc):
    """Other processes of this login may not read this runner's memory, fds
    or environment, nor ptrace it."""
    try:
        libc.func("prctl")(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except AttributeError:  # no libc (None), or no prctl
        pass


def main():
    global RUNNER, SPAWN_FD
    SPAWN_FD = ready_channel()
    if sys.version_info < (3, 8):
        sys.stderr.write("kerneldeck runner needs Python >= 3.8, found %s\n" % sys.version.split()[0])
        sys.exit(2)
    libc = load_libc()
    userns, mountns = own_namespaces(libc)
    not_dumpable(libc)
    untrusted = trusted_site()
    kdir = os.path.dirname(os.path.abspath(__file__))
    problem = make_private_dirs(kdir) or write_tools(kdir)
    if problem is not None:
        tell_spawn("FAILED " + only_chars(problem, PRINTABLE, "?"))
        sys.stderr.write("kerneldeck runner: %s; exiting\n" % problem)
        os._exit(2)
    cfg = read_config()
    setup_streams()
    idle_exit = _num(cfg, "idle_exit", 1800.0)
    runner = Runner(
        kdir,
        idle_exit,
        min(30.0, max(1.0, idle_exit / 4)),
        _num(cfg, "clip", 50000, int),
        _num(cfg, "spill_max", 5 << 20, int),
    )
    runner.display_max = _num(cfg, "display_max", 5 << 20, int)
    runner.park_ready = cfg.get("park_ready") is True
    secret = cfg.get("secret")
    try:
        key = bytes.fromhex(secret) if isinstance(secret, str) else b""
    except ValueError:
        key = b""
    if not key:
        # No config line (the engine ended in the middle of the spawn): a
        # runner nobody can drive, which would live the default idle_exit.
        # The spawn waits for READY; it is told instead, and ends at once.
        tell_spawn("NOCONFIG")
        sys.stderr.write("kerneldeck runner: no config line with a secret on stdin; exiting\n")
        os._exit(2)
    runner.auth = Auth(key)
    for path in untrusted:
        runner.log("did not run the code in %s: this login can change it, so another kernel could have put it there" % path)
    runner.libc = libc
    confined = cfg.get("confine", True) is not False
    deny = cfg.get("deny") if isinstance(cfg.get("deny"), list) else []
    # A host made for this kernel alone (a container or pod of its own)
    # holds nothing of anyone else's: there is nothing to hide, and its
    # temp dir stays whole (Landlock alone would close /tmp to hide the
    # kernel root's other entries, of which there are none).
    alone = cfg.get("alone") is True
    hidden = alone
    if confined and not alone:
        why = "no mount namespace" if not mountns else \
            hide(libc, kdir, deny) if cfg.get("no_hide") is not True else "turned off by the engine"
        hidden = why is None
        if not hidden:
            runner.log("not hidden by mounts (%s): Landlock alone keeps the engine's files and other kernels' dirs from this kernel" % why)
    if userns:
        # The capabilities a user namespace of our own gave us were for hide
        # alone (where there is none, a container's root keeps its own).
        drop_capabilities(libc)
    if not confined:
        runner.confinement = _unconfined("turned off by the engine")
    else:
        runner.confinement = confine(kdir, libc, deny, hidden) + ("+alone" if alone else "+mountns" if hidden else "")
        if not hidden and runner.confinement.startswith("landlock:"):
            # What Landlock alone denies (confine), for guard_note.
            runner.landlock_alone = ([os.path.abspath(d) for d in deny if isinstance(d, str)], kdir)
    runner.confinement += userns
    if userns:
        try:
            with open("/proc/sys/kernel/overflowuid") as f:
                runner.unmapped_uid = int(f.read())
        except (OSError, ValueError):
            runner.unmapped_uid = 65534
    set_limits(cfg, runner)
    if alone:
        settle_alone(os.path.dirname(os.path.dirname(kdir)))
    tmp = os.path.join(kdir, "tmp")
    try:
        os.mkdir(tmp, 0o700)
    except OSError:
        pass
    if not hidden:
        os.environ["TMPDIR"] = tmp  # Landlock alone: the temp dir's new files are out of reach
    try:
        os.setsid()
    except OSError:
        pass
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, on_sigint)
    # Started in the background by its watcher, the runner inherits SIGQUIT
    # ignored; the programs its cells start should not.
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    # Cells make files as their user would; the runner's own have explicit
    # modes (and the spawn's umask 077 made its dirs).
    # The engine's where it runs here (a client's comes with the first
    # cell); on another host, the login's there, as the spawn found it.
    umask, login = cfg.get("umask"), os.environ.pop("KERNELDECK_UMASK", "")
    if not is_umask(umask):
        try:
            umask = int(login, 8)
        except ValueError:
            umask = 0o022
    os.umask(umask if is_umask(umask) else 0o022)
    # kerneldeck_tools (generated at spawn) reaches the host through this.
    runtime = type(sys)("kerneldeck_runtime")
    runtime.call = runner.rpc.call
    sys.modules["kerneldeck_runtime"] = runtime
    # Rich output: display() in every cell, and matplotlib drawing with Agg
    # into displays unless the kernel asks for another backend.
    builtins.display = runner.display
    builtins.input = runner.input
    sys.meta_path.append(MplBackendFinder(runner))
    sys.meta_path.insert(0, GetpassFinder(runner))
    if "getpass" in sys.modules:  # imported by the interpreter's startup
        sys.modules["getpass"].getpass = runner.getpass
    os.environ.setdefault("MPLBACKEND", "module://kerneldeck_mpl")
    sys.dont_write_bytecode = True
    RUNNER = runner
    runner.serve()


if __name__ == "__main__":
    main()
