#!/usr/bin/env python3
"""pull_hub.py - `kettle pull`, `kettle ls`, `kettle rm` and `-m OWNER/REPO:QUANT`
against a local HTTP server that answers the way the Hugging Face Hub does.

The server (stdlib only, on a free loopback port) has the tree API
(/api/models/OWNER/REPO/tree/main), the model API's siblings, and
/OWNER/REPO/resolve/main/FILE answering 302 to /cdn/..., which serves the
bytes with Range support; the 302 carries X-Linked-Etag (the sha256),
X-Linked-Size and X-Repo-Commit as the Hub's does. Repositories misbehave on
purpose: one drops the connection midway, one publishes a wrong sha256, one
ignores Range, one stalls, one is gated behind a token, one is split.

usage: pull_hub.py KETTLE_BIN SHARED_DIR TMP_DIR
"""
import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

KETTLE, SHARED, TMP = sys.argv[1], sys.argv[2], sys.argv[3]
MODELS = os.path.join(SHARED, "models")
TOKEN = "hf_secret_token_never_printed"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def read(path):
    with open(path, "rb") as f:
        return f.read()


TINY_Q8 = read(os.path.join(MODELS, "test-tiny-Q8_0.gguf"))
TINY_Q4 = read(os.path.join(MODELS, "test-tiny-Q4_0.gguf"))
STORIES = read(os.path.join(MODELS, "stories260K.gguf"))


def sha(data):
    return hashlib.sha256(data).hexdigest()


class File:
    """A file of a fake repository and how the server misbehaves with it."""

    def __init__(self, path, data, advertised_sha=None, drop_after=None, drops=0,
                 ignore_range=False, stall=False, lfs=True):
        self.path, self.data = path, data
        self.sha = advertised_sha or sha(data)
        self.drop_after, self.drops = drop_after, drops  # drop the first `drops` transfers after `drop_after` bytes
        self.ignore_range, self.stall, self.lfs = ignore_range, stall, lfs


REPOS = {
    "test/tiny-GGUF": [File("tiny-Q8_0.gguf", TINY_Q8), File("tiny-Q4_0.gguf", TINY_Q4),
                       File("tiny-Q4_K_M.gguf", STORIES), File("README.md", b"# tiny\n", lfs=False)],
    "test/one-GGUF": [File("sub/only-Q8_0.gguf", STORIES)],
    "test/two-GGUF": [File("big-Q8_0.gguf", TINY_Q8), File("small-Q4_0.gguf", STORIES)],
    "test/flaky-GGUF": [File("flaky-Q8_0.gguf", TINY_Q8, drop_after=3 << 20, drops=1)],
    "test/bad-GGUF": [File("bad-Q8_0.gguf", STORIES, advertised_sha="ab" * 32)],
    "test/norange-GGUF": [File("norange-Q4_0.gguf", TINY_Q4, drop_after=2 << 20, drops=1, ignore_range=True)],
    "test/stall-GGUF": [File("stall-Q8_0.gguf", STORIES, stall=True)],
    "test/gated-GGUF": [File("gated-Q8_0.gguf", STORIES)],
    "test/split-GGUF": [File("big-Q4_0-00001-of-00002.gguf", STORIES[:1000]),
                        File("big-Q4_0-00002-of-00002.gguf", STORIES[1000:])],
    "test/siblings-GGUF": [File("sib-Q8_0.gguf", STORIES)],  # no tree API: the model API's siblings
}
PLAIN = {"/plain/files/story.gguf": STORIES}


class Hub:
    """What the server saw, for the tests' assertions."""
    lock = threading.Lock()
    requests = []  # (path, Range header or None, Authorization header or None)
    transfers = {}  # cdn path -> transfers started

    @classmethod
    def seen(cls):
        with cls.lock:
            return list(cls.requests)

    @classmethod
    def clear(cls):
        with cls.lock:
            cls.requests.clear()


