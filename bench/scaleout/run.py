#!/usr/bin/env python3
"""bench/scaleout/run.py - kettle replicas behind real HAProxy, one killed.

Starts N `kettle serve` replicas on loopback ports sharing one --cache-dir,
HAProxy in front with the configuration deploy/haproxy/kettle-haproxy.sh
prints (health checks on /health, retry-on + redispatch, consistent hashing
on X-Session-Id), drives S concurrent multi-turn chat sessions through it,
kill -9s one replica mid-run, restarts it, and checks:

  - no non-streaming request is lost: every one is answered 200 (HAProxy
    resends those the dead replica never answered to another one);
  - streams cut by the kill end with an error the client sees (no [DONE],
    an incomplete chunked body), within the socket timeout, not a hang;
  - affinity: each session's turns go to one replica (X-Kettle-Replica, set
    by HAProxy), sessions of the survivors do not move, the killed one's
    move to one survivor each (requests sent in the moment between the kill
    and HAProxy marking the replica down are left out: a redispatch may
    place one elsewhere), and the survivors' prefix-cache hit rate (from
    /metrics) stays high after the kill;
  - moved sessions find their KV in the shared --cache-dir (disk hits);
  - the killed replica rejoins when restarted (HAProxy marks it UP, and it
    answers requests again).

Builds nothing: takes the kettle binary and a model. Prints a summary with
the figures; exit 0 when every check passes, 1 otherwise, 77 when haproxy
is not installed.

  python3 bench/scaleout/run.py --kettle build/kettle \
      --model models/stories260K.gguf
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_SCRIPT = os.path.join(ROOT, "deploy", "haproxy", "kettle-haproxy.sh")
TIMEOUT_S = 30  # a request that hangs longer is a failure, not a slow answer

WORDS = ("the cat sat on a mat and then a dog ran by the old red house while "
         "birds sang in tall green trees near the quiet river bank").split()


def words(seed, n):
    """n words of a fixed sequence: every session's text is its own."""
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n))


def free_ports(n):
    """n consecutive free loopback ports (the config numbers replicas from
    a base port)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", p))
            return list(range(base, base + n))
        except OSError:
            continue
        finally:
            for x in socks:
                x.close()
    raise RuntimeError("no run of free ports")


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()
    except OSError:
        return 0, ""
    finally:
        c.close()


def metrics(port):
    """The counters of one replica's /metrics, {name: value} (0: not up)."""
    status, text = get(port, "/metrics")
    out = {}
    for line in text.splitlines() if status == 200 else []:
        m = re.match(r'^(kettle_[a-z_]+(?:\{[^}]*\})?) ([0-9.e+]+)$', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def hit_rate(before, after):
    """Prefix-cache hit rate between two /metrics snapshots: cached /
    (cached + prefilled) prompt tokens."""
    hit = after.get("kettle_cache_hit_tokens_total", 0) - before.get("kettle_cache_hit_tokens_total", 0)
    pre = after.get("kettle_prompt_tokens_total", 0) - before.get("kettle_prompt_tokens_total", 0)
    return hit / (hit + pre) if hit + pre > 0 else float("nan")


class Haproxy:
    def __init__(self, work, port, replica_ports, balance):
        self.sock = os.path.join(work, "haproxy.sock")
        cfg = subprocess.run(["sh", CONFIG_SCRIPT, "config", "--replicas", str(len(replica_ports)),
                              "--base-port", str(replica_ports[0]), "--port", str(port), "--balance", balance,
                              "--dir", work], check=True, capture_output=True, text=True).stdout
        path = os.path.join(work, "haproxy.cfg")
        with open(path, "w") as f:
            f.write(cfg)
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", path], stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(work, "haproxy.log"), "w"))

    def stat(self):
        """{server name: (status, requests sent)} from the stats socket."""
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(self.sock)
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            s.close()
        except OSError:
            return {}
        lines = data.decode().splitlines()
        if not lines or not lines[0].startswith("# "):
            return {}
        head = lines[0][2:].split(",")
        out = {}
        for line in lines[1:]:
            row = dict(zip(head, line.split(",")))
            if row.get("pxname") == "kettle" and row.get("svname", "").startswith("r"):
                out[row["svname"]] = (row["status"], int(row["stot"] or 0), row.get("check_status", ""))
        return out

    def wait_status(self, server, want, limit_s):
        t0 = time.time()
        while time.time() - t0 < limit_s:
            st, _, check = self.stat().get(server, ("?", 0, ""))
            if st.startswith(want) and (want != "UP" or check == "L7OK"):  # UP by a passed check
                return time.time() - t0
            time.sleep(0.05)
        return None

    def stop(self):
        self.proc.terminate()
        self.proc.wait(5)


class Replicas:
    def __init__(self, args, work, ports):
        self.args, self.work, self.ports = args, work, ports
        self.procs = [None] * len(ports)
        for i in range(len(ports)):
            self.start(i)

    def start(self, i):
        a = self.args
        cmd = [a.kettle, "serve", "-m", a.model, "--port", str(self.ports[i]), "-t", "1", "--ctx", "4096",
               "--chat-template", "chatml", "--cache-dir", os.path.join(self.work, "cache"), "--log-format", "off",
               "--drain-s", "5"]
        log = open(os.path.join(self.work, f"replica{i + 1}.log"), "a")
        self.procs[i] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)

    def wait_ready(self, i, limit_s=60):
        t0 = time.time()
        while time.time() - t0 < limit_s:
            if get(self.ports[i], "/health")[0] == 200:
                return True
            if self.procs[i].poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def stop(self):
        for p in self.procs:
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            if p:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


