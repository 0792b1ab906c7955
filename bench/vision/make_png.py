#!/usr/bin/env python3
"""make_png.py W H OUT.png - a deterministic synthetic "screenshot" (title
bars, panes, rows of text-like dashes, a gradient) in pure Python + zlib,
for timing the vision tower at sizes the test images do not have
(issue 40: 1920x1080). The picture's content does not change the encoder's
work; only its size does."""
import struct
import sys
import zlib


def pixel(x, y, w, h):
    if y < 32:  # title bar
        return (40, 44, 52)
    if x < w // 5:  # side pane with icon rows
        return (230, 230, 235) if (y // 24) % 2 else (215, 218, 225)
    line, col = (y - 32) // 20, (x - w // 5) // 9
    if (y - 32) % 20 < 12 and (line * 7 + col * 3) % 11 < 7 and col % 13 < 11:
        return (30 + line % 5 * 20, 30, 60 + col % 7 * 20)  # "text"
    return (255 - x * 40 // w, 255 - y * 40 // h, 250)  # page gradient


def main():
    w, h, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    raw = bytearray()
    for y in range(h):
        raw.append(0)  # filter: none
        for x in range(w):
            raw.extend(pixel(x, y, w, h))

    def chunk(kind, data):
        c = kind + data
        return struct.pack(">I", len(data)) + c + struct.pack(">I", zlib.crc32(c) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(bytes(raw), 6)) + chunk(b"IEND", b"")
    with open(out, "wb") as f:
        f.write(png)


if __name__ == "__main__":
    main()
