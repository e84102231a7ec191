#!/usr/bin/env bash
# Makes a Python venv with the real loaders (torch, torchvision, tensorflow-cpu, pillow; for
# record sources scikit-learn, pandas and webdataset) when
# missing, and exports SHUFFLEFS_PYTHON=its python. Sourced by tests/run.sh and demo.sh.
#
# The venv lives outside the checkout (SHUFFLEFS_VENV, default ~/.cache/shufflefs/venv) so a
# fresh clone reuses it: PyPI's torch wheel pulls CUDA libraries (about 5 GB, a few minutes;
# it runs on CPU). Set SHUFFLEFS_NO_LOADERS=1 to skip the install (loader tests then skip,
# unless SHUFFLEFS_REQUIRE_LOADERS=1 makes that a failure).
venv=${SHUFFLEFS_VENV:-$HOME/.cache/shufflefs/venv}
loaders_ok() {
  "$venv/bin/python" -c "import torch, torchvision, tensorflow, PIL, sklearn, pandas, webdataset" >/dev/null 2>&1
}
if [ "${SHUFFLEFS_NO_LOADERS:-0}" != 1 ] && ! loaders_ok; then
  echo "== installing torch, torchvision, tensorflow-cpu, pillow, scikit-learn, pandas, webdataset into $venv (about 5 GB, once)"
  if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
  fi
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q torch torchvision tensorflow-cpu pillow scikit-learn pandas webdataset
  loaders_ok || { echo "install-python.sh: the loaders in $venv do not import" >&2; return 1 2>/dev/null || exit 1; }
fi
# The S3-compatible test server of the s3:// source tests (tests/mpi/s3_mpi.rs): moto's,
# pure-Python wheels (about a minute), into the same venv.
if [ "${SHUFFLEFS_NO_LOADERS:-0}" != 1 ] && [ -x "$venv/bin/python" ] \
  && ! "$venv/bin/python" -c "import moto.server, boto3" >/dev/null 2>&1; then
  echo "== installing moto[server] (the S3 test server) into $venv"
  "$venv/bin/pip" install -q 'moto[server]' \
    || { echo "install-python.sh: moto[server] did not install" >&2; return 1 2>/dev/null || exit 1; }
fi
# Python's Prometheus client: its text parser checks the metrics (tests/mpi/jobview_mpi.rs).
if [ "${SHUFFLEFS_NO_LOADERS:-0}" != 1 ] && [ -x "$venv/bin/python" ] \
  && ! "$venv/bin/python" -c "import prometheus_client" >/dev/null 2>&1; then
  echo "== installing prometheus-client (the metrics test's parser) into $venv"
  "$venv/bin/pip" install -q prometheus-client \
    || { echo "install-python.sh: prometheus-client did not install" >&2; return 1 2>/dev/null || exit 1; }
fi
if loaders_ok; then
  export SHUFFLEFS_PYTHON="$venv/bin/python"
fi
# TensorFlow's start-up chatter (no GPU, oneDNN notes) is noise here.
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
