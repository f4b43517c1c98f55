#!/usr/bin/env bash
# Measures the shard log (felix-bench log) against the raw disk it runs on, in one run, and
# writes bench/results/log-vs-disk.md (table) and bench/results/log-vs-disk.jsonl (raw lines).
#
#   bench/log-vs-disk.sh [DIR]        DIR: a directory on the disk to measure (default ./target/bench-disk)
#   REPS=3 SIZE_MIB=2048 bench/log-vs-disk.sh
#
# Raw disk: dd sequential write of SIZE_MIB with a final fdatasync, dd sequential read with
# O_DIRECT, and fio (when installed) for the same two. The log: 1 KiB records in batches of
# 64 under periodic fsync (the same volume as dd), then read back with its files dropped
# from the page cache; and on_commit with 1, 8 and 64 concurrent writers (group commit).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-./target/bench-disk}
REPS=${REPS:-3}
SIZE_MIB=${SIZE_MIB:-2048}
mkdir -p "$DIR" bench/results
cargo build --release -q -p felix-bench
BIN=./target/release/felix-bench
OUT=bench/results/log-vs-disk.jsonl
: >"$OUT"

# "2147483648 bytes (2.1 GB, 2.0 GiB) copied, 6.8 s, 315 MB/s" -> bytes per second
dd_rate() { awk '/copied/ { for (i = 1; i <= NF; i++) if ($i == "copied,") { print $1 / $(i + 1); exit } }'; }

# Deleting a large file and writing another at once makes the next write slow on some
# virtual disks (the freed blocks are still being discarded), so each step starts after a
# sync and a short pause.
settle() { sync; sleep "${SETTLE_SECS:-3}"; }

