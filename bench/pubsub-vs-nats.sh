#!/usr/bin/env bash
# Felix vs NATS JetStream, publish/subscribe end to end on this machine, and writes
# bench/results/pubsub-vs-nats.md (tables) and bench/results/pubsub-vs-nats.jsonl (raw lines).
# Local runs only (CI never runs it). It installs nothing: it needs `nats-server` on PATH
# (Debian: apt-get install -y nats-server) and builds felix-bench with the `nats` feature.
#
#   bench/pubsub-vs-nats.sh
#   REPS=5 RECORDS_F1=1000000 LAT_SECS=20 bench/pubsub-vs-nats.sh
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

REPS=${REPS:-3}
RECORDS_F1=${RECORDS_F1:-500000}
RECORDS_F10=${RECORDS_F10:-200000}
LAT_SECS=${LAT_SECS:-10}
SIZE=${SIZE:-1024}
BATCH=${BATCH:-100}
PUBLISHERS=${PUBLISHERS:-4}
INFLIGHT=${INFLIGHT:-8}
PROFILE=${PROFILE:-1}

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
  for pid in $FELIX_PID $NATS_PID; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in $FELIX_PID $NATS_PID; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$TMP"
}
trap cleanup EXIT

# A loopback port free for both TCP and UDP (the broker's QUIC port is UDP). Other brokers
# may be running on this machine, so nothing uses fixed ports.
free_port() {
  python3 - <<'PY'
import socket
while True:
    t = socket.socket(); t.bind(("127.0.0.1", 0)); port = t.getsockname()[1]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.bind(("127.0.0.1", port)); print(port); break
    except OSError:
        pass
    finally:
        u.close(); t.close()
PY
}
QUIC_PORT=$(free_port)
ADMIN_PORT=$(free_port)
INTERNAL_PORT=$(free_port)
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

TCK=$(getconf CLK_TCK)
# user + system CPU ticks of a process (fields 14 and 15 of /proc/PID/stat).
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
server_pid() { if [ "$1" = felix ]; then echo "$FELIX_PID"; else echo "$NATS_PID"; fi; }
records_for() { if [ "$1" = 1 ]; then echo "$RECORDS_F1"; else echo "$RECORDS_F10"; fi; }

# run SYSTEM FANOUT RECORDS RATE PHASE REP: one felix-bench line, with the server's CPU
# seconds, the phase and the load average before the run added, appended to $OUT.
run() {
  local system=$1 fanout=$2 records=$3 rate=$4 phase=$5 rep=$6 pid before after load line
  pid=$(server_pid "$system")
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "rep $rep: $system fanout=$fanout records=$records rate=$rate ($phase, load $load)" >&2
  before=$(cpu_ticks "$pid")
  local target=(pubsub --broker "127.0.0.1:$QUIC_PORT")
  [ "$system" = felix ] || target=(nats-pubsub --server "127.0.0.1:$NATS_PORT")
  if ! line=$("$BIN" "${target[@]}" --records "$records" --size "$SIZE" --batch "$BATCH" \
    --publishers "$PUBLISHERS" --inflight "$INFLIGHT" --fanout "$fanout" --rate "$rate" 2>"$TMP/bench.err"); then
    echo "felix-bench failed:" >&2
    cat "$TMP/bench.err" >&2
    exit 1
  fi
  after=$(cpu_ticks "$pid")
  local cpu
  cpu=$(awk -v a="$after" -v b="$before" -v t="$TCK" 'BEGIN { printf "%.2f", (a - b) / t }')
  echo "$line" | sed "s/^{/{\"phase\":\"$phase\",\"rep\":$rep,\"loadavg_before\":$load,\"server_cpu_seconds\":$cpu,/" >>"$OUT"
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
    pct, dso, sym = float(m.group(1)), m.group(2), m.group(4).strip()
    total += pct
    s = sym.lower()
    if dso.startswith("[kernel"):
        k = "kernel (network stack, page cache, scheduler)"
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
if [ "$PROFILE" = 1 ]; then
  for f in 10 1; do
    for system in felix nats; do
      echo "profile: $system fanout=$f" >&2
      target=(pubsub --broker "127.0.0.1:$QUIC_PORT")
      [ "$system" = felix ] || target=(nats-pubsub --server "127.0.0.1:$NATS_PORT")
      "$BIN" "${target[@]}" --records "$(records_for "$f")" --fanout "$f" \
        --size "$SIZE" --batch "$BATCH" --publishers "$PUBLISHERS" --inflight "$INFLIGHT" >/dev/null 2>&1 &
      bench=$!
      sleep 1
      perf record -q -F 499 -p "$(server_pid "$system")" -o "$TMP/server.perf" -- sleep 3 >/dev/null 2>&1 &
      perf_server=$!
      perf record -q -F 499 -p "$bench" -o "$TMP/bench.perf" -- sleep 3 >/dev/null 2>&1 || true
      wait "$perf_server" || true
      wait "$bench" || true
      for proc in server bench; do
        perf report -i "$TMP/$proc.perf" --no-children --sort dso,symbol --stdio 2>/dev/null \
          | python3 -c "$CATEGORIZE" "$system" "$f" "$proc" >>"$OUT" || true
      done
      sleep "${SETTLE_SECS:-2}"
    done
  done
fi

# ---- the report ----
python3 - "$OUT" "$(nats-server --version)" "$(rustc --version)" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$(git status --porcelain 2>/dev/null | grep -qv '^??' && echo ' plus uncommitted changes' || true)" \
  "$REPS" "$LAT_SECS" <<'PY' >bench/results/pubsub-vs-nats.md
import json, statistics, sys, platform, subprocess, datetime, re
out, nats_version, rustc, commit, dirty, reps, lat_secs = sys.argv[1:8]
rows = [json.loads(l) for l in open(out)]
runs = [r for r in rows if r["scenario"] != "profile"]
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
r0 = runs[0]
print(f"# Felix vs NATS JetStream: publish/subscribe end to end ({datetime.date.today()})\n")
print(f"Command: `bench/pubsub-vs-nats.sh` ({reps} reps per cell, the two systems interleaved). Raw lines: `pubsub-vs-nats.jsonl`.\n")
print(f"* Machine: {model.group(1) if model else platform.machine()}, {subprocess.getoutput('nproc')} cores, {mem_gib:.0f} GiB, "
      f"kernel {platform.release()}. Load average before the runs: {min(loads):.1f}–{max(loads):.1f} "
      "(other work shares this machine; the interleaving spreads it over both systems).")
print(f"* Felix: `felix` at commit {commit}{dirty}, release build, {rustc}; defaults (durable stream of 1 shard, "
      "fsync `periodic` every 250 ms, publishes acknowledged once written to the log). Client: felix-client over QUIC (TLS 1.3, AES-GCM).")
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

if prof:
    print("\n## Where the CPU goes (max throughput, sampled with perf)\n")
    print("One extra max-throughput run per cell, sampled for 3 s at 499 Hz; share of each process's samples.\n")
    for f in (10, 1):
        for system in ("felix", "nats"):
            for proc in ("server", "bench"):
                p = [x for x in prof if x["system"] == system and x["fanout"] == f and x["process"] == proc]
                if p:
                    c = ", ".join(f"{name} {v:.0f}%" for name, v in p[0]["categories"].items() if v >= 1)
                    print(f"* fanout {f}, {system} {'server' if proc == 'server' else 'load generator'}: {c}")
PY
cat bench/results/pubsub-vs-nats.md
