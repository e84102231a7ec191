#!/usr/bin/env bash
# Read-path benchmarks: one shufflefs rank (no MPI) against native reads of the same data,
# measured in the same run. Prints the machine and a Markdown table of medians and ratios.
#
#   bash benches/read_path.sh                 full sizes (about 3 min on 2 cores; ~5 GB and 1.1M files in /tmp)
#   QUICK=1 bash benches/read_path.sh         small sizes, under 2 minutes
#   BENCHES="small scan" bash benches/read_path.sh      a subset (small stream scan ready)
#
# What is measured (details in benches/read_path.py):
#   small   20000 files of 100-120 KiB in 10 classes, read whole in a random order by 4 threads:
#           files/s through MOUNT/epoch-0 vs the same cache files read directly, and the FUSE
#           requests per file (the status's fuse_requests). Targets: warm >= 0.95x, cold >= 0.9x.
#   stream  one 1 GiB file read in 1 MiB reads: MiB/s through the mount vs directly. Target >= 1.0x.
#   scan    torchvision ImageFolder's listing of a 100k-file epoch (os.walk per class, sorted),
#           and the same with os.stat of each sample: time through the mount vs the source
#           tree. Target <= 1.2x.
#   ready   1M empty files in 1000 classes: daemon start until .shufflefs/status answers (the
#           manifest is built before the mount appears) vs `find SRC -type f | wc -l`, cold and
#           warm (target <= 1.2x); daemon peak RSS per sample (target <= 100 B); staging time.
# Cold runs drop the page, dentry and inode caches first (needs root); every measurement runs
# REPS=3 times, alternating which side goes first, and the median is shown.
#
# Knobs: READ_PATHS (--read-path modes for small and stream; default "auto passthrough", auto
# being the default), MOUNT_ARGS (more mount options),
# SHUFFLEFS (binary; default: cargo build --release of this repo), BENCH_DIR
# (/tmp/shufflefs-read-bench), REPS, SMALL_FILES, SMALL_CLASSES, STREAM_BYTES, SCAN_FILES,
# SCAN_CLASSES, READY_FILES, READY_CLASSES, READY_STAGE (1: also time staging of the 1M files),
# READY_STAGE_TIMEOUT (s), KEEP_DATA=1 (keep the generated datasets for the next run).
set -euo pipefail
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh
if [ -z "${SHUFFLEFS:-}" ]; then
  cargo build --release --quiet
  SHUFFLEFS="$PWD/target/release/shufflefs"
  built="built from $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' + uncommitted src changes')"
else
  built="SHUFFLEFS=$SHUFFLEFS"
fi
export SHUFFLEFS
export BENCH_DIR=${BENCH_DIR:-/tmp/shufflefs-read-bench}
if [ "${QUICK:-0}" = 1 ]; then
  export SMALL_FILES=${SMALL_FILES:-2000} STREAM_BYTES=${STREAM_BYTES:-$((128 << 20))}
  export SCAN_FILES=${SCAN_FILES:-10000} READY_FILES=${READY_FILES:-20000}
  export READY_CLASSES=${READY_CLASSES:-100}
fi
cleanup() {
  # Any mount this bench left behind (normally none: the helper unmounts in `finally`).
  for m in "$BENCH_DIR"/*-mnt; do
    if mountpoint -q "$m" 2>/dev/null; then
      "$SHUFFLEFS" unmount "$m" >/dev/null 2>&1 || fusermount3 -u -z "$m" || true
    fi
  done
}
trap cleanup EXIT
mkdir -p "$BENCH_DIR"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r); data on $(df -T "$BENCH_DIR" | awk 'NR==2{print $2}'); $built"
echo "sizes: small ${SMALL_FILES:-20000} files, stream $(( ${STREAM_BYTES:-1073741824} >> 20 )) MiB, scan ${SCAN_FILES:-100000} files, ready ${READY_FILES:-1000000} files"
python3 benches/read_path.py
