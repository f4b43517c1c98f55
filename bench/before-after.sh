#!/usr/bin/env bash
# Publish/subscribe throughput of two builds of Felix, one right after the other on this
# machine, for a change that must not be slower (a restructure). Each build's release `felix`
# and `felix-bench` must exist (build them first in each checkout:
# `cargo build --release -p felix-gateway -p felix-bench`). Writes one JSON line per run to
# bench/results/before-after.jsonl and prints the median records/s of each build.
#
#   bench/before-after.sh BEFORE_CHECKOUT AFTER_CHECKOUT [LABEL]
#   REPS=5 RECORDS=300000 FANOUT=1 bench/before-after.sh ../before ../after
#
# The load is pubsub-vs-nats.sh's (4 publishers, batches of 100 records of 1 KiB, 8 batches
# in flight each, FANOUT subscribers from the live end of one durable stream of one shard,
# not tiered). Runs alternate between the builds, each on a fresh broker and data dir.
#
#   MODE=replay GIB=0.5 bench/before-after.sh ../before ../after LABEL
#
# replays instead: catchup.sh's hot replay (`felix-bench catchup --phase load` of GIB GiB,
# then `--phase replay --expect hot` of that stream from offset 0, every record on the
# broker's disk); the figure is the replay's records/s.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh
BEFORE=${1:?usage: bench/before-after.sh BEFORE_CHECKOUT AFTER_CHECKOUT [LABEL]}
AFTER=${2:?usage: bench/before-after.sh BEFORE_CHECKOUT AFTER_CHECKOUT [LABEL]}
LABEL=${3:-before-after}
REPS=${REPS:-5}
RECORDS=${RECORDS:-300000}
FANOUT=${FANOUT:-1}
MODE=${MODE:-pubsub}
GIB=${GIB:-0.5}
OUT=bench/results/before-after.jsonl
TMP=$(mktemp -d "${TMPDIR:-/tmp}/before-after.XXXXXX")
FELIX_PID=
cleanup() {
  stop_pids "$FELIX_PID"
  rm -rf "$TMP"
}
on_exit cleanup

# run NAME CHECKOUT REP: one broker, one felix-bench run, one JSON line.
run() {
  local name=$1 dir=$2 rep=$3 line
  broker_ports
  rm -rf "$TMP/data"
  FELIX_LOG=warn "$dir/target/release/felix" --data-dir "$TMP/data" \
    --quic-addr "127.0.0.1:$QUIC_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
    --internal-addr "127.0.0.1:$INTERNAL_PORT" --kafka-addr "127.0.0.1:$(free_port)" \
    >"$TMP/felix.log" 2>&1 &
  FELIX_PID=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$ADMIN_PORT/healthz" >/dev/null 2>&1 && break
    kill -0 "$FELIX_PID" 2>/dev/null || { cat "$TMP/felix.log" >&2; exit 1; }
    sleep 0.1
  done
  if [ "$MODE" = replay ]; then
    local bench=("$dir/target/release/felix-bench" catchup --broker "127.0.0.1:$QUIC_PORT"
      --admin "127.0.0.1:$ADMIN_PORT" --stream hot)
    "${bench[@]}" --phase load --gib "$GIB" >/dev/null 2>"$TMP/bench.err" ||
      { cat "$TMP/bench.err" >&2; exit 1; }
    line=$("${bench[@]}" --phase replay --expect hot --label hot 2>"$TMP/bench.err") ||
      { cat "$TMP/bench.err" >&2; exit 1; }
    # The replay's figures, lifted to the top level where the summary reads them.
    # (The replay's own label moves to replay_label, so the run's LABEL stays the label.)
    line=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(d.pop("replay")); d["replay_label"]=d.pop("label", ""); print(json.dumps(d))' "$line")
  else
    line=$("$dir/target/release/felix-bench" pubsub --broker "127.0.0.1:$QUIC_PORT" --tiered false \
      --records "$RECORDS" --size 1024 --batch 100 --publishers 4 --inflight 8 \
      --fanout "$FANOUT" --rate 0 2>"$TMP/bench.err") || { cat "$TMP/bench.err" >&2; exit 1; }
  fi
  stop_pids "$FELIX_PID"
  FELIX_PID=
  echo "$line" | sed "s/^{/{\"mode\":\"$MODE\",\"label\":\"$LABEL\",\"build\":\"$name\",\"commit\":\"$(git -C "$dir" rev-parse --short HEAD)\",\"rep\":$rep,\"loadavg_before\":\"$(loadavg)\",/" >>"$OUT"
  echo "$name rep $rep: $(json "$line" "['records_per_sec']") records/s" >&2
  sleep 2
}

for rep in $(seq 1 "$REPS"); do
  run before "$BEFORE" "$rep"
  run after "$AFTER" "$rep"
done
python3 - "$OUT" "$LABEL" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("label") == sys.argv[2]]
for build in ("before", "after"):
    rates = sorted(r["records_per_sec"] for r in rows if r["build"] == build)
    if rates:
        print(f"{build} ({rows[0]['commit'] if build == 'before' else [r for r in rows if r['build'] == 'after'][0]['commit']}): "
              f"median {statistics.median(rates):,.0f} records/s over {len(rates)} runs "
              f"(min {rates[0]:,.0f}, max {rates[-1]:,.0f})")
PY
