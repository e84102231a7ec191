#!/usr/bin/env bash
# Slow-peer benchmark: 4 private hosts, one rank each, links at 1gbit, the dataset
# on the storage host; host 3's link reshaped to SLOW (none: every host fast). Every rank
# advances EPOCHS times in a row as soon as the previous advance returned (training that reads
# nothing: the worst case, the exchange has no time to run behind the reads), timing each
# `echo N > .shufflefs/epoch` inside its host. Prints one line per rank and epoch, then the
# given-up peers each exchange saw. Needs root (network namespaces), sshfs, sshd.
#
#   SLOW=10mbit bash benches/slow_peer.sh           (SLOW=none: the all-fast baseline)
#   SAMPLES=2000 SIZE=51200 EPOCHS=5 FLAGS="--slow-peer-factor 4" BIN=target/release/shufflefs
set -euo pipefail
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh >/dev/null
cluster=mount-helpers/shufflefs-cluster
name=${NAME:-slwb}
subnet=${SUBNET:-10.214.70.0/24}
bin=$(realpath "${BIN:-target/debug/shufflefs}")
samples=${SAMPLES:-2000}
size=${SIZE:-51200}
epochs=${EPOCHS:-5}
data=${DATA:-/tmp/slow-bench-data}
if [ ! -f "$data/.made-$samples-$size" ]; then
  rm -rf "$data"
  python3 - "$data" "$samples" "$size" <<'EOF'
import os, random, sys
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(29)
for i in range(n):
    d = os.path.join(root, f"c{i % 4}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"s{i:06}.bin"), "wb") as f:
        f.write(rng.randbytes(size))
open(os.path.join(root, f".made-{n}-{size}"), "w").close()
EOF
fi
trap '"$cluster" down "$name" >/dev/null 2>&1 || true' EXIT
"$cluster" down "$name" >/dev/null 2>&1 || true
"$cluster" up "$name" --hosts 4 --rate 1gbit --subnet "$subnet" --disk 1G --store "$data" >/dev/null
local_dir=$(awk -F= '$1 == "LOCAL" { print $2 }' "/run/shufflefs-cluster/$name/config")
store=$(awk -F= '$1 == "STORE" { print $2 }' "/run/shufflefs-cluster/$name/config")
[ "${SLOW:-none}" = none ] || "$cluster" shape "$name" 3 "$SLOW" >/dev/null
for r in 0 1 2 3; do mkdir -p "/run/shufflefs-cluster/$name/disk-h$r/mnt$r"; done
log=/tmp/slow-bench-$name.log
# shellcheck disable=SC2086
"$cluster" mpirun "$name" -- -np 4 "$bin" mount --seed 1 --fraction 1 --source "$store" \
  --cache "$local_dir/cache{rank}" ${FLAGS:-} "$local_dir/mnt{rank}" >/dev/null 2>"$log" &
job=$!
status() { "$cluster" exec "$name" "$1" cat "$local_dir/mnt$1/.shufflefs/status" 2>/dev/null; }
for r in 0 1 2 3; do
  until status "$r" | python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(s["staging"]["state"] != "done")' 2>/dev/null; do
    kill -0 $job 2>/dev/null || { echo "job ended before staging"; cat "$log"; exit 1; }
    sleep 0.5
  done
done
echo "### slow host: ${SLOW:-none}, $samples x $size B, flags: ${FLAGS:-default}"
for r in 0 1 2 3; do
  "$cluster" exec "$name" "$r" bash -c "for e in \$(seq 1 $epochs); do t0=\$(date +%s.%N);
    echo \$e > $local_dir/mnt$r/.shufflefs/epoch; t1=\$(date +%s.%N);
    echo \"rank $r epoch \$e advance \$(echo \"\$t1 - \$t0\" | bc)\"; done" &
done
wait_ranks() { for p in $(jobs -p); do [ "$p" = "$job" ] || wait "$p"; done; }
wait_ranks
report=$(mktemp)
cat >"$report" <<'EOF2'
import json, sys
s = json.load(sys.stdin)
for x in s["exchange"]:
    up = [p["rank"] for p in x["peers"] if p["given_up"]]
    src = sum(p.get("fetched_from_source", 0) for p in x["peers"])
    print(f"rank {sys.argv[1]} into {x['target_epoch']}: {x['state']}, settled {x['settled_seconds']:.2f} s,"
          f" all {x['seconds']:.2f} s, given up {up}, from source {src}")
EOF2
for r in 0 1 2 3; do status "$r" | python3 "$report" "$r" || true; done
rm -f "$report"
for r in 0 1 2 3; do
  "$cluster" exec "$name" "$r" "$bin" unmount --timeout 60 "$local_dir/mnt$r" >/dev/null 2>&1 || true
done
wait "$job" || echo "job exit $?"
