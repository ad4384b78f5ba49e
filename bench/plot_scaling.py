"""Draws how a decode step's cost grows, from one `drama bench --lanes ... --more-contexts ...`
results file, as an SVG with no plotting library: GPU milliseconds per step and the
aggregate audio seconds per second the steps could make, against lanes (at the run's
context), and the guidance pair's step against the context. Prints the markdown tables of
docs/performance.md's scaling section too.

Audio per second: each guided request holds two lanes and makes one token per step, and a
token is `samples per code / sample rate` seconds of audio (20 ms at the bench shape), so
lanes / 2 * 0.02 / step seconds, the sampling and the codec left out.

Usage: python3 bench/plot_scaling.py RESULTS.json --svg docs/scaling.svg [--token-seconds 0.02]"""

import argparse
import json

parser = argparse.ArgumentParser()
parser.add_argument("results")
parser.add_argument("--svg", required=True)
parser.add_argument("--token-seconds", type=float, default=0.02)
args = parser.parse_args()
report = json.load(open(args.results))
steps = report["decode"]
base = report["options"]["context"]
by_lanes = sorted((s for s in steps if s["context"] == base), key=lambda s: s["lanes"])
by_context = sorted((s for s in steps if s["lanes"] == 2), key=lambda s: s["context"])


def audio_rate(step):
    return max(step["lanes"] // 2, 1) * args.token_seconds / (step["gpu_ms"] / 1e3)


print("| lanes | GPU ms per step | audio s per s | x one request |")
print("|---|---|---|---|")
pair = next((s for s in by_lanes if s["lanes"] == 2), None)
for s in by_lanes:
    rate = audio_rate(s)
    relative = f"{rate / audio_rate(pair):.1f}x" if pair else "-"
    print(f"| {s['lanes']} | {s['gpu_ms']:.3f} | {rate:.1f} | {relative} |")
print()
print("| context | pair GPU ms per step | x at the shortest |")
print("|---|---|---|")
for s in by_context:
    print(f"| {s['context']} | {s['gpu_ms']:.3f} | {s['gpu_ms'] / by_context[0]['gpu_ms']:.2f}x |")

# The SVG: two panels side by side, log2 axes for lanes.
W, H, PAD = 900, 360, 60
panel = (W - 3 * PAD) / 2


def polyline(points, color):
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in points)
    return f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>{dots}'


def scale(values, low_px, high_px, log=False):
    import math
    f = math.log2 if log else (lambda v: v)
    lo, hi = f(min(values)), f(max(values))
    span = hi - lo or 1
    return lambda v: low_px + (f(v) - lo) / span * (high_px - low_px)


parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         '<rect width="100%" height="100%" fill="white"/>']
# Left: step ms and audio rate against lanes.
x0 = PAD
lanes = [s["lanes"] for s in by_lanes]
sx = scale(lanes, x0, x0 + panel, log=True)
ms = [s["gpu_ms"] for s in by_lanes]
rates = [audio_rate(s) for s in by_lanes]
sy_ms = scale([0] + ms, H - PAD, PAD)
sy_rate = scale([0] + rates, H - PAD, PAD)


def axes(left, ticks, at, label):
    """A panel's two axes, its x ticks and its x label."""
    parts.append(f'<line x1="{left}" y1="{H - PAD}" x2="{left + panel}" y2="{H - PAD}" stroke="black"/>')
    parts.append(f'<line x1="{left}" y1="{PAD}" x2="{left}" y2="{H - PAD}" stroke="black"/>')
    for tick in ticks:
        parts.append(f'<text x="{at(tick):.1f}" y="{H - PAD + 16}" text-anchor="middle">{tick}</text>')
    parts.append(f'<text x="{left + panel / 2}" y="{H - 15}" text-anchor="middle">{label}</text>')


axes(x0, lanes, sx, f"lanes (context {base})")
parts.append(polyline([(sx(l), sy_ms(m)) for l, m in zip(lanes, ms)], "#1f77b4"))
parts.append(polyline([(sx(l), sy_rate(r)) for l, r in zip(lanes, rates)], "#d62728"))
parts.append(f'<text x="{x0 + 5}" y="{PAD - 25}" fill="#1f77b4">GPU ms per step (max {max(ms):.2f})</text>')
parts.append(f'<text x="{x0 + 5}" y="{PAD - 10}" fill="#d62728">audio s per s (max {max(rates):.0f})</text>')
# Right: the pair's step against the context.
x1 = 2 * PAD + panel
contexts = [s["context"] for s in by_context]
cms = [s["gpu_ms"] for s in by_context]
if contexts:
    cx = scale(contexts, x1, x1 + panel, log=True)
    cy = scale([0] + cms, H - PAD, PAD)
    axes(x1, contexts, cx, "context (a guidance pair)")
    parts.append(polyline([(cx(c), cy(m)) for c, m in zip(contexts, cms)], "#1f77b4"))
    for c, m in zip(contexts, cms):
        parts.append(f'<text x="{cx(c):.1f}" y="{cy(m) - 8:.1f}" text-anchor="middle">{m:.2f} ms</text>')
machine = report["machine"]
parts.append(f'<text x="{PAD}" y="18">drama {machine["commit"]}, {machine["adapter"]["adapter"]}: decode steps of the bench checkpoint</text>')
parts.append("</svg>")
open(args.svg, "w").write("\n".join(parts) + "\n")
