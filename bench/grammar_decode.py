"""Decode tokens/s of `kettle serve` with and without a JSON schema.

usage: python3 bench/grammar_decode.py [PORT [string|structured]]
       (a kettle serve on 127.0.0.1:PORT, default 18500; schema default string)

Streams 96-token chat answers at temperature 1 (seeds 1 and 2, four
alternating rounds), unconstrained (ignore_eos) and under a JSON schema,
and prints the decode tokens/s of every answer of >= 40 tokens (first to
last content chunk) and the medians. `string`: one free string (the mask
is rarely needed); `structured`: an array of objects with an integer
range, an enum, a bounded string and a boolean (a mask at almost every
structural token).
"""
import json, sys, time, urllib.request
PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 18500
SCHEMAS = {
    "string": {"type":"object","properties":{"text":{"type":"string"}},"required":["text"]},
    "structured": {"type":"object","required":["items"],"properties":{"items":{"type":"array","items":{
        "type":"object","additionalProperties":False,"required":["id","kind","name","ok"],"properties":{
            "id":{"type":"integer","minimum":0,"maximum":9999},"kind":{"enum":["file","dir","link"]},
            "name":{"type":"string","maxLength":12},"ok":{"type":"boolean"}}}}}},
}
schema = SCHEMAS[sys.argv[2] if len(sys.argv) > 2 else "string"]
def run(mode, seed):
    body={"messages":[{"role":"user","content":"Write."}],"max_tokens":96,"temperature":1,"seed":seed,"stream":True}
    if mode=="free": body["ignore_eos"]=True
    else: body["response_format"]={"type":"json_schema","json_schema":{"name":"t","schema":schema}}
    req=urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type":"application/json"})
    times=[]
    with urllib.request.urlopen(req) as r:
        for line in r:
            line=line.decode().strip()
            if line.startswith("data: ") and line[6:].strip().startswith("{"):
                c=json.loads(line[6:])
                if c.get("choices") and c["choices"][0]["delta"].get("content"): times.append(time.perf_counter())
    n=len(times)-1
    return n/(times[-1]-times[0]) if n>0 else 0, n
res={"free":[], "schema":[]}
for rnd in range(4):
    for mode in ("free","schema"):
        for seed in (1,2):
            tps,n=run(mode, seed)
            if n>=40: res[mode].append(tps)
for m,v in res.items():
    v.sort(); print(m, "decode t/s runs:", ["%.1f"%x for x in v], "median %.1f"%v[len(v)//2])
