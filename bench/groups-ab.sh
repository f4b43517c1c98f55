#!/usr/bin/env bash
# Two `felix` binaries side by side under `felix-bench groups` (issue 22's load): PAIRS
# pairs, A then B, each run on a fresh broker with its defaults and a fresh data dir, 4-shard
# stream of RECORDS (default 400,000) 1 KiB records, polls of 400. Appends one JSON line per
# run to OUT (build, pair, load average, felix-bench's line) and prints a summary line.
# Build each binary first (release) and copy it aside. Local runs only (CI never runs it).
# BENCH_A / BENCH_B: a `felix-bench` per side (default: this tree's release build for both),
# for a change to the client as well as to the broker. BENCH_ARGS: more `felix-bench groups`
# arguments (e.g. `--half-load-secs 0`).
#
#   bench/groups-ab.sh bench/results/groups-journal-ab.jsonl 3 /tmp/felix-base /tmp/felix-new
#   BENCH_A=/tmp/bench-base bench/groups-ab.sh OUT.jsonl 3 /tmp/felix-base ./target/release/felix
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
OUT=$1; PAIRS=$2; A=$3; B=$4
BENCH_A=${BENCH_A:-./target/release/felix-bench}
BENCH_B=${BENCH_B:-./target/release/felix-bench}
for i in $(seq 1 "$PAIRS"); do
  for which in A B; do
    bin=$A; bench=$BENCH_A; [ $which = B ] && bin=$B && bench=$BENCH_B
    TMP=$(mktemp -d)
    broker_ports
    "$bin" --data-dir "$TMP/data" --quic-addr "127.0.0.1:$QUIC_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
      --internal-addr "127.0.0.1:$INTERNAL_PORT" --kafka-addr "127.0.0.1:$(free_port)" >"$TMP/felix.log" 2>&1 &
    PID=$!
    for _ in $(seq 1 120); do grep -qs "ready" "$TMP/felix.log" && break; sleep 0.5; done
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    line=$("$bench" groups --broker "127.0.0.1:$QUIC_PORT" --records "${RECORDS:-400000}" --batch 400 ${BENCH_ARGS:-} 2>/dev/null | tail -1)
    kill $PID; wait $PID 2>/dev/null || true
    rm -rf "$TMP"
    echo "{\"build\":\"$which\",\"bin\":\"$bin\",\"bench\":\"$bench\",\"pair\":$i,\"load\":\"$load\",\"run\":$line}" >> "$OUT"
    python3 -c "
import json,sys
d=json.loads(sys.argv[1]); r=d['run']
print(d['build'], d['pair'], 'sub', round(r['subscription_records_per_sec']), [ (g['consumers'], round(g['records_per_sec'])) for g in r['groups']], 'nack10', round(r['nack10']['records_per_sec']), 'load', d['load'])
" "$(tail -1 "$OUT")"
  done
done
