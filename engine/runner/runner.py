"""kerneldeck session kernel runner (stdlib only, Python >= 3.8).

One runner is one persistent Python namespace. It is started detached by the
engine's spawn command and takes cells from two doors:

* the wake FIFO: a line "cell ID" after the engine wrote cells/ID.req
  (the portable path over plain Execute), "int ID" to interrupt, "cfg SECONDS"
  to change idle_exit;
* a Unix socket (the fast path): JSON lines {"op": "cell"|"interrupt"|"config"|"ping"|"rpc_result"}.

Tool calls (kerneldeck_tools) go the other way: the call writes rpc/SEQ.req
(0600, tmp + rename) and rings the wake FIFO with "rpc". The I/O thread then
forwards every request file in rpc/ to the engine over the socket of the
running cell and removes it; with no socket it rings the done FIFO so that
the engine's host-side wait collects the files instead. The engine validates
each request (token, seq, cell) and answers over the socket ("rpc_result")
or by writing rpc/SEQ.res and ringing "rpcres SEQ". The calling thread
blocks on an Event until then: no polling on either side.

Each cell id runs at most once, whatever door or how often it is sent: a
repeated id only waits for (or returns) the one result. Every result is
written to cells/ID.res (0600, tmp + rename) and a byte is written to the
done FIFO so that a shell waiting on the host wakes up. Waiting for work
blocks in select(); nothing polls while the kernel is idle.
"""

import ast
import builtins
import codecs
import io
import json
import linecache
import os
import queue
import re
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import types
from stat import S_ISREG as stat_is_regular

CELL_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
STREAM_EVERY = 0.1  # seconds between output chunks while a cell runs
SOCK_PATH_MAX = 104  # bytes; sun_path holds 108 on Linux and 104 on BSDs, NUL included
RPC_FILE_MAX = (1 << 20) + (64 << 10)  # bytes of one request file forwarded; the engine rejects more
RPC_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")
RPC_SLACK = 5.0  # seconds a tool call waits past its cell's timeout for the engine's interrupt


def _env_int(name, default):
    try:
        return int(os.environ.pop(name, default))
    except ValueError:
        return default


def _env_float(name, default):
    try:
        return float(os.environ.pop(name, default))
    except ValueError:
        return default


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


def read_head(path, limit):
    """The first limit bytes of path, and whether there was more."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        return b"", False
    if len(data) > limit:
        return data[:limit], True
    return data, False


class Conn:
    """One engine connection: JSON lines in both directions."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.wlock = threading.Lock()
        self.alive = True

    def send(self, frame):
        """Send one frame; False if the connection is gone."""
        data = (json.dumps(frame) + "\n").encode()
        with self.wlock:
            if not self.alive:
                return False
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                self.alive = False
                return False


