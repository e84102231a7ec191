#!/usr/bin/env bash
# Installs DLIO (argonne-lcf's dlio-benchmark 2.0.0) beside the loaders of install-python.sh,
# for `mount-helpers/dlio_rank.sh` and `benches/dlio/compare.sh`:
#
#   bash mount-helpers/install-dlio.sh            # into the venv (SHUFFLEFS_VENV)
#   bash mount-helpers/install-dlio.sh DIR        # into DIR only (pip --target); then run
#                                                 # with PYTHONPATH=DIR
#
# dlio-benchmark's metadata requires nvidia-dali-cuda110, which PyPI cannot build here, so it
# is installed with --no-deps plus the requirements it needs to train: mpi4py, hydra-core,
# omegaconf, psutil and the pinned pydftracer 1.0.2 (numpy, pandas, h5py, pyyaml, pillow,
# torch, torchvision and tensorflow come with install-python.sh). Left out: DALI (the `dali`
# data loader and DLIO's TFRecord generator, which runs DALI's `tfrecord2idx`) and torchaudio
# (audio workloads). See docs/dlio.md.
set -euo pipefail
venv=${SHUFFLEFS_VENV:-$HOME/.cache/shufflefs/venv}
pkgs=(dlio-benchmark==2.0.0 pydftracer==1.0.2 mpi4py hydra-core omegaconf antlr4-python3-runtime==4.9.3 psutil)
if [ $# -ge 1 ]; then
    "$venv/bin/pip" install -q --no-deps --target "$1" "${pkgs[@]}"
    PYTHONPATH="$1" "$venv/bin/python" -c "import dlio_benchmark.main"
else
    "$venv/bin/pip" install -q --no-deps "${pkgs[@]}"
    "$venv/bin/python" -c "import dlio_benchmark.main"
fi
echo "install-dlio.sh: dlio_benchmark imports"
