#!/usr/bin/env bash
# Start-up time against the number of ranks, all on this host (oversubscribed): the seconds
# from `mpirun -np M shufflefs mount` to every rank's status file answering, on a tiny
# dataset (4 classes x 65 files of ~3 KB), so what grows with M is the launcher, the
# start-up agreements and the mounts, not the data. Each M runs ROUNDS times on fresh caches.
#
#   bash benches/startup_ranks.sh [BINARY] [RANKS...]     (default: target/debug/shufflefs 8 16 32)
#   ROUNDS=3 bash benches/startup_ranks.sh target/release/shufflefs 8 16 32 64
set -euo pipefail
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh >/dev/null
bin=$(realpath "${1:-target/debug/shufflefs}")
shift || true
[ $# -gt 0 ] && ranks=("$@") || ranks=(8 16 32)
rounds=${ROUNDS:-3}
work=$(mktemp -d /tmp/shufflefs-startup.XXXXXX)
trap 'rm -rf "$work"' EXIT
for c in 0 1 2 3; do
  mkdir -p "$work/src/class$c"
  for i in $(seq -w 0 64); do head -c $((40 + 10#$i * 97)) /dev/urandom >"$work/src/class$c/s$i.bin"; done
done
echo "machine: $(nproc) cores; binary: $bin"
for m in "${ranks[@]}"; do
  times=()
  for r in $(seq "$rounds"); do
    rm -rf "$work"/cache* "$work"/mnt*
    for k in $(seq 0 $((m - 1))); do mkdir -p "$work/mnt$k"; done
    start=$(date +%s.%N)
    mpirun --oversubscribe -np "$m" "$bin" mount --seed 1 --fraction 0.25 --source "$work/src" \
      --cache "$work/cache{rank}" "$work/mnt{rank}" >/dev/null 2>"$work/job.log" &
    job=$!
    for k in $(seq 0 $((m - 1))); do
      until [ -e "$work/mnt$k/.shufflefs/status" ]; do
        kill -0 "$job" 2>/dev/null || { cat "$work/job.log" >&2; exit 1; }
        sleep 0.05
      done
    done
    end=$(date +%s.%N)
    times+=("$(echo "$end - $start" | bc)")
    for k in $(seq 0 $((m - 1))); do "$bin" unmount "$work/mnt$k" >/dev/null 2>&1 & done
    wait
  done
  echo "ranks $m: mounted in ${times[*]} s"
done