def find_file(repo, path):
    for f in REPOS.get(repo, []):
        if f.path == path:
            return f
    return None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def authorized(self, repo):
        return repo != "test/gated-GGUF" or self.headers.get("Authorization") == "Bearer " + TOKEN

    def do_GET(self):
        with Hub.lock:
            Hub.requests.append((self.path, self.headers.get("Range"), self.headers.get("Authorization")))
        path = self.path.split("?")[0]
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self.api(parts)
        if len(parts) >= 5 and parts[2:4] == ["resolve", "main"]:
            return self.resolve("/".join(parts[:2]), "/".join(parts[4:]))
        if parts[0] == "cdn":
            repo, name = "/".join(parts[1:3]), "/".join(parts[3:])
            f = find_file(repo, name)
            return self.serve(f, path) if f else self.send_json(404, {"error": "no such file"})
        if path in PLAIN:
            return self.serve(File(path, PLAIN[path]), path, plain=True)
        self.send_json(404, {"error": "not found"})

    def api(self, parts):
        repo = "/".join(parts[2:4])
        if repo not in REPOS:
            return self.send_json(404, {"error": "Repository not found"})
        if not self.authorized(repo):
            return self.send_json(401, {"error": "Access to this repo is restricted"})
        files = REPOS[repo]
        if parts[4:6] == ["tree", "main"]:
            if repo == "test/siblings-GGUF":
                return self.send_json(404, {"error": "no tree API here"})
            tree = []
            for f in files:
                e = {"type": "file", "path": f.path, "size": len(f.data), "oid": "0" * 40}
                if f.lfs:
                    e["lfs"] = {"oid": f.sha, "size": len(f.data), "pointerSize": 134}
                tree.append(e)
            return self.send_json(200, tree)
        if len(parts) == 4:
            return self.send_json(200, {"id": repo, "siblings": [{"rfilename": f.path} for f in files]})
        self.send_json(404, {"error": "not found"})

    def resolve(self, repo, name):
        f = find_file(repo, name)
        if not f:
            return self.send_json(404, {"error": "Entry not found"})
        if not self.authorized(repo):
            return self.send_json(401, {"error": "gated"})
        self.send_response(302)
        self.send_header("Location", "/cdn/%s/%s" % (repo, name))
        self.send_header("X-Linked-Etag", '"%s"' % f.sha)
        self.send_header("X-Linked-Size", str(len(f.data)))
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", '"%s"' % ("1" * 40))  # the git blob id, not a sha256
        self.send_header("Content-Length", "0")
        self.end_headers()

    def byte_range(self, size, ignore):
        r = self.headers.get("Range")
        if not r or ignore or not r.startswith("bytes=") or not r.endswith("-"):
            return 0
        return int(r[6:-1])

    def serve(self, f, key, plain=False):
        with Hub.lock:
            n = Hub.transfers[key] = Hub.transfers.get(key, 0) + 1
        start, data = self.byte_range(len(f.data), f.ignore_range), f.data
        if start >= len(data) and start > 0:
            self.send_response(416)
            self.send_header("Content-Range", "bytes */%d" % len(data))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        self.send_header("Accept-Ranges", "none" if f.ignore_range else "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if not plain:
            self.send_header("ETag", '"cdn-%d"' % len(data))
        self.end_headers()
        body = memoryview(data)[start:]
        if f.stall:
            self.wfile.write(body[:1000])
            self.wfile.flush()
            time.sleep(8)
            return
        cut = f.drop_after if f.drop_after is not None and n <= f.drops else None
        if cut is not None:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        for i in range(0, len(body), 1 << 16):
            self.wfile.write(body[i:i + (1 << 16)])


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that hangs up (as kettle does on a bad checksum) is expected here


SERVER = Server(("127.0.0.1", 0), Handler)
ENDPOINT = "http://127.0.0.1:%d" % SERVER.server_address[1]


class PullTest(unittest.TestCase):
    def setUp(self):
        self.store = tempfile.mkdtemp(prefix="pull-", dir=TMP)
        Hub.clear()

    def tearDown(self):
        shutil.rmtree(self.store, ignore_errors=True)

    def kettle(self, *args, env=None, timeout=60):
        e = dict(os.environ, KETTLE_MODELS=self.store, KETTLE_HF_ENDPOINT=ENDPOINT)
        e.pop("HF_TOKEN", None)
        e.update(env or {})
        p = subprocess.run([KETTLE] + list(args), capture_output=True, text=True, env=e, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def stored(self, repo, name):
        return os.path.join(self.store, repo, name)

    def pull_ok(self, ref, repo, name, data):
        rc, out, err = self.kettle("pull", ref)
        self.assertEqual(rc, 0, err)
        path = self.stored(repo, name)
        self.assertEqual(out.strip(), path)
        self.assertEqual(read(path), data, "the pulled file differs from the server's")
        self.assertFalse(os.path.exists(path + ".part"))
        return err

    def test_pull_quant_then_use_it(self):
        err = self.pull_ok("test/tiny-GGUF:q8_0", "test/tiny-GGUF", "tiny-Q8_0.gguf", TINY_Q8)
        self.assertIn("sha256 verified", err)
        with open(self.stored("test/tiny-GGUF", "tiny-Q8_0.gguf") + ".meta.json") as f:
            meta = json.load(f)
        self.assertEqual(meta["sha256"], sha(TINY_Q8))
        self.assertEqual(meta["size"], len(TINY_Q8))
        self.assertEqual(meta["commit"], COMMIT)
        self.assertEqual(meta["repo"], "test/tiny-GGUF")
        self.assertTrue(any(p.startswith("/test/tiny-GGUF/resolve/main/tiny-Q8_0.gguf") for p, _, _ in Hub.seen()))
        self.assertTrue(any(p.startswith("/cdn/") for p, _, _ in Hub.seen()), "the 302 was not followed")
        rc, out, err = self.kettle("ls")
        self.assertEqual(rc, 0, err)
        self.assertIn("test/tiny-GGUF:Q8_0", out)
        self.assertIn(self.stored("test/tiny-GGUF", "tiny-Q8_0.gguf"), out)
        rc, out, err = self.kettle("info", "test/tiny-GGUF:Q8_0")
        self.assertEqual(rc, 0, err)
        self.assertIn("tiny-Q8_0.gguf", out)
        # a second pull of a pulled file downloads nothing
        Hub.clear()
        rc, out, err = self.kettle("pull", "test/tiny-GGUF:Q8_0")
        self.assertEqual(rc, 0, err)
        self.assertIn("already pulled", err)
        self.assertFalse(any(p.startswith("/cdn/") for p, _, _ in Hub.seen()))

    def test_default_is_q4_k_m_and_m_resolves(self):
        err = self.pull_ok("test/tiny-GGUF", "test/tiny-GGUF", "tiny-Q4_K_M.gguf", STORIES)
        self.assertIn("taking tiny-Q4_K_M.gguf", err)
        rc, out, err = self.kettle("tokenize", "-m", "test/tiny-GGUF:Q4_K_M", "--ids", "Once upon a time")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "[1, 403, 407, 261, 378]\n")
        rc, out, err = self.kettle("tokenize", "-m", "test/tiny-GGUF", "--ids", "Once upon a time")
        self.assertEqual(rc, 0, err)  # one file pulled: the name alone finds it
        rc, out, err = self.kettle("run", "-m", "test/tiny-GGUF:Q4_K_M", "-p", "Once", "-n", "4", "--temp", "0")
        self.assertEqual(rc, 0, err)

    def test_only_file_and_smallest(self):
        err = self.pull_ok("test/one-GGUF", "test/one-GGUF", "only-Q8_0.gguf", STORIES)
        self.assertIn("the only GGUF file", err)
        err = self.pull_ok("test/two-GGUF", "test/two-GGUF", "small-Q4_0.gguf", STORIES)
        self.assertIn("the smallest", err)

    def test_siblings_api_fallback(self):
        err = self.pull_ok("test/siblings-GGUF:Q8_0", "test/siblings-GGUF", "sib-Q8_0.gguf", STORIES)
        self.assertIn("sha256 verified", err)  # from X-Linked-Etag, as the listing has none

    def test_ambiguous_and_no_match(self):
        rc, out, err = self.kettle("pull", "test/tiny-GGUF:Q4")
        self.assertEqual(rc, 1)
        self.assertIn("matches 2 GGUF files", err)
        self.assertIn("tiny-Q4_0.gguf", err)
        self.assertIn("tiny-Q4_K_M.gguf", err)
        rc, out, err = self.kettle("pull", "test/tiny-GGUF:Q5_K_M")
        self.assertEqual(rc, 1)
        self.assertIn("no GGUF file of test/tiny-GGUF matches 'Q5_K_M'", err)
        self.assertIn("tiny-Q8_0.gguf", err)
        self.assertNotIn("README", err)
        rc, out, err = self.kettle("pull", "test/nothere-GGUF")
        self.assertEqual(rc, 1)
        self.assertIn("no repository test/nothere-GGUF", err)
        rc, out, err = self.kettle("pull", "not a name")
        self.assertEqual(rc, 1)
        self.assertIn("OWNER/REPO[:QUANT]", err)
        rc, out, err = self.kettle("pull", "../x/y")
        self.assertEqual(rc, 1)
        self.assertEqual(os.listdir(self.store), [])

    def test_interrupted_then_resumed(self):
        rc, out, err = self.kettle("pull", "test/flaky-GGUF:Q8_0")
        self.assertEqual(rc, 1)
        self.assertIn("resume", err)
        path = self.stored("test/flaky-GGUF", "flaky-Q8_0.gguf")
        self.assertFalse(os.path.exists(path))
        have = os.path.getsize(path + ".part")
        self.assertEqual(have, 3 << 20)
        rc, out, err = self.kettle("ls")
        self.assertIn("partial", out)
        rc, out, err = self.kettle("info", "test/flaky-GGUF:Q8_0")
        self.assertEqual(rc, 1)
        self.assertIn("not finished downloading", err)
        Hub.clear()
        self.pull_ok("test/flaky-GGUF:Q8_0", "test/flaky-GGUF", "flaky-Q8_0.gguf", TINY_Q8)
        ranges = [r for p, r, _ in Hub.seen() if p.startswith("/cdn/")]
        self.assertEqual(ranges, ["bytes=%d-" % have])

    def test_whole_part_is_checked_not_fetched(self):
        path = self.stored("test/tiny-GGUF", "tiny-Q4_0.gguf")
        os.makedirs(os.path.dirname(path))
        with open(path + ".part", "wb") as f:
            f.write(TINY_Q4)
        err = self.pull_ok("test/tiny-GGUF:Q4_0", "test/tiny-GGUF", "tiny-Q4_0.gguf", TINY_Q4)
        self.assertIn("sha256 verified", err)
        self.assertFalse(any(p.startswith("/cdn/") for p, _, _ in Hub.seen()))
        # a URL's whole part: the server answers the range with 416 and the file's size
        host = "127.0.0.1_%d" % SERVER.server_address[1]
        path = self.stored("_url/" + host, "story.gguf")
        os.makedirs(os.path.dirname(path))
        with open(path + ".part", "wb") as f:
            f.write(STORIES)
        rc, out, err = self.kettle("pull", ENDPOINT + "/plain/files/story.gguf")
        self.assertEqual(rc, 0, err)
        self.assertIn("only its size was checked", err)
        self.assertEqual(read(path), STORIES)
        self.assertIn(("/plain/files/story.gguf", "bytes=%d-" % len(STORIES)), [(p, r) for p, r, _ in Hub.seen()])

    def test_server_ignoring_range_restarts(self):
        rc, out, err = self.kettle("pull", "test/norange-GGUF")
        self.assertEqual(rc, 1)
        path = self.stored("test/norange-GGUF", "norange-Q4_0.gguf")
        self.assertEqual(os.path.getsize(path + ".part"), 2 << 20)
        Hub.clear()
        err = self.pull_ok("test/norange-GGUF", "test/norange-GGUF", "norange-Q4_0.gguf", TINY_Q4)
        self.assertIn("ignored the resume request", err)
        self.assertIn("sha256 verified", err)
        self.assertEqual([r for p, r, _ in Hub.seen() if p.startswith("/cdn/")], ["bytes=%d-" % (2 << 20)])

    def test_wrong_checksum(self):
        rc, out, err = self.kettle("pull", "test/bad-GGUF:Q8_0")
        self.assertEqual(rc, 1)
        self.assertIn("checksum mismatch", err)
        self.assertIn("again to retry", err)
        path = self.stored("test/bad-GGUF", "bad-Q8_0.gguf")
        self.assertFalse(os.path.exists(path))
        self.assertFalse(os.path.exists(path + ".part"))

    def test_stalled_server_times_out(self):
        t0 = time.time()
        rc, out, err = self.kettle("pull", "test/stall-GGUF", env={"KETTLE_PULL_STALL_S": "1"}, timeout=30)
        self.assertEqual(rc, 1)
        self.assertLess(time.time() - t0, 7)
        self.assertIn("resume", err)
        self.assertEqual(os.path.getsize(self.stored("test/stall-GGUF", "stall-Q8_0.gguf") + ".part"), 1000)

    def test_ctrl_c_keeps_the_part(self):
        e = dict(os.environ, KETTLE_MODELS=self.store, KETTLE_HF_ENDPOINT=ENDPOINT)
        p = subprocess.Popen([KETTLE, "pull", "test/stall-GGUF"], env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        part = self.stored("test/stall-GGUF", "stall-Q8_0.gguf") + ".part"
        deadline = time.time() + 10
        while time.time() < deadline and not (os.path.exists(part) and os.path.getsize(part) == 1000):
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=10)
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("interrupted", err)
        self.assertIn("resume", err)
        self.assertEqual(os.path.getsize(part), 1000)

    def test_gated_needs_token(self):
        rc, out, err = self.kettle("pull", "test/gated-GGUF")
        self.assertEqual(rc, 1)
        self.assertIn("HF_TOKEN", err)
        rc, out, err = self.kettle("pull", "test/gated-GGUF", env={"HF_TOKEN": TOKEN})
        self.assertEqual(rc, 0, err)
        self.assertNotIn(TOKEN, out + err)
        auth = [a for p, _, a in Hub.seen() if p.startswith("/api/") or "/resolve/" in p]
        self.assertTrue(auth and all(a == "Bearer " + TOKEN for a in auth[-2:]))

    def test_split_refused(self):
        rc, out, err = self.kettle("pull", "test/split-GGUF")
        self.assertEqual(rc, 1)
        self.assertIn("split", err)
        self.assertEqual(os.listdir(self.store), [])

    def test_plain_url(self):
        rc, out, err = self.kettle("pull", ENDPOINT + "/plain/files/story.gguf")
        self.assertEqual(rc, 0, err)
        self.assertIn("no checksum published: only its size was checked", err)
        path = out.strip()
        self.assertEqual(read(path), STORIES)
        self.assertTrue(path.startswith(os.path.join(self.store, "_url") + "/"))
        rc, out, err = self.kettle("pull", ENDPOINT + "/plain/files/story.txt")
        self.assertEqual(rc, 1)
        self.assertIn("does not name a .gguf file", err)

    def test_rm(self):
        self.pull_ok("test/tiny-GGUF:Q8_0", "test/tiny-GGUF", "tiny-Q8_0.gguf", TINY_Q8)
        self.pull_ok("test/tiny-GGUF:Q4_0", "test/tiny-GGUF", "tiny-Q4_0.gguf", TINY_Q4)
        rc, out, err = self.kettle("info", "test/tiny-GGUF")  # two files, neither Q4_K_M: which?
        self.assertEqual(rc, 1)
        self.assertIn("has 2 GGUF files", err)
        self.assertIn("tiny-Q4_0.gguf", err)
        rc, out, err = self.kettle("rm", "test/tiny-GGUF")
        self.assertEqual(rc, 1)
        self.assertIn("has 2 GGUF files", err)
        self.assertTrue(os.path.exists(self.stored("test/tiny-GGUF", "tiny-Q8_0.gguf")))
        rc, out, err = self.kettle("rm", "test/tiny-GGUF:Q8_0")
        self.assertEqual(rc, 0, err)
        self.assertFalse(os.path.exists(self.stored("test/tiny-GGUF", "tiny-Q8_0.gguf")))
        self.assertFalse(os.path.exists(self.stored("test/tiny-GGUF", "tiny-Q8_0.gguf.meta.json")))
        self.assertTrue(os.path.exists(self.stored("test/tiny-GGUF", "tiny-Q4_0.gguf")))
        rc, out, err = self.kettle("rm", "test/tiny-GGUF:Q8_0")
        self.assertEqual(rc, 1)
        rc, out, err = self.kettle("rm", "test/tiny-GGUF")
        self.assertEqual(rc, 0, err)
        self.assertEqual(os.listdir(self.store), [])  # the empty folders went too
        rc, out, err = self.kettle("rm", "nobody/nothing")
        self.assertEqual(rc, 1)
        self.assertIn("not in the model store", err)
        rc, out, err = self.kettle("info", "nobody/nothing:Q4_K_M")
        self.assertEqual(rc, 1)
        self.assertIn("kettle pull nobody/nothing:Q4_K_M", err)


if __name__ == "__main__":
    threading.Thread(target=SERVER.serve_forever, daemon=True).start()
    os.makedirs(TMP, exist_ok=True)
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    SERVER.shutdown()
    sys.exit(0 if result.wasSuccessful() else 1)
