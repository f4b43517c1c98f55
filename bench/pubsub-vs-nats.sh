#!/usr/bin/env bash
# Felix vs NATS JetStream, publish/subscribe end to end on this machine, and writes
# bench/results/pubsub-vs-nats.md (tables) and bench/results/pubsub-vs-nats.jsonl (raw lines).
# Local runs only (CI never runs it). It installs nothing: it needs `nats-server` on PATH
# (Debian: apt-get install -y nats-server) and builds felix-bench with the `nats` feature.
#
#   bench/pubsub-vs-nats.sh
#   REPS=3 RECORDS_F1=1000000 LAT_SECS=20 bench/pubsub-vs-nats.sh   (defaults: 5, 500000, 15)
#   FELIX_TIERED=true TIERED_REPS=0 bench/pubsub-vs-nats.sh   (Felix's stream tiered throughout)
#
# Both servers run on loopback with a fresh data directory each: `felix` with its defaults
# (durable streams fsynced periodically, every 250 ms; publishes acknowledged once written)
# and `nats-server -js` (file storage; JetStream flushes to disk on its own background
# interval, and 2.9.x cannot be told to fsync every write). The load is the same code for
# both (felix-bench `pubsub` / `nats-pubsub`): 4 publishers, batches of 100 records of
# 1 KiB, 8 batches in flight each, 1 or 10 subscribers from the live end of one stream of
# one shard.
#
# Steps, for fanout 1 and 10: REPS interleaved max-throughput runs of each system; then REPS
# runs of each at 50% of its own median max (LAT_SECS seconds of load) for latency; then, if
# `perf` is installed (PROFILE=0 turns it off), one extra max run of each with the server
# and the load generator sampled, to show where the CPU goes. Server CPU seconds are read
# from /proc around every run.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

REPS=${REPS:-5}
RECORDS_F1=${RECORDS_F1:-500000}
RECORDS_F10=${RECORDS_F10:-200000}
LAT_SECS=${LAT_SECS:-15}
SIZE=${SIZE:-1024}
BATCH=${BATCH:-100}
PUBLISHERS=${PUBLISHERS:-4}
INFLIGHT=${INFLIGHT:-8}
PROFILE=${PROFILE:-1}
# The Felix stream keeps its history on local disk only (`tiered: false`), as a JetStream
# file-storage stream does; TIERED_REPS extra max-throughput runs per fanout show Felix with
# tiering on (the default for a durable stream: sealed segments encoded to Parquet and
# uploaded, here to the embedded default, a local directory).
FELIX_TIERED=${FELIX_TIERED:-false}
TIERED_REPS=${TIERED_REPS:-3}

if ! command -v nats-server >/dev/null; then
  echo "pubsub-vs-nats.sh needs nats-server on PATH; on Debian/Ubuntu: apt-get install -y nats-server" >&2
  exit 1
fi
if [ "$PROFILE" = 1 ] && ! command -v perf >/dev/null; then
  echo "perf not found: skipping the CPU profile (apt-get install -y linux-perf to get it)" >&2
  PROFILE=0
fi

echo "building felix and felix-bench (release, --features nats)" >&2
cargo build --release -q -p felix-bench --features nats -p felix-gateway
BIN=./target/release/felix-bench
FELIX=./target/release/felix
mkdir -p bench/results
OUT=bench/results/pubsub-vs-nats.jsonl
: >"$OUT"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/pubsub-vs-nats.XXXXXX")
FELIX_PID=
NATS_PID=
cleanup() {
  stop_pids "$FELIX_PID" "$NATS_PID"
  rm -rf "$TMP"
}
on_exit cleanup

broker_ports
NATS_PORT=$(free_port)

echo "starting felix (quic 127.0.0.1:$QUIC_PORT, data $TMP/felix)" >&2
FELIX_LOG=warn "$FELIX" --data-dir "$TMP/felix" --quic-addr "127.0.0.1:$QUIC_PORT" \
  --admin-addr "127.0.0.1:$ADMIN_PORT" --internal-addr "127.0.0.1:$INTERNAL_PORT" \
  >"$TMP/felix.log" 2>&1 &
