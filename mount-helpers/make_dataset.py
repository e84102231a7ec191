"""Makes a small ImageFolder dataset of real PNG images (standard library only).

    python3 make_dataset.py OUT [--classes 6] [--per-class 60] [--size 48] [--seed 0] [--small-class N]

Each class has its own base colour and stripe direction plus noise, so images decode with any
PNG reader and a small model can learn the classes. --small-class N adds one more class with
only N images, so with more ranks than N some rank holds no sample of it.
"""
import argparse
import os
import random
import struct
import zlib


def png_bytes(width, height, pixel):
    raw = bytearray()
    for y in range(height):
        raw.append(0)  # filter: none
        for x in range(width):
            raw.extend(pixel(x, y))

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(raw), 6)) + chunk(b"IEND", b"")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--classes", type=int, default=6)
    ap.add_argument("--per-class", type=int, default=60)
    ap.add_argument("--size", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small-class", type=int, default=0, metavar="N")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    counts = [a.per_class] * a.classes + ([a.small_class] if a.small_class else [])
    for c, count in enumerate(counts):
        d = os.path.join(a.out, f"class_{c:02d}")
        os.makedirs(d, exist_ok=True)
        base = [(c * 97) % 256, (c * 53 + 80) % 256, (c * 31 + 160) % 256]
        for i in range(count):
            noise = [rng.randrange(256) for _ in range(64)]

            def pixel(x, y, base=base, noise=noise):
                stripe = ((x if c % 2 else y) // 6) % 2
                n = noise[(x * 7 + y * 13) % 64] // 4
                return bytes(min(255, v // (1 + stripe) + n) for v in base)

            with open(os.path.join(d, f"img_{i:04d}.png"), "wb") as f:
                f.write(png_bytes(a.size, a.size, pixel))
    print(f"made {sum(counts)} PNG images in {len(counts)} classes under {a.out}")


if __name__ == "__main__":
    main()
