#!/usr/bin/env python3
"""history_req.py N OUT.json - a chat request (max_tokens 0: the prepared
step) whose user message holds N distinct 1280x720 synthetic screenshots
(flat panels and rows of text-like noise, ~220 KB of PNG each, as a
desktop's are), for timing what a screenshot already in an agent's
history costs the server (bench/vision/history_step.sh). Deterministic:
screenshot i is drawn from seed i. Pure Python + zlib."""
import base64
import json
import random
import struct
import sys
import zlib


def screenshot(w, h, seed):
    rnd = random.Random(seed)
    pix = bytearray(bytes(rnd.randrange(200, 256) for _ in range(3)) * (w * h))
    for _ in range(60):  # panels
        x0, y0 = rnd.randrange(w), rnd.randrange(h)
        pw, ph = rnd.randrange(50, 400), rnd.randrange(20, 200)
        c = bytes(rnd.randrange(256) for _ in range(3))
        for y in range(y0, min(h, y0 + ph)):
            n = min(w, x0 + pw) - x0
            pix[(y * w + x0) * 3:(y * w + x0 + n) * 3] = c * n
    for _ in range(300):  # lines of "text"
        x0, y0, n = rnd.randrange(w - 200), rnd.randrange(h - 10), rnd.randrange(40, 200)
        for y in range(y0, y0 + 8):
            pix[(y * w + x0) * 3:(y * w + x0 + n) * 3] = bytes(rnd.choice((0, 40, 255)) for _ in range(3 * n))
    raw = b"".join(b"\x00" + bytes(pix[y * w * 3:(y + 1) * w * 3]) for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def main():
    n, out = int(sys.argv[1]), sys.argv[2]
    parts = []
    for i in range(n):
        url = "data:image/png;base64," + base64.b64encode(screenshot(1280, 720, i)).decode()
        parts += [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": f"Step {i + 1}. The screen."}]
    body = {"model": "m", "max_tokens": 0, "messages": [
        {"role": "system", "content": "You are a computer-use agent."}, {"role": "user", "content": parts}]}
    with open(out, "w") as f:
        json.dump(body, f)


if __name__ == "__main__":
    main()
