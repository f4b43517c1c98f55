#!/usr/bin/env bash
# Synchronous Kafka offset commits per second on one broker: one confluent-kafka Consumer
# commits each of RECORDS records synchronously before reading the next (as the classic-group
# test does), REPS runs, each on a fresh one-partition topic. Compares felix binaries: each
# `label=path` in BINS is started in turn (e.g. a build of the commit before offsets moved
# into the group journals, and this one). Writes bench/results/kafka-commits.md and .jsonl.
# Local runs only; needs python3 with confluent-kafka.
#
#   BINS="after=target/debug/felix" bench/kafka-commits.sh
#   BINS="before=/tmp/felix-before after=target/debug/felix" REPS=3 RECORDS=3000 bench/kafka-commits.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

REPS=${REPS:-3}
RECORDS=${RECORDS:-3000}
BINS=${BINS:-after=target/debug/felix}
RESULTS=bench/results/kafka-commits

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kafka-commits.XXXXXX")
OUT=$TMP/out.jsonl
: >"$OUT"
FELIX_PID=
cleanup() {
  stop_pids "$FELIX_PID"
  keep_partial_results
  rm -rf "$TMP"
}
on_exit cleanup

for rep in $(seq 1 "$REPS"); do
  for bin in $BINS; do
    label=${bin%%=*}
    path=${bin#*=}
    broker_ports
    KAFKA_PORT=$(free_port)
    KAFKA=127.0.0.1:$KAFKA_PORT
    rm -rf "$TMP/felix"
    FELIX_LOG=warn "$path" --data-dir "$TMP/felix" --quic-addr "127.0.0.1:$QUIC_PORT" \
      --admin-addr "127.0.0.1:$ADMIN_PORT" --internal-addr "127.0.0.1:$INTERNAL_PORT" \
      --kafka-addr "$KAFKA" --kafka-default-partitions 1 >"$TMP/felix.log" 2>&1 &
    FELIX_PID=$!
    for _ in $(seq 1 300); do
      if curl -sf "http://127.0.0.1:$ADMIN_PORT/healthz" >/dev/null 2>&1 \
        && (exec 3<>"/dev/tcp/127.0.0.1/$KAFKA_PORT") 2>/dev/null; then
        break
      fi
      kill -0 "$FELIX_PID" 2>/dev/null || { echo "felix exited:" >&2; cat "$TMP/felix.log" >&2; exit 1; }
      sleep 0.1
    done
    load_before=$(loadavg)
    line=$(python3 bench/kafka_commits.py "$KAFKA" "commits-$rep" "g-$rep" "$RECORDS")
    echo "$line" | python3 -c "
import json, sys
r = json.loads(sys.stdin.read())
r.update(binary='$label', rep=$rep, load_before='$load_before', load_after='$(loadavg)')
print(json.dumps(r))" | tee -a "$OUT" >&2
    stop_pids "$FELIX_PID"
    FELIX_PID=
  done
done
cp "$OUT" "$RESULTS.jsonl"
COPIED=1

python3 - "$RESULTS.jsonl" "$RECORDS" "$(git rev-parse --short HEAD)" >"$RESULTS.md" <<'PY'
import json, statistics, sys
path, records, commit = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
rows = {}
for r in lines:
    rows.setdefault(r["binary"], []).append(r["commits_per_s"])
print(f"# Synchronous Kafka offset commits per second, one broker (commit {commit})\n")
print(f"Command: `bench/kafka-commits.sh` ({len(lines)} runs). Raw lines: `kafka-commits.jsonl`.\n")
print(f"* One `felix` on loopback, defaults (fsync `periodic`), a fresh one-partition topic per run; one confluent-kafka Consumer commits each of {records} records synchronously before reading the next.")
print("* The machine is shared (2 cores, other builds and tests): the load average is in the raw lines.\n")
print("| binary | commits/s (median, range) |")
print("|---|---|")
for name, v in rows.items():
    print(f"| {name} | **{statistics.median(v):.0f}** ({min(v):.0f}–{max(v):.0f}) |")
PY
cat "$RESULTS.md" >&2
