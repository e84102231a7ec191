#!/usr/bin/env bash
# The headline benchmark: epoch time of shufflefs against global shuffling from the
# shared store, local shuffling, mosaicml-streaming and litdata, on the emulated cluster
# (mount-helpers/shufflefs-cluster), every system with the same local disk budget per host.
# Writes OUT/table.md, OUT/epoch_time.png, OUT/results.json and OUT/logs/. Needs root.
#
#   bash benches/epoch_time.sh OUT                       full size: 4 hosts, 16000 x 100 KB,
#                                                        5 epochs, raw and decode loops
#   bash benches/epoch_time.sh OUT --hosts 2 --samples 800 --epochs 3     a small trial
#   bash benches/epoch_time.sh OUT --mode shared ...     hosts sharing one filesystem (no store
#                                                        host: store bytes are not measured)
#   bash benches/epoch_time.sh OUT --store-kind s3 --folder-systems local,shufflefs-q0.3 ...
#                                                        the store as a bucket (s3s-fs or moto on
#                                                        the storage host): rows `SYSTEM (bucket)`
#
# Every option: `bash benches/epoch_time.sh --help`. The release binary is built when missing
# (unless --shufflefs names one).
# Metric definitions: docs/performance.md ("Epoch time against global shuffling, mosaic and
# litdata"). Python: the venv of mount-helpers/install-python.sh (torch, torchvision) plus
# mosaicml-streaming, litdata and matplotlib, installed here without touching torch.
set -euo pipefail
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh >/dev/null
venv=${SHUFFLEFS_VENV:-$HOME/.cache/shufflefs/venv}
py=$venv/bin/python
[ -x "$py" ] || { echo "epoch_time: no venv at $venv (run mount-helpers/install-python.sh)" >&2; exit 2; }
if ! "$py" -c 'import streaming, litdata, matplotlib' 2>/dev/null; then
  # --no-deps: their full requirements would replace numpy (mosaic pins numpy<2.2) and pull
  # cloud SDKs; what they import at run time is listed here
  "$py" -m pip install -q --no-deps mosaicml-streaming==0.13.0 litdata==0.2.76 lightning-utilities \
    matplotlib contourpy cycler fonttools kiwisolver pyparsing boto3 botocore jmespath s3transfer \
    brotli "xxhash<4" zstd python-snappy cramjam tqdm catalogue obstore tifffile \
    "transformers<5" "huggingface_hub<1" "tokenizers==0.22.2" safetensors regex hf-xet
fi
# --shufflefs BIN: another binary (e.g. a checkout's release build) and nothing is built here
case " $* " in *" --shufflefs "*|*" --shufflefs="*) ;; *) [ -x target/release/shufflefs ] || cargo build --release ;; esac
exec "$py" benches/epoch_time.py "$@"
