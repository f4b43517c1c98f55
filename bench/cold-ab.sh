#!/usr/bin/env bash
# A/B of cold-empty replays between two felix binaries: one stream of GIB GiB is loaded and
# tiered once (by A), then A and B alternate, each started on the same data dir with its
# cold cache wiped and timed over one cold-empty replay (felix-bench catchup), PAIRS times.
# One line per replay (MB/s, the broker's CPU seconds, load average) to OUT. Local runs only.
#
#   bench/cold-ab.sh FELIX_A FELIX_B
#   PAIRS=3 GIB=1 OUT=bench/results/cold-decode-ab.jsonl \
#     XFLAGS="--object-store-get-latency-ms 30 --object-store-get-bytes-per-sec 100000000" \
#     bench/cold-ab.sh /tmp/felix-main target/release/felix     (the s3-30ms case)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
A=$1; B=$2; PAIRS=${PAIRS:-3}; OUT=${OUT:-bench/results/cold-ab.jsonl}
BIN=${BENCH:-./target/release/felix-bench}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/cold-ab.XXXXXX"); mkdir -p "$TMP/objects"
PID=
cleanup() { stop_pids "$PID"; rm -rf "$TMP"; }
on_exit cleanup
broker_ports
start() {
  local felix=$1; shift
  rm -rf $TMP/cache
  FELIX_LOG=warn FELIX_FAULT_INJECTION=1 FELIX_OBJECT_STORE="file://$TMP/objects" \
    setsid nohup "$felix" --data-dir "$TMP/felix" --quic-addr "127.0.0.1:$QUIC_PORT" \
    --admin-addr "127.0.0.1:$ADMIN_PORT" --internal-addr "127.0.0.1:$INTERNAL_PORT" \
    --cache-dir "$TMP/cache" --cache-disk-bytes $((2 << 30)) --cache-memory-bytes $((64 << 20)) \
    --tier-row-group-bytes $((4<<20)) --retention-check-ms 1000 ${XFLAGS:-} >>"$TMP/felix.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$ADMIN_PORT/healthz" >/dev/null 2>&1 && return; sleep 0.1; done
}
b() { "$BIN" catchup --broker "127.0.0.1:$QUIC_PORT" --admin "127.0.0.1:$ADMIN_PORT" --size 1024 --batch 100 --publishers 4 --inflight 8 --segment-bytes $((64<<20)) "$@" 2>/dev/null; }
start "$A"
b --phase load --stream catchup --gib ${GIB:-1} >/dev/null
b --phase make-cold --stream catchup >/dev/null
stop_pids "$PID"
for p in $(seq 1 $PAIRS); do
  for side in A B; do
    felix=$A; [ $side = B ] && felix=$B
    start "$felix"
    t0=$(cpu_ticks $PID)
    line=$(b --phase replay --stream catchup --expect cold --label cold-empty)
    t1=$(cpu_ticks $PID)
    mbps=$(echo "$line" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["replay"]["payload_mb_per_sec"],1))')
    echo "{\"pair\":$p,\"side\":\"$side\",\"mb_per_sec\":$mbps,\"felix_cpu_s\":$(secs $t1 $t0),\"load\":\"$(loadavg)\"}" | tee -a $OUT
    stop_pids "$PID"
  done
done
