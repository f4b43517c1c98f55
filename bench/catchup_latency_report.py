"""bench/results/catchup-latency.md from the .jsonl bench/catchup-latency.sh writes.

Tables: replays per case (median MB/s of the repetitions, x hot of the same case), the
content-digest check's cost (cold replays with it on and off), ten concurrent readers, and
publish latency beside a cold reader.
"""

import json
import os
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
run = next((r for r in rows if r.get("case") == "run"), {})
replays = [r for r in rows if r.get("phase") == "replay"]
GIB = float(1 << 30)


def med(values):
    return statistics.median(values) if values else float("nan")


def of(case, label):
    return [r for r in replays if r["case"] == case and r["label"] == label]


def mbps(rs):
    return med([r["replay"]["payload_mb_per_sec"] for r in rs])


def fmt(x, digits=1):
    return "n/a" if x != x else f"{x:,.{digits}f}"


out = []
w = out.append
w("# Catch-up against a distant object store (simulated GET latency over `file://`)")
w("")
w(f"Command: `bench/catchup-latency.sh` (BUILD={run.get('build', '?')}, GIB={run.get('gib', '?')}, "
  f"REPS={run.get('reps', '?')}); commit {run.get('commit', '?')}; {run.get('seconds', '?')} s in all. "
  f"Raw lines: `{os.path.basename(sys.argv[1])}`.")
w("")
w(f"* Machine: {run.get('cpu', '?')}, {run.get('cores', '?')} cores, shared with other engineers' "
  "builds and tests (load averages are in the raw lines).")
if run.get("build") == "debug":
    w("* **Debug builds** of `felix` and `felix-bench` (this machine is shared; release builds are not "
      "made here). Absolute MB/s are far below a release build's and CPU-bound; the ratios between "
      "cases of the same run are what this page is for. For release figures on a quiet machine: "
      "`BUILD=release GIB=1 REPS=3 bench/catchup-latency.sh`.")
w("* One broker, `file://` object store with the broker's simulated distant store "
  "(`FELIX_FAULT_INJECTION=1`; `object_store_get_latency_ms`, `_jitter_ms`, `_bytes_per_sec` "
  "apply to every GET), 64 MiB segments, 4 MiB row groups, cache 64 MiB memory + 2 GiB disk, "
  "records of 1 KiB incompressible payload. Each case restarts the broker with the cache wiped, "
  "then replays cold-empty, cold-warm and hot (a second copy of the stream kept local).")
w("* MB/s counts payload bytes (10^6) from the subscribe call to the last record; GETs per GiB and "
  "bytes fetched per byte delivered are deltas of the broker's `/metrics` over the replay.")
w("")
w("## Replays from offset 0")
w("")
w("| case | broker flags | replay | runs | MB/s (median) | range | × hot (same case) | first record ms | GETs per GiB | fetched per delivered | broker CPU s |")
w("|---|---|---|---|---|---|---|---|---|---|---|")
cases = []
for r in replays:
    if r["case"] not in cases and r["case"] not in ("readers-10", "streams-10"):
        cases.append(r["case"])
for case in cases:
    hot = mbps(of(case, "hot"))
    for label in ("hot", "cold-empty", "cold-warm"):
        rs = of(case, label)
        if not rs:
            continue
        speeds = sorted(r["replay"]["payload_mb_per_sec"] for r in rs)
        gib = med([r["replay"]["payload_bytes"] / GIB for r in rs])
        w(f"| {case} | `{rs[0].get('broker_flags', '')}` | {label} | {len(rs)} | {fmt(mbps(rs))} | "
          f"{fmt(speeds[0])}–{fmt(speeds[-1])} | {fmt(mbps(rs) / hot, 2)}× | "
          f"{fmt(med([r['replay']['first_record_ms'] for r in rs]), 0)} | "
          f"{fmt(med([r['store']['get_requests'] for r in rs]) / max(gib, 1e-9), 0)} | "
          f"{fmt(med([r['fetched_per_delivered'] for r in rs]), 3)} | "
          f"{fmt(med([r['felix_cpu_seconds'] for r in rs]), 1)} |")
