#!/usr/bin/env bash
# Runs every test: installs what is missing (fuse3, Open MPI, clang for rsmpi; a Python venv
# with torch, torchvision, tensorflow-cpu, pillow, scikit-learn, pandas and webdataset, about
# 5 GB the first time), then format,
# lint, unit/property tests, real FUSE mounts, real mpirun runs and the real loaders.
#
#   bash tests/run.sh
#
# The integration tests are five binaries, grouped by what they need from the machine (one
# binary each, so the library is linked five times, not once per file); each file in a group
# is a module, so a test is named `FILE::TEST` (`cargo test --test pure plan_props::`):
#
#   tests/pure/          nothing: plan and elastic properties, the model-based reftest, and
#                        in-process exchange, coded exchange, resume and view logic
#   tests/fuse/          real FUSE mounts from one process: bad input, host calls, single
#                        mounts, the packed cache, the page cache, a slow source
#   tests/mpi/           real mpirun (and FUSE): comm, exchange, coded, elastic, resume,
#                        signals, stress, a full disk
#   tests/cluster/       emulated hosts (mount-helpers/shufflefs-cluster)
#   tests/loaders_real/  the real Python loaders of the venv (tests/loaders/*.py): real
#                        loaders, record mounts, records under mpirun
#   tests/common/        helpers, one file per concern (skip.rs holds every skip)
#
# Tests that need /dev/fuse, mpirun or the loaders skip on machines without them, unless
# SHUFFLEFS_REQUIRE_FUSE=1 / SHUFFLEFS_REQUIRE_MPI=1 / SHUFFLEFS_REQUIRE_LOADERS=1 (set by
# .ci/run) turn a skip into a failure. The emulated-host tests (tests/cluster/, through
# mount-helpers/shufflefs-cluster) also need root, iproute2 (ip, tc), nsenter and python3;
# SHUFFLEFS_REQUIRE_CLUSTER=1 (set by .ci/run) makes their skip a failure too.
# SHUFFLEFS_REQUIRE_DLIO=1 does the same for the DLIO test (DLIO is installed beside the loaders).
# SHUFFLEFS_NO_LOADERS=1 skips the venv install.
set -euo pipefail
cd "$(dirname "$0")/.."

source mount-helpers/install-deps.sh
source mount-helpers/install-python.sh
# DLIO beside the loaders, when missing: tests/loaders_real/dlio.rs runs it for real.
if [ "${SHUFFLEFS_NO_LOADERS:-0}" != 1 ] && [ -x "$venv/bin/python" ] &&
   ! "$venv/bin/python" -c 'import dlio_benchmark.main' >/dev/null 2>&1; then
  bash mount-helpers/install-dlio.sh
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== the walls: what the lower crates may not depend on"
# crate name, then the crates its graph (without features) must not hold
while read -r crate banned; do
  if cargo tree -p "$crate" -e normal,build --prefix none --format '{p}' | awk '{print $1}' |
     grep -xE "$banned"; then
    echo "$crate depends on the crates above (not allowed: $banned)"; exit 1
  fi
done <<'WALLS'
shufflefs-plan mpi|mpi-sys|clang-sys|tokio|fuser|clap
shufflefs-store mpi|mpi-sys|clang-sys|fuser|clap
shufflefs-net fuser|clap
shufflefs-fs mpi|mpi-sys|clang-sys|clap
WALLS
echo "== a build without MPI or S3 (--no-default-features)"
cargo clippy --bins --no-default-features -- -D warnings
echo "== import circles"
python3 .ci/import-cycles.py
python3 .ci/import-cycles.py crates/shufflefs-plan/src
python3 .ci/import-cycles.py crates/shufflefs-store/src
python3 .ci/import-cycles.py crates/shufflefs-net/src
python3 .ci/import-cycles.py crates/shufflefs-fs/src
echo "== functions over 80 lines (outside tests)"
for src in src crates/shufflefs-*/src; do
  python3 .ci/long-functions.py --over 80 "$src" >/dev/null ||
    { python3 .ci/long-functions.py --over 80 "$src"; exit 1; }
done
echo "== cargo test"
# Mount tests start daemons; a few at a time is plenty on small machines.
cargo test --workspace --no-fail-fast --all-targets -- --test-threads=2
