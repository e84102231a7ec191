#!/usr/bin/env bash
# Runs DLIO (dlio-benchmark 2.0) on this rank's shufflefs view, as one DLIO process per rank.
#
#   mpirun -np M mount-helpers/dlio_rank.sh --mount '/mnt/sfs-{rank}' [--epoch N] -- \
#       workload=unet3d_h100 ++workload.train.epochs=3 ...
#
# DLIO splits its file list across the ranks of its MPI world. A view already holds only this
# rank's share, so DLIO must not split it again: each DLIO process here runs in a world of one
# (the launcher's MPI variables are removed before it starts, so mpi4py starts a singleton),
# reads MOUNT/epoch-N (default: the current epoch) as its data folder, and is told the view's
# number of files (`++workload.dataset.num_files_train`, from the mount's status). Mount with
# `--format tree` (DLIO's data folder is flat: train/*.npz) and `--equal-shares drop`, so every
# rank reads as many files and runs as many steps. DLIO's output goes to OUT/rank-R (--output,
# default ./dlio-output), one summary.json per rank; its figures are per rank.
set -euo pipefail

mount_tpl="" epoch="" out="./dlio-output" python="${PYTHON:-python3}"
while [ $# -gt 0 ]; do
    case "$1" in
        --mount) mount_tpl="$2"; shift 2 ;;
        --epoch) epoch="$2"; shift 2 ;;
        --output) out="$2"; shift 2 ;;
        --) shift; break ;;
        *) echo "dlio_rank.sh: unknown option $1 (options: --mount TEMPLATE [--epoch N] [--output DIR] -- DLIO ARGS)" >&2; exit 2 ;;
    esac
done
[ -n "$mount_tpl" ] || { echo "dlio_rank.sh: --mount '/path/mnt-{rank}' is required" >&2; exit 2; }
rank="${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-${RANK:-}}}}"
[ -n "$rank" ] || { echo "dlio_rank.sh: no rank found (run me under mpirun or srun)" >&2; exit 2; }
mount="${mount_tpl//\{rank\}/$rank}"
status="$mount/.shufflefs/status"
[ -r "$status" ] || { echo "dlio_rank.sh: $status is not readable; is $mount a shufflefs mount?" >&2; exit 2; }
if [ -z "$epoch" ]; then epoch="$(cat "$mount/.shufflefs/epoch")"; fi
view="$mount/epoch-$epoch"
files="$(find "$view/train" -type f | wc -l)"
[ "$files" -gt 0 ] || { echo "dlio_rank.sh: $view/train holds no files (DLIO reads DATA/train/)" >&2; exit 2; }
# A world of one for DLIO: without the launcher's variables mpi4py starts a singleton.
for v in $(env | grep -o '^\(OMPI\|PMIX\|PRTE\|OPAL\|SLURM\)_[A-Za-z0-9_]*' || true); do unset "$v"; done
exec "$python" -m dlio_benchmark.main "$@" \
    "++workload.dataset.data_folder=$view" \
    "++workload.dataset.num_files_train=$files" \
    "++workload.workflow.generate_data=False" \
    "++workload.output.folder=$out/rank-$rank" \
    "hydra.run.dir=$out/rank-$rank/hydra"
