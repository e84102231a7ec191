#!/usr/bin/env bash
# Exchange benchmark: 4 ranks under mpirun on this machine, exchange vs an MPI point-to-point
# baseline of the same bytes measured in the same run. Prints a Markdown table.
#
#   bash benches/exchange.sh            (RANKS=4, SHUFFLEFS_BENCH_DIR=/tmp by default)
#   SCENARIOS=100KB,362B LAYOUTS=packed bash benches/exchange.sh    (a subset; see exchange_mpi.rs)
#   TRANSPORT=tcp bash benches/exchange.sh    (the TCP transport, under torchrun; the
#   "MPI p2p baseline" column is then TCP's own; benches/transport_ab.sh alternates both)
set -euo pipefail
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh
bin=$(cargo bench --bench exchange_mpi --no-run --message-format=json \
  | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and "exchange_mpi" in m["executable"]]' | tail -1)
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r); cache on $(df -T "${SHUFFLEFS_BENCH_DIR:-/tmp}" | awk 'NR==2{print $2}')"
case "${TRANSPORT:-mpi}" in
  mpi) mpirun -np "${RANKS:-4}" --oversubscribe "$bin" ;;
  # The TCP transport, launched as torchrun launches it (the loaders' venv's torchrun).
  tcp) "${SHUFFLEFS_VENV:-$HOME/.cache/shufflefs/venv}/bin/torchrun" --standalone \
         --nproc_per_node "${RANKS:-4}" --no-python "$bin" 2> >(grep -v "^W.*torch" >&2) ;;
  *) echo "TRANSPORT=mpi or tcp" >&2; exit 2 ;;
esac
