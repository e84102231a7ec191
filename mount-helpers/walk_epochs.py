"""Walks epochs through shufflefs mounts the way a loader does and prints a table per epoch.

    python3 walk_epochs.py [--epochs 3] [--plot FILE.png] MOUNT...

Uses torchvision's ImageFolder + DataLoader when torchvision is installed; otherwise lists
each class folder with scandir, reads every file and decodes the PNG with zlib.

Before each epoch it shows the exchange into it (one progress line for the job) and then what
moved into every rank's view and how: handed over on this host's disk (a peer's cached file
taken over, no byte on the network), sent over MPI within a host or across hosts (the
network), or fetched from the source; and how many bytes the source was read for. `--plot`
draws the per-epoch read rates and these shares (matplotlib).
"""
import argparse
import json
import os
import struct
import sys
import time
import zlib

import shufflefs
from shufflefs import progress


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


def staging_progress(mounts):
    progress.watch_staging(mounts, sys.stdout)


def exchange_progress(mounts, epoch):
    """Waits for every rank's exchange into `epoch` (running while the previous epoch was
    read), showing one line for the job: bytes received, disk hand-offs included."""
    line = progress.Line(sys.stdout, f"exchange into epoch {epoch}")
    while True:
        sts = [shufflefs.status(m) for m in mounts]
        xs = [[x for x in s["exchange"] if x["target_epoch"] == epoch] for s in sts]
        for m, x in zip(mounts, xs):
            if x and x[0]["state"] == "failed":
                raise SystemExit(f"{m}: exchange into epoch {epoch} failed: {x[0]['error']}")
        finished = all(x and x[0]["state"] == "done" for x in xs)
        pairs = [progress.exchange_bytes(s, epoch) for s in sts]
        line.update(sum(p[0] for p in pairs), sum(p[1] for p in pairs), len(sts), finished)
        if finished:
            return
        time.sleep(0.2)


def source_bytes(st):
    """Bytes this rank copied from the source so far (`cache.fetched_bytes_from_source`;
    estimated from the sample count on daemons without it)."""
    cache = st["cache"]
    if "fetched_bytes_from_source" in cache:
        return cache["fetched_bytes_from_source"]
    mean = st["share_bytes"] / st["share_samples"] if st.get("share_samples") else 0
    return int(cache["fetched_from_source"] * mean)


def moved_into(st, epoch):
    """What came into this rank's view of `epoch`, by way: {way: [samples, bytes]}. Told from
    the exchange's totals less its disk hand-offs: `--exchange coded` fills only the totals
    (its packets come from the server, not from peers); its samples came across hosts when
    any of its bytes did."""
    ways = {"disk": [0, 0], "mpi, same host": [0, 0], "network": [0, 0], "source": [0, 0]}
    for x in st["exchange"]:
        if x["target_epoch"] != epoch:
            continue
        peers = x.get("peers") or []
        disk = [p for p in peers if p["via"] == "disk"]
        disk_n = sum(p["samples_received"] for p in disk)
        disk_b = sum(p["bytes_received"] for p in disk)
        mpi_n = max(0, x["samples_received"] - disk_n)
        mpi_b = max(0, x["bytes_received"] - disk_b)
        across_b = x.get("bytes_across_hosts", 0)
        if peers:
            across_n = sum(p["samples_received"] for p in peers
                           if p["via"] != "disk" and not p["same_host"])
        else:
            across_n = mpi_n if across_b else 0
        ways["disk"][0] += disk_n
        ways["disk"][1] += disk_b
        ways["network"][0] += across_n
        ways["network"][1] += across_b
        ways["mpi, same host"][0] += mpi_n - across_n
        ways["mpi, same host"][1] += max(0, mpi_b - across_b)
        ways["source"][0] += sum(p["fetched_from_source"] for p in peers)
    return ways


def print_moved(epoch, sts, read_from_source, dataset_bytes):
    """One line per way for the job: what moved into `epoch`, and what the source gave."""
    ways = {}
    for st in sts:
        for way, (n, b) in moved_into(st, epoch).items():
            ways.setdefault(way, [0, 0])
            ways[way][0] += n
            ways[way][1] += b
    h = progress.human_bytes
    moved = ", ".join(f"{n} samples ({h(b)}) {label}" for way, label in (
        ("disk", "handed over on this host's disk"),
        ("mpi, same host", "over MPI within a host"),
        ("network", "over the network"),
    ) for n, b in [ways[way]] if n or way != "mpi, same host")
    print(f"  moved in: {moved}; {ways['source'][0]} fetched from the source instead")
    print(f"  the source was read for {h(read_from_source)} "
          f"(reading the whole dataset again every epoch: {h(dataset_bytes)})")
    return ways


