#!/usr/bin/python3
# bfcl_tools.py - every BFCL entry of shared/toolcall/bfcl (simple_python:
# one function offered; multiple: several) through `kettle serve` under
# tool_choice "required", judged by an independent validator.
#
#   /usr/bin/python3 tests/py/bfcl_tools.py KETTLE_BIN SHARED_DIR
#
# kettle promises that under tool_choice "required" a reply is calls of
# offered functions whose arguments validate against their parameter
# schema. The model is a random-weight test-tiny with Qwen 2's tokenizer,
# served with Qwen 2.5's template (the Hermes `<tool_call>` format): its
# sampling at temperature 1 is a random walk through whatever the grammar
# allows, so every part of the schemas gets exercised and nothing but the
# grammar can make an answer valid. Function names are rewritten from
# "a.b" to "a_b" as BFCL does for OpenAI's name rule.
#
# Per entry, a request with a fixed seed:
#   200, "tool_calls"   exactly one call (parallel_tool_calls false); its
#                       name must be offered, its arguments parse as a JSON
#                       object and validate (python3-jsonschema);
#   200, "length"       the walk did not close the arguments (a free string
#                       can run long): retried with the next seed, up to
#                       SEEDS seeds, never counted as valid;
#   anything else       a failure (a refused schema would be a 400: BFCL's
#                       schemas are all ones kettle enforces).
# Exits 0 only if every finished call validated and at least MIN_FINISHED
# of the entries finished.
import concurrent.futures
import glob
import json
import os
import sys
import tempfile
import time

import kettle_server as ks

try:
    import jsonschema
except ImportError as e:
    print(f"FAIL - setup: cannot import jsonschema ({e}) in {sys.executable}; "
          "run scripts/deps.sh (it installs Debian's python3-jsonschema)")
    sys.exit(1)

MAX_TOKENS = 400
# A random walk inside a free JSON string rarely draws the closing quote;
# favouring the '"' token (Qwen 2's id 1) where the grammar allows it ends
# strings sooner. It changes which valid call comes out, never whether it
# is valid: the grammar still decides what may be drawn.
QUOTE_ID = 1
QUOTE_BIAS = 10
SEEDS = tuple(range(1, 5))
PARALLEL = 16
# Measured (2 cores, -t 2, the settings here): 200 of 200 entries finish
# (all validate) in 48 s.
# The bar is below it so that a change in how walks end does not fail the
# test, while a grammar that stopped closing calls would.
MIN_FINISHED = 190
BUDGET_S = 540  # a hang watchdog: ~78 s on a quiet 2-core machine, twice that loaded


def entries(shared):
    out = []
    for path in sorted(glob.glob(os.path.join(shared, "toolcall/bfcl/*.jsonl"))):
        with open(path) as f:
            for line in f:
                e = json.loads(line)
                for t in e["tools"]:
                    t["function"]["name"] = t["function"]["name"].replace(".", "_")
                out.append(e)
    return out


def judge(e, reply):
    """None when the reply's call is valid, else why not."""
    c = reply["choices"][0]
    calls = c["message"].get("tool_calls") or []
    if len(calls) != 1:
        return f"{len(calls)} calls: {json.dumps(c)[:300]}"
    fn = calls[0]["function"]
    offered = {t["function"]["name"]: t["function"].get("parameters") or {} for t in e["tools"]}
    if fn["name"] not in offered:
        return f"'{fn['name']}' was not offered"
    try:
        args = json.loads(fn["arguments"])
    except ValueError as err:
        return f"arguments are not JSON ({err}): {fn['arguments'][:300]}"
    if not isinstance(args, dict):
        return f"arguments are not an object: {fn['arguments'][:300]}"
    try:
        jsonschema.validate(args, offered[fn["name"]])
    except jsonschema.ValidationError as err:
        return f"arguments do not validate ({err.message}): {fn['arguments'][:300]}"
    return None


def run_one(url, e):
    for seed in SEEDS:
        body = {"messages": e["messages"], "tools": e["tools"], "tool_choice": "required",
                "parallel_tool_calls": False, "temperature": 1, "seed": seed, "max_tokens": MAX_TOKENS,
                "logit_bias": {str(QUOTE_ID): QUOTE_BIAS}}
        status, text = ks.post(url, body)
        if status != 200:
            return {"id": e["id"], "outcome": "error", "detail": f"{status} {text[:300]}"}
        reply = json.loads(text)
        finish = reply["choices"][0]["finish_reason"]
        if finish == "length":
            continue
        if finish != "tool_calls":
            return {"id": e["id"], "outcome": "invalid", "detail": f"finish_reason {finish}"}
        why = judge(e, reply)
        return {"id": e["id"], "outcome": "invalid" if why else "valid", "detail": why, "seed": seed}
    return {"id": e["id"], "outcome": "length"}


def main():
    if len(sys.argv) != 3:
        print("usage: bfcl_tools.py KETTLE_BIN SHARED_DIR")
        return 1
    binary, shared = sys.argv[1], sys.argv[2]
    todo = entries(shared)
    if not todo:
        print(f"FAIL - setup: no BFCL entries under {shared}/toolcall/bfcl")
        return 1
    # the judge can fail: a call with no arguments where some are required,
    # and one of a function not offered
    need = next(e for e in todo if e["tools"][0]["function"]["parameters"].get("required"))
    fake = {"choices": [{"message": {"tool_calls": [{"function": {"name": need["tools"][0]["function"]["name"],
                                                                   "arguments": "{}"}}]}}]}
    other = {"choices": [{"message": {"tool_calls": [{"function": {"name": "not_offered", "arguments": "{}"}}]}}]}
    if judge(need, fake) is None or judge(need, other) is None:
        print("FAIL - setup: the judge accepts calls it must refuse")
        return 1
    t0 = time.monotonic()
    timer = ks.guard(BUDGET_S)
    log = []
    try:
        with tempfile.TemporaryDirectory(prefix="kt-bfcl-") as tmp:
            ks.tmp_dir = tmp
            model = os.path.join(tmp, "m.gguf")
            ks.gen_model(binary, os.path.join(shared, "vocab/ggml-vocab-qwen2.gguf"), model)
            port, log = ks.start_server(binary, model, [
                "--chat-template", os.path.join(shared, "templates/Qwen-Qwen2.5-7B-Instruct.jinja"),
                "--parallel", str(PARALLEL), "-c", "2048"])
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
                results = list(pool.map(lambda e: run_one(url, e), todo))
    except Exception as err:
        print(f"FAIL - setup: {err}")
        if log:
            print("kettle serve stderr:\n" + "".join(log[-40:]))
        return 1
    finally:
        ks.kill_server()
        timer.cancel()
    by = {k: [r for r in results if r["outcome"] == k] for k in ("valid", "invalid", "length", "error")}
    for r in by["invalid"] + by["error"]:
        print(f"FAIL - {r['id']}: {r['outcome']}: {r['detail']}")
    finished = len(by["valid"]) + len(by["invalid"])
    print(f"entries {len(todo)}, finished {finished}, valid {len(by['valid'])}, invalid {len(by['invalid'])}, "
          f"length {len(by['length'])} (after {len(SEEDS)} seeds), errors {len(by['error'])}; "
          f"max_tokens {MAX_TOKENS}, {time.monotonic() - t0:.1f} s")
    ok = not by["invalid"] and not by["error"] and finished >= MIN_FINISHED
    if finished < MIN_FINISHED:
        print(f"FAIL - only {finished} entries finished (at least {MIN_FINISHED} wanted)")
    print("ok - bfcl_tools" if ok else "FAIL - bfcl_tools")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
