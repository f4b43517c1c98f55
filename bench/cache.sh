#!/usr/bin/env bash
# The cache (felix-bench cache) on one broker and on three (Leader and Quorum), side by side
# in the same run with redis-server (appendonly yes, appendfsync everysec) driven by
# redis-benchmark, and NATS JetStream KV (nats-server -js, a file-storage bucket) driven by
# felix-bench nats-kv; writes bench/results/cache.md (a table) and bench/results/cache.jsonl
# (raw lines). Local runs only (CI never runs it). Needs redis-server and nats-server on
# PATH (Debian: apt-get install -y redis-server nats-server).
#
#   bench/cache.sh
#   OPS=20000 PROFILE=debug bench/cache.sh   (defaults: 50000 ops per phase, release)
#   SKIP_BUILD=1 FELIX=/tmp/felix BENCH=/tmp/felix-bench RESULTS=bench/results/cache-x \
#     bench/cache.sh                         (binaries built elsewhere)
#
# Load: 1 KiB values, 10,000 keys, 16 concurrent clients; puts, then gets. Felix caches are
# log-backed (durable) with the broker's default fsync policy (periodic, 250 ms), the
# comparable setting to Redis's appendfsync everysec; JetStream flushes on its own interval.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

OPS=${OPS:-50000}
KEYS=${KEYS:-10000}
CLIENTS=${CLIENTS:-16}
PROFILE=${PROFILE:-release}
RESULTS=${RESULTS:-bench/results/cache}
command -v redis-server >/dev/null || { echo "redis-server is needed (apt-get install redis-server)" >&2; exit 1; }
command -v nats-server >/dev/null || { echo "nats-server is needed (apt-get install nats-server)" >&2; exit 1; }

# SKIP_BUILD=1 takes FELIX and BENCH (built with the `nats` feature) as given.
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  if [ "$PROFILE" = release ]; then
    cargo build --release -q -p felix-gateway --bin felix
    cargo build --release -q -p felix-bench --features nats
  else
    cargo build -q -p felix-gateway --bin felix
    cargo build -q -p felix-bench --features nats
  fi
fi
FELIX=${FELIX:-./target/$PROFILE/felix}
BENCH=${BENCH:-./target/$PROFILE/felix-bench}

TMP=$(mktemp -d)
OUT=$TMP/cache.jsonl
PIDS=()
cleanup() { stop_pids "${PIDS[@]:-}"; keep_partial_results; rm -rf "$TMP"; }
on_exit cleanup

wait_ready() {
  for _ in $(seq 1 240); do
    grep -qs "ready" "$1" && return 0
    sleep 0.5
  done
  cat "$1" >&2
  return 1
}

# Brokers 1..N of a cluster (N=1: a single node); sets SEEDS.
start_felix() {
  local n=$1 spec="" id
  local -a quic internal
  for id in $(seq 1 "$n"); do
    quic[$id]=$(free_port) internal[$id]=$(free_port)
    spec="${spec:+$spec,}$id=127.0.0.1:${internal[$id]}"
  done
  SEEDS=""
  for id in $(seq 1 "$n"); do
    local dir=$TMP/felix-$n/node-$id
    mkdir -p "$dir"
    local cluster=()
    [ "$n" -gt 1 ] && cluster=(--node-id "$id" --cluster "$spec")
    FELIX_OBJECT_STORE="file://$TMP/felix-$n/objects" "$FELIX" "${cluster[@]}" \
      --data-dir "$dir/data" --quic-addr "127.0.0.1:${quic[$id]}" \
      --internal-addr "127.0.0.1:${internal[$id]}" --admin-addr "127.0.0.1:$(free_port)" \
      --kafka-addr "127.0.0.1:$(free_port)" >"$dir/felix.log" 2>&1 &
    PIDS+=($!)
    SEEDS="${SEEDS:+$SEEDS,}127.0.0.1:${quic[$id]}"
  done
  for id in $(seq 1 "$n"); do wait_ready "$TMP/felix-$n/node-$id/felix.log"; done
}