class Cell:
    def __init__(self, cid, code, stream, timeout=None):
        self.id = cid
        self.code = code
        self.stream = stream
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
        self.lock = threading.Lock()
        self.seq = 0
        self.calls = {}  # seq -> [threading.Event, response]

    def call(self, tool, args):
        """Ask the host to run tool with args; returns the engine's answer
        (a dict with "ok") or raises TimeoutError."""
        r = self.runner
        try:
            body = {"tool": tool, "args": args, "token": r.token, "cell": r.running or ""}
            json.dumps(body)
        except (TypeError, ValueError) as e:
            return {"ok": False, "error": "the arguments are not JSON-serializable: %s" % e}
        with self.lock:
            self.seq += 1
            seq = self.seq
            waiter = [threading.Event(), None]
            self.calls[seq] = waiter
        body["seq"] = seq
        try:
            write_private(os.path.join(r.kdir, "rpc", "%d.req" % seq), json.dumps(body).encode())
            os.write(r.wake_fd, b"rpc\n")
            wait = max(1.0, r.cell_deadline - time.monotonic() + RPC_SLACK)
            if not waiter[0].wait(wait):
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
        self.lock = threading.Lock()
        self.seen = set()
        self.pending = set()  # submitted, result not yet written
        self.prev_ids = []
        self.waiters = {}  # cell id -> [Conn]
        self.streamers = []  # Conns that asked for output of the running cell
        self.last = None  # (cell id, result frame) of the latest finished cell
        self.work = queue.Queue()
        self.running = None
        self.pending_interrupt = None
        self.in_user_code = False
        self.execution_count = 0
        self.last_activity = time.monotonic()
        self.ns = {"__name__": "__main__", "__builtins__": builtins}
        self.main_ident = threading.get_ident()
        self.log_fd = None
        self.token = ""
        self.cell_deadline = 0.0
        self.rpc = RPC(self)
        self.rpc_dir = os.path.join(kdir, "rpc")

    # ---- lifecycle -------------------------------------------------------

    def idle_deadline(self):
        return self.last_activity + self.idle_exit + self.margin

    def touch(self):
        self.last_activity = time.monotonic()

    def serve(self):
        self.log_fd = os.dup(1)
        self.listener = None
        sock_path = os.path.join(self.kdir, "sock")
        if len(sock_path.encode()) <= SOCK_PATH_MAX:
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(sock_path)
            os.chmod(sock_path, 0o600)
            self.listener.listen(16)
        else:
            # Too long for sun_path: the engine uses the FIFO door only.
            print("kerneldeck runner: %s is too long for a socket; FIFO only" % sock_path, flush=True)
        self.wake_fd = os.open(os.path.join(self.kdir, "wake"), os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        threading.Thread(target=self.io_loop, name="kerneldeck-io", daemon=True).start()
        self.signal_ready()
        while True:
            try:
                wait = self.idle_deadline() - time.monotonic()
                if wait <= 0 and self.running is None and self.work.empty():
                    self.exit_idle()
                    return
                try:
                    cell = self.work.get(timeout=max(wait, 0.01))
                except queue.Empty:
                    continue
                if cell is not None:
                    self.run_cell(cell)
            except KeyboardInterrupt:
                # A stray interrupt between cells never ends the kernel.
                continue

    def signal_ready(self):
        try:
            fd = os.open(os.path.join(self.kdir, "ready"), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return
        try:
            # sys.executable lets the engine skip PATH wrappers (pyenv shims)
            # on the next spawn; a path with blanks is not reported.
            exe = sys.executable if sys.executable and " " not in sys.executable else ""
            os.write(fd, ("READY %d %s\n" % (os.getpid(), exe)).encode())
        finally:
            os.close(fd)

    def exit_idle(self):
        print("kerneldeck runner: idle for %ds, exiting" % self.idle_exit, flush=True)
        import shutil

        shutil.rmtree(self.kdir, ignore_errors=True)
        os._exit(0)

    # ---- I/O thread ------------------------------------------------------

    def io_loop(self):
        sel = selectors.DefaultSelector()
        if self.listener is not None:
            sel.register(self.listener, selectors.EVENT_READ, "listen")
        sel.register(self.wake_fd, selectors.EVENT_READ, "wake")
        wake_buf = b""
        offsets = {}
        while True:
            # Tick only while someone waits for a cell's output; idle, we block.
            events = sel.select(STREAM_EVERY if self.streamers else None)
            for key, _ in events:
                if key.data == "listen":
                    self.accept(sel)
                elif key.data == "wake":
                    try:
                        chunk = os.read(self.wake_fd, 65536)
                    except BlockingIOError:
                        continue
                    wake_buf += chunk
                    while b"\n" in wake_buf:
                        line, wake_buf = wake_buf.split(b"\n", 1)
                        self.on_wake(line.decode("utf-8", "replace").strip())
                else:
                    self.on_conn(sel, key.data)
            if self.running is not None and self.streamers:
                self.stream_output(offsets)
            elif offsets:
                offsets.clear()

    def accept(self, sel):
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        # Only our own user may drive this kernel, even though the 0700
        # directory already keeps co-tenants away from the socket.
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
            if uid != os.getuid():
                sock.close()
                return
        except (OSError, AttributeError):
            pass
        sock.settimeout(30)
        sel.register(sock, selectors.EVENT_READ, Conn(sock))

    def on_conn(self, sel, conn):
        try:
            data = conn.sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            sel.unregister(conn.sock)
            conn.alive = False
            conn.sock.close()
            return
        conn.buf += data
        while b"\n" in conn.buf:
            line, conn.buf = conn.buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                conn.send({"op": "error", "error": "bad frame: %s" % e})
                continue
            self.on_message(msg, conn)

    def on_message(self, msg, conn):
        op = msg.get("op")
        if op == "cell":
            cid, code = msg.get("id"), msg.get("code")
            if not isinstance(cid, str) or not CELL_ID.match(cid) or not isinstance(code, str):
                conn.send({"op": "error", "id": cid, "error": "cell needs an id and code"})
                return
            self.submit(Cell(cid, code, bool(msg.get("stream")), msg.get("timeout")), conn)
        elif op == "interrupt":
            self.interrupt(msg.get("id"))
        elif op == "config":
            self.configure(msg.get("idle_exit"))
        elif op == "ping":
            conn.send(self.status_frame("pong"))
        elif op == "rpc_result":
            self.rpc.deliver(msg.get("seq"), msg.get("result"))
        else:
            conn.send({"op": "error", "error": "unknown op %r" % (op,)})

    def on_wake(self, line):
        verb, _, arg = line.partition(" ")
        if verb == "cell" and CELL_ID.match(arg):
            try:
                with open(os.path.join(self.cells, arg + ".req"), "rb") as f:
                    req = json.loads(f.read())
                code = req["code"]
                if not isinstance(code, str):
                    raise ValueError("code is not a string")
            except (OSError, ValueError, KeyError, TypeError) as e:
                print("kerneldeck runner: bad request %s: %s" % (arg, e), flush=True)
                return
            self.submit(Cell(arg, code, False, req.get("timeout")), None)
        elif verb == "rpc":
            self.sweep_rpc()
        elif verb == "rpcres" and arg.isdigit():
            path = os.path.join(self.rpc_dir, arg + ".res")
            try:
                with open(path, "rb") as f:
                    response = json.loads(f.read())
                os.unlink(path)
            except (OSError, ValueError) as e:
                print("kerneldeck runner: bad tool response %s: %s" % (arg, e), flush=True)
                return
            self.rpc.deliver(int(arg), response)
        elif verb == "int":
            self.interrupt(arg)
        elif verb == "cfg":
            self.configure(arg)

    def sweep_rpc(self):
        """Forward every request file in rpc/ to the engine over the running
        cell's socket, removing each; the engine authenticates them. Without
        a live socket, wake the engine's host-side wait, which collects them."""
        with self.lock:
            conns = [c for c in self.waiters.get(self.running, []) if c.alive] if self.running else []
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
            frame = {"op": "rpc", "name": name if RPC_NAME.match(name) else "?"}
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
            "execution_count": self.execution_count,
        }

    def configure(self, idle_exit):
        try:
            value = float(idle_exit)
        except (TypeError, ValueError):
            return
        if value > 0:
            self.idle_exit = value
            self.margin = min(30.0, max(1.0, value / 4))
            self.touch()
            self.work.put(None)  # re-arm the main loop's idle timer

    def submit(self, cell, conn):
        with self.lock:
            if cell.id in self.seen:
                # Exactly once: a repeated id never runs again.
                if conn is None:
                    return
                if self.last is not None and self.last[0] == cell.id:
                    conn.send(self.last[1])
                elif cell.id in self.pending:
                    self.waiters.setdefault(cell.id, []).append(conn)
                    if cell.stream:
                        self.streamers.append(conn)
                else:
                    conn.send({"op": "error", "id": cell.id,
                               "error": "cell %s already ran and its result was collected" % cell.id})
                return
            self.seen.add(cell.id)
            self.pending.add(cell.id)
            self.touch()
            if conn is not None:
                # The .req file is the record that this id was published, for
                # whichever door the engine uses next (see cellScript).
                try:
                    write_private(os.path.join(self.cells, cell.id + ".req"),
                                  json.dumps({"id": cell.id, "code": cell.code}).encode())
                except OSError as e:
                    self.seen.discard(cell.id)
                    self.pending.discard(cell.id)
                    conn.send({"op": "error", "id": cell.id, "error": "publish failed: %s" % e})
                    return
            # Publishing a new cell acknowledges the earlier ones: the engine
            # runs one cell at a time per kernel, so their files are collected.
            for old in self.prev_ids:
                for suffix in (".req", ".res", ".out", ".err"):
                    try:
                        os.unlink(os.path.join(self.cells, old + suffix))
                    except OSError:
                        pass
            self.prev_ids = [cell.id]
            if conn is not None:
                self.waiters.setdefault(cell.id, []).append(conn)
                if cell.stream:
                    self.streamers.append(conn)
            self.work.put(cell)

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

    def stream_output(self, offsets):
        cid = self.running
        for name in ("stdout", "stderr"):
            path = os.path.join(self.cells, "%s.%s" % (cid, name[3:]))
            key = (cid, name)
            pos, dec = offsets.get(key, (0, codecs.getincrementaldecoder("utf-8")("replace")))
            if pos >= self.spill_max:
                continue
            try:
                with open(path, "rb") as f:
                    f.seek(pos)
                    data = f.read(min(1 << 20, self.spill_max - pos))
            except OSError:
                continue
            offsets[key] = (pos + len(data), dec)
            text = dec.decode(data)
            if text:
                frame = {"op": "output", "id": cid, "stream": name, "text": text}
                for conn in list(self.streamers):
                    conn.send(frame)

    # ---- cells (main thread) ---------------------------------------------

    def run_cell(self, cell):
        start = time.monotonic()
        self.cell_deadline = start + cell.timeout
        self.running = cell.id
        out_path = os.path.join(self.cells, cell.id + ".out")
        err_path = os.path.join(self.cells, cell.id + ".err")
        self.redirect(out_path, err_path)
        self.execution_count += 1
        try:
            status, tb = self.exec_user(cell)
        except KeyboardInterrupt:
            status, tb = "interrupted", "KeyboardInterrupt\n"
        self.restore()
        frame = {
            "op": "result",
            "id": cell.id,
            "status": status,
            "traceback": tb,
            "execution_count": self.execution_count,
            "duration_ms": round((time.monotonic() - start) * 1000, 3),
        }
        for name, path in (("stdout", out_path), ("stderr", err_path)):
            data, more = read_head(path, self.spill_max)
            text = data.decode("utf-8", "replace")
            clipped = more or len(text) > self.clip
            frame[name] = text[: self.clip]
            frame[name + "_clipped"] = clipped
            frame[name + "_spill"] = ""
            if clipped:
                if more:
                    os.truncate(path, self.spill_max)
                frame[name + "_spill"] = path
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        self.finish(cell.id, frame)

    def redirect(self, out_path, err_path):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        fo = os.open(out_path, flags, 0o600)
        fe = os.open(err_path, flags, 0o600)
        os.dup2(fo, 1)
        os.dup2(fe, 2)
        os.close(fo)
        os.close(fe)

    def restore(self):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os.dup2(self.log_fd, 1)
        os.dup2(self.log_fd, 2)

    def exec_user(self, cell):
        """Run one cell in the persistent namespace; returns (status, traceback)."""
        filename = "<cell-%d>" % (self.execution_count)
        linecache.cache[filename] = (len(cell.code), None, cell.code.splitlines(True), filename)
        try:
            with self.lock:
                if self.pending_interrupt == cell.id:
                    self.pending_interrupt = None
                    raise KeyboardInterrupt
                self.in_user_code = True
            tree = compile(cell.code, filename, "exec", ast.PyCF_ONLY_AST)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Interactive(body=[tree.body.pop()])
            exec(compile(tree, filename, "exec"), self.ns)
            if last is not None:
                # Like the interactive interpreter: show the last expression's value.
                exec(compile(last, filename, "single"), self.ns)
            return "ok", ""
        except KeyboardInterrupt:
            return "interrupted", self.format_exc()
        except SystemExit as e:
            if e.code is None or e.code == 0:
                return "exit", ""
            return "exit", "SystemExit: %s\n" % (e.code,)
        except BaseException:
            return "error", self.format_exc()
        finally:
            self.in_user_code = False

    @staticmethod
    def format_exc():
        etype, value, tb = sys.exc_info()
        # Drop the runner's own frames: the user sees only their cell.
        frames = [f for f in traceback.extract_tb(tb) if f.filename != __file__]
        lines = ["Traceback (most recent call last):\n"] if frames else []
        lines += traceback.StackSummary.from_list(frames).format()
        lines += traceback.format_exception_only(etype, value)
        return "".join(lines)

    def finish(self, cid, frame):
        data = json.dumps(frame)
        write_private(os.path.join(self.cells, cid + ".res"), data.encode())
        with self.lock:
            self.last = (cid, frame)
            self.pending.discard(cid)
            self.running = None
            self.streamers = []
            waiters = self.waiters.pop(cid, [])
            self.touch()
        for conn in waiters:
            conn.send(frame)
        self.ring_done()


def on_sigint(signum, frame):
    # Only a running cell is interrupted; the runner's own bookkeeping never is.
    if RUNNER is not None and RUNNER.in_user_code:
        raise KeyboardInterrupt


RUNNER = None


def setup_streams():
    # Unbuffered text streams over fds 1 and 2, so Python output and output of
    # subprocesses land in the cell's files in the order they were written.
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stdin = open(os.devnull)
    sys.path.insert(0, "")  # like the interactive interpreter: the cwd is importable


def main():
    global RUNNER
    if sys.version_info < (3, 8):
        sys.stderr.write("kerneldeck runner needs Python >= 3.8, found %s\n" % sys.version.split()[0])
        sys.exit(2)
    setup_streams()
    kdir = os.path.dirname(os.path.abspath(__file__))
    idle_exit = _env_float("KERNELDECK_IDLE_EXIT", 1800)
    runner = Runner(
        kdir,
        idle_exit,
        min(30.0, max(1.0, idle_exit / 4)),
        _env_int("KERNELDECK_CLIP", 50000),
        _env_int("KERNELDECK_SPILL_MAX", 5 << 20),
    )
    # The token stays in this process for the tool module; cells and their
    # subprocesses never see it in os.environ.
    runner.token = os.environ.pop("KERNELDECK_RPC_TOKEN", "")
    try:
        os.setsid()
    except OSError:
        pass
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, on_sigint)
    os.umask(0o077)
    # kerneldeck_tools (generated at spawn) reaches the host through this.
    runtime = types.ModuleType("kerneldeck_runtime")
    runtime.call = runner.rpc.call
    sys.modules["kerneldeck_runtime"] = runtime
    sys.dont_write_bytecode = True
    RUNNER = runner
    runner.serve()


if __name__ == "__main__":
    main()
