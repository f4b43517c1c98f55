#!/usr/bin/env bash
# Consumer groups against a plain subscription (felix-bench groups) on one broker on this
# machine; writes bench/results/groups.md (a table) and bench/results/groups.jsonl (raw lines).
# Local runs only (CI never runs it).
#
#   bench/groups.sh
#   REPS=3 RECORDS=50000 PROFILE=debug bench/groups.sh   (defaults: 3, 100000, release)
#   SKIP_BUILD=1 FELIX=/tmp/felix BENCH=/tmp/felix-bench RESULTS=bench/results/groups-x \
#     bench/groups.sh      (binaries built elsewhere; BENCH with the `nats` feature for NATS)
#
# A fresh `felix` with its defaults on loopback; a 4-shard durable stream (tiering off)
# preloaded with RECORDS records of 1 KiB; per rep and poll size (BATCHES, records asked per
# poll across the shards): a plain subscription of every shard from earliest, then groups of
# 1, 4 and 16 consumers acknowledging everything, then 4 consumers nacking every tenth
# record to a dead-letter stream (max_attempts 1). PROFILE=debug uses the debug binaries
# (no release build).
#
# With `nats-server` on PATH (Debian: apt-get install -y nats-server; NATS=0 skips it), the
# same rep also runs the load against NATS JetStream on this machine (`nats-server -js`,
# file storage, fresh directory): work-queue pull consumers with explicit acks, 1, 4 and 16
# consumers, the same records, sizes and fetch sizes (felix-bench nats-groups, built with
# the `nats` feature). Raw lines: bench/results/groups-nats.jsonl.
#
# Both sides claim their next batch while the consumer acks the last (Felix:
# `GroupConsumer::prefetch`; NATS: the next pull request sent before the acks). PREFETCH=0
# runs both one batch at a time instead (`--no-prefetch`).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

REPS=${REPS:-3}
RECORDS=${RECORDS:-100000}
BATCHES=${BATCHES:-"400 100"}
PROFILE=${PROFILE:-release}
RESULTS=${RESULTS:-bench/results/groups}
NATS=${NATS:-1}
PREFETCH_ARGS=()
[ "${PREFETCH:-1}" = 0 ] && PREFETCH_ARGS=(--no-prefetch)
if [ "$NATS" = 1 ] && ! command -v nats-server >/dev/null; then
  echo "nats-server not on PATH: no NATS JetStream comparison (apt-get install -y nats-server)" >&2
  NATS=0
fi
FEATURES=()
[ "$NATS" = 1 ] && FEATURES=(--features nats)

# Built alone, `-p felix-gateway --bin felix` unifies features differently from the other
# scripts' builds and can rebuild every dependency: SKIP_BUILD=1 takes FELIX and BENCH as given.
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  if [ "$PROFILE" = release ]; then
    cargo build --release -q -p felix-gateway --bin felix
    cargo build --release -q -p felix-bench "${FEATURES[@]}"
  else
    cargo build -q -p felix-gateway --bin felix
    cargo build -q -p felix-bench "${FEATURES[@]}"
  fi
fi
FELIX=${FELIX:-./target/$PROFILE/felix}
BENCH=${BENCH:-./target/$PROFILE/felix-bench}

TMP=$(mktemp -d)
OUT=$TMP/groups.jsonl
NATS_OUT=$TMP/groups-nats.jsonl
: >"$NATS_OUT"
cleanup() { stop_pids "${PID:-}" "${NATS_PID:-}"; keep_partial_results; rm -rf "$TMP"; }
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
if [ "$NATS" = 1 ]; then
  NATS_PORT=$(free_port)
  nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$TMP/nats" >"$TMP/nats.log" 2>&1 &
  NATS_PID=$!
  sleep 1
fi

LOAD_BEFORE=$(loadavg)
for rep in $(seq 1 "$REPS"); do
  for batch in $BATCHES; do
    echo "groups: rep $rep, poll size $batch" >&2
    "$BENCH" groups --broker "127.0.0.1:$QUIC_PORT" --records "$RECORDS" --batch "$batch" \
      "${PREFETCH_ARGS[@]}" 2>/dev/null | tail -1 >>"$OUT"
    if [ "$NATS" = 1 ]; then
      echo "nats-groups: rep $rep, fetch size $batch" >&2
      "$BENCH" nats-groups --server "127.0.0.1:$NATS_PORT" --records "$RECORDS" \
        --batch "$batch" "${PREFETCH_ARGS[@]}" 2>/dev/null | tail -1 >>"$NATS_OUT"
    fi
  done
