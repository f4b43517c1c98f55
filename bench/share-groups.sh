#!/usr/bin/env bash
# Kafka share groups vs a classic consumer group on Felix: consume+accept records/s with 1
# and 4 confluent-kafka ShareConsumers, accepting each record with an explicit ACCEPT call
# ("share") or implicitly by the next poll ("implicit", Kafka's default acknowledgement
# mode), acknowledgements piggy-backed on ShareFetch either way, and with one classic
# Consumer (auto-commit), each on a fresh
# topic of PARTITIONS partitions holding the same RECORDS records of SIZE bytes, interleaved
# reps, one broker. Writes bench/results/share-groups.md (table) and
# bench/results/share-groups.jsonl (raw lines). Local runs only (CI never runs it); needs
# python3 with confluent-kafka 2.16 (ShareConsumer).
#
#   bench/share-groups.sh
#   REPS=5 RECORDS=50000 bench/share-groups.sh        (defaults: 3, 20000)
#   KINDS="classic:1 implicit:1" bench/share-groups.sh  (default: all five kinds below)
#   PROFILE=release bench/share-groups.sh             (default: debug, the dev build)
#   FELIX_BIN=/path/to/felix SKIP_BUILD=1 RESULTS=/tmp/ab/main-1 bench/share-groups.sh
#       (another build's broker, e.g. main's for an A/B, its table and lines written to
#       $RESULTS.md and $RESULTS.jsonl instead of bench/results/share-groups.*)
#
# Where one consumer's time goes (its own CPU, the time inside poll(), the poll sizes):
# bench/share_groups_probe.py against a broker already up (its header has the commands).
#
# Per rep, for each of classic, share x1, share x4, implicit x1, implicit x4 (order rotating
# between reps): create the
# topic, make the share group exist (a share group starts at `latest`), produce RECORDS,
# then time from the first record received to the last (across all consumers for share x4,
# 4 processes; the time from subscribe() is kept too, but for the classic group it includes
# the 3 s initial rebalance delay). The broker's CPU seconds and the load average are read
# around each run.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

REPS=${REPS:-3}
RECORDS=${RECORDS:-20000}
SIZE=${SIZE:-200}
PARTITIONS=${PARTITIONS:-4}
PROFILE=${PROFILE:-debug}
RESULTS=${RESULTS:-bench/results/share-groups}

python3 -c 'from confluent_kafka import ShareConsumer' 2>/dev/null || {
  echo "share-groups.sh needs confluent-kafka >= 2.15 for python3 (ShareConsumer)" >&2
  exit 1
}
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  if [ "$PROFILE" = release ]; then
    cargo build -q --release -p felix-gateway --bin felix
  else
    cargo build -q -p felix-gateway --bin felix
  fi
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/share-groups.XXXXXX")
OUT=$TMP/out.jsonl
: >"$OUT"
mkdir "$TMP/bin"
cp "${FELIX_BIN:-target/$PROFILE/felix}" "$TMP/bin/felix"
FELIX_PID=
cleanup() {
  stop_pids "$FELIX_PID"
  keep_partial_results
  rm -rf "$TMP"
}
on_exit cleanup

broker_ports
KAFKA_PORT=$(free_port)
KAFKA=127.0.0.1:$KAFKA_PORT
FELIX_LOG=warn "$TMP/bin/felix" --data-dir "$TMP/felix" --quic-addr "127.0.0.1:$QUIC_PORT" \
  --admin-addr "127.0.0.1:$ADMIN_PORT" --internal-addr "127.0.0.1:$INTERNAL_PORT" \
  --kafka-addr "$KAFKA" --kafka-default-partitions "$PARTITIONS" >"$TMP/felix.log" 2>&1 &
FELIX_PID=$!
for _ in $(seq 1 300); do
  if curl -sf "http://127.0.0.1:$ADMIN_PORT/healthz" >/dev/null 2>&1 \
    && (exec 3<>"/dev/tcp/127.0.0.1/$KAFKA_PORT") 2>/dev/null; then
    break
  fi
  kill -0 "$FELIX_PID" 2>/dev/null || { echo "felix exited:" >&2; cat "$TMP/felix.log" >&2; exit 1; }
  sleep 0.1
