#!/usr/bin/env bash
# Control-plane commit throughput and latency (felix-bench meta) for 1- and 3-node groups on
# loopback; writes bench/results/meta.md and bench/results/meta.jsonl.
#   bench/meta.sh [DIR]     DIR holds the nodes' data (default ./target/bench-meta)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-./target/bench-meta}
mkdir -p "$DIR" bench/results
cargo build --release -q -p felix-bench
BIN=./target/release/felix-bench
OUT=bench/results/meta.jsonl
: >"$OUT"
for nodes in 1 3; do
  for conc in 1 64; do
    n=$((conc == 1 ? 2000 : 20000))
    echo "meta: nodes=$nodes concurrency=$conc segment" >&2
    $BIN meta --dir "$DIR" --nodes "$nodes" --commands "$n" --concurrency "$conc" --kind segment >>"$OUT"
  done
done
echo "meta: nodes=3 concurrency=64 segment via follower" >&2
$BIN meta --dir "$DIR" --nodes 3 --commands 20000 --concurrency 64 --kind segment --via follower >>"$OUT"
python3 - "$OUT" <<'PY' >bench/results/meta.md
import json, sys, datetime, platform, subprocess
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"# Control-plane commits ({datetime.date.today()})\n")
print(f"Command: `bench/meta.sh`. Machine: {platform.machine()}, {subprocess.getoutput('nproc')} cores. All nodes in one "
      "process, real HTTP between them on 127.0.0.1, Raft log fsynced on every append. Each proposer waits for its "
      "command to apply before sending the next; commands that queue meanwhile share one Raft entry.\n")
print("| nodes | proposers | via | command | commands/s | p50 ms | p99 ms | commands per Raft entry |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['nodes']} | {r['concurrency']} | {r['via']} | {r['kind']} | {r['commands_per_sec']:,.0f} | "
          f"{r['p50_us']/1000:.1f} | {r['p99_us']/1000:.1f} | {r['commands_per_raft_entry']:.1f} |")
PY
cat bench/results/meta.md
