#!/usr/bin/env bash
# Exchange benchmark on emulated hosts (mount-helpers/shufflefs-cluster): one rank per host,
# each host's link shaped to RATE both ways. Per (rate, hosts): the exchange's time against
# (a) an MPI point-to-point baseline of the same bytes on the same links and (b) the link's
# own floor (busiest link's bytes / rate), measured in the same run; 100 KB and 4 KB samples.
# Prints Markdown tables. Needs root (network namespaces).
#
#   bash benches/cluster_exchange.sh                 (RATES="1gbit 5gbit" HOSTS="4 8")
#   RATES=1gbit HOSTS=4 bash benches/cluster_exchange.sh
# Hosts are private (own mount namespace and disk): each rank's cache is on its host's disk.
set -euo pipefail
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh
bin=$(cargo bench --bench exchange_mpi --no-run --message-format=json \
  | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and "exchange_mpi" in m["executable"]]' | tail -1)
cluster=mount-helpers/shufflefs-cluster
export SCENARIOS=${SCENARIOS:-}
name=bench$$
name=${name:0:7}
trap '"$cluster" down "$name" >/dev/null 2>&1 || true' EXIT
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r); private hosts, caches on each host's own ${DISK:-4G} ext4 disk (BENCH_DIR=... to use a shared folder)"
for rate in ${RATES:-1gbit 5gbit}; do
  case "$rate" in
    *gbit) bps=$(( ${rate%gbit} * 125000000 )) ;;
    *mbit) bps=$(( ${rate%mbit} * 125000 )) ;;
    *) echo "rate $rate: use Nmbit or Ngbit" >&2; exit 2 ;;
  esac
  for hosts in ${HOSTS:-4 8}; do
    echo
    echo "### $hosts hosts x 1 rank, links shaped to $rate"
    "$cluster" up "$name" --hosts "$hosts" --rate "$rate" --disk "${DISK:-4G}" >/dev/null
    # Private hosts: each rank's cache on its own host's disk (LOCAL), unless told otherwise.
    export SHUFFLEFS_BENCH_DIR=${BENCH_DIR:-$(awk -F= '$1 == "LOCAL" { print $2 }' "/run/shufflefs-cluster/$name/config")}
    SHUFFLEFS_LINK_BYTES_PER_S=$bps "$cluster" mpirun "$name" -- -np "$hosts" \
      -x SHUFFLEFS_LINK_BYTES_PER_S -x SHUFFLEFS_BENCH_DIR -x SCENARIOS "$bin"
    "$cluster" down "$name" >/dev/null
  done
done
