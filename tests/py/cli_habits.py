#!/usr/bin/env python3
"""cli_habits.py - the CLI's operability habits, end to end, on the shared
tiny models:

  version   `kettle --version` / `kettle version`: version, git, kernel tier
  serve_log `kettle serve`'s request log: one line per request, text by
            default, valid JSON with --log-format json, nothing with off
  port      a taken port is named (before the model is even loaded)
  chat      banner, /help, /save, /clear, /load, unknown commands
  chat_sig  Ctrl-C stops a reply and the session answers the next line; no
            128-token cut; Ctrl-C twice at the prompt quits
  bench_svg `kettle bench --svg`: well-formed SVG with the expected lines
  defaults  a file whose metadata says 131072 positions: serve and run pick
            4096, a pool too big for the memory (KETTLE_MEM_MB) is cut with
            a banner saying so, a --kv-mb or -c that cannot fit is refused
            naming the flag, a context past the training length warns
  clean     stderr that is not a terminal carries no progress-bar control
            characters, and a terminal gets the bar (quantize, under a pty)

usage: cli_habits.py KETTLE SHARED_DIR [TEST...]   (exit 0: all passed)
"""
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kettle_server import ServeChild, check, run_named  # noqa: E402

KETTLE, SHARED = sys.argv[1], sys.argv[2]
STORIES = os.path.join(SHARED, "models", "stories260K.gguf")
TINY_Q8 = os.path.join(SHARED, "models", "test-tiny-Q8_0.gguf")
TINY_F16 = os.path.join(SHARED, "models", "test-tiny-F16.gguf")
TMP = tempfile.mkdtemp(prefix="kettle_cli_habits_")




def run(args, **kw):
    return subprocess.run([KETTLE] + args, capture_output=True, text=True, timeout=60, **kw)


# ---- version ----

def test_version():
    a, b = run(["--version"]), run(["version"])
    check(a.returncode == 0 and b.returncode == 0, "--version exits 0", a.stderr + b.stderr)
    check(a.stdout == b.stdout, "'kettle version' prints what '--version' does", a.stdout + b.stdout)
    lines = a.stdout.splitlines()
    check(len(lines) == 2 and re.fullmatch(r"kettle \d+\.\d+\.\d+ \(git \S+\)", lines[0]) is not None,
          "first line 'kettle X.Y.Z (git ...)'", a.stdout)
    check(re.fullmatch(r"kernels: (AMX-INT8 \+ AVX-512 VNNI|AVX-512 VNNI|AVX-VNNI|AVX2|scalar) \(CPU: .*\)", lines[1]) is not None,
          "second line names the kernel tier", a.stdout)
    # the switches the dispatch obeys must show in the tier it reports
    env = dict(os.environ, KETTLE_NO_VNNI="1", KETTLE_NO_AVX512="1")
    off = run(["--version"], env=env).stdout.splitlines()[1]
    check(re.match(r"kernels: (AVX2|scalar) ", off) is not None, "KETTLE_NO_VNNI/AVX512 show in the tier", off)
    off = run(["--version"], env=dict(os.environ, KETTLE_NO_AMX="1")).stdout.splitlines()[1]
    check(not off.startswith("kernels: AMX"), "KETTLE_NO_AMX shows in the tier", off)


# ---- serve ----

class Server(ServeChild):
    """kettle serve on a model with the chatml template; req() gives the status."""

    def __init__(self, extra, model=STORIES, env=None):
        super().__init__(KETTLE, ["-m", model, "-t", "1", "--chat-template", "chatml"] + extra, env, start_s=30)
        self.n_banner = len(self.log)

    def req(self, method, path, body=None):
        with self.open(method, path, body, timeout=30) as resp:
            return resp.status

    def stop(self):
        super().stop()
        # the request lines: everything after the banner but the shutdown line
        return [l for l in self.log[self.n_banner:] if not l.startswith("kettle serve:")]


ODD_MODEL = 'a "quoted"\nname'


def some_requests(s):
    return [s.req("GET", "/health"), s.req("GET", "/v1/models"),
            s.req("POST", "/v1/completions", {"model": ODD_MODEL, "prompt": "Once upon", "max_tokens": 4}),
            s.req("POST", "/v1/chat/completions",
                  {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}),
            s.req("POST", "/v1/completions", {"prompt": "x", "max_tokens": -5}),
            s.req("GET", "/nope")]


