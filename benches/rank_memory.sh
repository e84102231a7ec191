#!/usr/bin/env bash
# Peak resident memory of every daemon of a job on this host, against the number of ranks
# (what each rank holds should follow its share, not the dataset). A tree of
# FILES empty files in FOLDERS folders (`--format tree`), `mpirun -np M shufflefs mount`,
# every rank's status answering, one advance (the exchange into epoch 1), then each daemon's
# VmHWM (peak RSS), its anonymous RSS and PSS (proportional: pages shared between daemons
# counted once over them) after the advance, and the cache's manifest.bin; the job is unmounted. Binaries are alternated per M
# so that both see the same machine state.
#
#   bash benches/rank_memory.sh BINARY [BINARY...]          (ranks 1 4 8)
#   FILES=1000000 RANKS="1 4 8" bash benches/rank_memory.sh old/shufflefs target/release/shufflefs
#   FORMAT=records FILES=10000000 bash benches/rank_memory.sh ...   (16-byte lines in FOLDERS shards;
#                                        GROUP=records: one sample a record, not a page)
set -euo pipefail
cd "$(dirname "$0")/.."
source mount-helpers/install-deps.sh >/dev/null
[ $# -gt 0 ] || { echo "usage: $0 BINARY [BINARY...]" >&2; exit 2; }
files=${FILES:-1000000}
folders=${FOLDERS:-1000}
read -r -a ranks <<<"${RANKS:-1 4 8}"
work=$(mktemp -d /tmp/shufflefs-memory.XXXXXX)
trap 'for m in "$work"/mnt*; do fusermount3 -uz "$m" 2>/dev/null || true; done; rm -rf "$work"' EXIT
if [ "${FORMAT:-tree}" = records ]; then
  # FILES 16-byte lines in FOLDERS shard files (--format records --framing lines).
  python3 - "$work/src" "$files" "$folders" <<'PY'
import os, sys
root, n, f = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(root)
for s in range(f):
    with open(f"{root}/shard-{s:05}.txt", "w") as out:
        out.writelines(f"{i:015}\n" for i in range(s, n, f))
PY
  flags=(--format records --framing lines ${GROUP:+--group "$GROUP"})
  what="$files 16-byte records in $folders shards (--format records --framing lines${GROUP:+ --group $GROUP})"
else
  python3 - "$work/src" "$files" "$folders" <<'PY'
import os, sys
root, n, f = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for d in range(f):
    os.makedirs(f"{root}/d{d:05}", exist_ok=True)
for i in range(n):
    open(f"{root}/d{i % f:05}/sample-{i:09}.bin", "w").close()
PY
  flags=(--format tree)
  what="$files empty files in $folders folders (--format tree)"
fi
echo "machine: $(nproc) cores; $what"
echo "| binary | ranks | peak RSS per daemon MiB (min-max) | sum MiB | anonymous RSS after the advance MiB | sum | PSS after the advance MiB | sum | manifest.bin MB per cache |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for m in "${ranks[@]}"; do
  for bin in "$@"; do
    bin=$(realpath "$bin")
    rm -rf "$work"/cache* "$work"/mnt*
    for k in $(seq 0 $((m - 1))); do mkdir -p "$work/mnt$k"; done
    mpirun --oversubscribe -np "$m" "$bin" mount "${flags[@]}" --seed 1 --fraction 0.3 \
      --source "$work/src" --cache "$work/cache{rank}" "$work/mnt{rank}" >/dev/null 2>"$work/job.log" &
    job=$!
    for k in $(seq 0 $((m - 1))); do
      until [ -e "$work/mnt$k/.shufflefs/status" ]; do
        kill -0 "$job" 2>/dev/null || { cat "$work/job.log" >&2; exit 1; }
        sleep 0.2
      done
    done
    for k in $(seq 0 $((m - 1))); do ls "$work/mnt$k/epoch-1" >/dev/null & done
    wait $(jobs -p | grep -v "^$job$") 2>/dev/null || true
    peaks=() anon=() pss=()
    for pid in $(pgrep -f "^$bin mount ${flags[*]}"); do
      peaks+=("$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")")
      anon+=("$(awk '/RssAnon/ {print $2}' "/proc/$pid/status")")
      pss+=("$(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup")")
    done
    manifest=$(stat -c %s "$work/cache0/manifest.bin" 2>/dev/null || echo 0)
    range() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1; s+=$1} END {printf "%.0f-%.0f | %.0f", a[1]/1024, a[NR]/1024, s/1024}'; }
    echo "| $(basename "$bin") | $m | $(range "${peaks[@]}") | $(range "${anon[@]}") | $(range "${pss[@]}") | $(awk -v b="$manifest" 'BEGIN {printf "%.1f", b/1e6}') |"
    for k in $(seq 0 $((m - 1))); do "$bin" unmount "$work/mnt$k" >/dev/null 2>&1 & done
    wait "$job" 2>/dev/null || true
  done
done
