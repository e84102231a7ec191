#!/usr/bin/env bash
# A/B of two shufflefs binaries on warm small-file reads, alternated on the same data, for
# changes smaller than this machine's run-to-run noise (which moves read_path.sh's absolute
# rates by 2x between runs).
#
#   bash benches/ab_small_warm.sh OLD_BINARY NEW_BINARY [ROUNDS] [EXTRA MOUNT ARGS...]
#
# Uses read_path.sh's small-file tree (run `BENCHES=small KEEP_DATA=1 bash
# benches/read_path.sh` once first). Each round mounts each binary in turn on a fresh cache,
# waits for staging, reads every file once to warm up, then reads all files with 4 threads
# in a random order for 5 s and prints files/s.
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 rounds=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
work=${BENCH_DIR:-/tmp/shufflefs-read-bench}
src=$work/small-src mnt=$work/ab-mnt cache=$work/ab-cache
[ -d "$src" ] || { echo "no $src: run BENCHES=small KEEP_DATA=1 bash benches/read_path.sh first" >&2; exit 2; }
mkdir -p "$mnt"
echo "machine: $(nproc) cores, $(uname -r); old=$old new=$new; extra args: $*"
for r in $(seq "$rounds"); do
  for which in old new; do
    bin=${!which}
    "$bin" mount --source "$src" --cache "$cache" --reset-cache --seed 1 "$@" "$mnt" >/dev/null
    rate=$(python3 - "$mnt" <<'PY'
import json, os, random, sys, threading, time
mnt = sys.argv[1]
while json.load(open(os.path.join(mnt, ".shufflefs/status")))["staging"]["state"] != "done":
    time.sleep(0.2)
root = os.path.join(mnt, "epoch-0")
paths = [os.path.join(root, c, f) for c in sorted(os.listdir(root)) for f in sorted(os.listdir(os.path.join(root, c)))]
random.seed(1)
random.shuffle(paths)
def read(ps):
    view = memoryview(bytearray(1 << 20))
    for p in ps:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(view):
                pass
read(paths)
t0, n = time.perf_counter(), 0
while time.perf_counter() - t0 < 5:
    ts = [threading.Thread(target=read, args=(paths[i::4],)) for i in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    n += len(paths)
print(f"{n / (time.perf_counter() - t0):.0f}")
PY
)
    "$bin" unmount "$mnt" >/dev/null
    echo "round $r $which: $rate files/s"
  done
done