def plot(path, epochs):
    """Two panels: each rank's read rate per epoch, and how each epoch's views were filled."""
    try:
        import matplotlib
    except ImportError:
        print("== no plot: matplotlib is not installed (pip install matplotlib)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rates, shares, source) = plt.subplots(1, 3, figsize=(14, 4.2))
    xs = [e["epoch"] for e in epochs]
    for r in range(len(epochs[0]["rates"])):
        rates.plot(xs, [e["rates"][r] / 1e6 for e in epochs], marker="o", label=f"rank {r}")
    rates.set(title="read rate per rank", xlabel="epoch", ylabel="MB/s", xticks=xs)
    rates.legend(fontsize="small")
    bottom = [0.0] * len(xs)
    for key, label in (("kept", "kept in place"), ("disk", "disk hand-off (same host)"),
                       ("mpi, same host", "MPI within a host"), ("network", "network (other hosts)"),
                       ("source", "from the source")):
        vals = [100.0 * e["shares"][key] / max(e["samples"], 1) for e in epochs]
        shares.bar(xs, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    shares.set(title="how each epoch's views were filled", xlabel="epoch", ylabel="% of samples",
               xticks=xs, ylim=(0, 100))
    shares.legend(fontsize="small", loc="lower right")
    scale, unit = (1e6, "MB") if epochs[0]["dataset_bytes"] >= 1e7 else (1e3, "kB")
    source.bar(xs, [e["source_bytes"] / scale for e in epochs], label="read from the source")
    source.axhline(epochs[0]["dataset_bytes"] / scale, color="grey", linestyle="--",
                   label="the whole dataset")
    source.set(title="bytes read from the source", xlabel="epoch", ylabel=unit, xticks=xs)
    source.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"== plot: {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--plot", metavar="FILE.png", help="draw read rates and moved shares per epoch")
    ap.add_argument("--json", metavar="FILE", help="write the per-epoch numbers as JSON")
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
    previous, epochs, read_before = {}, [], 0
    dataset_bytes = sum(shufflefs.status(m)["staging"]["bytes_total"] for m in mounts)
    for epoch in range(a.epochs):
        if epoch:
            exchange_progress(mounts, epoch)
        print(f"\nepoch {epoch}")
        sts = [shufflefs.status(m) for m in mounts]
        read_now = sum(source_bytes(st) for st in sts)
        if epoch:
            ways = print_moved(epoch, sts, read_now - read_before, dataset_bytes)
        else:
            ways = {"source": [sum(st["staging"]["files_done"] for st in sts), 0]}
            print(f"  staged: the source was read for {progress.human_bytes(read_now)} "
                  f"(the dataset: {progress.human_bytes(dataset_bytes)})")
        print(f"  {'rank':>4} {'samples':>8} {'moved in':>9} {'received':>10} {'read':>10} {'files/s':>9}")
        row = {"epoch": epoch, "rates": [], "samples": 0, "source_bytes": read_now - read_before,
               "dataset_bytes": dataset_bytes}
        read_before = read_now
        kept = 0
        for rank, m in enumerate(mounts):
            path = shufflefs.epoch_dir(m, epoch)
            listing = {os.path.join(c, f) for c in os.listdir(path) for f in os.listdir(os.path.join(path, c))}
            moved = len(listing - previous.get(rank, listing))
            kept += len(listing) - moved if epoch else 0
            exch = [x for x in sts[rank]["exchange"] if x["target_epoch"] == epoch]
            received = exch[0]["bytes_received"] if exch else 0
            t0 = time.perf_counter()
            files, nbytes = reader(path)
            dt = time.perf_counter() - t0
            assert files == len(listing), (files, len(listing))
            share = f"{100.0 * moved / max(len(listing), 1):.0f}%" if epoch else "-"
            print(f"  {rank:>4} {files:>8} {share:>9} {received / 1e6:>8.2f}MB {nbytes / dt / 1e6:>7.1f}MB/s {files / dt:>9.0f}")
            previous[rank] = listing
            row["rates"].append(nbytes / dt)
            row["samples"] += files
        row["shares"] = {w: ways.get(w, [0, 0])[0] for w in ("disk", "mpi, same host", "network", "source")}
        row["shares"]["kept"] = kept
        epochs.append(row)
    total = sum(len(v) for v in previous.values())
    spared = dataset_bytes * a.epochs - sum(e["source_bytes"] for e in epochs)
    print(f"\n== every epoch covered all {total} samples exactly once across ranks")
    print(f"== the source was read for {progress.human_bytes(sum(e['source_bytes'] for e in epochs))} "
          f"in {a.epochs} epochs; reading it every epoch would have been "
          f"{progress.human_bytes(dataset_bytes * a.epochs)} ({progress.human_bytes(spared)} spared)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(epochs, f, indent=1)
    if a.plot:
        plot(a.plot, epochs)


if __name__ == "__main__":
    main()