class Tally:
    """What every request came to, under one lock."""

    def __init__(self):
        self.mu = threading.Lock()
        self.rows = []  # (session, turn, stream, phase, outcome, replica, seconds, t_sent, t_done)

    def add(self, *row):
        with self.mu:
            self.rows.append(row)


def send_turn(port, sid, messages, stream, max_tokens):
    """One chat turn through HAProxy: (outcome, replica, reply text).
    outcome: ok, http_NNN, cut (a stream that ended without [DONE]), hang."""
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
                       "ignore_eos": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json", "X-Session-Id": sid})
        r = c.getresponse()
        replica = r.getheader("X-Kettle-Replica", "?")
        if r.status != 200:
            r.read()
            return f"http_{r.status}", replica, ""
        if not stream:
            return "ok", replica, json.loads(r.read())["choices"][0]["message"]["content"]
        text, done = [], False
        try:
            for line in r:
                line = line.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    ev = json.loads(line[6:])
                    if ev.get("choices"):
                        text.append(ev["choices"][0].get("delta", {}).get("content") or "")
        except (http.client.IncompleteRead, ConnectionError, ValueError):
            pass  # the cut the client must see
        return ("ok" if done else "cut"), replica, "".join(text)
    except socket.timeout:
        return "hang", "?", ""
    except (ConnectionError, http.client.HTTPException) as e:
        return f"error_{type(e).__name__}", "?", ""
    finally:
        c.close()


