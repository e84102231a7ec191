#!/usr/bin/env bash
# End-to-end demo on a fresh machine: installs what is missing, builds, makes a small dataset
# of real PNG images, starts 4 ranks with Q=0.3, walks 3 epochs through the mounts with
# torchvision's ImageFolder + DataLoader (decoding every image), prints a table per epoch, then
# unmounts and leaves nothing running. Staging and each exchange show progress; each epoch
# says what moved into the ranks' views and how (on one host: handed over on the disk, no
# network), and what the source was read for; the daemons' log has one line per rank and
# epoch; the end is a plot of per-epoch read rates and moved shares (DEMO_DIR/epochs.png).
#
#   bash mount-helpers/demo.sh            (DEMO_DIR=/tmp/shufflefs-demo by default;
#                                         SHUFFLEFS=/path/to/shufflefs skips the build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
work=${DEMO_DIR:-/tmp/shufflefs-demo}
np=${DEMO_RANKS:-4}

source "$here/install-deps.sh"
source "$here/install-python.sh"
py=${SHUFFLEFS_PYTHON:-python3}
if [ -z "${SHUFFLEFS:-}" ]; then
  echo "== building shufflefs (release)"
  (cd "$root" && cargo build --release --quiet)
  export SHUFFLEFS="$root/target/release/shufflefs"
fi

rm -rf "$work"; mkdir -p "$work"
echo "== making a dataset of PNG images in $work/dataset"
python3 "$here/make_dataset.py" "$work/dataset" --classes 6 --per-class 60 --size 48

job="$work/job"
cleanup() { "$here/shufflefs-teardown" --job "$job" >/dev/null 2>&1 || true; }
trap cleanup EXIT
echo "== starting $np ranks (mpirun) with --fraction 0.3"
"$here/shufflefs-launch" --np "$np" --job "$job" -- \
  --source "$work/dataset" --cache "$work/cache-{rank}" --fraction 0.3 --seed 42 "$work/mnt-{rank}"

"$py" "$here/walk_epochs.py" --epochs 3 --plot "$work/epochs.png" "$work"/mnt-*
echo "== the daemons' log: what each epoch advance moved, per rank"
grep -h "epoch advanced" "$job.log" | sed 's/^.*epoch advanced /  /' || true

echo "== unmounting"
"$here/shufflefs-teardown" --job "$job"
trap - EXIT
left=$(grep -c " $work" /proc/self/mounts || true)
echo "== done: $left mounts left, $(pgrep -f "$SHUFFLEFS mount" | wc -l) daemons running"
