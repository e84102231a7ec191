#!/usr/bin/env bash
# The exchange over TCP against MPI between emulated hosts at 1 Gbit, alternated in one run:
# a private cluster of HOSTS (2) hosts, PER_HOST (2) ranks each, ROUNDS (2) x (shufflefs-cluster
# mpirun, shufflefs-cluster torchrun) of the exchange bench (benches/exchange_mpi.rs), 100 KB
# and 4 KB samples, packed cache. Prints scenario, exchange rate and exchange CPU per run.
#
#   bash benches/transport_cluster_ab.sh          (root; the loaders' venv for torchrun)
set -euo pipefail
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh >/dev/null
bin=$(cargo bench --bench exchange_mpi --no-run --message-format=json \
  | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and "exchange_mpi" in m["executable"]]' | tail -1)
C=mount-helpers/shufflefs-cluster
name=tab
$C down "$name" >/dev/null 2>&1 || true
$C up "$name" --hosts "${HOSTS:-2}" --rate "${RATE:-1gbit}" >/dev/null
trap '$C down "$name" >/dev/null 2>&1' EXIT
export SCENARIOS=${SCENARIOS:-100KB,4KB} LAYOUTS=${LAYOUTS:-packed}
echo "| run | transport | scenario | exchange | exchange CPU (all ranks) |"
echo "|---|---|---|---:|---|"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for t in mpirun torchrun; do
    $C "$t" "$name" --per-host "${PER_HOST:-2}" -- "$bin" 2>/dev/null |
      awk -F'|' -v r="$round" -v t="$t" '/^\| (100KB|4KB)/ {print "| " r " | " t " |" $2 "|" $8 "|" $13 "|"}'
  done
done
