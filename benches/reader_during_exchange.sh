#!/usr/bin/env bash
# How much a reader walking epoch-N slows while the exchange into N+1 runs, with the default
# settings (Q=0.3, uncapped) or EXCHANGE_RATE=bytes/s. 4 ranks under mpirun on this machine,
# so by default the exchange moves samples through the shared disk (hard links);
# SHARE_DISK=never moves them through MPI as ranks on different hosts would.
#
#   bash benches/reader_during_exchange.sh      (FILES=24000 x 100 KB by default)
#   SHARE_DISK=never bash benches/reader_during_exchange.sh
#
# The job is started once to stage the caches, then restarted on the warm caches: the restart
# runs the exchange into epoch 1 at once, with no staging, while rank 0's reader walks epoch-0
# (4 threads, page cache dropped first). The same walk after the exchange is the baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh
cargo build --release --quiet
export SHUFFLEFS="$PWD/target/release/shufflefs"
work=${BENCH_DIR:-/tmp/shufflefs-reader-bench}
files=${FILES:-24000}
rm -rf "$work"; mkdir -p "$work/src"
python3 - "$work/src" "$files" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"c{i % 16:02d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"{i:06d}.bin"), "wb") as f:
        f.write(os.urandom(100_000))
PY
extra=(--share-disk "${SHARE_DISK:-auto}"); [ -n "${EXCHANGE_RATE:-}" ] && extra+=(--exchange-rate "$EXCHANGE_RATE")
launch() {
  mount-helpers/shufflefs-launch --np 4 --job "$work/job" -- --source "$work/src" \
    --cache "$work/cache-{rank}" --seed 1 "${extra[@]}" "$work/mnt-{rank}" >/dev/null
}
trap 'mount-helpers/shufflefs-teardown --job "$work/job" >/dev/null 2>&1 || true' EXIT
launch
python3 - "$work" <<'PY'
import sys, time; sys.path.insert(0, "mount-helpers"); import shufflefs
for r in range(4):
    m = f"{sys.argv[1]}/mnt-{r}"
    shufflefs.wait_ready(m, staged=True)
    while not any(x["target_epoch"] == 1 and x["state"] == "done" for x in shufflefs.status(m)["exchange"]):
        time.sleep(0.1)
PY
mount-helpers/shufflefs-teardown --job "$work/job" >/dev/null
sync
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r); $files x 100 KB, 4 ranks, Q=0.3 ${EXCHANGE_RATE:+rate $EXCHANGE_RATE B/s}"
launch
python3 - "$work/mnt-0" <<'PY'
import os, sys, threading, time
sys.path.insert(0, "mount-helpers"); import shufflefs
mount = sys.argv[1]
def drop_caches():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        print("(cannot drop the page cache: not root; walks may be warm)")
def walk(limit_s=None):
    path = os.path.join(mount, "epoch-0")
    files = [os.path.join(path, c, f) for c in sorted(os.listdir(path)) for f in sorted(os.listdir(os.path.join(path, c)))]
    idx, lock, count = [0], threading.Lock(), [0]
    def worker():
        while True:
            with lock:
                i = idx[0]; idx[0] += 1
            if i >= len(files):
                return
            with open(files[i], "rb") as f:
                while f.read(1 << 20):
                    pass
            with lock:
                count[0] += 1
    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(4)]
    [t.start() for t in ts]; [t.join() for t in ts]
    return count[0] / (time.perf_counter() - t0), time.perf_counter() - t0
def exchange_state():
    x = [x for x in shufflefs.status(mount)["exchange"] if x["target_epoch"] == 1]
    return x[0] if x else None
drop_caches()
# Sample the exchange's state during the walk: the share of samples that saw it running.
samples, stop = [], threading.Event()
def sampler():
    while not stop.is_set():
        samples.append(exchange_state()["state"] == "running")
        time.sleep(0.02)
st = threading.Thread(target=sampler); st.start()
busy, busy_s = walk()
stop.set(); st.join()
while exchange_state()["state"] != "done":
    time.sleep(0.1)
ex = exchange_state()
drop_caches()
idle, idle_s = walk()
overlap = sum(samples) / max(len(samples), 1)
print(f"| reader during exchange | {busy:.0f} files/s ({busy_s:.2f} s) |")
print(f"| reader after exchange  | {idle:.0f} files/s ({idle_s:.2f} s) |")
print(f"| ratio                  | {busy / idle:.2f}x |")
print(f"| exchange               | {ex['bytes_sent'] / 1e6:.0f} MB sent, {ex['bytes_received'] / 1e6:.0f} MB received in {ex['seconds']:.2f} s; running during {100 * overlap:.0f}% of the walk |")
PY