for rep in $(seq 1 "$REPS"); do
  settle
  echo "rep $rep/$REPS: dd write" >&2
  w=$(dd if=/dev/zero of="$DIR/dd.bin" bs=1M count="$SIZE_MIB" conv=fdatasync 2>&1 | dd_rate)
  echo "{\"scenario\":\"dd_write\",\"rep\":$rep,\"bytes_per_sec\":$w}" >>"$OUT"
  echo "rep $rep/$REPS: dd read" >&2
  r=$(dd if="$DIR/dd.bin" of=/dev/null bs=1M iflag=direct 2>&1 | dd_rate)
  echo "{\"scenario\":\"dd_read\",\"rep\":$rep,\"bytes_per_sec\":$r}" >>"$OUT"
  rm -f "$DIR/dd.bin"
  settle
  if command -v fio >/dev/null; then
    echo "rep $rep/$REPS: fio" >&2
    fw=$(fio --name=seqwrite --directory="$DIR" --rw=write --bs=1M --size="${SIZE_MIB}M" --direct=1 --ioengine=libaio --iodepth=8 \
      --end_fsync=1 --output-format=json | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"])')
    settle
    fr=$(fio --name=seqwrite --directory="$DIR" --rw=read --bs=1M --size="${SIZE_MIB}M" --direct=1 --ioengine=psync \
      --output-format=json | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"])')
    rm -f "$DIR"/seqwrite*
    settle
    echo "{\"scenario\":\"fio_write\",\"rep\":$rep,\"bytes_per_sec\":$fw}" >>"$OUT"
    echo "{\"scenario\":\"fio_read\",\"rep\":$rep,\"bytes_per_sec\":$fr}" >>"$OUT"
  fi
  echo "rep $rep/$REPS: felix-bench log periodic" >&2
  $BIN log --dir "$DIR" --records $((SIZE_MIB * 1024)) --size 1024 --batch 64 --fsync periodic \
    | sed "s/^{/{\"rep\":$rep,/" >>"$OUT"
done
for w in 1 8 64; do
  echo "felix-bench log on_commit writers=$w" >&2
  $BIN log --dir "$DIR" --records $((w * 2000 + 10000)) --size 1024 --batch 1 --fsync on_commit --writers "$w" --inflight 1 >>"$OUT"
  $BIN log --dir "$DIR" --records $((w * 64 * 500 + 64000)) --size 1024 --batch 64 --fsync on_commit --writers "$w" --inflight 1 >>"$OUT"
done

python3 - "$OUT" <<'PY' >bench/results/log-vs-disk.md
import json, statistics, sys, platform, subprocess, datetime
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(scn, key="bytes_per_sec", **match):
    v = [r[key] for r in rows if r["scenario"] == scn and all(r.get(k) == m for k, m in match.items())]
    return statistics.median(v) if v else None
mib = lambda x: f"{x / 1048576:.0f} MiB/s" if x else "n/a"
dd_w, dd_r = med("dd_write"), med("dd_read")
fio_w, fio_r = med("fio_write"), med("fio_read")
lw = med("log", "append_bytes_per_sec", fsync="periodic:250")
lr = med("log", "read_bytes_per_sec", fsync="periodic:250")
p50 = med("log", "append_p50_us", fsync="periodic:250"); p99 = med("log", "append_p99_us", fsync="periodic:250")
ratio = lambda a, b: f"{a / b:.0%}" if a and b else "n/a"
print(f"# Shard log vs raw disk ({datetime.date.today()})\n")
print(f"Command: `bench/log-vs-disk.sh` ({len([r for r in rows if r['scenario']=='dd_write'])} reps, interleaved: dd, fio, log in each). "
      f"Machine: {platform.machine()}, {subprocess.getoutput('nproc')} cores, kernel {platform.release()}. "
      "Medians over the reps; raw lines in `log-vs-disk.jsonl`. The disk is a shared virtual disk whose speed "
      "varies severalfold between runs, which is why raw and log figures come from the same run.\n")
print("| measurement | dd | fio | felix log | log / dd | log / fio |\n|---|---|---|---|---|---|")
print(f"| sequential write, durable | {mib(dd_w)} (1 MiB, conv=fdatasync) | {mib(fio_w)} (1 MiB O_DIRECT QD8, end_fsync) | {mib(lw)} (periodic; 1 KiB records, 64 per batch, 16 batches in flight; through a final fsync) | {ratio(lw, dd_w)} | {ratio(lw, fio_w)} |")
print(f"| sequential read, from disk | {mib(dd_r)} (1 MiB, iflag=direct) | {mib(fio_r)} (1 MiB O_DIRECT QD1) | {mib(lr)} (1 MiB reads, page cache dropped first) | {ratio(lr, dd_r)} | {ratio(lr, fio_r)} |")
def per_rep(log_key, raw):
    out = []
    for r in rows:
        if r["scenario"] == "log" and r.get("rep") is not None:
            raw_r = [x["bytes_per_sec"] for x in rows if x["scenario"] == raw and x["rep"] == r["rep"]]
            if raw_r:
                out.append(r[log_key] / raw_r[0])
    return ", ".join(f"{x:.0%}" for x in out) + (f" (median {statistics.median(out):.0%})" if out else "")
print(f"\nPer rep, log / dd: write {per_rep('append_bytes_per_sec', 'dd_write')}; read {per_rep('read_bytes_per_sec', 'dd_read')}.")
print(f"\nPeriodic append latency (call to commit, 64-record batches): p50 {p50:.0f} us, p99 {p99:.0f} us.\n")
print("## on_commit: group commit as writers grow\n\nEach writer waits for its append to commit before the next (`--inflight 1`).\n")
print("| writers | records/batch | records/s | MiB/s | p50 us | p99 us |\n|---|---|---|---|---|---|")
for b in (1, 64):
    for w in (1, 8, 64):
        r = [x for x in rows if x["scenario"] == "log" and x["fsync"] == "on_commit" and x["writers"] == w and x["batch_records"] == b]
        if r:
            r = r[0]
            print(f"| {w} | {b} | {r['append_records_per_sec']:,.0f} | {r['append_mib_per_sec']:.1f} | {r['append_p50_us']} | {r['append_p99_us']} |")
PY
cat bench/results/log-vs-disk.md
