#!/usr/bin/env bash
# Shard moves on a 4-broker loopback cluster: the time to move a Quorum shard's leadership
# (with FILLS MiB of hot data the destination copies from the leader) and a steady
# publisher's ack latency before, during and after the move. Writes bench/results/moves.md
# and bench/results/moves.jsonl (one line per run). Local runs only (CI never runs it).
#
#   bench/moves.sh
#   FILLS="64 256" REPS=2 bench/moves.sh     (defaults: "64 256", 2)
#   PROFILE=release bench/moves.sh           (default: debug; builds with cargo unless SKIP_BUILD=1)
#   TIERED=true bench/moves.sh               (default false: nothing is uploaded, so the
#                                             destination copies the whole fill from the leader)
#   DRAIN_SHARDS=20 DRAIN_FILL=64 DRAINS=1    (then DRAINS runs of `felix-bench drain`: the broker
#                                             holding most of a DRAIN_SHARDS-shard stream drained;
#                                             DRAINS=0 skips them)
#
# Four `felix` processes (node ids 1-4, each its own data dir and free loopback ports, one
# shared `file://` object store), `FELIX_LEASE_MS=2000`, settings otherwise default; then
# for each fill and rep `felix-bench move --cluster SEEDS --fill-mib FILL`.
set -euo pipefail
{
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

FILLS=${FILLS:-"64 256"}
REPS=${REPS:-2}
TIERED=${TIERED:-false}
DRAIN_SHARDS=${DRAIN_SHARDS:-20}
DRAIN_FILL=${DRAIN_FILL:-64}
DRAINS=${DRAINS:-1}
PROFILE=${PROFILE:-debug}
BIN=./target/$PROFILE/felix-bench
FELIX=./target/$PROFILE/felix
RESULTS=bench/results/moves
mkdir -p bench/results
TMP=$(mktemp -d "${TMPDIR:-/tmp}/moves.XXXXXX")
OUT=$TMP/moves.jsonl
: >"$OUT"
START=$(date +%s)
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  if [ "$PROFILE" = release ]; then flag=--release; else flag=; fi
  cargo build $flag -q -p felix-bench -p felix-gateway
fi

PIDS=()
cleanup() {
  stop_pids "${PIDS[@]}"
  keep_partial_results
  rm -rf "$TMP"
}
on_exit cleanup

SPEC= SEEDS=
declare -A QUIC ADMIN INTERNAL KAFKA
for id in 1 2 3 4; do
  QUIC[$id]=$(free_port) ADMIN[$id]=$(free_port) INTERNAL[$id]=$(free_port) KAFKA[$id]=$(free_port)
  SPEC="$SPEC${SPEC:+,}$id=127.0.0.1:${INTERNAL[$id]}"
  SEEDS="$SEEDS${SEEDS:+,}127.0.0.1:${QUIC[$id]}"
done
for id in 1 2 3 4; do
  dir=$TMP/node-$id
  mkdir -p "$dir"
  FELIX_LOG=info,openraft=warn FELIX_LEASE_MS=2000 FELIX_OBJECT_STORE="file://$TMP/objects" \
    "$FELIX" --node-id "$id" --cluster "$SPEC" --data-dir "$dir/data" \
    --internal-addr "127.0.0.1:${INTERNAL[$id]}" --quic-addr "127.0.0.1:${QUIC[$id]}" \
    --admin-addr "127.0.0.1:${ADMIN[$id]}" --kafka-addr "127.0.0.1:${KAFKA[$id]}" \
    </dev/null >>"$dir/felix.log" 2>&1 &
  PIDS+=($!)
done
mkdir -p "$TMP/objects"
for id in 1 2 3 4; do
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:${ADMIN[$id]}/healthz" >/dev/null 2>&1 && break
    sleep 0.1
  done
done
echo "cluster up: $SEEDS" >&2

for fill in $FILLS; do
  for rep in $(seq 1 "$REPS"); do
    load0=$(loadavg)
    line=$("$BIN" move --cluster "$SEEDS" --fill-mib "$fill" --tiered "$TIERED")
    load1=$(loadavg)
    line=$(echo "$line" | sed "s/^{/{\"profile\":\"$PROFILE\",\"rep\":$rep,\"loadavg_before\":[$load0],\"loadavg_after\":[$load1],/")
    echo "$line" >>"$OUT"
    echo "  $line" >&2
  done
done
for rep in $(seq 1 "$DRAINS"); do
  load0=$(loadavg)
  line=$("$BIN" drain --cluster "$SEEDS" --shards "$DRAIN_SHARDS" --fill-mib "$DRAIN_FILL")
  load1=$(loadavg)
  line=$(echo "$line" | sed "s/^{/{\"profile\":\"$PROFILE\",\"rep\":$rep,\"loadavg_before\":[$load0],\"loadavg_after\":[$load1],/")
  echo "$line" >>"$OUT"
  echo "  $line" >&2
done
TOTAL=$(($(date +%s) - START))

COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
python3 - "$OUT" "$TOTAL" "$COMMIT" "$CPU" "$(nproc)" "$PROFILE" <<'PY' >"$TMP/moves.md"
import json, sys, datetime
out, total, commit, cpu, ncpu, profile = sys.argv[1:]
rows = [json.loads(l) for l in open(out) if l.strip()]
ms = lambda us: f"{us / 1000:.1f}"
print(f"# Shard moves: time to move a shard and the publish latency around it ({datetime.date.today()})\n")
print(f"Command: `bench/moves.sh` ({total} s in all). Raw lines: `moves.jsonl`.\n")
print(f"* Machine: {cpu}, {ncpu} cores, shared with other work; load average before → after each run in the table.")
print(f"* Felix at commit {commit}, **{profile} build** ({'not representative of release speed' if profile == 'debug' else 'release'}). "
      "Four brokers on loopback (`FELIX_LEASE_MS=2000`, fsync `periodic`), one `file://` object store.")
print("* `felix-bench move --cluster SEEDS --fill-mib FILL --tiered TIERED`: a fresh Quorum stream (1 shard, 3 replicas) filled with FILL MiB "
      "of 1 KiB incompressible records, one publisher sending one 1 KiB record every 5 ms "
      "through a `ClusterClient`; after 3 s the shard's leadership is moved to the fourth broker (`move_shard`), "
      "the move list polled every 20 ms until the move is gone, then 3 s more.\n")
print("An untiered stream uploads nothing, so the destination copies the whole fill from the leader's log: the hot "
      "catch-up. A tiered stream's new replica starts after the shard's uploaded history and copies only what was not "
      "uploaded when the move began (the column after *move s*, read just before the move).\n")
print("| fill MiB | tiered | rep | move s | MiB uploaded / not uploaded at the move | ack p50 / p99 / max ms before | during | after | longest ack gap ms | failed publishes | load avg before → after |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
drains = [r for r in rows if r.get("scenario") == "drain"]
rows = [r for r in rows if r.get("scenario") != "drain"]
for r in rows:
    f = lambda p: f"{ms(r[p]['p50_us'])} / {ms(r[p]['p99_us'])} / {ms(r[p]['max_us'])}"
    up = (f"{r['uploaded_bytes_at_move'] / 2**20:.0f} / {r['not_uploaded_bytes_at_move'] / 2**20:.0f}"
          if 'uploaded_bytes_at_move' in r else "n/a")
    print(f"| {r['fill_bytes'] / 2**20:.0f} | {str(r.get('tiered', True)).lower()} | {r['rep']} | {r['move_ms'] / 1000:.2f} | {up} | {f('before')} | {f('during')} | {f('after')} "
          f"| {r['max_ack_gap_ms']} | {r['publish_errors']} | {r['loadavg_before'][0]:.1f} → {r['loadavg_after'][0]:.1f} |")
print()
if drains:
    print("## Drains\n")
    print("`felix-bench drain --cluster SEEDS --shards N --fill-mib FILL`: a fresh untiered Quorum stream of N shards (3 replicas) "
          "filled with FILL MiB over its shards, one publisher per shard sending one 1 KiB record every 20 ms; after 3 s the broker "
          "holding most of the stream's replicas is drained (`set_draining`), the broker list polled every 50 ms until it holds no "
          "replica, then 3 s more. *Hold* is the worst ack latency any publisher saw during the drain.\n")
    print("| shards | fill MiB | rep | replicas drained (stream / all) | drain s | ack p50 / p99 / hold ms during | before p99 | after p99 | longest ack gap of one shard ms | failed publishes | load avg before → after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in drains:
        print(f"| {r['shards']} | {r['fill_bytes'] / 2**20:.0f} | {r['rep']} | {r['stream_replicas_drained']} / {r['all_replicas_drained']} "
              f"| {r['drain_ms'] / 1000:.2f} | {ms(r['during']['p50_us'])} / {ms(r['during']['p99_us'])} / {ms(r['during']['max_us'])} "
              f"| {ms(r['before']['p99_us'])} | {ms(r['after']['p99_us'])} | {r['max_shard_ack_gap_ms']} | {r['publish_errors']} "
              f"| {r['loadavg_before'][0]:.1f} → {r['loadavg_after'][0]:.1f} |")
    print()
PY
cp "$TMP/moves.md" "$RESULTS.md"
cp "$OUT" "$RESULTS.jsonl"
COPIED=1
cat "$RESULTS.md"
exit
}
