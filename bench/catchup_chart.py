"""An SVG chart of replay MB/s over time (hot, cold-empty, cold-warm) from the
`timeline_mb_per_sec` of felix-bench catchup replay lines: the first run of CASE.

    python3 bench/catchup_chart.py bench/results/catchup-latency.jsonl s3-30ms > chart.svg
"""

import json
import sys

STEP = 0.25  # seconds per timeline step (bench/src/replay.rs, TIMELINE_STEP)
path, case = sys.argv[1], sys.argv[2]
rows = [json.loads(line) for line in open(path) if line.strip()]
series = {}
for r in rows:
    if r.get("phase") == "replay" and r.get("case") == case and r.get("readers", 1) == 1:
        t = r["replay"].get("timeline_mb_per_sec")
        if t and r["label"] not in series:
            series[r["label"]] = t
if not series:
    sys.exit(f"no replay of case {case} with a timeline in {path}")
W, H, L, B, T, R = 760, 360, 60, 40, 30, 130
max_t = max(len(t) for t in series.values()) * STEP
max_y = max(max(t) for t in series.values()) * 1.1 or 1
colors = {"hot": "#d62728", "cold-empty": "#1f77b4", "cold-warm": "#2ca02c"}
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{L}" y="18" font-size="14">Replay MB/s over time, case {case} (payload, {STEP} s steps)</text>']
pw, ph = W - L - R, H - T - B
x = lambda s: L + s / max_t * pw
y = lambda v: T + ph - v / max_y * ph
out.append(f'<line x1="{L}" y1="{T + ph}" x2="{L + pw}" y2="{T + ph}" stroke="black"/>')
out.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{T + ph}" stroke="black"/>')
for i in range(6):
    v = max_y * i / 5
    out.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
    out.append(f'<line x1="{L}" y1="{y(v):.1f}" x2="{L + pw}" y2="{y(v):.1f}" stroke="#ddd"/>')
    s = max_t * i / 5
    out.append(f'<text x="{x(s):.1f}" y="{T + ph + 16}" text-anchor="middle">{s:.1f}</text>')
out.append(f'<text x="{L + pw / 2}" y="{H - 6}" text-anchor="middle">seconds since the subscribe call</text>')
out.append(f'<text x="14" y="{T + ph / 2}" transform="rotate(-90 14 {T + ph / 2})" text-anchor="middle">MB/s</text>')
for k, (label, t) in enumerate(series.items()):
    pts = " ".join(f"{x((i + 1) * STEP):.1f},{y(v):.1f}" for i, v in enumerate(t))
    c = colors.get(label, "#555")
    out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{x(0):.1f},{y(0):.1f} {pts}"/>')
    out.append(f'<line x1="{L + pw + 12}" y1="{T + 14 + k * 20}" x2="{L + pw + 32}" y2="{T + 14 + k * 20}" stroke="{c}" stroke-width="2"/>')
    out.append(f'<text x="{L + pw + 38}" y="{T + 18 + k * 20}">{label}</text>')
out.append("</svg>")
print("\n".join(out))
