#!/usr/bin/env bash
# Coded exchange on emulated hosts (mount-helpers/shufflefs-cluster): the server rank alone on
# host h0 whose link is shaped to RATE (the bottleneck: the storage host of the paper's Table
# 2), each compute rank on a host of its own with an unshaped link. Per M: one epoch's shuffle
# time for uncoded, coded, ubershuffle and `direct` (every rank gets what it lacks straight from
# the storage host, no coding), side by side in one run, with the server's bytes, the link's
# floor for them, and encode/decode CPU seconds. Prints Markdown tables. Needs root.
#
#   bash benches/coded_exchange.sh                    (RATE=1gbit RANKS="4 8" SAMPLES=2000)
#   RANKS=4 SAMPLES=1000 SAMPLE_BYTES=100000 bash benches/coded_exchange.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh
bin=$(cargo bench --bench coded_exchange --no-run --message-format=json \
  | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and "coded_exchange" in m["executable"]]' | tail -1)
cluster=mount-helpers/shufflefs-cluster
rate=${RATE:-1gbit}
case "$rate" in
  *gbit) bps=$(( ${rate%gbit} * 125000000 )) ;;
  *mbit) bps=$(( ${rate%mbit} * 125000 )) ;;
  *) echo "rate $rate: use Nmbit or Ngbit" >&2; exit 2 ;;
esac
export SHUFFLEFS_BENCH_DIR=${SHUFFLEFS_BENCH_DIR:-/tmp}
export SHUFFLEFS_BENCH_SAMPLES=${SAMPLES:-2000} SHUFFLEFS_BENCH_SAMPLE_BYTES=${SAMPLE_BYTES:-100000}
export SHUFFLEFS_LINK_BYTES_PER_S=$bps
name=cod$$
name=${name:0:7}
trap '"$cluster" down "$name" >/dev/null 2>&1 || true' EXIT
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r); caches on $(df -T "$SHUFFLEFS_BENCH_DIR" | awk 'NR==2{print $2}')"
for ranks in ${RANKS:-4 8}; do
  echo
  echo "### server link $rate, $ranks compute ranks (one per host, unshaped links)"
  "$cluster" up "$name" --hosts $(( ranks + 1 )) --rate none >/dev/null
  "$cluster" shape "$name" h0 "$rate" >/dev/null
  # Ranks waiting in MPI yield the core: with every emulated host on the same 2 cores,
  # spinning waiters would starve the ranks with work (all schemes alike).
  "$cluster" mpirun "$name" -- -np $(( ranks + 1 )) --mca mpi_yield_when_idle 1 -x SHUFFLEFS_LINK_BYTES_PER_S \
    -x SHUFFLEFS_BENCH_DIR -x SHUFFLEFS_BENCH_SAMPLES -x SHUFFLEFS_BENCH_SAMPLE_BYTES \
    ${ALPHA:+-x SHUFFLEFS_BENCH_ALPHA=$ALPHA} "$bin"
  "$cluster" down "$name" >/dev/null
done
