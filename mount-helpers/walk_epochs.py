"""Walks epochs through shufflefs mounts the way a loader does and prints a table per epoch.

    python3 walk_epochs.py [--epochs 3] MOUNT...

Uses torchvision's ImageFolder + DataLoader when torchvision is installed; otherwise lists
each class folder with scandir, reads every file and decodes the PNG with zlib.
"""
import argparse
import os
import struct
import sys
import time
import zlib

import shufflefs


def decode_png(data):
    """Returns (width, height) after checking the image data inflates to the right size."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    assert len(raw) == height * (1 + 3 * width), "truncated image data"
    return width, height


def read_epoch_plain(path):
    files = 0
    nbytes = 0
    for cls in sorted(e.name for e in os.scandir(path) if e.is_dir()):
        for entry in os.scandir(os.path.join(path, cls)):
            entry.stat()
            with open(entry.path, "rb") as f:
                data = f.read()
            decode_png(data)
            files += 1
            nbytes += len(data)
    return files, nbytes


def read_epoch_torch(path):
    import torch
    from torchvision import datasets, transforms

    ds = datasets.ImageFolder(path, transform=transforms.ToTensor(), allow_empty=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=2)
    files = sum(len(y) for _, y in loader)
    nbytes = sum(os.path.getsize(p) for p, _ in ds.samples)
    return files, nbytes


def show_progress(label, measure, unit=""):
    """Polls measure() -> (done, total) until done, as a bar on a terminal, plain lines otherwise."""
    tty = sys.stdout.isatty()
    last = None
    while True:
        done, total = measure()
        if tty:
            width = 30
            fill = width * done // max(total, 1)
            print(f"\r  {label} [{'#' * fill}{'.' * (width - fill)}] {done}/{total}{unit}", end="", flush=True)
        elif done != last:
            print(f"  {label} {done}/{total}{unit}", flush=True)
        last = done
        if done >= total:
            if tty:
                print()
            return
        time.sleep(0.2)


def staging_progress(mounts):
    def measure():
        sts = [shufflefs.status(m)["staging"] for m in mounts]
        return sum(s["files_done"] for s in sts), sum(s["files_total"] for s in sts)

    show_progress("staging", measure, " files")


def exchange_progress(mounts, epoch):
    """Waits for every rank's exchange into `epoch` (running while the previous epoch was read)."""

    def measure():
        done = total = 0
        for m in mounts:
            x = [x for x in shufflefs.status(m)["exchange"] if x["target_epoch"] == epoch]
            if not x:
                return 0, 1
            if x[0]["state"] == "failed":
                raise SystemExit(f"{m}: exchange into epoch {epoch} failed: {x[0]['error']}")
            finished = x[0]["state"] == "done"
            done += x[0]["bytes_to_receive"] if finished else x[0]["bytes_received"]
            total += x[0]["bytes_to_receive"]
        return done // 1000, total // 1000

    show_progress(f"exchange into epoch {epoch}", measure, " kB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("mounts", nargs="+")
    a = ap.parse_args()
    try:
        import torchvision  # noqa: F401

        reader, how = read_epoch_torch, "torchvision ImageFolder + DataLoader(num_workers=2)"
    except ImportError:
        reader, how = read_epoch_plain, "scandir + read + PNG decode (install torchvision for ImageFolder)"
    mounts = sorted(a.mounts)
    for m in mounts:
        shufflefs.wait_ready(m)
    staging_progress(mounts)
    print(f"== walking {a.epochs} epochs on {len(mounts)} ranks with {how}")
    previous = {}
    for epoch in range(a.epochs):
        if epoch:
            exchange_progress(mounts, epoch)
        print(f"\nepoch {epoch}")
        print(f"  {'rank':>4} {'samples':>8} {'moved in':>9} {'exchanged':>10} {'read':>10} {'files/s':>9}")
        for rank, m in enumerate(mounts):
            path = shufflefs.epoch_dir(m, epoch)
            listing = {os.path.join(c, f) for c in os.listdir(path) for f in os.listdir(os.path.join(path, c))}
            moved = len(listing - previous.get(rank, listing))
            st = shufflefs.status(m)
            exch = [x for x in st["exchange"] if x["target_epoch"] == epoch]
            exchanged = exch[0]["bytes_received"] + exch[0]["bytes_sent"] if exch else 0
            t0 = time.perf_counter()
            files, nbytes = reader(path)
            dt = time.perf_counter() - t0
            assert files == len(listing), (files, len(listing))
            share = f"{100.0 * moved / max(len(listing), 1):.0f}%" if epoch else "-"
            print(f"  {rank:>4} {files:>8} {share:>9} {exchanged / 1e6:>8.2f}MB {nbytes / dt / 1e6:>7.1f}MB/s {files / dt:>9.0f}")
            previous[rank] = listing
    total = sum(len(v) for v in previous.values())
    print(f"\n== every epoch covered all {total} samples exactly once across ranks")


if __name__ == "__main__":
    main()