felix_run() {
  local label=$1
  shift
  echo "cache: felix $label" >&2
  "$BENCH" cache --broker "$SEEDS" --keys "$KEYS" --clients "$CLIENTS" --ops "$OPS" --durable "$@" \
    2>/dev/null | tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['system']='felix $label'; print(json.dumps(d))" >>"$OUT"
}

LOAD_BEFORE=$(loadavg)
start_felix 1
felix_run "1 broker"
stop_pids "${PIDS[@]}"; PIDS=()
start_felix 3
felix_run "3 brokers, Leader" --replicas 3 --consistency leader
felix_run "3 brokers, Quorum" --replicas 3 --consistency quorum
stop_pids "${PIDS[@]}"; PIDS=()

echo "cache: redis" >&2
RPORT=$(free_port)
mkdir -p "$TMP/redis"
redis-server --port "$RPORT" --dir "$TMP/redis" --appendonly yes --appendfsync everysec \
  --save "" --daemonize no >"$TMP/redis/log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 50); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-benchmark -p "$RPORT" -t set,get -n "$OPS" -c "$CLIENTS" -d 1024 -r "$KEYS" --csv 2>/dev/null |
  python3 -c '
import csv, json, sys
rows = {r[0]: r for r in csv.reader(sys.stdin) if r and r[0] in ("SET", "GET")}
def phase(r):
    # redis-benchmark --csv: test, rps, avg_latency_ms, min, p50, p95, p99, max (ms)
    return {"ops_per_sec": float(r[1]), "latency_us": [int(float(r[4]) * 1000), int(float(r[6]) * 1000), None, int(float(r[7]) * 1000)]}
print(json.dumps({"scenario": "cache", "system": "redis appendfsync everysec", "put": phase(rows["SET"]), "get": phase(rows["GET"])}))
' >>"$OUT"
stop_pids "${PIDS[@]}"; PIDS=()

echo "cache: nats kv" >&2
NPORT=$(free_port)
mkdir -p "$TMP/nats"
nats-server -a 127.0.0.1 -p "$NPORT" -js -sd "$TMP/nats" >"$TMP/nats.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 50); do grep -qs "Server is ready" "$TMP/nats.log" && break; sleep 0.1; done
"$BENCH" nats-kv --server "127.0.0.1:$NPORT" --keys "$KEYS" --clients "$CLIENTS" --ops "$OPS" \
  2>/dev/null | tail -1 >>"$OUT"
stop_pids "${PIDS[@]}"; PIDS=()

cp "$OUT" "$RESULTS.jsonl"
COPIED=1
python3 - "$OUT" "$PROFILE" "$LOAD_BEFORE" "$OPS" "$KEYS" "$CLIENTS" >"$RESULTS.md" <<'PY'
import json, sys
path, profile, load, ops, keys, clients = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
print("# Cache: Felix against Redis and NATS JetStream KV\n")
print(f"`bench/cache.sh`, profile `{profile}`, {ops} ops per phase, {keys} keys, 1 KiB values, "
      f"{clients} concurrent clients; load average before: {load}. Felix caches are log-backed "
      "(periodic fsync, 250 ms); Redis runs appendonly with appendfsync everysec; NATS "
      "JetStream KV is a file-storage bucket, one replica, history 1.\n")
print("| system | put ops/s | put p50 / p99 µs | get ops/s | get p50 / p99 µs |")
print("|---|---|---|---|---|")
for d in lines:
    p, g = d["put"], d["get"]
    print(f"| {d['system']} | {p['ops_per_sec']:.0f} | {p['latency_us'][0]} / {p['latency_us'][1]} "
          f"| {g['ops_per_sec']:.0f} | {g['latency_us'][0]} / {g['latency_us'][1]} |")
PY
cat "$RESULTS.md"
