#!/usr/bin/env bash
# The exchange over TCP against MPI, alternated in one run (issue: TCP >= 1.0x MPI's rate,
# CPU seconds per byte <= 1.0x): ROUNDS x (mpirun, torchrun) of benches/exchange.sh, 4 ranks,
# 100 KB and 4 KB samples, packed cache. Prints each run's rows; compare the "exchange" and
# "exchange CPU" columns of the same scenario.
#
#   bash benches/transport_ab.sh               (ROUNDS=2, SCENARIOS=100KB,4KB, LAYOUTS=packed)
set -euo pipefail
cd "$(dirname "$0")/.."
export SCENARIOS=${SCENARIOS:-100KB,4KB} LAYOUTS=${LAYOUTS:-packed}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for t in mpi tcp; do
    echo "== round $round, $t"
    TRANSPORT=$t bash benches/exchange.sh | grep -E "^\| (100KB|4KB|362B)|^ranks"
  done
done