w("")
w("## The content-digest check's cost (issue 19)")
w("")
w("Cold-empty replays decode every row group and, with the check on (the default), rebuild its "
  "content digest and compare it with the footer's; `cold_skip_content_digests` turns only that "
  "off. Same run, alternating within each repetition. Target: under 5%.")
w("")
w("| store | replay | digest on MB/s | digest off MB/s | cost | broker CPU s on / off |")
w("|---|---|---|---|---|---|")
for on, off in (("local", "local-nodigest"), ("s3-30ms", "s3-30ms-nodigest")):
    for label in ("cold-empty", "cold-warm"):
        a, b = of(on, label), of(off, label)
        if a and b:
            cost = 1 - mbps(a) / mbps(b)
            w(f"| {on} | {label} | {fmt(mbps(a))} | {fmt(mbps(b))} | {fmt(cost * 100)}% | "
              f"{fmt(med([r['felix_cpu_seconds'] for r in a]))} / {fmt(med([r['felix_cpu_seconds'] for r in b]))} |")
w("")
w("## Ten concurrent readers (s3-30ms)")
w("")
w("`readers-10`: ten readers on their own connections, reader i from offset i/10 of the stream to "
  "its end. `streams-10`: ten readers, each of its own stream of a tenth of the size, from offset 0. "
  "MB/s is their payload together over the wall time of them all.")
w("")
w("| case | replay | aggregate MB/s | slowest first record ms | GETs per GiB | fetched per delivered |")
w("|---|---|---|---|---|---|")
for case, label in [(c, l) for c in ("readers-10", "streams-10") for l in ("hot", "cold-empty", "cold-warm")]:
    for r in of(case, label):
        gib = r["replay"]["payload_bytes"] / GIB
        w(f"| {case} | {label} | {fmt(r['replay']['payload_mb_per_sec'])} | {fmt(r['replay']['first_record_ms'], 0)} | "
          f"{fmt(r['store']['get_requests'] / max(gib, 1e-9), 0)} | {fmt(r['fetched_per_delivered'], 3)} |")
w("")
w("## Publish latency beside a cold reader (s3-30ms)")
w("")
w("Publishing to a fresh tiered stream at half the load phase's rate, 4 publishers; the reader "
  "replays the cold stream (`cold-reader`) or the hot copy (`hot-reader`) from offset 0 on its own "
  "connection for the whole window. Target: p99 with a cold reader ≤ 1.2× alone.")
w("")
w("| broker | run | rate (records/s) | achieved | ack p50 ms | ack p99 ms | ack p99.9 ms | p99 × alone (mean of the two) | reader MB/s |")
w("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if r.get("phase") == "publish-latency":
        r["group"] = r["case"]
for group in dict.fromkeys(r["group"] for r in rows if r.get("phase") == "publish-latency"):
    pubs = [r for r in rows if r.get("phase") == "publish-latency" and r["group"] == group]
    alone = [r["publish"]["ack_p99_us"] for r in pubs if not r.get("cold_reader")]
    alone_p99 = statistics.mean(alone) if alone else float("nan")
    for r in pubs:
        p = r["publish"]
        ratio = p["ack_p99_us"] / alone_p99 if r.get("cold_reader") else float("nan")  # any reader
        reader = r.get("reader") or {}
        w(f"| `{r.get('broker_flags', '')}` | {r['label']} | {fmt(p['target_rate'], 0)} | {fmt(p['records_per_sec'], 0)} | {fmt(p['ack_p50_us'] / 1e3)} | "
          f"{fmt(p['ack_p99_us'] / 1e3)} | {fmt(p['ack_p999_us'] / 1e3)} | "
          f"{'' if ratio != ratio else fmt(ratio, 2) + '×'} | {fmt(reader.get('payload_mb_per_sec', float('nan')))} |")
# Hand-written reading of the figures, kept beside the results (not regenerated).
notes = sys.argv[1].replace(".jsonl", "-notes.md")
try:
    out += ["", open(notes).read().rstrip()]
except FileNotFoundError:
    pass
print("\n".join(out))