def test_serve_log():
    s = Server(["--log-format", "json"])
    statuses = some_requests(s)
    lines = s.stop()
    check(statuses == [200, 200, 200, 200, 400, 404], "the requests' statuses", str(statuses))
    check(len(lines) == 6, "one log line per request", "".join(lines))
    recs = [json.loads(l) for l in lines]  # raises if a line is not JSON
    # a line is written when MHD says the request is complete, which may come after the next one's
    want = [("GET", "/health", 200), ("GET", "/v1/models", 200), ("POST", "/v1/completions", 200),
            ("POST", "/v1/chat/completions", 200), ("POST", "/v1/completions", 400), ("GET", "/nope", 404)]
    got = sorted(recs, key=lambda r: want.index((r["method"], r["path"], r["status"]))
                 if (r["method"], r["path"], r["status"]) in want else 99)
    check([(r["method"], r["path"], r["status"]) for r in got] == want, "method, path, status", "".join(lines))
    for r in got:
        check(isinstance(r["total_ms"], float) and r["total_ms"] >= 0, "total_ms", json.dumps(r))
        check(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["time"]) is not None, "time", json.dumps(r))
        gen = r["status"] == 200 and "completions" in r["path"]
        check(("prompt_tokens" in r) == gen, "token fields on generation requests only", json.dumps(r))
    recs = got
    comp, chat = recs[2], recs[3]
    check(comp["model"] == ODD_MODEL and chat["model"] == "m", "the request's model", json.dumps(recs[2:4]))
    for r, n in ((comp, 4), (chat, 3)):
        check(r["prompt_tokens"] > 0 and 0 <= r["cached_tokens"] <= r["prompt_tokens"], "prompt/cached", json.dumps(r))
        check(1 <= r["generated_tokens"] <= n, "generated tokens", json.dumps(r))
        check(0 <= r["ttft_ms"] <= r["total_ms"], "ttft within total", json.dumps(r))

    s = Server([])  # the default: text
    statuses = some_requests(s)
    lines = s.stop()
    check(len(lines) == 6, "text: one line per request", "".join(lines))
    health = [l for l in lines if " GET /health " in l]
    comp = [l for l in lines if " POST /v1/completions 200 " in l]
    check(len(health) == 1 and re.fullmatch(r"\S+Z GET /health 200 total_ms=\d+\.\d\n", health[0]) is not None,
          "text health line", "".join(lines))
    check(len(comp) == 1 and re.fullmatch(r'\S+Z POST /v1/completions 200 model="a \\"quoted\\"\\nname" prompt=\d+ '
                                          r'cached=\d+ generated=[1-4] ttft_ms=\d+\.\d total_ms=\d+\.\d\n', comp[0]),
          "text generation line, model quoted on one line", "".join(lines))

    s = Server(["--log-format", "off"])
    some_requests(s)
    check(s.stop() == [], "--log-format off logs nothing")
    check(run(["serve", "-m", STORIES, "--log-format", "xml"]).returncode == 2, "a bad --log-format is a usage error")


def test_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        # no such model: the port must be refused before the load is tried
        r = run(["serve", "-m", os.path.join(TMP, "missing.gguf"), "--port", str(port)])
    check(r.returncode == 1, "exit status 1", r.stderr)
    msg = (f"port {port} on 127.0.0.1 is already in use (another kettle or program is listening); "
           f"pick another with --port")
    check(msg in r.stderr and "missing.gguf" not in r.stderr, "the port is named, before the model", r.stderr)


# ---- defaults on a long-context file ----

