#!/usr/bin/env bash
# Alternates exchange_mpi binaries (built from different commits) on ONE emulated cluster of 4
# private hosts at 1 Gbit, ROUNDS times, and prints per run: scenario, layout, exchange rate,
# exchange / MPI baseline rate, exchange CPU (all ranks) and the baseline's CPU with the ratio.
# Comparing binaries side by side like this is what makes CPU-per-byte changes visible on a
# noisy machine (see docs/performance.md, "Bringing the exchange's CPU per byte down").
#
#   cargo bench --bench exchange_mpi --no-run   # then copy target/release/deps/exchange_mpi-*
#   SCENARIOS=100KB,4KB nice -n -19 bash benches/exchange_ab.sh 3 /tmp/old /tmp/new
# SUBNET=10.214.X.0/24 picks the cluster's /24 (default 10.214.98.0/24).
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,10p "$0"; exit 2; }
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh >/dev/null
rounds=$1
shift
cluster=mount-helpers/shufflefs-cluster
name=abx$$
name=${name:0:7}
"$cluster" up "$name" --hosts 4 --rate 1gbit --disk 4G --subnet "${SUBNET:-10.214.98.0/24}" >/dev/null
trap '"$cluster" down "$name" >/dev/null 2>&1 || true' EXIT
export SHUFFLEFS_BENCH_DIR
SHUFFLEFS_BENCH_DIR=$(awk -F= '$1 == "LOCAL" { print $2 }' "/run/shufflefs-cluster/$name/config")
export SHUFFLEFS_LINK_BYTES_PER_S=125000000 SCENARIOS=${SCENARIOS:-100KB}
for r in $(seq "$rounds"); do
  for b in "$@"; do
    "$cluster" mpirun "$name" -- -np 4 -x SHUFFLEFS_LINK_BYTES_PER_S -x SHUFFLEFS_BENCH_DIR \
      -x SCENARIOS "$b" 2>&1 | awk -F'|' -v who="$(basename "$b") round $r" \
      '/^\| [0-9]+K?B/ { print who ":", $2, $3, "exchange", $8, "vs MPI", $9, "CPU", $13, "baseline", $14 }'
  done
done
