#!/usr/bin/env bash
# Makes a Python venv with the real loaders (torch, torchvision, tensorflow-cpu, pillow; for
# record sources scikit-learn, pandas and webdataset; matplotlib for the demo's plot) and
# this checkout's package (python/) when missing, and exports SHUFFLEFS_PYTHON=its python.
# Sourced by tests/run.sh and demo.sh.
#
# The venv lives outside the checkout (SHUFFLEFS_VENV, default ~/.cache/shufflefs/venv) so a
# fresh clone reuses it: PyPI's torch wheel pulls CUDA libraries (about 5 GB, a few minutes;
# it runs on CPU). Set SHUFFLEFS_NO_LOADERS=1 to skip the install (loader tests then skip,
# unless SHUFFLEFS_REQUIRE_LOADERS=1 makes that a failure). SHUFFLEFS_PACKAGE_ONLY=1 installs
# only the package into SHUFFLEFS_VENV (an existing venv), offline when it can build it.
venv=${SHUFFLEFS_VENV:-$HOME/.cache/shufflefs/venv}
loaders_ok() {
  "$venv/bin/python" -c "import torch, torchvision, tensorflow, PIL, sklearn, pandas, webdataset" >/dev/null 2>&1
}
if [ "${SHUFFLEFS_PACKAGE_ONLY:-0}" != 1 ] && [ "${SHUFFLEFS_NO_LOADERS:-0}" != 1 ] && ! loaders_ok; then
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
if [ "${SHUFFLEFS_PACKAGE_ONLY:-0}" != 1 ] && [ "${SHUFFLEFS_NO_LOADERS:-0}" != 1 ] && [ -x "$venv/bin/python" ] \
  && ! "$venv/bin/python" -c "import moto.server, boto3" >/dev/null 2>&1; then
  echo "== installing moto[server] (the S3 test server) into $venv"
  "$venv/bin/pip" install -q 'moto[server]' \
    || { echo "install-python.sh: moto[server] did not install" >&2; return 1 2>/dev/null || exit 1; }
fi
# maturin, which builds the wheel that brings the binary (python/wheel; the wheel test,
# tests/loaders_real/torchrun_ddp.rs), into the same venv.
if [ "${SHUFFLEFS_PACKAGE_ONLY:-0}" != 1 ] && [ "${SHUFFLEFS_NO_LOADERS:-0}" != 1 ] && [ -x "$venv/bin/python" ] \
  && [ ! -x "$venv/bin/maturin" ]; then
  echo "== installing maturin (the wheel's build backend) into $venv"
  "$venv/bin/pip" install -q 'maturin>=1.5,<2' \
    || { echo "install-python.sh: maturin did not install" >&2; return 1 2>/dev/null || exit 1; }
fi
# The demo's plot (mount-helpers/demo.sh): matplotlib, into the same venv.
if [ "${SHUFFLEFS_PACKAGE_ONLY:-0}" != 1 ] && [ "${SHUFFLEFS_NO_LOADERS:-0}" != 1 ] && [ -x "$venv/bin/python" ] \
  && ! "$venv/bin/python" -c "import matplotlib" >/dev/null 2>&1; then
  echo "== installing matplotlib (the demo's plot) into $venv"
  "$venv/bin/pip" install -q matplotlib || echo "install-python.sh: matplotlib did not install; the demo makes no plot" >&2
fi
# The helpers' own package (python/ next to this folder: `import shufflefs`), which the
# examples import: installed when missing or another version (pip install ./python).
package=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)/python
# An offline build (--no-build-isolation) uses the venv's setuptools: one older than 70.1
# needs the wheel package for bdist_wheel ("invalid command 'bdist_wheel'" otherwise).
can_build_offline() {
  "$venv/bin/python" -c '
import importlib.util, sys
import setuptools
v = tuple(int(x) for x in setuptools.__version__.split(".")[:2] if x.isdigit())
sys.exit(0 if v >= (70, 1) or importlib.util.find_spec("wheel") else 1)' >/dev/null 2>&1
}
if { [ "${SHUFFLEFS_PACKAGE_ONLY:-0}" = 1 ] || [ "${SHUFFLEFS_NO_LOADERS:-0}" != 1 ]; } \
  && [ -x "$venv/bin/python" ] && [ -f "$package/pyproject.toml" ]; then
  want=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$package/shufflefs/__init__.py" | head -n 1)
  have=$(cd / && "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("shufflefs"))' 2>/dev/null || true)
  if [ "$have" != "$want" ]; then
    echo "== installing the shufflefs Python package ($package) into $venv"
    # Offline when the venv can build it (adding wheel where its setuptools needs it); else
    # pip fetches the build backend.
    can_build_offline || "$venv/bin/pip" install -q wheel >/dev/null 2>&1 \
      || "$venv/bin/pip" install -q 'setuptools>=70.1' >/dev/null 2>&1 || true
    "$venv/bin/pip" install -q --no-build-isolation "$package" 2>/dev/null \
      || "$venv/bin/pip" install -q "$package" \
      || { echo "install-python.sh: pip install $package failed" >&2; return 1 2>/dev/null || exit 1; }
  fi
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
