#!/usr/bin/env bash
# What authorization costs the data path: felix-bench pubsub against a broker with auth off
# and one with auth on, interleaved on this machine. Prints the table for bench/results/auth.md
# and writes bench/results/auth.jsonl (raw lines). Local runs only (CI never runs it).
#
#   bench/auth.sh                                      (builds release binaries first)
#   REPS=5 RECORDS=200000 bench/auth.sh                (defaults: 5, 300000)
#   BIN=target/debug SKIP_BUILD=1 bench/auth.sh        (binaries already built, e.g. debug)
#   RATE=100000 bench/auth.sh                          (offered load in records/s; 0 = as fast
#                                                       as the broker takes them, the default)
#
# At RATE=0 the broker is saturated and delivery latency is mostly the depth of the queue
# in front of the subscriber, which swings with small changes in throughput; a fixed offered
# load below saturation measures what a check adds to each record's path instead.
#
# Per rep, in alternating order (off first on odd reps, on first on even ones), each on a
# fresh broker and data dir: `felix` (FELIX_AUTH=off, or on), then felix-bench pubsub with
# 4 publishers x 8 batches of 100 records of 1 KiB in flight and FANOUT live subscribers on
# one durable, untiered stream of one shard. With auth on, the bench presents a tenant-admin
# token of tenant `bench` minted with felixctl from the bootstrap admin.token, so every
# publish and the subscription are checked against a role-expanded principal as a tenant's
# client would be. The broker's CPU seconds and the machine's busy CPU seconds and load
# average are read around every run: other work on the machine shows there.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

REPS=${REPS:-5}
RECORDS=${RECORDS:-300000}
FANOUT=${FANOUT:-1}
RATE=${RATE:-0}
BIN=${BIN:-target/release}
RESULTS=${RESULTS:-bench/results/auth}   # raw lines go to $RESULTS.jsonl
TMP=$(mktemp -d "${TMPDIR:-/tmp}/auth-bench.XXXXXX")
OUT=$TMP/auth.jsonl
FELIX_PID=
cleanup() {
  stop_pids "$FELIX_PID"
  rm -rf "$TMP"
}
on_exit cleanup

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  echo "building felix, felixctl and felix-bench (release)" >&2
  cargo build --release -p felix-gateway -p felix-client -p felix-bench >&2
fi
for b in felix felixctl felix-bench; do
  [ -x "$BIN/$b" ] || { echo "$BIN/$b not found (build it, or set BIN)" >&2; exit 1; }
done

# run MODE REP: one broker with FELIX_AUTH=MODE, one felix-bench run, one JSON line.
run() {
  local mode=$1 rep=$2 line cpu0 busy0 load
  local token_arg=()
  broker_ports
  rm -rf "$TMP/data"
  FELIX_LOG=warn FELIX_AUTH=$mode "$BIN/felix" --data-dir "$TMP/data" \
    --quic-addr "127.0.0.1:$QUIC_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
    --internal-addr "127.0.0.1:$INTERNAL_PORT" --kafka-addr "127.0.0.1:$(free_port)" \
    >"$TMP/felix.log" 2>&1 &
  FELIX_PID=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$ADMIN_PORT/healthz" >/dev/null 2>&1 && break
    kill -0 "$FELIX_PID" 2>/dev/null || { cat "$TMP/felix.log" >&2; exit 1; }
    sleep 0.1
  done
  if [ "$mode" = on ]; then
    local ctl=("$BIN/felixctl" --broker "127.0.0.1:$QUIC_PORT" --token-file "$TMP/data/admin.token")
    "${ctl[@]}" tenant create bench >/dev/null 2>&1
    token_arg=(--token "$("${ctl[@]}" token create --tenant bench --ttl 1h 2>/dev/null)")
  fi
  load=$(loadavg)
  cpu0=$(cpu_ticks "$FELIX_PID")
  busy0=$(busy_ticks)
  line=$(env -u FELIX_TOKEN "$BIN/felix-bench" pubsub "${token_arg[@]}" --broker "127.0.0.1:$QUIC_PORT" \
    --tiered false --records "$RECORDS" --size 1024 --batch 100 --publishers 4 --inflight 8 \
    --fanout "$FANOUT" --rate "$RATE" 2>"$TMP/bench.err") || { cat "$TMP/bench.err" >&2; exit 1; }
  local broker_cpu machine_busy
  broker_cpu=$(secs "$(cpu_ticks "$FELIX_PID")" "$cpu0")
  machine_busy=$(secs "$(busy_ticks)" "$busy0")
  stop_pids "$FELIX_PID"
  FELIX_PID=
  echo "$line" | sed "s#^{#{\"auth\":\"$mode\",\"rep\":$rep,\"rate\":$RATE,\"bin\":\"$BIN\",\"commit\":\"$(git rev-parse --short HEAD)\",\"loadavg_before\":\"$load\",\"broker_cpu_seconds\":$broker_cpu,\"machine_busy_cpu_seconds\":$machine_busy,#" >>"$OUT"
  echo "auth $mode rep $rep: $(json "$line" "['records_per_sec']") records/s, ack p99 $(json "$line" "['ack_p99_us']") us, e2e p99 $(json "$line" "['e2e_p99_us']") us" >&2
  sleep 1
}

for rep in $(seq 1 "$REPS"); do
  if [ $((rep % 2)) = 1 ]; then
    run off "$rep"
    run on "$rep"
  else
    run on "$rep"
    run off "$rep"
  fi
done
cp "$OUT" "$RESULTS.jsonl"
python3 - "$RESULTS.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(mode, key):
    return statistics.median(r[key] for r in rows if r["auth"] == mode)
def rng(mode, key):
    v = sorted(r[key] for r in rows if r["auth"] == mode)
    return f"{v[0]:,.2f}-{v[-1]:,.2f}" if v[-1] < 100 else f"{v[0]:,.0f}-{v[-1]:,.0f}"
print("| figure (median of %d runs each) | auth off | auth on | on / off |" % len([r for r in rows if r["auth"] == "off"]))
print("|---|---|---|---|")
for key, label in [("records_per_sec", "records/s (end to end)"),
                   ("publish_records_per_sec", "records/s (published)"),
                   ("ack_p50_us", "publish ack p50 (us)"), ("ack_p99_us", "publish ack p99 (us)"),
                   ("e2e_p50_us", "delivery p50 (us)"), ("e2e_p99_us", "delivery p99 (us)"),
                   ("broker_cpu_seconds", "broker CPU s per run")]:
    off, on = med("off", key), med("on", key)
    print(f"| {label} | {off:,.2f} ({rng('off', key)}) | {on:,.2f} ({rng('on', key)}) | {on / off:.3f} |" if off < 100
          else f"| {label} | {off:,.0f} ({rng('off', key)}) | {on:,.0f} ({rng('on', key)}) | {on / off:.3f} |")
PY
echo "raw lines: $RESULTS.jsonl; copy the table above into $RESULTS.md" >&2
