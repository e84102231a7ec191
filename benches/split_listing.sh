#!/usr/bin/env bash
# Mount-ready time of a tree of empty files (`--format tree`) on M ranks of this host against
# one `find SRC -type f` over the same tree (the listing split across ranks). For
# each round and each binary (alternated, which goes first swapped every round): fresh caches,
# `find` timed, then `mpirun -np M BIN mount` timed until every rank's `.shufflefs/status`
# answers (the manifest is built before the mount appears, so this is listing + combining +
# start-up), then unmounted; `scan` is rank 0's "source scanned" time from the log (the
# listing and combining alone). Cold rounds drop the page, dentry and inode caches before each
# timed command (needs root); warm rounds run each once untimed first.
#
#   bash benches/split_listing.sh OLD_BIN NEW_BIN            (defaults below)
#   FILES=1000000 TOP=100 MID=10 RANKS=8 ROUNDS=3 TEMPS="cold warm" bash benches/split_listing.sh A B
#
# The tree: TOP folders x MID sub-folders x FILES/(TOP*MID) empty files (made once, kept in
# WORK with KEEP=1). Needs ~60 MB of disk per 10^6 files, and the caches ~30 MB per rank.
set -euo pipefail
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh >/dev/null
old=$(realpath "$1")
new=$(realpath "$2")
files=${FILES:-1000000}
top=${TOP:-100}
mid=${MID:-10}
m=${RANKS:-8}
rounds=${ROUNDS:-3}
temps=${TEMPS:-cold warm}
work=${WORK:-/tmp/shufflefs-split-listing}
mkdir -p "$work"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
src="$work/src"
if [ ! -e "$src/.done" ]; then
  python3 - "$src" "$files" "$top" "$mid" <<'EOF'
import os, sys
src, files, top, mid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
per = files // (top * mid)
for t in range(top):
    for s in range(mid):
        d = os.path.join(src, f"t{t:04d}", f"s{s:04d}")
        os.makedirs(d)
        for i in range(per):
            os.close(os.open(os.path.join(d, f"{i:07d}.bin"), os.O_CREAT | os.O_WRONLY, 0o644))
EOF
  touch "$src/.done"
fi
echo "machine: $(nproc) cores; tree: $(find "$src" -type f | wc -l) files in $top x $mid folders; ranks: $m"

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

time_find() {
  local t0 t1
  t0=$(date +%s.%N)
  find "$src" -type f | wc -l >/dev/null
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}

time_mount() {
  local bin=$1 t0 t1 k job
  rm -rf "$work"/cache* "$work"/mnt*
  for k in $(seq 0 $((m - 1))); do mkdir -p "$work/mnt$k"; done
  t0=$(date +%s.%N)
  mpirun --oversubscribe -np "$m" "$bin" mount --format tree --seed 1 --fraction 0.25 \
    --source "$src" --cache "$work/cache{rank}" "$work/mnt{rank}" >/dev/null 2>"$work/job.log" &
  job=$!
  for k in $(seq 0 $((m - 1))); do
    until [ -e "$work/mnt$k/.shufflefs/status" ]; do
      kill -0 "$job" 2>/dev/null || { cat "$work/job.log" >&2; exit 1; }
      sleep 0.02
    done
  done
  t1=$(date +%s.%N)
  # A clean unmount waits for the epoch-1 exchange the job starts once mounted (minutes for
  # 10^6 files on a loaded VM): the job is killed and its mounts detached instead.
  pkill -KILL -P "$job" 2>/dev/null || true
  kill -KILL "$job" 2>/dev/null || true
  wait "$job" 2>/dev/null || true
  for k in $(seq 0 $((m - 1))); do fusermount3 -uz "$work/mnt$k" 2>/dev/null || true; done
  scan=$(grep -a "source scanned" "$work/job.log" | grep -o 'secs=[0-9.]*' | head -1 | cut -d= -f2)
  echo "$(echo "$t1 - $t0" | bc) ${scan:-?}"
}

for temp in $temps; do
  for r in $(seq "$rounds"); do
    order=("$old" "$new")
    [ $((r % 2)) = 0 ] && order=("$new" "$old")
    line="$temp round $r:"
    for bin in "${order[@]}"; do
      [ "$temp" = warm ] && { time_find >/dev/null; time_mount "$bin" >/dev/null; }
      [ "$temp" = cold ] && drop
      f=$(time_find)
      [ "$temp" = cold ] && drop
      read -r t scan <<<"$(time_mount "$bin")"
      name=old
      [ "$bin" = "$new" ] && name=new
      line="$line $name: find $f s, ready $t s ($(echo "scale=2; $t / $f" | bc)x), scan $scan s;"
    done
    echo "$line"
  done
done
rm -rf "$work"/cache* "$work"/mnt*
