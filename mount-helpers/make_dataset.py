"""Makes a small dataset (standard library only): an ImageFolder of real PNG images, or, with
--records KIND, packed-record shard files for `--format records`.

    python3 make_dataset.py OUT [--classes 6] [--per-class 60] [--size 48] [--seed 0] [--small-class N]
    python3 make_dataset.py OUT --records svm|csv|fixed|tfrecord|tar [--count 1000] [--files 4]
        [--record-size 64] [--no-final-newline]

Record kinds (every record carries its id, so a reader can check it saw each record once):
  svm       LIBSVM lines `LABEL 1:ID 2:x 3:x ...`, feature 2 telling the label apart (shards
            .svm; --framing lines)
  csv       a header line `id,label,x0,x1` then rows (shards .csv; --framing lines --header-line)
  fixed     binary rows of --record-size bytes starting with the id as u64 little-endian
            (shards .bin; --framing fixed --record-size N)
  tfrecord  TFRecord files of payloads `record-ID|...` (shards .tfrecord; --framing tfrecord)
  tar       webdataset shards: members ID.txt (payload) and ID.cls (label) (shards .tar;
            --framing tar)
--no-final-newline leaves the last line of each svm/csv shard without its newline.

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


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def masked_crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data):
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack("<I", masked_crc32c(data))


def make_records(a):
    import io
    import tarfile

    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    ext = {"svm": "svm", "csv": "csv", "fixed": "bin", "tfrecord": "tfrecord", "tar": "tar"}[a.records]
    per_file = -(-a.count // a.files)
    for f in range(a.files):
        ids = range(f * per_file, min(a.count, (f + 1) * per_file))
        path = os.path.join(a.out, f"shard-{f:05d}.{ext}")
        if a.records == "tar":
            with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
                for i in ids:
                    for name, data in ((f"{i:08d}.txt", f"record-{i}|" + "x" * rng.randrange(200)),
                                       (f"{i:08d}.cls", str(i % 7))):
                        info = tarfile.TarInfo(name)
                        info.size = len(data)
                        info.mtime = 0
                        tar.addfile(info, io.BytesIO(data.encode()))
            continue
        out = bytearray()
        if a.records == "csv":
            out += b"id,label,x0,x1\n"
        for i in ids:
            if a.records == "svm":
                # Feature 2 carries the label (learnable); the rest is noise.
                feats = " ".join(f"{k}:{rng.random():.4f}" for k in range(3, 3 + rng.randrange(1, 40)))
                out += f"{i % 2} 1:{i} 2:{(i % 2) * 0.6 + rng.random() * 0.4:.4f} {feats}\n".encode()
            elif a.records == "csv":
                out += f"{i},{i % 5},{rng.random():.6f},{rng.random():.6f}\n".encode()
            elif a.records == "fixed":
                out += struct.pack("<Q", i) + bytes((i + k) % 251 for k in range(a.record_size - 8))
            else:
                out += tfrecord(f"record-{i}|".encode() + b"y" * rng.randrange(300))
        if a.no_final_newline and out.endswith(b"\n"):
            out = out[:-1]
        with open(path, "wb") as fh:
            fh.write(out)
    print(f"made {a.count} {a.records} records in {a.files} files under {a.out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--classes", type=int, default=6)
    ap.add_argument("--per-class", type=int, default=60)
    ap.add_argument("--size", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small-class", type=int, default=0, metavar="N")
    ap.add_argument("--records", choices=["svm", "csv", "fixed", "tfrecord", "tar"])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--record-size", type=int, default=64)
    ap.add_argument("--no-final-newline", action="store_true")
    a = ap.parse_args()
    if a.records:
        if a.records == "fixed" and a.record_size < 8:
            ap.error("--record-size must be at least 8 (the id)")
        return make_records(a)
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
