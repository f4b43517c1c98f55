#!/usr/bin/env bash
# Catch-up against a distant object store: bench/catchup.sh's replays (hot, cold behind an
# empty cache, cold behind a warm cache) with every GET slowed as real S3 answers it, by the
# broker's simulated store (object_store_get_latency_ms, _jitter_ms, _bytes_per_sec; a
# FELIX_FAULT_INJECTION=1 benchmark tool) over `file://`, so neither an S3 server's CPU nor
# loopback's free GETs is what is measured. Also: ten concurrent cold readers, publish
# latency beside a cold reader, and cold replays with the content-digest check off
# (cold_skip_content_digests) beside the same replays with it on (issue 19's cost figure).
# Writes bench/results/catchup-latency.jsonl (one line per phase) and
# bench/results/catchup-latency.md. Local runs only (CI never runs it).
#
#   bench/catchup-latency.sh
#   BUILD=release GIB=1 REPS=3 bench/catchup-latency.sh   (defaults: debug, 0.25, 2)
#   REPORT_ONLY=1 bench/catchup-latency.sh                  (rewrite the .md from the .jsonl)
#   CASES="s3-30ms" READERS=0 PUBLISH=0 REPS=1 RESULTS=bench/results/catchup-chart \
#     bench/catchup-latency.sh                              (some cases only, elsewhere)
#
# The .md is followed by an SVG chart of MB/s over time (hot, cold-empty, cold-warm) of the
# first s3-30ms repetition: $RESULTS-s3-30ms.svg.
#
# Cases (each after a restart with the cache dir wiped; hot, cold-empty and cold-warm
# replays alternate inside a repetition):
#   local        no simulated latency (what bench/catchup.sh's `file` rows measure)
#   s3-30ms      30 ms to the first byte of every GET, 100 MB/s per GET
#   s3-30-80ms   30 ms plus up to 50 ms more (uniform), 100 MB/s per GET: a tail
#   s3-30ms-2rg  as s3-30ms with the read-ahead budget at two row groups (8 MiB), about
#                the fixed read-ahead of two row groups the broker had before
#   *-nodigest   the same with cold_skip_content_digests (local and s3-30ms)
#   readers-10   s3-30ms, ten readers at once from offsets i/10 of the stream (aggregate)
#   streams-10   s3-30ms, ten readers at once, each of its own stream of GIB/10 (aggregate)
# then publish latency at half the load rate, alone, beside one cold reader and beside one
# reader of the hot copy (s3-30ms).
set -euo pipefail
{
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

BUILD=${BUILD:-debug}
GIB=${GIB:-0.25}
REPS=${REPS:-2}
SEGMENT_BYTES=${SEGMENT_BYTES:-$((64 << 20))}
ROW_GROUP_BYTES=${ROW_GROUP_BYTES:-$((4 << 20))}
LAT_SECS=${LAT_SECS:-15}
REPORT_ONLY=${REPORT_ONLY:-0}
RESULTS=${RESULTS:-bench/results/catchup-latency}
CASES=${CASES:-"local local-nodigest s3-30ms s3-30ms-nodigest s3-30-80ms s3-30ms-2rg"}
READERS=${READERS:-1}
PUBLISH=${PUBLISH:-1}
BIN=./target/$BUILD/felix-bench
FELIX=./target/$BUILD/felix
SLOW=(--object-store-get-latency-ms 30 --object-store-get-bytes-per-sec 100000000)
TAIL=(--object-store-get-latency-ms 30 --object-store-get-jitter-ms 50 --object-store-get-bytes-per-sec 100000000)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/catchup-latency.XXXXXX")
OUT=$TMP/out.jsonl
FELIX_PID=
cleanup() {
  stop_pids "$FELIX_PID"
  keep_partial_results
  rm -rf "$TMP"
}
on_exit cleanup

if [ "$REPORT_ONLY" != 1 ]; then
  echo "building felix and felix-bench ($BUILD)" >&2
  if [ "$BUILD" = release ]; then
    cargo build --release -q -p felix-bench -p felix-gateway
  else
    cargo build -q -p felix-bench -p felix-gateway
  fi
  broker_ports
  EXTRA=(--kafka-addr "127.0.0.1:$(free_port)")
fi

# start_felix FLAGS...: the broker on the run's data dir and object directory, cache wiped.
start_felix() {
  rm -rf "$TMP/cache"
  mkdir -p "$TMP/objects"
  CASE_FLAGS="$*"
  FELIX_LOG=warn FELIX_FAULT_INJECTION=1 FELIX_OBJECT_STORE="file://$TMP/objects" \
    "$FELIX" --data-dir "$TMP/felix" --quic-addr "127.0.0.1:$QUIC_PORT" \
    --admin-addr "127.0.0.1:$ADMIN_PORT" --internal-addr "127.0.0.1:$INTERNAL_PORT" \
    --cache-dir "$TMP/cache" --cache-disk-bytes $((2 << 30)) --cache-memory-bytes $((64 << 20)) \
    --tier-row-group-bytes "$ROW_GROUP_BYTES" --retention-check-ms 1000 "${EXTRA[@]}" "$@" \
    >>"$TMP/felix.log" 2>&1 &
  FELIX_PID=$!
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$ADMIN_PORT/healthz" >/dev/null 2>&1 && return
    kill -0 "$FELIX_PID" 2>/dev/null || { tail -20 "$TMP/felix.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "felix not ready" >&2
  exit 1
}

stop_felix() {
  stop_pids "$FELIX_PID"
  FELIX_PID=
}

# phase CASE ARGS...: one felix-bench catchup line with the case, the broker's flags, the
# broker's CPU seconds and the load average added.
phase() {
  local case=$1 load0 f0 f1 line
  shift
  load0=$(loadavg)
  f0=$(cpu_ticks "$FELIX_PID")
  echo "$case: catchup $* (load $load0)" >&2
  line=$("$BIN" catchup --broker "127.0.0.1:$QUIC_PORT" --admin "127.0.0.1:$ADMIN_PORT" \
    --size 1024 --batch 100 --publishers 4 --inflight 8 --segment-bytes "$SEGMENT_BYTES" "$@" \
    2>"$TMP/bench.err") || { cat "$TMP/bench.err" >&2; tail -20 "$TMP/felix.log" >&2; exit 1; }
  f1=$(cpu_ticks "$FELIX_PID")
  line=$(echo "$line" | sed "s/^{/{\"case\":\"$case\",\"build\":\"$BUILD\",\"broker_flags\":\"$CASE_FLAGS\",\"loadavg_before\":[$load0],\"loadavg_after\":[$(loadavg)],\"felix_cpu_seconds\":$(secs "$f1" "$f0"),/")
  echo "$line" >>"$OUT"
  LINE=$line
  echo "  $(echo "$line" | cut -c1-300)" >&2
  sleep 1
}

# replays CASE FLAGS...: a restart with FLAGS and the cache wiped, then cold-empty,
# cold-warm and hot replays.
replays() {
  local case=$1
  shift
  stop_felix
  start_felix "$@"
  phase "$case" --phase replay --stream catchup --expect cold --label cold-empty
  phase "$case" --phase replay --stream catchup --expect cold --label cold-warm
  phase "$case" --phase replay --stream catchup-hot --expect hot --label hot
}

if [ "$REPORT_ONLY" != 1 ]; then
  START=$(date +%s)
  start_felix
  phase load --phase load --stream catchup --gib "$GIB"
  rate=$(printf '%.0f' "$(json "$LINE" '["publish"]["records_per_sec"] / 2')")
  phase load --phase load --stream catchup-hot --gib "$GIB" --label hot-copy
  phase load --phase make-cold --stream catchup
  for rep in $(seq 1 "$REPS"); do
    echo "repetition $rep of $REPS" >&2
    for case in $CASES; do
      case $case in
        local) replays local ;;
        local-nodigest) replays local-nodigest --cold-skip-content-digests ;;
        s3-30ms) replays s3-30ms "${SLOW[@]}" ;;
        s3-30ms-nodigest) replays s3-30ms-nodigest "${SLOW[@]}" --cold-skip-content-digests ;;
        s3-30-80ms) replays s3-30-80ms "${TAIL[@]}" ;;
        s3-30ms-2rg) replays s3-30ms-2rg "${SLOW[@]}" --cold-read-ahead-bytes $((2 * ROW_GROUP_BYTES)) ;;
        *) echo "unknown case $case" >&2; exit 2 ;;
      esac
    done
  done
  if [ "$READERS" = 1 ]; then
    stop_felix
    start_felix "${SLOW[@]}"
    phase readers-10 --phase replay --stream catchup --expect cold --label cold-empty --readers 10
    phase readers-10 --phase replay --stream catchup --expect cold --label cold-warm --readers 10
    phase readers-10 --phase replay --stream catchup-hot --expect hot --label hot --readers 10
    # Ten streams of a tenth of the size each, one reader each, from offset 0.
    others=
    for n in $(seq 1 10); do
      phase streams-10 --phase load --stream "catchup-s$n" --gib "$(awk -v g="$GIB" 'BEGIN { print g / 10 }')" --label load
      phase streams-10 --phase make-cold --stream "catchup-s$n" --label make-cold
      [ "$n" -gt 1 ] && others="${others:+$others,}catchup-s$n"
    done
    stop_felix
    start_felix "${SLOW[@]}"
    phase streams-10 --phase replay --stream catchup-s1 --also-streams "$others" --expect cold --label cold-empty
    phase streams-10 --phase replay --stream catchup-s1 --also-streams "$others" --expect cold --label cold-warm
  fi
  if [ "$PUBLISH" = 1 ]; then
    stop_felix
    start_felix "${SLOW[@]}"
    phase publish --phase publish-latency --rate "$rate" --seconds "$LAT_SECS" --label alone
    phase publish --phase publish-latency --rate "$rate" --seconds "$LAT_SECS" --label cold-reader --cold-reader
    # The same reader on the hot copy: what delivering a replay costs the publishes, apart
    # from fetching and decoding cold history.
    phase publish --phase publish-latency --rate "$rate" --seconds "$LAT_SECS" --label hot-reader --cold-reader --stream catchup-hot
    phase publish --phase publish-latency --rate "$rate" --seconds "$LAT_SECS" --label alone
    # The same cold reader with read-ahead held to two row groups (about the fixed
    # read-ahead before it was sized by the store): does deeper read-ahead cost publishes?
    stop_felix
    start_felix "${SLOW[@]}" --cold-read-ahead-bytes $((2 * ROW_GROUP_BYTES))
    phase publish-2rg --phase publish-latency --rate "$rate" --seconds "$LAT_SECS" --label alone
    phase publish-2rg --phase publish-latency --rate "$rate" --seconds "$LAT_SECS" --label cold-reader --cold-reader
    phase publish-2rg --phase publish-latency --rate "$rate" --seconds "$LAT_SECS" --label alone
  fi
  stop_felix
  echo "{\"case\":\"run\",\"build\":\"$BUILD\",\"commit\":\"$(git rev-parse --short HEAD)\",\"seconds\":$(($(date +%s) - START)),\"cpu\":\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\",\"cores\":$(nproc),\"gib\":$GIB,\"reps\":$REPS}" >>"$OUT"
  cp "$OUT" "$RESULTS.jsonl"
  COPIED=1
fi

python3 bench/catchup_latency_report.py "$RESULTS.jsonl" >"$RESULTS.md"
echo "wrote $RESULTS.md" >&2
if python3 bench/catchup_chart.py "$RESULTS.jsonl" s3-30ms >"$TMP/chart.svg"; then
  cp "$TMP/chart.svg" "$RESULTS-s3-30ms.svg"
  echo "wrote $RESULTS-s3-30ms.svg" >&2
fi
}