done

PY=bench/share_groups.py
read -r -a KINDS <<<"${KINDS:-classic:1 share:1 share:4 implicit:1 implicit:4}"
for rep in $(seq 1 "$REPS"); do
  for k in "${!KINDS[@]}"; do
    IFS=: read -r kind consumers <<<"${KINDS[$(((k + rep) % ${#KINDS[@]}))]}"
    topic="r${rep}-${kind}-${consumers}"
    [ "$kind" != classic ] && python3 "$PY" join "$KAFKA" "$topic" "$topic-share"
    python3 "$PY" produce "$KAFKA" "$topic" "$RECORDS" "$SIZE"
    load_before=$(loadavg)
    cpu_before=$(cpu_ticks "$FELIX_PID")
    line=$(python3 "$PY" "$kind" "$KAFKA" "$topic" "$RECORDS" "$consumers")
    cpu=$(secs "$(cpu_ticks "$FELIX_PID")" "$cpu_before")
    echo "$line" | python3 -c "
import json, sys
r = json.loads(sys.stdin.read())
r.update(rep=$rep, broker_cpu_s=$cpu, load_before='$load_before', load_after='$(loadavg)',
         size=$SIZE, partitions=$PARTITIONS, profile='$PROFILE')
print(json.dumps(r))" | tee -a "$OUT" >&2
  done
done
cp "$OUT" "$RESULTS.jsonl"
COPIED=1

python3 - "$RESULTS.jsonl" "$PROFILE" "$RECORDS" "$SIZE" "$PARTITIONS" "$(git rev-parse --short HEAD)" >"$RESULTS.md" <<'PY'
import json, os, statistics, sys
path, profile, records, size, partitions, commit = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
def label(r):
    if r["kind"] == "classic":
        return "classic consumer group, 1 Consumer"
    how = "explicit ACCEPT per record" if r["kind"] == "share" else "implicit acceptance"
    return f"share group, {r['consumers']} ShareConsumer(s), {how}"
rows = {}
for r in lines:
    rows.setdefault(label(r), []).append(r)
classic = statistics.median(r["steady_records_per_s"] for r in rows["classic consumer group, 1 Consumer"])
print(f"# Kafka share groups vs a classic consumer group: consume+accept records/s (commit {commit})\n")
print(f"Command: `bench/share-groups.sh` (PROFILE={profile}, {max(len(rs) for rs in rows.values())} reps interleaved). Raw lines: `{os.path.basename(path)}`.\n")
print(f"* One `felix` ({profile} build) on loopback, defaults; each run on a fresh topic of {partitions} partitions holding {records} records of {size} B, confluent-kafka 2.16 (librdkafka 2.16.0).")
print("* Share: every record accepted, with an explicit ACCEPT call or implicitly by the next poll (Kafka's default mode), acknowledgements piggy-backed on the next ShareFetch; N consumers are N processes. Classic: one Consumer, auto-commit. Rate: records over the time from the first record received to the last (steady state); from subscribe() in the last column (the classic group's includes its 3 s initial rebalance delay).")
print("* The machine is shared (2 cores, other builds and tests): the load average is in the raw lines.\n")
print("| consumers | records/s, first→last record (median, range) | ÷ classic | broker CPU s per 10k records | records/s from subscribe() (median) |")
print("|---|---|---|---|---|")
for name, rs in rows.items():
    v = [r["steady_records_per_s"] for r in rs]
    cpu = statistics.median(r["broker_cpu_s"] / r["records"] * 10000 for r in rs)
    total = statistics.median(r["records_per_s"] for r in rs)
    print(f"| {name} | **{statistics.median(v):.0f}** ({min(v):.0f}–{max(v):.0f}) | {statistics.median(v)/classic:.2f}× | {cpu:.3f} | {total:.0f} |")
PY
cat "$RESULTS.md" >&2
