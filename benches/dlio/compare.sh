#!/usr/bin/env bash
# DLIO (dlio-benchmark 2.0) on a native folder and on shufflefs views of it, in one run.
#
#   bash benches/dlio/compare.sh DATA WORK RANKS EPOCH_VIEW -- DLIO ARGS...
#
# DATA: a DLIO data folder (DATA/train/*) made by DLIO's own generate step. WORK: scratch
# folder (caches, mounts, outputs). First `mpirun -np RANKS` DLIO on DATA (DLIO splits the
# files across its ranks), then RANKS shufflefs ranks mount DATA (`--format tree
# --equal-shares drop`) and `mpirun -np RANKS mount-helpers/dlio_rank.sh` runs one DLIO per
# rank on its own view (no second split). Prints DLIO's own figures for both: throughput per
# epoch summed over the ranks, and accelerator utilisation (AU) averaged over them.
# Needs PYTHON (a python with dlio_benchmark importable) and SHUFFLEFS (the binary).
set -euo pipefail
data="$1" work="$2" ranks="$3"; shift 4
[ "${1:-}" = "--" ] && shift
here="$(cd "$(dirname "$0")/../.." && pwd)"
py="${PYTHON:-python3}" sfs="${SHUFFLEFS:-$here/target/release/shufflefs}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=3
mkdir -p "$work"
mpirun --oversubscribe -np "$ranks" -x PYTHONPATH -x TF_CPP_MIN_LOG_LEVEL "$py" -m dlio_benchmark.main "$@" \
    ++workload.workflow.generate_data=False "++workload.dataset.data_folder=$data" \
    "++workload.output.folder=$work/native" "hydra.run.dir=$work/native/hydra" > "$work/native.log" 2>&1
for r in $(seq 0 $((ranks - 1))); do mkdir -p "$work/mnt$r"; done
mpirun --oversubscribe -np "$ranks" "$sfs" mount --format tree --equal-shares drop --source "$data" \
    --cache "$work/cache{rank}" "$work/mnt{rank}" > "$work/mount.log" 2>&1 &
for r in $(seq 0 $((ranks - 1))); do
    until grep -q '"state": "done"' "$work/mnt$r/.shufflefs/status" 2>/dev/null; do sleep 0.2; done
done
PYTHON="$py" mpirun --oversubscribe -np "$ranks" -x PYTHONPATH -x TF_CPP_MIN_LOG_LEVEL -x PYTHON \
    "$here/mount-helpers/dlio_rank.sh" --mount "$work/mnt{rank}" --output "$work/view" -- "$@" \
    > "$work/view.log" 2>&1
for r in $(seq 0 $((ranks - 1))); do "$sfs" unmount "$work/mnt$r"; done
wait
"$py" - "$work" "$ranks" <<'PY'
import json, sys
work, ranks = sys.argv[1], int(sys.argv[2])
native = json.load(open(f"{work}/native/summary.json"))["metric"]
views = [json.load(open(f"{work}/view/rank-{r}/summary.json")) for r in range(ranks)]
tput = [sum(v["metric"]["train_throughput_samples_per_second"][e] for v in views)
        for e in range(len(native["train_throughput_samples_per_second"]))]
au = [sum(v["metric"]["train_au_percentage"][e] for v in views) / ranks
      for e in range(len(tput))]
files = [v["num_files_train"] for v in views]
print(f"| epoch | native samples/s | view samples/s | native AU % | view AU % |")
print(f"|---|---|---|---|---|")
for e in range(len(tput)):
    print(f"| {e + 1} | {native['train_throughput_samples_per_second'][e]:.1f} | {tput[e]:.1f} "
          f"| {native['train_au_percentage'][e]:.1f} | {au[e]:.1f} |")
print(f"files per rank on the views: {files}")
PY
