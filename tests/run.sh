#!/usr/bin/env bash
# Runs every test: installs what is missing (fuse3, Open MPI, clang for rsmpi), then format,
# lint, unit/property tests, real FUSE mounts and real mpirun runs.
#
#   bash tests/run.sh
#
# Tests that need /dev/fuse or mpirun skip on machines without them, unless
# SHUFFLEFS_REQUIRE_FUSE=1 / SHUFFLEFS_REQUIRE_MPI=1 (set by .ci/run) turn a skip into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
[ -f /usr/include/fuse3/fuse.h ] || need_apt+=(libfuse3-dev)
command -v mpirun >/dev/null || need_apt+=(openmpi-bin)
command -v mpicc >/dev/null || need_apt+=(libopenmpi-dev)
command -v clang >/dev/null || need_apt+=(clang)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || need_apt+=(libclang-dev)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Open MPI refuses to run as root, and 4 ranks on a 2-core machine, unless told.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets -- -D warnings
echo "== cargo test"
# Mount tests start daemons; a few at a time is plenty on small machines.
cargo test --all-targets -- --test-threads=2
