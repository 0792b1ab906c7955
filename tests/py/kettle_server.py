# kettle_server.py - what the Python tests that drive `kettle serve` share:
# the server as a child process on a free loopback port (--port 0, the port
# read from its "listening on" line), JSON POSTs, and a guard that always
# stops the server: a watchdog past the test's time budget, SIGTERM / SIGINT
# / SIGHUP, and PR_SET_PDEATHSIG should the test itself be killed.
import ctypes
import json
import os
import shutil
import signal
import subprocess
import threading
import urllib.error
import urllib.request

START_TIMEOUT_S = 30
REQUEST_TIMEOUT_S = 120

server = None   # the kettle serve Popen
tmp_dir = None  # removed by the watchdog and the signal handler too


def kill_server():
    s = server
    if s is None or s.poll() is not None:
        return
    s.terminate()  # SIGTERM, then SIGKILL if it has not exited after 5 s
    try:
        s.wait(timeout=5)
    except subprocess.TimeoutExpired:
        s.kill()
        s.wait()


def _cleanup():
    kill_server()
    if tmp_dir:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def guard(budget_s):
    """Kills the server (and removes tmp_dir) past budget_s or on a signal."""
    def watchdog():
        print(f"FAIL - the test ran over its {budget_s} s budget; killing kettle serve", flush=True)
        _cleanup()
        os._exit(1)

    def on_signal(signum, _frame):
        _cleanup()
        print(f"FAIL - interrupted by signal {signum}", flush=True)
        os._exit(1)

    timer = threading.Timer(budget_s, watchdog)
    timer.daemon = True
    timer.start()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    return timer


def _die_with_parent():
    # runs in the child before exec: SIGKILL it if this script dies
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def start_server(binary, model, extra):
    """`kettle serve -m MODEL --port 0 -t 2 EXTRA`; returns (port, log lines)."""
    global server
    args = [binary, "serve", "-m", model, "--port", "0", "-t", "2"] + list(extra)
    server = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    log, port, found = [], [None], threading.Event()

    def reader():
        for line in server.stderr:
            log.append(line)
            if port[0] is None and "listening on http://" in line:
                port[0] = int(line.rsplit(":", 1)[1].strip().rstrip("/"))
                found.set()
        found.set()  # EOF: the server exited

    threading.Thread(target=reader, daemon=True).start()
    if not found.wait(START_TIMEOUT_S) or port[0] is None:
        raise RuntimeError("kettle serve did not print its listening line:\n" + "".join(log))
    return port[0], log


def gen_model(binary, vocab, out):
    subprocess.run([binary, "gen-model", "--shape", "test-tiny", "--type", "Q8_0",
                    "--vocab", vocab, "-o", out], check=True, stdout=subprocess.DEVNULL, timeout=60)


def post(url, body):
    """(status, text) of a JSON POST; an HTTP error is a status, not an exception."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


# ---- named checks (cli_habits.py, serve_classes.py) ----

def check(cond, what, detail=""):
    """An assertion that says what failed and shows the evidence."""
    if not cond:
        raise AssertionError(what + (("\n" + detail) if detail else ""))


def run_named(tests, names, cleanup_dir=None):
    """Runs tests[name]() for each name (all when none are given), printing
    'ok' or 'FAIL' with the time; every test runs even after a failure.
    Returns the exit status: 0 only if all passed."""
    import time
    failed = 0
    for n in names or list(tests):
        t = time.time()
        try:
            tests[n]()
            print(f"ok   {n} ({time.time() - t:.1f} s)")
        except Exception as e:  # report every test, then fail
            failed += 1
            print(f"FAIL {n}: {type(e).__name__}: {e}")
    if cleanup_dir:
        shutil.rmtree(cleanup_dir, ignore_errors=True)
    return 1 if failed else 0


# ---- a `kettle serve` child that logs (cli_habits.py, serve_classes.py) ----

class ServeChild:
    """`KETTLE serve --port 0 ARGS`: its stderr lines kept in .log, its
    port read from the "listening on" line (a failed check after
    start_s). stop() sends SIGTERM and checks for exit status 0."""

    def __init__(self, kettle, args, env=None, start_s=60):
        import re
        self.log = []
        self.port = None
        self.p = subprocess.Popen([kettle, "serve", "--port", "0"] + args, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        found = threading.Event()

        def reader():
            for line in self.p.stderr:
                self.log.append(line)
                m = re.search(r"listening on http://[^\s]+:(\d+)", line)
                if m and not self.port:
                    self.port = int(m.group(1))
                    found.set()
            found.set()

        self.t = threading.Thread(target=reader, daemon=True)
        self.t.start()
        found.wait(start_s)
        check(self.port, "kettle serve started", "".join(self.log))

    def open(self, method, path, body=None, timeout=60):
        """The urllib response (an HTTPError is returned, not raised)."""
        data = json.dumps(body).encode() if body is not None else None
        r = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                   headers={"Content-Type": "application/json"})
        try:
            return urllib.request.urlopen(r, timeout=timeout)
        except urllib.error.HTTPError as e:
            return e

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(20)
        self.t.join(5)
        check(rc == 0, "kettle serve exits 0 on SIGTERM", "".join(self.log))
