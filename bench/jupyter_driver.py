"""Drive a local ipykernel with jupyter_client for kerneldeck's bench.

Reads one JSON command per line on stdin and answers one JSON line on
stdout; timings are taken here with time.perf_counter, around exactly what a
jupyter_client user waits for:

  {"op": "start"}          start the warm kernel (not timed); answers its pid,
                           the interpreter and the package versions
  {"op": "warm", "n": N}   N trivial cells ("1") on the warm kernel; a cell
                           is timed from execute() until both the
                           execute_reply and the iopub "idle" status for it
                           arrived, with the execute_result "1" checked
  {"op": "cold", "n": N}   N cold starts: KernelManager.start_kernel(),
                           client channels, wait_for_ready(), first cell "1"
                           as above; the shutdown is outside the timing
  {"op": "quit"}           shut the warm kernel down and exit

Answers: {"ok": true, ...} with "lat" in seconds, or {"ok": false, "error"}.
"""

import json
import sys
import time
import traceback

from jupyter_client.manager import KernelManager

TIMEOUT = 60.0


def run_cell(kc, code):
    msg_id = kc.execute(code, store_history=True)
    result, idle, reply = None, False, None
    while not idle:
        msg = kc.get_iopub_msg(timeout=TIMEOUT)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "execute_result":
            result = msg["content"]["data"].get("text/plain")
        elif kind == "error":
            raise RuntimeError("cell failed: %s" % msg["content"].get("evalue"))
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
    while reply is None:
        msg = kc.get_shell_msg(timeout=TIMEOUT)
        if msg["parent_header"].get("msg_id") == msg_id:
            reply = msg
    if reply["content"]["status"] != "ok":
        raise RuntimeError("execute_reply status %r" % reply["content"]["status"])
    return result


def start():
    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=TIMEOUT)
    return km, kc


def stop(km, kc):
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def versions():
    import ipykernel
    import jupyter_client
    import zmq

    return {
        "jupyter_client": jupyter_client.__version__,
        "ipykernel": ipykernel.__version__,
        "pyzmq": zmq.__version__,
        "python": sys.version.split()[0],
    }


def main():
    km = kc = None
    out = sys.stdout
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            op = cmd.get("op")
            if op == "start":
                km, kc = start()
                exe = run_cell(kc, "import sys; sys.executable")
                ans = {"ok": True, "pid": km.provisioner.pid if km.provisioner else 0,
                       "executable": (exe or "").strip("'"), "versions": versions()}
            elif op == "warm":
                lat = []
                for _ in range(int(cmd["n"])):
                    t0 = time.perf_counter()
                    res = run_cell(kc, "1")
                    lat.append(time.perf_counter() - t0)
                    if res != "1":
                        raise RuntimeError("warm cell returned %r, want '1'" % res)
                ans = {"ok": True, "lat": lat}
            elif op == "cold":
                lat = []
                for _ in range(int(cmd["n"])):
                    t0 = time.perf_counter()
                    ckm, ckc = start()
                    res = run_cell(ckc, "1")
                    lat.append(time.perf_counter() - t0)
                    stop(ckm, ckc)
                    if res != "1":
                        raise RuntimeError("first cell returned %r, want '1'" % res)
                ans = {"ok": True, "lat": lat}
            elif op == "quit":
                if km is not None:
                    stop(km, kc)
                out.write(json.dumps({"ok": True}) + "\n")
                out.flush()
                return
            else:
                ans = {"ok": False, "error": "unknown op %r" % op}
        except Exception as e:  # reported to the bench, which stops
            ans = {"ok": False, "error": "%s: %s" % (type(e).__name__, e), "trace": traceback.format_exc()}
        out.write(json.dumps(ans) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
