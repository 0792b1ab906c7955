#!/usr/bin/env python3
"""serve_classes.py - several models in one `kettle serve` (inference
classes), end to end:

  routing   the request's "model" picks the class (an alias too; none: the
            first); an unknown name is a 404 listing every served name
  params    each class's own context and parallel sequences, default
            request fields (a router at temperature 0), embeddings
  metrics   /metrics carries each class's figures under a model label
  config    --config FILE.json declares the same classes, and the default
            fields only a file can give (grammar, logit_bias)
  memory    classes share the memory: a class that cannot fit what the
            ones before it left is refused naming it and the flag; a
            default pool is cut to fit, and said so
  lazy      a class loads on its first request (which waits) and unloads
            after keep-alive idle seconds, then loads again; a stream on
            another class runs through the load untouched; a file that
            cannot load is a 503 saying why; a load that does not fit the
            memory unloads an idle class first, or is refused
  fallback  a class's own fallback upstream (fallback=, fallback-on=): its
            prompts too long for it go there, marked; another class's are
            refused as before; a trigger it does not list is not forwarded
  usage     bad class declarations are usage errors naming the key

usage: serve_classes.py KETTLE SHARED_DIR   (exit 0: all passed)
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kettle_server import ServeChild, check, run_named  # noqa: E402

KETTLE, SHARED = sys.argv[1], sys.argv[2]
STORIES = os.path.join(SHARED, "models", "stories260K.gguf")
TMP = tempfile.mkdtemp(prefix="kettle_classes_")
QWEN = os.path.join(TMP, "qwen.gguf")
QWEN_TMPL = os.path.join(SHARED, "templates", "Qwen-Qwen2.5-7B-Instruct.jinja")




class Server(ServeChild):
    """kettle serve ARGS; req() gives (status, JSON or /metrics text)."""

    def __init__(self, args, env=None):
        super().__init__(KETTLE, ["-t", "1"] + args, env)

    def req(self, method, path, body=None):
        with self.open(method, path, body) as resp:
            text = resp.read().decode()
            return resp.status, (json.loads(text) if path != "/metrics" or resp.status != 200 else text)

    def chat(self, model, content="Hi", **kw):
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": kw.pop("max_tokens", 8), **kw}
        if model is not None:
            body["model"] = model
        return self.req("POST", "/v1/chat/completions", body)


def run(args, env=None):
    return subprocess.run([KETTLE] + args, capture_output=True, text=True, timeout=60, env=env)


ROUTER = f"router={STORIES},temperature=0,alias=fast,chat-template=chatml,ctx=512,embeddings,spec=ngram,draft-max=4"
BIG = f"big={QWEN},ctx=256,parallel=2,chat-template={QWEN_TMPL}"


def test_routing_and_params():
    s = Server(["--model", ROUTER, "--model", BIG])
    banner = "".join(s.log)
    try:
        st, models = s.req("GET", "/v1/models")
        check([m["id"] for m in models["data"]] == ["router", "fast", "big"], "/v1/models lists classes and aliases",
              json.dumps(models))
        check(", ctx 512, parallel 16," in banner and ", ctx 256, parallel 2," in banner, "each class's ctx/parallel",
              banner)
        check(banner.count("speculative decoding: prompt lookup") == 2 and "up to 4 tokens" in banner
              and "up to 8 tokens" in banner,
              "spec= and draft-max=: the router's 4 tokens, big's default (prompt lookup, 8)", banner)
        # the router's default temperature 0: two unseeded requests agree, and equal an explicit temperature 0
        a, b = s.chat("router")[1], s.chat(None)[1]
        c = s.chat("fast", temperature=0)[1]
        texts = [x["choices"][0]["message"]["content"] for x in (a, b, c)]
        check(texts[0] == texts[1] == texts[2], "router: default temperature 0 (and no model = the first class)",
              json.dumps(texts))
        check(a["model"] == "router" and b["model"] == "router" and c["model"] == "fast", "the name asked for", "")
        # a request's own temperature wins over the class default
        hot = {s.chat("router", temperature=1.5, seed=k)[1]["choices"][0]["message"]["content"] for k in range(4)}
        check(len(hot) > 1, "a request's temperature overrides the class's", json.dumps(sorted(hot)))
        # big's context is 256: a long prompt is refused there, served by the router (512)
        long = " ".join(["Once upon a time"] * 80)
        st_big, e = s.chat("big", long)
        check(st_big == 400 and e["error"]["code"] == "context_length_exceeded" and "256" in e["error"]["message"],
              "big: its own context", json.dumps(e))
        check(s.chat("router", long)[0] == 200, "router: a longer context", "")
        st, e = s.chat("gpt-4o")
        check(st == 404 and e["error"]["code"] == "model_not_found" and "'router', 'fast', 'big'" in e["error"]["message"],
              "an unknown model is a 404 listing the served names", json.dumps(e))
        st, r = s.req("POST", "/v1/embeddings", {"model": "router", "input": "Once"})
        check(st == 200 and len(r["data"][0]["embedding"]) == 64, "embeddings=: the router embeds", json.dumps(r)[:200])
        st, e = s.req("POST", "/v1/embeddings", {"model": "big", "input": "Once"})
        check(st == 400 and "--embeddings" in e["error"]["message"], "big does not embed", json.dumps(e))
        st, r = s.req("POST", "/v1/responses", {"model": "big", "input": "Hi", "max_output_tokens": 4})
        check(st == 200 and r["model"] == "big", "the Responses API routes too", json.dumps(r)[:200])
        st, t = s.req("POST", "/tokenize", {"model": "big", "content": "Hello"})
        st2, t2 = s.req("POST", "/tokenize", {"model": "router", "content": "Hello"})
        check(st == 200 and st2 == 200 and t["tokens"] != t2["tokens"], "/tokenize uses the class's vocabulary",
              json.dumps([t, t2]))
        # metrics: each class under its label, the tokens on the class that made them
        _, m = s.req("GET", "/metrics")
        gen = dict(re.findall(r'kettle_generated_tokens_total\{model="(\w+)"\} (\d+)', m))
        check(set(gen) == {"router", "big"} and int(gen["router"]) > 0 and int(gen["big"]) > 0,
              "per-class generated tokens", m[:400])
        check(re.search(r'kettle_queue_depth\{model="big"\} 0', m) and "# TYPE kettle_queue_depth gauge" in m,
              "per-class gauges", "")
        check(re.search(r'kettle_time_to_first_token_seconds_count\{model="router"\} [1-9]', m), "per-class TTFT", "")
        spec = dict(re.findall(r'kettle_spec_proposed_tokens_total\{model="(\w+)"\} (\d+)', m))
        check(int(spec.get("router", 0)) > 0 and spec.get("big") is not None, "the router's proposals, big's series",
              json.dumps(spec))
    finally:
        s.stop()


def test_config():
    cfg = os.path.join(TMP, "classes.json")
    with open(cfg, "w") as f:
        json.dump({"models": [
            {"name": "router", "path": STORIES, "aliases": ["fast"], "temperature": 0, "chat-template": "chatml",
             "ctx": 512},
            {"name": "big", "path": QWEN, "ctx": 256, "parallel": 2, "chat-template": QWEN_TMPL},
            # the default fields only a file can give: the grammar allows two
            # answers and the bias picks one, whatever the random weights say
            {"name": "forced", "path": QWEN, "ctx": 256, "parallel": 2, "chat-template": QWEN_TMPL,
             "grammar": 'root ::= "yes" | "no"', "logit_bias": {}}]}, f)
    s = Server(["--config", cfg])
    try:
        _, models = s.req("GET", "/v1/models")
        check([m["id"] for m in models["data"]] == ["router", "fast", "big", "forced"], "--config: the same classes",
              json.dumps(models))
        check(s.chat("big")[0] == 200, "--config: big answers", "")
        # the bias needs the token id of "no": the class's tokenizer says it
        _, tok = s.req("POST", "/tokenize", {"model": "forced", "content": "no"})
    finally:
        s.stop()
    check(len(tok["tokens"]) == 1, "'no' is one token", json.dumps(tok))
    with open(cfg) as f:
        doc = json.load(f)
    doc["models"][-1]["logit_bias"] = {str(tok["tokens"][0]): 100}
    with open(cfg, "w") as f:
        json.dump(doc, f)
    s = Server(["--config", cfg])
    try:
        answers = [s.chat("forced", f"Hi {k}", temperature=1.0, seed=k)[1]["choices"][0]["message"]["content"]
                   for k in range(8)]
        check(answers == ["no"] * 8, "--config: a class's default grammar and logit_bias shape its answers",
              json.dumps(answers))
        own = s.chat("forced", grammar='root ::= "mine"', logit_bias={"0": 0})[1]["choices"][0]["message"]["content"]
        check(own == "mine", "a request's own grammar and logit_bias win over the class's", json.dumps(own))
    finally:
        s.stop()
    bad = os.path.join(TMP, "bad.json")
    for doc, want in [({"models": [{"name": "a", "path": STORIES, "colour": 1}]}, 'unknown key "colour"'),
                      ({"models": [{"name": "a"}]}, 'needs a non-empty "name" and "path"'),
                      ({"models": []}, "non-empty array"), ({"model": []}, 'unknown key "model"'),
                      ({"models": [{"name": "a", "path": STORIES, "grammar": 1}]}, '"grammar" must be a GBNF string'),
                      ({"models": [{"name": "a", "path": STORIES, "logit_bias": [1]}]}, '"logit_bias" must be an object')]:
        with open(bad, "w") as f:
            json.dump(doc, f)
        r = run(["serve", "--config", bad, "--port", "0"])
        check(r.returncode == 2 and want in r.stderr, f"--config error: {want}", r.stderr)
    with open(bad, "w") as f:
        f.write("{\"models\": [")
    r = run(["serve", "--config", bad, "--port", "0"])
    check(r.returncode == 2 and "line" in r.stderr, "--config: malformed JSON names the line", r.stderr)


def test_memory():
    # 64 MiB for the KV caches of both: the first class's explicit 48 leaves 16; the second's 32 cannot fit
    env = dict(os.environ, KETTLE_MEM_MB="64")
    r = run(["serve", "--port", "0", "--model", f"a={STORIES},kv-mb=48,chat-template=chatml",
             "--model", f"b={QWEN},kv-mb=32,chat-template=chatml"], env=env)
    check(r.returncode != 0 and "model 'b'" in r.stderr and "--kv-mb 32" in r.stderr
          and re.search(r"took \d+ MiB", r.stderr), "a class that does not fit is refused, naming it and the flag", r.stderr)
    # without --kv-mb the second class's default pool is cut to what is left, and the banner says so
    s = Server(["--model", f"a={STORIES},kv-mb=48,chat-template=chatml",
                "--model", f"b={QWEN},ctx=2048,parallel=16,chat-template=chatml"], env=env)
    banner = "".join(s.log)
    try:
        m = re.findall(r"KV cache \d+ blocks of 16 positions \((\d+) MiB", banner)
        check(len(m) == 2 and int(m[0]) == 48 and int(m[1]) <= 16, "the second pool fits what the first left", banner)
        check("more than the memory available now" in banner, "the cut is said", banner)
        check(s.chat("b")[0] == 200, "the cut class answers", "")
    finally:
        s.stop()


def test_usage():
    cases = [
        (["--model", f"a={STORIES},colour=red"], "unknown key 'colour'"),
        (["--model", f"a={STORIES},ctx=x"], "ctx=x is not an integer"),
        (["--model", f"a={STORIES},kv-type=q4"], "kv-type=q4"),
        (["--model", f"a={STORIES},grammar=x"], "grammar is a JSON value: give it in a --config file"),
        (["--model", f"a={STORIES},spec=fast"], "spec=fast (off, ngram, draft, mtp, auto)"),
        (["--model", f"a={STORIES},spec=draft"], "model 'a': spec=draft needs draft=PATH"),
        (["--model", f"a={STORIES},spec=ngram,draft={STORIES}"], "a draft model goes with spec=draft (it has spec=ngram)"),
        (["--model", f"a={STORIES}", "--model", f"b={STORIES}", "--draft", STORIES], "give each its own draft=PATH"),
        (["--model", "a="], "the path is empty"),
        (["-m", STORIES, "--model", f"a={STORIES}"], "not both"),
        (["--model", f"a={STORIES}", "--alias", "x"], "a class takes alias=NAME"),
    ]
    for args, want in cases:
        r = run(["serve", "--port", "0"] + args)
        check(r.returncode == 2 and want in r.stderr, f"usage error: {want}", r.stderr)
    r = run(["serve", "--port", "0", "--model", f"a={STORIES},lazy,draft=/nonexistent.gguf"])
    check(r.returncode == 1 and "model 'a': cannot open /nonexistent.gguf" in r.stderr,
          "a lazy class's draft is checked at start", r.stderr)
    r = run(["serve", "--port", "0", "--model", f"a={STORIES},alias=b,chat-template=chatml", "--model",
             f"b={STORIES},chat-template=chatml"])
    check(r.returncode != 0 and "the model name 'b' is given twice" in r.stderr, "names are unique across classes",
          r.stderr)


def test_class_drafts():
    """Each class its own draft model (draft=PATH): one loaded at start,
    one lazy that unloads and loads again with it (its engine owns the
    draft); the answers are plain decoding's, the drafts' proposals are
    on their classes' metrics; a draft of another vocabulary is refused
    at start, naming the class. The drafts are the target itself, which
    can never pay (a guess costs what the pass it saves does), so the
    adaptive policy rightly declines them: --spec-fixed makes every class
    verify what its draft proposes, which is what this test is about."""
    plain = f"plain={STORIES},chat-template=chatml,temperature=0,spec=off"
    a = f"a={STORIES},chat-template=chatml,temperature=0,draft={STORIES},draft-max=4"
    b = f"b={STORIES},chat-template=chatml,temperature=0,draft={STORIES},lazy,keep-alive=1"
    s = Server(["--spec-fixed", "--model", plain, "--model", a, "--model", b])
    try:
        banner = "".join(s.log)
        check(banner.count("speculative decoding: a draft model, up to 4 tokens") == 1, "a's draft in the banner",
              banner)
        text = {m: s.chat(m, "Once upon a time", max_tokens=48)[1]["choices"][0]["message"]["content"]
                for m in ("plain", "a", "b")}
        check(text["a"] == text["plain"] == text["b"] and text["plain"], "drafts change no token", json.dumps(text))
        check(wait_for(lambda: metric(s, "kettle_model_loaded", "b") == 0, 6), "b unloads, its draft with it", "")
        again = s.chat("b", "Once upon a time", max_tokens=48)[1]["choices"][0]["message"]["content"]
        check(again == text["plain"], "b loaded again with its draft, the same answer", json.dumps([again, text]))
        for m in ("a", "b"):
            kept, proposed = metric(s, "kettle_spec_accepted_tokens_total", m), metric(s, "kettle_spec_proposed_tokens_total", m)
            check(proposed and kept and kept > 0.5 * proposed, f"{m}: its draft's proposals, mostly kept (itself)",
                  f"{kept} of {proposed}")
        check(metric(s, "kettle_spec_proposed_tokens_total", "plain") == 0, "plain: no proposals", "")
    finally:
        s.stop()
    r = run(["serve", "--port", "0", "--model", f"a={STORIES},chat-template=chatml", "--model",
             f"q={STORIES},chat-template=chatml,draft={QWEN}"])
    check(r.returncode != 0 and "model 'q'" in r.stderr and "vocabular" in r.stderr,
          "a draft of another vocabulary is refused, naming the class", r.stderr)


def metric(s, name, model):
    _, m = s.req("GET", "/metrics")
    found = re.search(r'%s\{model="%s"\} (\S+)' % (name, model), m)
    return float(found.group(1)) if found else None


def wait_for(cond, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def stream_tokens(s, model, n):
    """A streamed completion of n tokens; returns (finish_reason, tokens)."""
    body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": n, "ignore_eos": True,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}).encode()
    r = urllib.request.Request(f"http://127.0.0.1:{s.port}/v1/completions", data=body,
                               headers={"Content-Type": "application/json"})
    finish, usage = None, None
    with urllib.request.urlopen(r, timeout=60) as resp:
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            for ch in ev.get("choices", []):
                finish = ch.get("finish_reason") or finish
            usage = ev.get("usage") or usage
    return finish, usage["completion_tokens"] if usage else 0


def test_lazy():
    broken = os.path.join(TMP, "broken.gguf")
    with open(broken, "wb") as f:
        f.write(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    s = Server(["--model", f"router={STORIES},chat-template=chatml",
                "--model", f"big={QWEN},lazy,keep-alive=1,ctx=256,chat-template={QWEN_TMPL}",
                "--model", f"bad={broken},lazy,chat-template=chatml"])
    try:
        check("model big: loaded on its first request (lazy)" in "".join(s.log), "the banner says big is lazy",
              "".join(s.log))
        check(metric(s, "kettle_model_loaded", "big") == 0 and metric(s, "kettle_model_loaded", "router") == 1,
              "big is not loaded at start", "")
        st, t = s.req("POST", "/tokenize", {"model": "big", "content": "Hello"})
        check(st == 503 and "is loading" in t["error"]["message"], "/tokenize while big loads: 503", json.dumps(t))
        # a stream on the router runs while big loads (and unloads)
        result = {}
        th = threading.Thread(target=lambda: result.update(r=stream_tokens(s, "router", 300)))
        th.start()
        st, first = s.chat("big", temperature=0)
        check(st == 200 and first["model"] == "big", "the first request waited for the load", json.dumps(first))
        check(metric(s, "kettle_model_loaded", "big") == 1, "big is loaded", "")
        check(any("loaded 'big' in" in l for l in s.log), "the load is logged", "".join(s.log))
        th.join(60)
        check(result.get("r") == ("length", 300), "the router's stream ran through big's load", str(result))
        check(wait_for(lambda: metric(s, "kettle_model_loaded", "big") == 0, 6), "big unloads after 1 s idle",
              "".join(s.log))
        # the log line comes through the log reader thread, after the gauge may already say 0
        check(wait_for(lambda: any("unloaded 'big' (idle for 1 s" in l for l in s.log), 3), "the unload is logged",
              "".join(s.log))
        st, again = s.chat("big", temperature=0)
        check(st == 200 and again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"],
              "loaded again, the same answer", json.dumps([first, again]))
        st, e = s.chat("bad")
        check(st == 503 and e["error"]["code"] == "model_not_loaded" and "could not be loaded" in e["error"]["message"],
              "a file that cannot load: a 503 saying why", json.dumps(e))
        check(s.chat("router")[0] == 200, "the others still answer", "")
    finally:
        s.stop()
    # memory (100 MiB): the pinned router holds 49 (its KV and weights); big needs its weights (~48) and 32 of
    # KV, so it cannot load until the router may be unloaded
    env = dict(os.environ, KETTLE_MEM_MB="100")
    lazy_big = f"big={QWEN},lazy,kv-mb=32,chat-template={QWEN_TMPL}"
    s = Server(["--model", f"router={STORIES},kv-mb=48,chat-template=chatml", "--model", lazy_big], env=env)
    try:
        st, e = s.chat("big")
        check(st == 503 and "not enough memory to load 'big'" in e["error"]["message"],
              "a load that cannot fit beside a pinned class is refused", json.dumps(e))
    finally:
        s.stop()
    s = Server(["--model", f"router={STORIES},kv-mb=48,keep-alive=600,chat-template=chatml", "--model", lazy_big],
               env=env)
    try:
        st, _ = s.chat("big")
        check(st == 200 and metric(s, "kettle_model_loaded", "router") == 0, "an idle class makes room",
              "".join(s.log))
        check(any("unloaded 'router' (to make room" in l for l in s.log), "the unload says why", "".join(s.log))
    finally:
        s.stop()


def post_headers(s, path, body):
    r = urllib.request.Request(f"http://127.0.0.1:{s.port}{path}", data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=60) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read().decode())


def test_fallback():
    # the upstream: the same qwen file with a context long enough
    up = Server(["-m", QWEN, "--ctx", "2048", "--chat-template", QWEN_TMPL, "--alias", "big"])
    url = f"http://127.0.0.1:{up.port}/v1"
    broken = os.path.join(TMP, "broken2.gguf")
    with open(broken, "wb") as f:
        f.write(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    s = Server(["--model", f"router={STORIES},chat-template=chatml,ctx=512",
                "--model", f"bad={broken},lazy,chat-template=chatml,fallback={url}",
                "--model", f"big={QWEN},ctx=256,chat-template={QWEN_TMPL},fallback={url}",
                "--model", f"strict={QWEN},ctx=256,chat-template={QWEN_TMPL},fallback={url},fallback-on=busy"])
    try:
        check(f"big: fallback upstream {url} on context, busy, unknown-model, error" in "".join(s.log),
              "the banner names the class's upstream", "".join(s.log))
        long = " ".join(["Once upon a time"] * 80)
        body = {"model": "big", "messages": [{"role": "user", "content": long}], "max_tokens": 4, "temperature": 0}
        st, h, r = post_headers(s, "/v1/chat/completions", body)
        check(st == 200 and h.get("x-kettle-served-by") == "fallback" and h.get("x-kettle-fallback-reason") == "context",
              "big: a prompt too long for it is answered by its upstream", json.dumps([st, h, r])[:600])
        st2, _, direct = post_headers(up, "/v1/chat/completions", body)
        check(r["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"],
              "the upstream's own answer, passed on", json.dumps([r, direct])[:600])
        st, h, e = post_headers(s, "/v1/chat/completions", dict(body, model="strict"))
        check(st == 400 and "x-kettle-served-by" not in h and e["error"]["code"] == "context_length_exceeded",
              "fallback-on=busy: a context refusal stays local", json.dumps([st, e]))
        st, h, e = post_headers(s, "/v1/chat/completions", dict(body, model="router",
                                                                  messages=[{"role": "user", "content": long * 3}]))
        check(st == 400 and "x-kettle-served-by" not in h, "router has no upstream: refused as before", json.dumps(e))
        st, h, r = post_headers(s, "/v1/chat/completions", dict(body, model="bad", messages=[{"role": "user",
                                                                                            "content": "Hi"}]))
        check(st == 200 and h.get("x-kettle-served-by") == "fallback" and
              h.get("x-kettle-fallback-reason") == "unknown-model", "a class that cannot load goes to its upstream",
              json.dumps([st, h, r])[:600])
        st, h, e = post_headers(s, "/v1/chat/completions", dict(body, model="gpt-9"))
        check(st == 404 and "x-kettle-served-by" not in h, "an unknown name, no server-wide --fallback: 404", "")
    finally:
        s.stop()
        up.stop()
    r = run(["serve", "--port", "0", "--model", f"a={STORIES},fallback-on=context"])
    check(r.returncode == 2 and "fallback-on= needs fallback=URL" in r.stderr, "fallback-on without an upstream", r.stderr)
    r = run(["serve", "--port", "0", "--model", f"a={STORIES},fallback=ftp://x"])
    check(r.returncode == 2 and "model 'a': fallback:" in r.stderr, "a bad class upstream URL", r.stderr)


TESTS = {"routing": test_routing_and_params, "config": test_config, "memory": test_memory, "lazy": test_lazy,
         "fallback": test_fallback, "usage": test_usage, "drafts": test_class_drafts}


def main():
    r = run(["gen-model", "--shape", "test-tiny", "--type", "Q8_0", "--vocab",
             os.path.join(SHARED, "vocab", "ggml-vocab-qwen2.gguf"), "-o", QWEN])
    if r.returncode:
        print("FAIL setup: gen-model\n" + r.stderr)
        return 1
    return run_named(TESTS, sys.argv[3:], TMP)


if __name__ == "__main__":
    sys.exit(main())
