#!/usr/bin/env python3
"""Alternates two `shufflefs` binaries on one host and compares how long the daemons'
exchanges take: `mpirun -np RANKS BIN mount ... --share-disk never` (every sample over MPI),
staging waited out, then EPOCHS + 1 advances, each started only once every rank's exchange
into it ended (the exchange into epoch 1, which runs beside staging, is not counted) (so readers never overlap an exchange and the exchange's own `seconds` in the
status are what is compared). Prints per run the median exchange seconds over ranks and
epochs, then per binary the median of its runs and the ratio to the first binary.

Made to measure what the job view costs inside exchanges (it is ticked whenever
the exchange polls its transport since 6183d25): build the commit before and after, e.g.

    git worktree add /tmp/old a597b20 && (cd /tmp/old && cargo build --release)
    cargo build --release
    python3 benches/exchange_daemon_ab.py 3 /tmp/old/target/release/shufflefs \\
        target/release/shufflefs

Environment: RANKS (4), EPOCHS (4), SAMPLES (4000), BYTES (100000), FRACTION (0.5),
WORK (a scratch folder, default under /tmp; removed at the end).
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

RANKS = int(os.environ.get("RANKS", "4"))
EPOCHS = int(os.environ.get("EPOCHS", "4"))
SAMPLES = int(os.environ.get("SAMPLES", "4000"))
BYTES = int(os.environ.get("BYTES", "100000"))
FRACTION = os.environ.get("FRACTION", "0.5")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def write_source(src):
    classes = 4
    for c in range(classes):
        folder = os.path.join(src, f"c{c}")
        os.makedirs(folder, exist_ok=True)
        for i in range(SAMPLES // classes):
            with open(os.path.join(folder, f"s{i:05}.bin"), "wb") as f:
                f.write(bytes([(i + c) % 251]) * BYTES)


def status(mnt):
    with open(os.path.join(mnt, ".shufflefs", "status")) as f:
        return json.load(f)


def wait_all(mnts, pred, what, limit=600):
    deadline = time.monotonic() + limit
    while True:
        try:
            if all(pred(status(m)) for m in mnts):
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.2)


def exchange(st, target):
    return next((x for x in st.get("exchange", []) if x.get("target_epoch") == target), None)


def ended(st, target):
    x = exchange(st, target)
    return x is not None and x.get("state") in ("done", "failed")


def run(binary, work, src):
    cache, mnt = os.path.join(work, "cache{rank}"), os.path.join(work, "mnt{rank}")
    mnts = [mnt.format(rank=r) for r in range(RANKS)]
    for m in mnts:
        os.makedirs(m, exist_ok=True)
    log = open(os.path.join(work, "job.log"), "w")
    job = subprocess.Popen(
        ["mpirun", "--oversubscribe", "-np", str(RANKS), binary, "mount", "--source", src,
         "--cache", cache, "--seed", "7", "--fraction", FRACTION, "--share-disk", "never",
         mnt],
        stdout=log, stderr=log, env={**os.environ, **MPI_ENV})
    try:
        wait_all(mnts, lambda st: st["staging"]["state"] == "done", "staging")
        seconds = []
        # The exchange into epoch 1 runs beside staging (it starts at mount): not counted.
        for epoch in range(1, EPOCHS + 2):
            wait_all(mnts, lambda st: ended(st, epoch), f"the exchange into {epoch}")
            if epoch > 1:
                seconds += [exchange(status(m), epoch)["seconds"] for m in mnts]
            threads = [threading.Thread(target=os.listdir, args=(os.path.join(m, f"epoch-{epoch}"),))
                       for m in mnts]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return statistics.median(seconds)
    finally:
        for m in mnts:
            subprocess.run([binary, "unmount", m], capture_output=True)
        try:
            job.wait(timeout=120)
        except subprocess.TimeoutExpired:
            job.kill()
        for r in range(RANKS):
            shutil.rmtree(cache.format(rank=r), ignore_errors=True)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rounds, binaries = int(sys.argv[1]), [os.path.abspath(b) for b in sys.argv[2:]]
    work = tempfile.mkdtemp(prefix="sfs-xab-", dir=os.environ.get("WORK"))
    try:
        src = os.path.join(work, "src")
        write_source(src)
        results = {b: [] for b in binaries}
        for r in range(rounds):
            for b in binaries:
                s = run(b, work, src)
                results[b].append(s)
                print(f"round {r + 1} {b}: median exchange {s:.3f} s", flush=True)
        base = statistics.median(results[binaries[0]])
        for b in binaries:
            m = statistics.median(results[b])
            print(f"{b}: median {m:.3f} s over {rounds} runs, {m / base:.3f}x the first")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