FELIX_PID=$!
echo "starting nats-server -js (127.0.0.1:$NATS_PORT, store $TMP/nats)" >&2
nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$TMP/nats" >"$TMP/nats.log" 2>&1 &
NATS_PID=$!

for _ in $(seq 1 300); do
  if curl -sf "http://127.0.0.1:$ADMIN_PORT/healthz" >/dev/null 2>&1 \
    && (exec 3<>"/dev/tcp/127.0.0.1/$NATS_PORT") 2>/dev/null; then
    break
  fi
  for pid in $FELIX_PID $NATS_PID; do
    kill -0 "$pid" 2>/dev/null || { echo "a server exited:" >&2; cat "$TMP"/*.log >&2; exit 1; }
  done
  sleep 0.1
done
curl -sf "http://127.0.0.1:$ADMIN_PORT/healthz" >/dev/null || { echo "felix not ready" >&2; cat "$TMP/felix.log" >&2; exit 1; }

server_pid() { if [ "$1" = felix ]; then echo "$FELIX_PID"; else echo "$NATS_PID"; fi; }
records_for() { if [ "$1" = 1 ]; then echo "$RECORDS_F1"; else echo "$RECORDS_F10"; fi; }

# run SYSTEM FANOUT RECORDS RATE PHASE REP [TIERED]: one felix-bench line, with the server's
# CPU seconds, the phase and the load average before the run added, appended to $OUT.
run() {
  local system=$1 fanout=$2 records=$3 rate=$4 phase=$5 rep=$6 tiered=${7:-$FELIX_TIERED}
  local pid before after busy_before busy_after t0 t1 load line
  pid=$(server_pid "$system")
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "rep $rep: $system fanout=$fanout records=$records rate=$rate ($phase, load $load)" >&2
  before=$(cpu_ticks "$pid")
  busy_before=$(busy_ticks)
  t0=$(date +%s.%N)
  local target=(pubsub --broker "127.0.0.1:$QUIC_PORT" --tiered "$tiered")
  [ "$system" = felix ] || target=(nats-pubsub --server "127.0.0.1:$NATS_PORT")
  if ! line=$("$BIN" "${target[@]}" --records "$records" --size "$SIZE" --batch "$BATCH" \
    --publishers "$PUBLISHERS" --inflight "$INFLIGHT" --fanout "$fanout" --rate "$rate" 2>"$TMP/bench.err"); then
    echo "felix-bench failed:" >&2
    cat "$TMP/bench.err" >&2
    exit 1
  fi
  after=$(cpu_ticks "$pid")
  busy_after=$(busy_ticks)
  t1=$(date +%s.%N)
  local cpu busy
  cpu=$(awk -v a="$after" -v b="$before" -v t="$TCK" 'BEGIN { printf "%.2f", (a - b) / t }')
  busy=$(awk -v a="$busy_after" -v b="$busy_before" -v t="$TCK" 'BEGIN { printf "%.2f", (a - b) / t }')
  echo "$line" | sed "s/^{/{\"phase\":\"$phase\",\"rep\":$rep,\"loadavg_before\":$load,\"server_cpu_seconds\":$cpu,\"machine_busy_cpu_seconds\":$busy,\"wall_seconds\":$(awk -v a="$t1" -v b="$t0" 'BEGIN { printf "%.2f", a - b }'),/" >>"$OUT"
  sleep "${SETTLE_SECS:-2}"
}

# ---- 1. maximum throughput, interleaved (the order alternates between reps) ----
for rep in $(seq 1 "$REPS"); do
  for f in 1 10; do
    if [ $((rep % 2)) = 1 ]; then order="felix nats"; else order="nats felix"; fi
    for system in $order; do
      run "$system" "$f" "$(records_for "$f")" 0 max "$rep"
    done
  done
done

# ---- 1b. Felix with its stream tiered (not in the Felix / NATS ratios) ----
for rep in $(seq 1 "$TIERED_REPS"); do
  for f in 1 10; do
    run felix "$f" "$(records_for "$f")" 0 max_tiered "$rep" true
  done
done

# ---- 2. latency at 50% of each system's own median maximum ----
half_rate() {
  python3 - "$OUT" "$1" "$2" <<'PY'
import json, statistics, sys
out, system, fanout = sys.argv[1], sys.argv[2], int(sys.argv[3])
v = [r["records_per_sec"] for r in map(json.loads, open(out))
     if r["phase"] == "max" and r["system"] == system and r["fanout"] == fanout]
print(round(statistics.median(v) / 2))
PY
}
for f in 1 10; do
  for system in felix nats; do
    rate=$(half_rate "$system" "$f")
    records=$(((rate * LAT_SECS / BATCH + 1) * BATCH))
    eval "RATE_${system}_$f=$rate RECS_${system}_$f=$records"
  done
done
for rep in $(seq 1 "$REPS"); do
  for f in 1 10; do
    if [ $((rep % 2)) = 1 ]; then order="felix nats"; else order="nats felix"; fi
    for system in $order; do
      rate_var="RATE_${system}_$f" recs_var="RECS_${system}_$f"
      run "$system" "$f" "${!recs_var}" "${!rate_var}" half "$rep"
    done
  done
done

# ---- 3. where the CPU goes (one extra max run of each, sampled; not in the tables) ----
CATEGORIZE=$(cat <<'PY'
import json, re, sys, collections
system, fanout, process = sys.argv[1], int(sys.argv[2]), sys.argv[3]
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
        if any(x in s for x in ("copy_folio", "filemap", "folio", "ext4", "iomap", "jbd2", "generic_perform_write", "vfs_", "blk_", "page_cache")):
            k = "kernel: file writes / page cache"
        elif any(x in s for x in ("udp", "tcp", "ip_", "ipv6", "skb", "sock", "net_", "netif", "napi", "inet", "dst_", "datagram", "loopback", "sendmsg", "recvmsg", "gso", "gro")):
            k = "kernel: network stack"
        elif any(x in s for x in ("clear_page", "page_fault", "anonymous_page", "handle_mm_fault", "alloc_pages", "rmqueue", "zap_", "mmap", "munmap", "madvise")):
            k = "kernel: page faults / memory"
        elif any(x in s for x in ("copy_from_iter", "copy_to_iter", "copy_user", "memcpy", "memmove")):
            k = "kernel: user<->kernel copies"
        else:
            k = "kernel: syscalls, scheduler, other"
    elif re.fullmatch(r"0x[0-9a-f]+", s) or dso.endswith("nats-server"):
        k = "user code without symbols (stripped binary)"
    elif any(x in s for x in ("aes", "gcm", "ghash", "aws_lc", "seal", "crypt", "chacha", "poly1305", "crypto/")):
        k = "crypto (TLS/QUIC packet protection)"
    elif "quinn" in s:
        k = "QUIC protocol (quinn)"
    elif "memmove" in s or "memcpy" in s:
        k = "memcpy"
    elif any(x in s for x in ("malloc", "free", "unlink_chunk", "realloc", "runtime.mallocgc", "runtime.gc", "runtime.scan", "runtime.mark")):
        k = "allocation / GC"
    elif "crc32" in s:
        k = "crc32c"
    elif "tokio" in s or s.startswith("runtime.") or "futex" in s:
        k = "async runtime / scheduler"
    elif "nats" in s or s.startswith("github.com"):
        k = "NATS server/client code"
    else:
        k = "other user code"
    cats[k] += pct
    syms[sym[:70]] += pct
print(json.dumps({"scenario": "profile", "system": system, "fanout": fanout, "process": process,
                  "categories": {k: round(v, 1) for k, v in cats.most_common()},
                  "top_symbols": {k: round(v, 1) for k, v in syms.most_common(8)}}))
PY
)
COMPONENTS=$(cat <<'PY'
import json, re, sys
fanout = int(sys.argv[1])
# Inclusive ("children") share of the broker's samples for frames that mark its components.
frames = [
    ("QUIC connection drivers: build, encrypt and send packets, process ACKs", "<quinn::connection::ConnectionDriver as"),
    ("  of which UDP sendmsg (kernel)", "__libc_sendmsg"),
    ("  of which packet encryption (AES-GCM)", "PacketKey>::encrypt_in_place"),
    ("QUIC endpoint: receive datagrams", "<quinn::endpoint::EndpointDriver as"),
    ("request and subscription streams (frame encode, stream writes)", "felix_gateway::server::handle_stream"),
    ("log writer (append, group commit)", "felix_hot::writer::Writer::run"),
    ("log reads for delivery", "felix_hot::log::ShardLog::read"),
    ("fanout task (follow the log)", "felix_gateway::fanout::follow_log"),
    ("periodic fsync", "fdatasync"),
]
found = {}
for line in sys.stdin:
    m = re.match(r"\s*([\d.]+)%\s+([\d.]+)%\s+\[(.)\]\s+(.*)", line)
    if not m:
        continue
    for name, needle in frames:
        if needle in m.group(4) and name not in found:
            found[name] = float(m.group(1))
print(json.dumps({"scenario": "profile_components", "system": "felix", "fanout": fanout, "process": "server",
                  "inclusive": {name: round(found.get(name, 0.0), 1) for name, _ in frames}}))
PY
)
if [ "$PROFILE" = 1 ]; then
  for f in 10 1; do
    for system in felix nats; do
      echo "profile: $system fanout=$f" >&2
      target=(pubsub --broker "127.0.0.1:$QUIC_PORT" --tiered "$FELIX_TIERED")
      [ "$system" = felix ] || target=(nats-pubsub --server "127.0.0.1:$NATS_PORT")
      "$BIN" "${target[@]}" --records $((2 * $(records_for "$f"))) --fanout "$f" \
        --size "$SIZE" --batch "$BATCH" --publishers "$PUBLISHERS" --inflight "$INFLIGHT" >/dev/null 2>&1 &
      bench=$!
      sleep 1
      perf record -q -F 499 -p "$(server_pid "$system")" -o "$TMP/server.perf" -- sleep 3 >/dev/null 2>&1 &
      perf_server=$!
      if [ "$system" = felix ]; then
        perf record -q -F 199 --call-graph dwarf,16384 -p "$FELIX_PID" -o "$TMP/server-dwarf.perf" -- sleep 3 >/dev/null 2>&1 &
        perf_dwarf=$!
      fi
      perf record -q -F 499 -p "$bench" -o "$TMP/bench.perf" -- sleep 3 >/dev/null 2>&1 || true
      { wait "$perf_server" || true; } 2>/dev/null
      [ "$system" != felix ] || { wait "$perf_dwarf" || true; } 2>/dev/null
      { wait "$bench" || true; } 2>/dev/null
      for proc in server bench; do
        perf report -i "$TMP/$proc.perf" --no-children --sort dso,symbol --stdio 2>/dev/null \
          | python3 -c "$CATEGORIZE" "$system" "$f" "$proc" >>"$OUT" || true
      done
      if [ "$system" = felix ]; then
        # The broker's inclusive time per component (call graphs through DWARF unwinding).
        perf report -i "$TMP/server-dwarf.perf" --children --sort symbol -g none --stdio 2>/dev/null \
          | python3 -c "$COMPONENTS" "$f" >>"$OUT" || true
      fi
      sleep "${SETTLE_SECS:-2}"
    done
  done
fi

# ---- the report ----
COMMAND="bench/pubsub-vs-nats.sh"
for v in REPS RECORDS_F1 RECORDS_F10 LAT_SECS SIZE BATCH PUBLISHERS INFLIGHT FELIX_TIERED TIERED_REPS; do
  # Only the settings that differ from the defaults go into the command line shown.
  case "$v=${!v}" in
    REPS=5 | RECORDS_F1=500000 | RECORDS_F10=200000 | LAT_SECS=15 | SIZE=1024 | BATCH=100 | PUBLISHERS=4 | INFLIGHT=8 | FELIX_TIERED=false | TIERED_REPS=3) ;;
    *) COMMAND="$v=${!v} $COMMAND" ;;
  esac
done
python3 - "$OUT" "$(nats-server --version)" "$(rustc --version)" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$(git status --porcelain -- . ':!bench/results' 2>/dev/null | grep -qv '^??' && echo ' plus uncommitted changes' || true)" \
  "$REPS" "$LAT_SECS" "$COMMAND" "$FELIX_TIERED" <<'PY' >bench/results/pubsub-vs-nats.md
import json, statistics, sys, platform, subprocess, datetime, re
out, nats_version, rustc, commit, dirty, reps, lat_secs, command, felix_tiered = sys.argv[1:10]
rows = [json.loads(l) for l in open(out)]
runs = [r for r in rows if not r["scenario"].startswith("profile")]
prof = [r for r in rows if r["scenario"] == "profile"]
def sel(phase, system, fanout):
    return [r for r in runs if r["phase"] == phase and r["system"] == system and r["fanout"] == fanout]
def med(phase, system, fanout, key):
    v = [r[key] for r in sel(phase, system, fanout)]
    return statistics.median(v) if v else None
def rng(phase, system, fanout, key, fmt):
    v = [r[key] for r in sel(phase, system, fanout)]
    return f"{fmt(min(v))}–{fmt(max(v))}" if v else "n/a"
k = lambda x: f"{x:,.0f}"
ms = lambda us: f"{us / 1000:.1f}" if us is not None else "n/a"
ratio = lambda a, b: f"{a / b:.2f}×" if a and b else "n/a"
cpu = open("/proc/cpuinfo").read()
model = re.search(r"model name\s*:\s*(.*)", cpu)
mem_gib = int(re.search(r"MemTotal:\s*(\d+)", open("/proc/meminfo").read()).group(1)) / 1048576
loads = [r["loadavg_before"] for r in runs]
ncpu = int(subprocess.getoutput("nproc"))
def other_share(r):
    # CPU the machine spent on anything but this server and the load generator, as a share
    # of all its cores over the run.
    return max(0.0, r["machine_busy_cpu_seconds"] - r["server_cpu_seconds"] - r["bench_cpu_seconds"]) / (r["wall_seconds"] * ncpu)
others = sorted(other_share(r) for r in runs)
r0 = runs[0]
print(f"# Felix vs NATS JetStream: publish/subscribe end to end ({datetime.date.today()})\n")
print(f"Command: `{command}` ({reps} reps per cell, the two systems interleaved). Raw lines: `pubsub-vs-nats.jsonl`.\n")
print(f"* Machine: {model.group(1) if model else platform.machine()}, {subprocess.getoutput('nproc')} cores, {mem_gib:.0f} GiB, "
      f"kernel {platform.release()}. Other work shares this machine: load average {min(loads):.1f}–{max(loads):.1f} before the runs, "
      f"and processes other than the server and the load generator took {statistics.median(others):.0%} of its CPU during a median run "
      f"({others[0]:.0%}–{others[-1]:.0%}). The interleaving spreads that over both systems; the ranges show the noise.")
tiering = ("tiering on (sealed segments encoded to Parquet and uploaded to the embedded default object store, a local directory)"
           if felix_tiered == "true" else
           "tiering off (`tiered: false`: history stays on local disk, as a JetStream file-storage stream's does; "
           "runs with tiering on are in their own table)")
print(f"* Felix: `felix` at commit {commit}{dirty}, release build, {rustc}; broker defaults (fsync `periodic` every 250 ms, "
      f"publishes acknowledged once written to the log); a durable stream of 1 shard with {tiering}. "
      "Client: felix-client over QUIC (TLS 1.3, AES-GCM).")
print(f"* NATS: {nats_version} (Debian package), `nats-server -js`, file storage, 1 replica, default limits. "
      "Client: async-nats 0.51.0 over plain TCP (no TLS). Subscribers are ordered push consumers (deliver `new`, flow control, no acks).")
print(f"* Load (both): {r0['publishers']} publishers × {r0['inflight']} batches in flight, {r0['batch_records']} records of "
      f"{r0['record_bytes']} B per batch (Felix: one `publish_batch` with `AckMode::Batch`; NATS: {r0['batch_records']} "
      "publishes, then all their PubAcks awaited); 1 or 10 subscribers from the live end, started before publishing. "
      "Every publisher and subscriber has its own connection; all in one `felix-bench` process on the same machine as the server.")
print("* Throughput is end to end: first publish to the last record received by the slowest subscriber. "
      "Ack latency is per batch (call to its last acknowledgement). Delivery latency is per record, from its batch "
      "being handed to the client to the subscriber decoding it (same process clock).\n")

print("## Maximum throughput\n")
print("Medians over the reps (range in brackets). CPU columns: CPU seconds per 100k records, server process and load-generator process.\n")
print("| fanout | system | records/s | ingest MB/s | delivered MB/s | Felix / NATS | ack p50 ms | ack p99 ms | delivery p50 ms | delivery p99 ms | server CPU s | bench CPU s | resubscribes |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for f in (1, 10):
    fm = med("max", "felix", f, "records_per_sec"); nm = med("max", "nats", f, "records_per_sec")
    for system in ("felix", "nats"):
        rs = sel("max", system, f)
        if not rs:
            continue
        per100k = lambda key: statistics.median([r[key] / r["records"] * 1e5 for r in rs])
        print(f"| {f} | {system} | {k(med('max', system, f, 'records_per_sec'))} ({rng('max', system, f, 'records_per_sec', k)}) "
              f"| {med('max', system, f, 'mb_per_sec'):.1f} | {med('max', system, f, 'delivered_mb_per_sec'):.1f} "
              f"| {ratio(fm, nm) if system == 'felix' else ''} "
              f"| {ms(med('max', system, f, 'ack_p50_us'))} | {ms(med('max', system, f, 'ack_p99_us'))} "
              f"| {ms(med('max', system, f, 'e2e_p50_us'))} | {ms(med('max', system, f, 'e2e_p99_us'))} "
              f"| {per100k('server_cpu_seconds'):.2f} | {per100k('bench_cpu_seconds'):.2f} "
              f"| {sum(r['resubscribes'] for r in rs)} |")

tiered_runs = [r for r in runs if r["phase"] == "max_tiered"]
if tiered_runs:
    print("\n### Felix with its stream tiered\n")
    print(f"The same maximum-throughput load against a stream with tiering on (a durable stream's default): sealed "
          "segments are encoded to Parquet (zstd) and uploaded, here to the embedded default object store, a local "
          "directory, by the same broker on the same 2 cores. Medians over the runs (range in brackets); the ratio "
          "is against the NATS median above.\n")
    print("| fanout | runs | records/s | Felix tiered / NATS | ack p99 ms | server CPU s per 100k | bench CPU s per 100k | resubscribes |")
    print("|---|---|---|---|---|---|---|---|")
    for f in (1, 10):
        rs = sel("max_tiered", "felix", f)
        if not rs:
            continue
        per100k = lambda key: statistics.median([r[key] / r["records"] * 1e5 for r in rs])
        tm = med("max_tiered", "felix", f, "records_per_sec")
        print(f"| {f} | {len(rs)} | {k(tm)} ({rng('max_tiered', 'felix', f, 'records_per_sec', k)}) "
              f"| {ratio(tm, med('max', 'nats', f, 'records_per_sec'))} | {ms(med('max_tiered', 'felix', f, 'ack_p99_us'))} "
              f"| {per100k('server_cpu_seconds'):.2f} | {per100k('bench_cpu_seconds'):.2f} | {sum(r['resubscribes'] for r in rs)} |")

print(f"\n## Latency at 50% of each system's own maximum\n")
print(f"Each system paced at half its median maximum above, {lat_secs} s of load per run; medians over the reps (p99 range in brackets).\n")
print("| fanout | system | rate (records/s) | achieved records/s | ack p50 ms | ack p99 ms | ack p99.9 ms | delivery p50 ms | delivery p99 ms | delivery p99.9 ms | p99 delivery Felix / NATS |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for f in (1, 10):
    fp = med("half", "felix", f, "e2e_p99_us"); np_ = med("half", "nats", f, "e2e_p99_us")
    for system in ("felix", "nats"):
        rs = sel("half", system, f)
        if not rs:
            continue
        print(f"| {f} | {system} | {k(med('half', system, f, 'target_rate'))} | {k(med('half', system, f, 'records_per_sec'))} "
              f"| {ms(med('half', system, f, 'ack_p50_us'))} | {ms(med('half', system, f, 'ack_p99_us'))} ({rng('half', system, f, 'ack_p99_us', ms)}) "
              f"| {ms(med('half', system, f, 'ack_p999_us'))} "
              f"| {ms(med('half', system, f, 'e2e_p50_us'))} | {ms(med('half', system, f, 'e2e_p99_us'))} ({rng('half', system, f, 'e2e_p99_us', ms)}) "
              f"| {ms(med('half', system, f, 'e2e_p999_us'))} | {ratio(fp, np_) if system == 'felix' else ''} |")

print("""
## Caveats

* **One 2-core machine for everything.** Each server shares the cores with the load generator (its CPU is in the
  tables) and with whatever else runs here. Neither system gets a core to itself, so these are figures for this
  box, not for either system's ceiling.
* **Transport security differs.** Felix always speaks QUIC, so every packet is encrypted (TLS 1.3, AES-GCM) at
  the broker and at the client. NATS runs here in its default plaintext TCP. A NATS deployment with TLS would pay
  for encryption too; this comparison is Felix as shipped against NATS as configured by default.
* **Durability differs, and neither syncs per acknowledgement.** Felix acknowledges once the batch is written to
  the log (page cache) and fsyncs every 250 ms. JetStream 2.9.10 acknowledges once the message is in its file store
  (OS buffers) and syncs on a background interval: the filestore's default interval is minutes, and 2.9.x has no
  setting to shorten it (`sync_interval` arrived in 2.10). So a machine crash can lose up to ~250 ms of
  acknowledged Felix records, and more of JetStream's. Felix with `--fsync on_commit` would be slower than this.
* **Batching differs by protocol.** A Felix batch of 100 records is one RecordBatch, one request and one
  acknowledgement. JetStream 2.9 has no batch publish: the same 100 records are 100 publishes, each with its own
  PubAck. That difference is part of what is being compared.
* **Delivery latency at maximum throughput is mostly queueing.** Publishers never wait for subscribers, so when
  publishing outruns delivery, records wait in line and the delivery figures in the first table grow with the
  backlog. The system's own latency is in the 50% table. A Felix subscriber that falls too far behind is ended
  with `subscription_lagged` and resumes from its offset (counted as *resubscribes*; nothing is lost or repeated).
  A JetStream ordered consumer recreates itself on a gap without telling the client, so nothing is counted for it.
* **Latency timing.** Each batch is timestamped just before it is handed to the client, after pacing. At 50% load
  both systems keep to the schedule (achieved rate = target rate), so coordinated omission does not hide stalls
  longer than one batch interval. Delivery latency includes the client decoding the record.
* **Scope.** Loopback only, single node, one shard (R1 stream), 1 KiB incompressible payloads, no compression.
""")

if prof:
    print("\n## Where the CPU goes (max throughput, sampled with perf)\n")
    print("One extra max-throughput run per cell (twice the records), sampled from 1 s in for 3 s at 499 Hz; share of each process's samples. The Debian nats-server binary is stripped, so its own code shows as one lump.\n")
    for f in (10, 1):
        for system in ("felix", "nats"):
            for proc in ("server", "bench"):
                p = [x for x in prof if x["system"] == system and x["fanout"] == f and x["process"] == proc]
                if p:
                    c = ", ".join(f"{name} {v:.0f}%" for name, v in p[0]["categories"].items() if v >= 1)
                    print(f"* fanout {f}, {system} {'server' if proc == 'server' else 'load generator'}: {c}")
    comps = [x for x in rows if x["scenario"] == "profile_components"]
    if comps:
        print("\nThe Felix broker by component (inclusive share of its samples, from DWARF call graphs of the same runs):\n")
        print("| component | " + " | ".join(f"fanout {c['fanout']}" for c in comps) + " |")
        print("|---|" + "---|" * len(comps))
        for name in comps[0]["inclusive"]:
            print(f"| {name} | " + " | ".join(f"{c['inclusive'][name]:.0f}%" for c in comps) + " |")
PY
cat bench/results/pubsub-vs-nats.md