def test_defaults():
    model = os.path.join(TMP, "long.gguf")
    r = run(["gen-model", "--shape", "test-tiny", "--type", "Q8_0", "--ctx-train", "131072",
             "--vocab", os.path.join(SHARED, "vocab", "ggml-vocab-llama-bpe.gguf"), "-o", model])
    check(r.returncode == 0, "gen-model --ctx-train", r.stderr)
    s = Server([], model=model)
    banner = "".join(s.log)
    check(s.req("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2}) == 200, "it answers", banner)
    s.stop()
    check(", ctx 32768, parallel 16," in banner and "(64 MiB, 65536 positions)" in banner,
          "serve: ctx 32768 of the 131072 trained, a pool of 16 x 4096 positions", banner)
    check("beyond" not in banner and "would take" not in banner, "no warning for the defaults", banner)
    # the machine 'has' 200 MiB: 64 x 4096 positions (256 MiB) cannot be; the pool is cut to fit
    env = dict(os.environ, KETTLE_MEM_MB="200")
    s = Server(["-c", "8192", "--parallel", "64", "--batch-tokens", "256"], model=model, env=env)
    banner = "".join(s.log)
    check(s.req("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2}) == 200, "the cut pool answers", banner)
    s.stop()
    m = re.search(r"KV cache (\d+) blocks of 16 positions \((\d+) MiB", banner)
    check(m and int(m.group(2)) <= 200, "the pool fits the 200 MiB", banner)
    check("the default KV pool (64 x 4096 positions, at least one context) would take 256 MiB, more than the "
          "memory available now" in banner
          and "--kv-mb, --ctx or --parallel" in banner, "the banner says what was cut and which flags set it", banner)
    r = run(["serve", "-m", model, "--port", "0", "--kv-mb", "500"], env=env)
    check(r.returncode != 0 and "--kv-mb 500 is more than the 200 MiB" in r.stderr and "lower --kv-mb" in r.stderr,
          "serve: a --kv-mb above the memory is refused naming the flag", r.stderr)
    r = run(["run", "-m", model, "-p", "Hi", "-n", "2", "-c", "131072"], env=dict(os.environ, KETTLE_MEM_MB="100"))
    check(r.returncode != 0 and "lower -c" in r.stderr, "run: a context whose KV cannot fit is refused naming -c",
          r.stderr)
    r = run(["run", "-m", model, "-p", "Hi", "-n", "2", "-c", "262144", "-t", "1"])
    check(r.returncode == 0 and "-c 262144 is beyond the 131072 positions the model was trained on" in r.stderr,
          "run: a context past the training length warns", r.stderr)
    r = run(["run", "-m", model, "-p", "Hi", "-n", "2", "-t", "1"])
    check(r.returncode == 0 and "beyond" not in r.stderr, "run: no warning for the default context", r.stderr)


# ---- chat ----

def test_chat():
    save = os.path.join(TMP, "conv.json")
    script = f"Hello\n/help\n/save {save}\n/clear\nAgain\n/load {save}\n/load {TMP}/nope.json\n/bogus\nMore\n/exit\n"
    r = run(["chat", "-m", STORIES, "--chat-template", "chatml", "-n", "6", "--seed", "1", "-t", "1"], input=script)
    check(r.returncode == 0, "chat exits 0", r.stderr)
    e = r.stderr
    check("kettle chat: stories260K.gguf, context 2048 positions, template chatml\n" in e, "banner", e)
    check("/help lists commands" in e and "/save FILE" in e and "/load FILE" in e and "/clear" in e, "help", e)
    saved = json.load(open(save))
    check([m["role"] for m in saved] == ["user", "assistant"] and saved[0]["content"] == "Hello", "/save", str(saved))
    check(f"[saved 2 messages to {save}]" in e and "[new conversation]" in e and f"[loaded 2 messages from {save}]" in e,
          "save/clear/load messages", e)
    check("/load: cannot read" in e and "unknown command /bogus" in e, "bad /load and unknown command reported", e)
    stats = re.findall(r"\[prompt (\d+) tokens: (\d+) reused", e)
    check(len(stats) == 3, "three replies", e)
    # after /clear the conversation is one message: shorter than the first two turns, nothing reused
    check(stats[1][1] == "0" and int(stats[1][0]) == int(stats[0][0]), "/clear starts over with an empty cache", e)
    # after /load the prompt holds the saved two messages and the new one
    check(int(stats[2][0]) > int(stats[0][0]), "/load brought the saved conversation back", e)


class Chat:
    """kettle chat with pipes read by threads, so the test can wait for text."""

    def __init__(self, args):
        self.p = subprocess.Popen([KETTLE, "chat"] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        self.out, self.err = bytearray(), bytearray()
        for f, buf in ((self.p.stdout, self.out), (self.p.stderr, self.err)):
            threading.Thread(target=self._read, args=(f, buf), daemon=True).start()

    @staticmethod
    def _read(f, buf):
        while True:
            d = f.read1(4096)
            if not d:
                return
            buf.extend(d)

    def send(self, line):
        self.p.stdin.write(line.encode() + b"\n")
        self.p.stdin.flush()

    def wait_for(self, cond, what, timeout=30):
        t = time.time()
        while not cond():
            check(time.time() - t < timeout and self.p.poll() is None, "waiting for " + what, self.err.decode())
            time.sleep(0.01)


def test_chat_sigint():
    # random weights: an end-of-turn token is a 1 in 32000 draw, so a reply runs to the context's end
    c = Chat(["-m", TINY_Q8, "--chat-template", "chatml", "-c", "400", "-t", "1", "--seed", "3"])
    c.wait_for(lambda: b"Ctrl-D or /exit quits" in c.err, "the banner")
    c.send("Hello")
    c.wait_for(lambda: len(c.out) >= 20, "the first reply to start")
    c.p.send_signal(signal.SIGINT)
    c.wait_for(lambda: b"[stopped]" in c.err and b"[prompt" in c.err, "the reply to stop")
    first = re.findall(rb"reply (\d+) tokens", bytes(c.err))
    check(len(first) == 1 and int(first[0]) < 300, "Ctrl-C ended the reply early", c.err.decode())
    c.send("Again")  # the session goes on
    c.wait_for(lambda: c.err.count(b"[prompt") == 2, "the second reply")
    n = re.findall(rb"\[prompt (\d+) tokens: (\d+) reused.*reply (\d+) tokens", bytes(c.err))
    check(int(n[1][1]) > 0, "the second turn reused the first's KV", c.err.decode())
    check(int(n[1][2]) > 128 and b"[the context is full" in c.err, "no 128-token cut: to the context's end",
          c.err.decode())
    time.sleep(0.2)  # into the read of the next line
    c.p.send_signal(signal.SIGINT)
    c.wait_for(lambda: b"[Ctrl-C again" in c.err, "the hint after one Ctrl-C at the prompt")
    check(c.p.poll() is None, "one Ctrl-C at the prompt does not quit", c.err.decode())
    c.p.send_signal(signal.SIGINT)
    check(c.p.wait(10) == 0, "a second Ctrl-C at the prompt quits cleanly", c.err.decode())


# ---- bench --svg ----

def test_bench_svg():
    svg = os.path.join(TMP, "bench.svg")
    r = run(["bench", "-m", STORIES, "-p", "16", "-n", "4", "-d", "0,32", "-r", "1", "-t", "1", "--svg", svg])
    check(r.returncode == 0, "bench exits 0", r.stderr)
    root = ET.parse(svg).getroot()  # raises if not well-formed
    ns = "{http://www.w3.org/2000/svg}"
    check(root.tag == ns + "svg", "an <svg> document", root.tag)
    texts = [t.text for t in root.iter(ns + "text")]
    for want in ("Prefill (pp)", "Decode (tg)", "stories260K.gguf pp16 t1", "stories260K.gguf tg4 t1",
                 "context depth (tokens)"):
        check(want in texts, f"'{want}' in the plot", str(texts))
    lines = [p.get("points").split() for p in root.iter(ns + "polyline")]
    check(len(lines) == 2 and all(len(p) == 2 for p in lines), "two lines of two depths", str(lines))
    check(run(["bench", "-m", STORIES, "-p", "1,2,3", "-t", "1,2,3", "--svg", svg]).returncode == 2,
          "more than 8 lines a panel is refused before running")


# ---- progress bars ----

CONTROL = re.compile(r"[\r\x1b]")


def on_terminal(args):
    """(exit status, what args wrote to stderr) with stderr a pseudo-terminal."""
    master, slave = pty.openpty()
    p = subprocess.Popen([KETTLE] + args, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    got = b""
    while True:
        r, _, _ = select.select([master], [], [], 30)
        try:
            d = os.read(master, 4096) if r else b""
        except OSError:  # the child closed the terminal
            d = b""
        if not d:
            break
        got += d
    os.close(master)
    return p.wait(30), got


def bar(stage):
    return re.compile(rb"\r\x1b\[K\[#*\.*\] +\d+%  " + stage)


def test_clean_and_bar():
    out = os.path.join(TMP, "q.gguf")
    # a load bar is for files of 64 MiB or more: a random-weight SmolLM-135M in Q4_0 is 71 MB
    big = os.path.join(TMP, "big.gguf")
    subprocess.run([KETTLE, "gen-model", "--shape", "smollm-135m", "--type", "Q4_0", "--vocab", TINY_Q8, "-o", big],
                   check=True, capture_output=True, timeout=60)
    for args in (["run", "-m", big, "-p", "Once", "-n", "2", "-t", "1"], ["quantize", TINY_F16, out, "Q8_0"],
                 ["bench", "-m", STORIES, "-p", "8", "-n", "2", "-r", "1", "-t", "1"]):
        r = run(args)
        check(r.returncode == 0, " ".join(args[:1]) + " exits 0", r.stderr)
        check(not CONTROL.search(r.stderr), args[0] + ": no progress-bar control characters off a terminal",
              repr(r.stderr))
    rc, got = on_terminal(["quantize", TINY_F16, out, "Q8_0"])
    check(rc == 0 and bar(rb"\S").search(got), "quantize: a progress bar on a terminal", repr(got[:400]))
    rc, got = on_terminal(["run", "-m", big, "-p", "Once", "-n", "2", "-t", "1"])
    check(rc == 0 and bar(b"reading").search(got) and bar(b"repacking").search(got),
          "run: reading and repacking bars while a big model loads", repr(got[:400]))
    rc, got = on_terminal(["run", "-m", STORIES, "-p", "Once", "-n", "2", "-t", "1"])
    check(rc == 0 and not bar(b"reading").search(got), "no load bar for a small file", repr(got[:400]))
    os.unlink(big)


TESTS = {"version": test_version, "serve_log": test_serve_log, "port": test_port, "chat": test_chat,
         "chat_sig": test_chat_sigint, "bench_svg": test_bench_svg, "defaults": test_defaults,
         "clean": test_clean_and_bar}


def main():
    return run_named(TESTS, sys.argv[3:], TMP)


if __name__ == "__main__":
    sys.exit(main())