def session(port, k, turns, tally, system):
    """Session k: its own document, turns alternating streamed and not
    (odd sessions start streamed); a turn that fails is sent again, as a
    client would, up to 3 times."""
    sid = f"session-{k}"
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": "Document: " + words(k, 150) + ". Summarize it."}]
    for t in range(turns):
        stream = (t + k) % 2 == 1
        for _ in range(3):
            t0 = time.time()
            outcome, replica, text = send_turn(port, sid, messages, stream, 48)
            tally.add(k, t, stream, None, outcome, replica, time.time() - t0, t0, time.time())
            if outcome == "ok":
                break
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": "Tool result: " + words(k * 31 + t, 40) + ". Go on."})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kettle", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--kill", type=int, default=2, help="the replica killed (1-based)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, config)")
    a = ap.parse_args()
    if not shutil.which("haproxy"):
        print("run.py: haproxy is not installed (Debian: apt-get install haproxy, or scripts/deps.sh)")
        return 77
    work = tempfile.mkdtemp(prefix="kettle-scaleout-")
    ports = free_ports(a.replicas + 1)
    front, rports = ports[0], ports[1:]
    reps = Replicas(a, work, rports)
    hap = None
    checks = []

    def check(ok, what):
        checks.append((bool(ok), what))
        print(("ok    " if ok else "FAIL  ") + what)

    try:
        if not all(reps.wait_ready(i) for i in range(a.replicas)):
            print(f"run.py: a replica did not become ready (logs in {work})")
            return 1
        hap = Haproxy(work, front, rports, "session")
        for i in range(a.replicas):
            if hap.wait_status(f"r{i + 1}", "UP", 10) is None:
                print(f"run.py: HAProxy does not see r{i + 1} UP (log: {work}/haproxy.log)")
                return 1
        killed = a.kill - 1
        survivors = [i for i in range(a.replicas) if i != killed]
        system = "You are a helpful agent. " + words(99, 200) + "."
        tally = Tally()
        t_start = time.time()
        threads = [threading.Thread(target=session, args=(front, k, a.turns, tally, system))
                   for k in range(a.sessions)]
        for t in threads:
            t.start()
        # kill -9 once a third of the turns are done, while requests run
        while len(tally.rows) < a.sessions * a.turns // 3 and any(t.is_alive() for t in threads):
            time.sleep(0.01)
        m_before = [metrics(p) for p in rports]
        t_kill = time.time()
        reps.procs[killed].send_signal(signal.SIGKILL)
        reps.procs[killed].wait()
        down_s = hap.wait_status(f"r{a.kill}", "DOWN", 10)  # from the kill
        for t in threads:
            t.join(TIMEOUT_S * 4)
        m_after = [metrics(p) for p in rports]
        wall = time.time() - t_start

        # done before the kill; in flight at it or sent before HAProxy saw
        # the replica down (a redispatch then may pick a replica other than
        # the session's new home on the hash ring, once); or sent after
        t_down = t_kill + (down_s or 0)

        def phase(r):
            return "before" if r[8] < t_kill else "during" if r[7] < t_down else "after"
        rows = [r[:3] + (phase(r),) + r[4:] for r in tally.rows]

        # the killed replica rejoins
        reps.start(killed)
        rejoin_ready = reps.wait_ready(killed)
        up_s = hap.wait_status(f"r{a.kill}", "UP", 15)
        m_rejoin0 = metrics(rports[killed])
        tally2 = Tally()
        more = [threading.Thread(target=session, args=(front, k, 2, tally2, system))
                for k in range(a.sessions)]
        for t in more:
            t.start()
        for t in more:
            t.join(TIMEOUT_S * 4)
        m_rejoin = metrics(rports[killed])
        stat = hap.stat()

        # ---- the figures ----
        def count(pred):
            return sum(1 for r in rows if pred(r))
        plain = [r for r in rows if not r[2]]
        streams = [r for r in rows if r[2]]
        print(f"\n{a.replicas} replicas, {a.sessions} sessions x {a.turns} turns, kill -9 of r{a.kill} "
              f"after {count(lambda r: r[3] == 'before')} requests had been answered "
              f"({count(lambda r: r[3] == 'during')} in flight); {wall:.1f} s")
        print(f"requests: {len(rows)} ({len(plain)} non-streaming, {len(streams)} streaming)")
        outcomes = {}
        for r in rows:
            outcomes[(r[2], r[4])] = outcomes.get((r[2], r[4]), 0) + 1
        for (st, oc), n in sorted(outcomes.items()):
            print(f"  {'stream' if st else 'plain '} {oc}: {n}")
        per_rep = {}
        for r in rows:
            per_rep[r[5]] = per_rep.get(r[5], 0) + 1
        print("per replica (X-Kettle-Replica): " + ", ".join(f"{k} {v}" for k, v in sorted(per_rep.items())))
        print("HAProxy stot after the rejoin: " + ", ".join(f"{k} {v[1]} ({v[0]})" for k, v in sorted(stat.items())))
        hr_before = [hit_rate({}, m_before[i]) for i in survivors]
        hr_after = [hit_rate(m_before[i], m_after[i]) for i in survivors]
        disk_after = sum(m_after[i].get("kettle_cache_disk_hit_tokens_total", 0) -
                         m_before[i].get("kettle_cache_disk_hit_tokens_total", 0) for i in survivors)
        print("survivors' hit rate before the kill: " + ", ".join(f"r{i + 1} {h:.1%}" for i, h in zip(survivors, hr_before)))
        print("survivors' hit rate after the kill:  " + ", ".join(f"r{i + 1} {h:.1%}" for i, h in zip(survivors, hr_after)))
        print(f"survivors' disk-tier hit tokens after the kill: {disk_after:.0f}")
        print(f"r{a.kill} marked DOWN {down_s if down_s is None else round(down_s, 2)} s after the kill; "
              f"UP {up_s if up_s is None else round(up_s, 2)} s after its restart was ready")
        rj_req = (m_rejoin.get('kettle_http_requests_total{endpoint="chat_completions",status="200"}', 0) -
                  m_rejoin0.get('kettle_http_requests_total{endpoint="chat_completions",status="200"}', 0))
        rj_disk = m_rejoin.get("kettle_cache_disk_hit_tokens_total", 0)
        print(f"after the rejoin: {len(tally2.rows)} more requests, r{a.kill} answered {rj_req:.0f} "
              f"(hit rate {hit_rate(m_rejoin0, m_rejoin):.1%}, {rj_disk:.0f} tokens from the shared disk cache)")
        print()

        # ---- the checks ----
        check(all(r[4] == "ok" for r in plain), "every non-streaming request answered 200 "
              f"({count(lambda r: not r[2] and r[4] == 'ok')}/{len(plain)})")
        cut = [r for r in streams if r[4] != "ok"]
        check(all(r[4] == "cut" for r in cut) and all(r[6] < TIMEOUT_S for r in cut),
              f"streams cut by the kill ended with an error the client saw, none hung ({len(cut)} cut)")
        check(all(t[4] == "ok" for t in rows if t[3] != "during"), "no failure but of requests in flight at the kill")
        # each session: one replica before the kill; after, one replica (the
        # same one unless it was on the killed replica)
        moved, kept, bad = 0, 0, []
        for k in range(a.sessions):
            b = {r[5] for r in rows if r[0] == k and r[3] == "before" and r[4] == "ok"}
            # the re-send of a turn that was in flight at the kill may land on
            # any survivor (HAProxy redispatches while the failover settles);
            # every later turn must stay on one replica
            resent = {r[1] for r in rows if r[0] == k and r[3] == "during"}
            af = {r[5] for r in rows if r[0] == k and r[3] == "after" and r[4] == "ok" and r[1] not in resent}
            if len(b) > 1 or len(af) > 1:
                print(f"  session {k} split: before {sorted(b)}, after {sorted(af)}: " +
                      " ".join(f"{r[1]}:{r[5]}:{r[3]}" for r in rows if r[0] == k))
                bad.append(k)
            elif b and af and b != af:
                print(f"  session {k} moved: {sorted(b)} -> {sorted(af)}")
                if b != {f"r{a.kill}"}:
                    bad.append(k)
                moved += 1
            else:
                kept += 1
        check(not bad, f"affinity: every session on one replica; only the killed one's moved "
              f"({kept} kept, {moved} moved{', broken: ' + str(bad) if bad else ''})")
        check(moved > 0, "the killed replica had sessions (the kill mattered)")
        # non-streaming requests of the killed replica's sessions in flight at
        # the kill, answered anyway: HAProxy's retry on another replica
        on_killed = {r[0] for r in rows if r[3] == "before" and r[5] == f"r{a.kill}"}
        retried = count(lambda r: not r[2] and r[3] == "during" and r[0] in on_killed and r[4] == "ok")
        print(f"non-streaming requests in flight on r{a.kill} at the kill, answered by another replica: {retried}")
        check(len(cut) + retried > 0, "the kill hit requests in flight (streams cut or requests retried)")
        check(all(h >= 0.7 for h in hr_after), "survivors' hit rate after the kill stays >= 70%")
        check(disk_after > 0, "moved sessions found KV in the shared --cache-dir")
        check(down_s is not None, f"HAProxy marked r{a.kill} DOWN")
        check(rejoin_ready and up_s is not None and rj_req > 0,
              f"r{a.kill} rejoined: UP in HAProxy and answering ({rj_req:.0f} requests)")
        check(all(r[4] == "ok" for r in tally2.rows), "every request after the rejoin answered")
    finally:
        if hap:
            hap.stop()
        reps.stop()
        if a.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    failed = [w for ok, w in checks if not ok]
    print(f"\n{len(checks) - len(failed)}/{len(checks)} checks passed")
    return 1 if failed or not checks else 0


if __name__ == "__main__":
    sys.exit(main())
