#!/usr/bin/env python3
"""Renders a Loom profiler trace (Chrome-trace / Perfetto JSON, docs/profiling.md) as an SVG timeline.

usage: scripts/trace_to_svg.py TRACE.json OUT.svg [--ranks 0,1] [--names gemm.tile,ag_gemm.chunk_wait]
                               [--max-tracks-per-rank 24] [--from-us T0] [--to-us T1] [--title TEXT]

One lane per track (rank x SM x warp), grouped by rank from the top; each span a bar coloured by its name, nested
spans drawn thinner on top of their parents; instants as ticks. Tracks are the trace's own (pid = rank, tid = SM x
10000 + CTA slot x 100 + warp). --max-tracks-per-rank keeps a rank's first tracks in SM order (a whole H200 has 132
SMs x several warps: more lanes than a page shows). Output is deterministic for one matplotlib version (fixed
svg.hashsalt, no date).
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402


def load_spans(trace, ranks, names, t0, t1):
    """Per (pid, tid): list of (start_us, end_us, name, depth); per (pid, tid): instants (ts, name)."""
    spans, instants, open_ = {}, {}, {}
    tnames = {}
    for e in trace["traceEvents"]:
        ph = e.get("ph")
        if ph == "M":
            if e.get("name") == "thread_name":
                tnames[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        pid, tid = e["pid"], e["tid"]
        if ranks is not None and pid not in ranks:
            continue
        key = (pid, tid)
        if ph == "B":
            open_.setdefault(key, []).append((e["ts"], e["name"]))
        elif ph == "E":
            stack = open_.get(key)
            if not stack:
                continue
            ts, name = stack.pop()
            if (names is None or name in names) and e["ts"] >= t0 and ts <= t1:
                spans.setdefault(key, []).append((ts, e["ts"], name, len(stack)))
        elif ph == "X":
            if names is None or e["name"] in names:
                spans.setdefault(key, []).append((e["ts"], e["ts"] + e["dur"], e["name"], 0))
        elif ph == "i":
            if (names is None or e["name"] in names) and t0 <= e["ts"] <= t1:
                instants.setdefault(key, []).append((e["ts"], e["name"]))
    return spans, instants, tnames


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--ranks", help="comma-separated ranks (default: all)")
    ap.add_argument("--names", help="comma-separated span names (default: all)")
    ap.add_argument("--max-tracks-per-rank", type=int, default=24)
    ap.add_argument("--from-us", type=float, default=float("-inf"))
    ap.add_argument("--to-us", type=float, default=float("inf"))
    ap.add_argument("--title", default=None)
    a = ap.parse_args(argv)
    with open(a.trace) as f:
        trace = json.load(f)
    ranks = {int(r) for r in a.ranks.split(",")} if a.ranks else None
    names = set(a.names.split(",")) if a.names else None
    spans, instants, tnames = load_spans(trace, ranks, names, a.from_us, a.to_us)

    keys = sorted(set(spans) | set(instants))
    by_rank = {}
    for k in keys:
        by_rank.setdefault(k[0], []).append(k)
    lanes = []
    for pid in sorted(by_rank):
        lanes += by_rank[pid][: a.max_tracks_per_rank]
    if not lanes:
        sys.exit(f"{a.trace}: no spans to draw (check --ranks / --names)")

    all_names = sorted({s[2] for k in lanes for s in spans.get(k, [])} | {i[1] for k in lanes for i in instants.get(k, [])})
    cmap = plt.get_cmap("tab20")
    colour = {n: cmap(i % 20) for i, n in enumerate(all_names)}

    plt.rcParams["svg.hashsalt"] = "loom-trace"
    plt.rcParams["svg.fonttype"] = "none"
    height = max(2.5, 0.22 * len(lanes) + 1.5)
    fig, ax = plt.subplots(figsize=(14, height))
    for y, k in enumerate(lanes):
        for start, end, name, depth in spans.get(k, []):
            h = 0.8 * (0.75 ** depth)
            ax.broken_barh([(start, max(end - start, 1e-3))], (y - h / 2, h), facecolors=colour[name], linewidth=0)
        for ts, name in instants.get(k, []):
            ax.plot([ts, ts], [y - 0.45, y + 0.45], color=colour[name], linewidth=0.8)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"r{k[0]} " + tnames.get(k, f"tid {k[1]}") for k in lanes], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("time (µs, rank 0's clock)")
    # Rank separators.
    y = 0
    for pid in sorted(by_rank):
        n = min(len(by_rank[pid]), a.max_tracks_per_rank)
        if y:
            ax.axhline(y - 0.5, color="black", linewidth=0.6)
        y += n
    ax.legend(handles=[Patch(color=colour[n], label=n) for n in all_names], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    ax.set_title(a.title or a.trace, fontsize=9)
    fig.tight_layout()
    fig.savefig(a.out, format="svg", metadata={"Date": None, "Creator": None})
    print(f"wrote {a.out}: {len(lanes)} tracks, {sum(len(spans.get(k, [])) for k in lanes)} spans")


if __name__ == "__main__":
    main(sys.argv[1:])
