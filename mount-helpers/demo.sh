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
#
# Refuses to start while an earlier demo in DEMO_DIR still runs (its launcher alive, or a
# mount under DEMO_DIR), naming the teardown to run; Ctrl-C ends it at any point.
set -euo pipefail
# Ctrl-C ends the demo at once (the EXIT trap below then stops what it started). Without a
# trap of its own bash goes on after a child that catches SIGINT and exits normally, as
# Python does while it imports the loaders in the first seconds: the Ctrl-C was lost.
trap 'echo "== interrupted" >&2; exit 130' INT TERM
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
work=$(realpath -m "${DEMO_DIR:-/tmp/shufflefs-demo}")
np=${DEMO_RANKS:-4}
job="$work/job"

# An earlier demo in this folder that still runs (stopped with Ctrl-Z, its terminal closed):
# starting over would remove its live caches and dataset under its daemons. Its launcher
# (from its job file) still alive, or a mount under the folder, is one.
earlier_demo() {
  local pid mounts
  pid=$(sed -n 's/^launcher_pid=\([0-9][0-9]*\)$/\1/p' "$job" 2>/dev/null | head -1)
  mounts=$(awk -v w="$work/" 'index($2, w) == 1 { printf " %s", $2 }' /proc/self/mounts)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    echo "launcher $pid${mounts:+, mounts$mounts}"
  elif [ -n "$mounts" ]; then
    echo "mounts$mounts"
  else
    return 1
  fi
}
if running=$(earlier_demo); then
  echo "demo.sh: an earlier demo still runs in $work ($running); stop it first with" \
    "$here/shufflefs-teardown --job $job (or run this one elsewhere: DEMO_DIR=/another/folder)" >&2
  exit 1
fi

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

cleanup() { "$here/shufflefs-teardown" --job "$job" >/dev/null 2>&1 || true; }
trap cleanup EXIT
echo "== starting $np ranks (mpirun) with --fraction 0.3"
"$here/shufflefs-launch" --np "$np" --job "$job" -- \
  --source "$work/dataset" --cache "$work/cache-{rank}" --fraction 0.3 --seed 42 "$work/mnt-{rank}"

"$py" "$here/walk_epochs.py" --epochs 3 --plot "$work/epochs.png" "$work"/mnt-*
echo "== the daemons' log: what each epoch advance moved, per rank"
grep -h "epoch advanced" "$job.log" | sed 's/^.*epoch advanced /  /' || true

# This job's daemons (rank 0's ready record names each rank's pid): the last line counts
# them, not every shufflefs daemon on the machine (another user's, another job's).
daemons=$(python3 -c 'import json, sys; print(*(r["pid"] for r in json.load(open(sys.argv[1]))["ranks"]))' "$job.ready" 2>/dev/null || true)
echo "== unmounting"
"$here/shufflefs-teardown" --job "$job"
trap - EXIT
left=$(awk -v w="$work/" 'index($2, w) == 1' /proc/self/mounts | wc -l)
alive() {
  local n=0 pid
  for pid in $daemons; do
    if kill -0 "$pid" 2>/dev/null; then n=$((n + 1)); fi
  done
  echo "$n"
}
# mpirun may exit a moment before its ranks' processes are gone.
for _ in $(seq 50); do
  running=$(alive)
  [ "$running" = 0 ] && break
  sleep 0.2
done
echo "== done: $left mounts left, $running of this demo's daemons running"