done
cp "$OUT" "$RESULTS.jsonl"
[ "$NATS" = 1 ] && cp "$NATS_OUT" "$RESULTS-nats.jsonl"
COPIED=1
COMMIT=$(git rev-parse --short HEAD)
NATS_VERSION=$( [ "$NATS" = 1 ] && nats-server --version || echo none)
python3 - "$RESULTS.jsonl" "$PROFILE" "$COMMIT" "$LOAD_BEFORE" "$(loadavg)" "$NATS_OUT" "$NATS_VERSION" <<'PY' >"$RESULTS.md"
import json, os, statistics, sys, datetime, subprocess
path, profile, commit, load_before, load_after, nats_path, nats_version = sys.argv[1:8]
rows = [json.loads(l) for l in open(path) if l.strip()]
nats = [json.loads(l) for l in open(nats_path) if l.strip()] if os.path.exists(nats_path) else []
print(f"# Consumer groups vs a plain subscription ({datetime.date.today()})\n")
print(f"Command: `PROFILE={profile} bench/groups.sh` ({len(rows)} runs). Raw lines: `{os.path.basename(path)}`.\n")
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
      "acknowledgement's answer, per record, at full load.")
if nats:
    print(f"* NATS JetStream ({nats_version}, `nats-server -js`, file storage) on the same machine in the same "
          "run, after each Felix rep: a fresh work-queue stream per consumer count, preloaded the same way, one "
          "durable pull consumer with explicit acks shared by that many consumers (own connections), fetching "
          "`batch` records, acking each, then flushing the connection (a JetStream ack is not answered). "
          "`vs NATS`: Felix's group records/s over NATS's for the same consumer count and fetch size.")
print()
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
        ns = [g for r in nats if r['batch'] == batch for g in r['groups'] if g['consumers'] == n]
        if ns:
            nv = [g['records_per_sec'] for g in ns]
            vs = statistics.median(v) / statistics.median(nv)
            print(f"| {batch} | NATS, {n} | {statistics.median(nv):,.0f} ({min(nv):,.0f}–{max(nv):,.0f}) | Felix {vs:.2f}× NATS | "
                  f"{statistics.median([g['claim_to_ack_us'][0] for g in ns])/1000:.1f} | "
                  f"{statistics.median([g['claim_to_ack_us'][1] for g in ns])/1000:.1f} |")
    nk = [(r['nack10'], r['subscription_records_per_sec']) for r in rs]
    v = [g['records_per_sec'] for g, _ in nk]
    ratio = statistics.median([g['records_per_sec'] / s for g, s in nk])
    print(f"| {batch} | 4, 10% dead-lettered | {statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f}) | {ratio:.2f}× | "
          f"{statistics.median([g['claim_to_ack_us'][0] for g, _ in nk])/1000:.1f} | "
          f"{statistics.median([g['claim_to_ack_us'][1] for g, _ in nk])/1000:.1f} |")
half = [(r['batch'], r['half_load']) for r in rows if r.get('half_load')]
if half:
    print("\n## At half load\n")
    print("4 consumers of a fresh group from `latest` while one publisher sends a batch every 5 ms (up to 8 unanswered) at half the records/s the "
          "4-consumer run reached (`--half-load-secs`, default 10 s). Claim-to-ack: a poll's return to its acknowledgement's "
          "answer; publish-to-ack: the record's timestamp (ms, set by the publishing client) to that answer.\n")
    print("| poll size | offered records/s | published records/s | acknowledged records/s | claim-to-ack p50 / p99 / max ms | publish-to-ack p50 / p99 / max ms |")
    print("|---|---|---|---|---|---|")
    for batch, h in half:
        c, e = h['claim_to_ack_us'], h['publish_to_ack_us']
        print(f"| {batch} | {h['offered_per_sec']:,.0f} | {h.get('published_per_sec', 0):,.0f} | {h['records_per_sec']:,.0f} | {c[0]/1000:.1f} / {c[1]/1000:.1f} / {c[3]/1000:.1f} "
              f"| {e[0]/1000:.1f} / {e[1]/1000:.1f} / {e[3]/1000:.1f} |")
PY
cat "$RESULTS.md"
