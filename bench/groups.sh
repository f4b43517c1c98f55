#!/usr/bin/env bash
# Consumer groups against a plain subscription (felix-bench groups) on one broker on this
# machine; writes bench/results/groups.md (a table) and bench/results/groups.jsonl (raw lines).
# Local runs only (CI never runs it).
#
#   bench/groups.sh
#   REPS=3 RECORDS=50000 PROFILE=debug bench/groups.sh   (defaults: 3, 100000, release)
#
# A fresh `felix` with its defaults on loopback; a 4-shard durable stream (tiering off)
# preloaded with RECORDS records of 1 KiB; per rep and poll size (BATCHES, records asked per
# poll across the shards): a plain subscription of every shard from earliest, then groups of
# 1, 4 and 16 consumers acknowledging everything, then 4 consumers nacking every tenth
# record to a dead-letter stream (max_attempts 1). PROFILE=debug uses the debug binaries
# (no release build).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

REPS=${REPS:-3}
RECORDS=${RECORDS:-100000}
BATCHES=${BATCHES:-"400 100"}
PROFILE=${PROFILE:-release}
RESULTS=bench/results/groups

if [ "$PROFILE" = release ]; then
  cargo build --release -q -p felix-gateway --bin felix
  cargo build --release -q -p felix-bench
else
  cargo build -q -p felix-gateway --bin felix
  cargo build -q -p felix-bench
fi
FELIX=./target/$PROFILE/felix
BENCH=./target/$PROFILE/felix-bench

TMP=$(mktemp -d)
OUT=$TMP/groups.jsonl
cleanup() { stop_pids "${PID:-}"; keep_partial_results; rm -rf "$TMP"; }
on_exit cleanup

broker_ports
KAFKA_PORT=$(free_port)
"$FELIX" --data-dir "$TMP/data" --quic-addr "127.0.0.1:$QUIC_PORT" \
  --admin-addr "127.0.0.1:$ADMIN_PORT" --internal-addr "127.0.0.1:$INTERNAL_PORT" \
  --kafka-addr "127.0.0.1:$KAFKA_PORT" >"$TMP/felix.log" 2>&1 &
PID=$!
for _ in $(seq 1 120); do
  grep -q "ready" "$TMP/felix.log" && break
  sleep 0.5
done
grep -q "ready" "$TMP/felix.log" || { cat "$TMP/felix.log" >&2; exit 1; }

LOAD_BEFORE=$(loadavg)
for rep in $(seq 1 "$REPS"); do
  for batch in $BATCHES; do
    echo "groups: rep $rep, poll size $batch" >&2
    "$BENCH" groups --broker "127.0.0.1:$QUIC_PORT" --records "$RECORDS" --batch "$batch" \
      2>/dev/null | tail -1 >>"$OUT"
  done
done
cp "$OUT" "$RESULTS.jsonl"
COPIED=1
COMMIT=$(git rev-parse --short HEAD)
python3 - "$RESULTS.jsonl" "$PROFILE" "$COMMIT" "$LOAD_BEFORE" "$(loadavg)" <<'PY' >"$RESULTS.md"
import json, statistics, sys, datetime, subprocess
path, profile, commit, load_before, load_after = sys.argv[1:6]
rows = [json.loads(l) for l in open(path) if l.strip()]
print(f"# Consumer groups vs a plain subscription ({datetime.date.today()})\n")
print(f"Command: `PROFILE={profile} bench/groups.sh` ({len(rows)} runs). Raw lines: `groups.jsonl`.\n")
print(f"* Felix at commit {commit}, **{profile} build**; machine: {subprocess.getoutput('nproc')} cores, "
      f"load average {load_before} before and {load_after} after (other work shares this machine).")
r0 = rows[0]
print(f"* One broker with its defaults; a durable stream of {r0['shards']} shards (tiering off) preloaded with "
      f"{r0['records']:,} records of {r0['size']} B (batches of 100); every consumer and subscriber has its own client "
      "in one felix-bench process on the same machine.")
print("* `subscription`: one plain subscription per shard from earliest, no acknowledgements. Groups: a fresh group "
      "per run, consumers polling `batch` records (across the shards) and acknowledging them in one request per "
      "shard. `nack10`: 4 consumers, every tenth record nacked into a dead-letter stream (max_attempts 1).")
print("* records/s from the first poll to the last answer; claim-to-ack: from a poll's return to its "
      "acknowledgement's answer, per record, at full load.\n")
print("| poll size | consumers | records/s (median, range) | vs subscription | claim-to-ack p50 ms | p99 ms |")
print("|---|---|---|---|---|---|")
for batch in sorted({r['batch'] for r in rows}, reverse=True):
    rs = [r for r in rows if r['batch'] == batch]
    sub = [r['subscription_records_per_sec'] for r in rs]
    print(f"| {batch} | subscription | {statistics.median(sub):,.0f} ({min(sub):,.0f}–{max(sub):,.0f}) | 1.00× | | |")
    for n in sorted({g['consumers'] for r in rs for g in r['groups']}):
        gs = [(g, r['subscription_records_per_sec']) for r in rs for g in r['groups'] if g['consumers'] == n]
        v = [g['records_per_sec'] for g, _ in gs]
        ratio = statistics.median([g['records_per_sec'] / s for g, s in gs])
        p50 = statistics.median([g['claim_to_ack_us'][0] for g, _ in gs]) / 1000
        p99 = statistics.median([g['claim_to_ack_us'][1] for g, _ in gs]) / 1000
        print(f"| {batch} | {n} | {statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f}) | {ratio:.2f}× | {p50:.1f} | {p99:.1f} |")
    nk = [(r['nack10'], r['subscription_records_per_sec']) for r in rs]
    v = [g['records_per_sec'] for g, _ in nk]
    ratio = statistics.median([g['records_per_sec'] / s for g, s in nk])
    print(f"| {batch} | 4, 10% dead-lettered | {statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f}) | {ratio:.2f}× | "
          f"{statistics.median([g['claim_to_ack_us'][0] for g, _ in nk])/1000:.1f} | "
          f"{statistics.median([g['claim_to_ack_us'][1] for g, _ in nk])/1000:.1f} |")
PY
cat "$RESULTS.md"
