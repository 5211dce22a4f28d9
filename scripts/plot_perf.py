#!/usr/bin/env python3
"""Draws docs/perf/*.json as SVGs under docs/perf/plots/ (one <file>.svg per JSON file it knows how to draw).

usage: scripts/plot_perf.py [--check] [--root DIR]

The JSON is validated by scripts/perf_summary.py's schema. Each file is drawn by the first kind whose rows fit:
  collective  rows with size_bytes, busBW_GBps, algo, auto_choice (all_gather, reduce_scatter, all_reduce,
              all_to_all): busBW against size, one panel per setup (ranks, distinct or shared GPU). Loom's line is
              the rows with algo "auto" (each row's auto_choice is the algorithm Auto picked); a baseline's busBW is
              busBW_loom * loom_us / baseline_us, the factor of Loom's row. A dotted line is the best fixed
              algorithm per size, for reference. Rows with a "timing" field (no busBW) and out_plain rows are left
              out.
  gemm        rows with m, n, k, loom_tflops: TFLOP/s per shape, Loom's heuristic config (and the autotuned one
              where the file has it) against each baseline (TFLOP/s = loom_tflops * loom_us / baseline_us).
  overlap     rows with M, N, K, world and no "run" (ag_gemm, gemm_rs, gemm_ar and their variants): speedup per
              shape as grouped bars, one panel per setup (world, machine).
  generic     any other file of at most 40 rows with speedups: each row's speedups as grouped bars.
Other files are skipped with a printed note.

Output is deterministic for one matplotlib version (fixed svg.hashsalt, no date or creator, text kept as text).
--check writes nothing into the repository: it regenerates into a temporary folder and fails when the committed
SVGs differ from it, or when one is missing or extra. Byte identity holds only for the pinned matplotlib version
(MATPLOTLIB_VERSION, the one scripts/setup.sh installs); under another version --check says so and checks instead
that every expected SVG exists and parses as XML.
"""
import argparse
import filecmp
import os
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_summary  # noqa: E402  (the schema and row labels)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MATPLOTLIB_VERSION = "3.11.2"
MAX_GENERIC_ROWS = 40
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")

plt.rcParams.update({
    "svg.hashsalt": "loom-perf",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 8,
    "axes.titlesize": 9,
    "figure.dpi": 72,
    "axes.grid": True,
    "grid.alpha": 0.3,
})
SAVE_META = {"Date": None, "Creator": None}


# ---- helpers --------------------------------------------------------------------------------------------------


def has(row, *keys):
    return all(k in row for k in keys)


def setup_of(row):
    """A short name of the machine setup a row ran on: ranks and whether they shared one GPU."""
    ranks = row.get("ranks", row.get("world"))
    machine = row.get("machine", "")
    shared = row.get("shared_gpu")
    if shared is None:
        shared = "shared" in machine or "one H200" in machine
    where = "one shared H200" if shared else ("distinct GPUs, NVLink" if "NVLink" in machine else "distinct GPUs")
    return (0 if not shared else 1, ranks or 0), f"{ranks} ranks, {where}" if ranks else where


def size_label(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def panels(n):
    fig, axes = plt.subplots(n, 1, figsize=(8, 3.2 * n), squeeze=False)
    return fig, [a[0] for a in axes]


def grouped_bars(ax, labels, series, ylabel):
    """series: [(name, [value or None per label])]; draws one bar group per label."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j, v in enumerate(values) if v is not None]
        ys = [v for v in values if v is not None]
        ax.bar(xs, ys, width, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    top = max((v for _, vals in series for v in vals if v is not None), default=1.0)
    ax.set_ylim(0, top * 1.35)  # headroom for the legend
    ax.legend(fontsize=6, ncol=3, loc="upper left")


# ---- the kinds ------------------------------------------------------------------------------------------------


def is_collective(rows):
    return any(has(r, "size_bytes", "busBW_GBps", "algo", "auto_choice") for r in rows)


def plot_collective(name, d):
    rows = [r for r in d["rows"] if "busBW_GBps" in r and "timing" not in r and not r.get("out_plain")]
    groups = {}
    for r in rows:
        key, label = setup_of(r)
        groups.setdefault((key, label), []).append(r)
    fig, axes = panels(len(groups))
    for ax, ((_, label), rs) in zip(axes, sorted(groups.items())):
        auto = sorted((r for r in rs if r["algo"] == "auto"), key=lambda r: r["size_bytes"])
        xs = [r["size_bytes"] for r in auto]
        ax.plot(xs, [r["busBW_GBps"] for r in auto], "o-", color="black", label="Loom Auto")
        baselines = sorted({b for r in auto for b in r["baselines"]})
        for b in baselines:
            pts = [(r["size_bytes"], r["busBW_GBps"] * r["loom_us"] / r["baselines"][b])
                   for r in auto if b in r["baselines"]]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "s--", ms=3, label=b)
        best = {}
        for r in rs:
            if r["algo"] != "auto" and r["busBW_GBps"] > best.get(r["size_bytes"], (0, ""))[0]:
                best[r["size_bytes"]] = (r["busBW_GBps"], f"{r['algo']}/{r.get('path', '')}")
        if best:
            sizes = sorted(best)
            ax.plot(sizes, [best[s][0] for s in sizes], ":", color="gray", label="best fixed algorithm")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = xs[:: max(1, len(xs) // 11)]
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(s) for s in ticks], fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("size (the row's size_bytes)")
        ax.set_ylabel("busBW (GB/s)")
        ax.set_title(f"{label}")
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle(f"{name}: busBW against size. Loom Auto = rows with algo 'auto' (the algorithm it picked is "
                 "auto_choice);\nbaselines converted with Loom's busBW factor; dotted: best fixed algorithm per size",
                 fontsize=9)
    return fig


def is_gemm(rows):
    return all(has(r, "m", "n", "k", "loom_tflops") for r in rows)


def plot_gemm(name, d):
    rows = d["rows"]
    variants = [v for v in ("heuristic", "autotuned") if any(r.get("variant") == v for r in rows)]
    shapes = []
    for r in rows:
        if r["shape"] not in shapes and (not variants or r.get("variant") == variants[0]):
            shapes.append(r["shape"])
    first = {}
    for r in rows:
        if not variants or r.get("variant") == variants[0]:
            first.setdefault(r["shape"], r)
    series = []
    for v in variants or [None]:
        by_shape = {}
        for r in rows:
            if v is None or r.get("variant") == v:
                by_shape.setdefault(r["shape"], r["loom_tflops"])
        series.append((f"Loom ({v} config)" if v else "Loom", [by_shape.get(s) for s in shapes]))
    for b in sorted({b for r in first.values() for b in r["baselines"]}):
        vals = []
        for s in shapes:
            r = first[s]
            vals.append(r["loom_tflops"] * r["loom_us"] / r["baselines"][b] if b in r["baselines"] else None)
        series.append((b, vals))
    fig, (ax,) = panels(1)
    grouped_bars(ax, shapes, series, "TFLOP/s")
    dtype = first[shapes[0]].get("dtype", "")
    ax.set_title(f"{name}: GEMM {dtype} TFLOP/s per shape (MxNxK), Loom against the baselines of the same run")
    return fig


def is_overlap(rows):
    return all(has(r, "M", "N", "K", "world") and "run" not in r for r in rows)


def plot_speedups(ax, rows, labels):
    names = sorted({b for r in rows for b in r["speedup"]})
    series = [(b, [r["speedup"].get(b) for r in rows]) for b in names]
    grouped_bars(ax, labels, series, "baseline µs / Loom µs")
    ax.axhline(1.0, color="black", lw=0.8)


def plot_overlap(name, d):
    groups = {}
    for r in d["rows"]:
        groups.setdefault(setup_of(r), []).append(r)
    fig, axes = panels(len(groups))
    for ax, ((_, label), rs) in zip(axes, sorted(groups.items())):
        plot_speedups(ax, rs, [r["shape"] for r in rs])
        ax.set_title(label)
    fig.suptitle(f"{name}: Loom's overlapped op, speedup per shape (MxNxK) over each baseline (> 1: Loom is faster)",
                 fontsize=9)
    return fig


def is_generic(rows):
    return len(rows) <= MAX_GENERIC_ROWS and any(r["speedup"] for r in rows)


def plot_generic(name, d):
    rows = [r for r in d["rows"] if r["speedup"]]
    labels = []
    for r in rows:
        v = perf_summary.variant_of(r, r["shape"], False)
        labels.append(f"{r['shape']} {v}".strip())
    fig, (ax,) = panels(1)
    plot_speedups(ax, rows, labels)
    ax.set_title(f"{name}: each row's speedups (baseline µs / Loom µs, > 1: Loom is faster)")
    return fig


KINDS = [("collective", is_collective, plot_collective), ("gemm", is_gemm, plot_gemm),
         ("overlap", is_overlap, plot_overlap), ("generic", is_generic, plot_generic)]


# ---- driver ---------------------------------------------------------------------------------------------------


def render(files, out_dir):
    """Writes one SVG per drawable file into out_dir; returns the SVG names written."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for fname, d in files.items():
        stem = fname[:-5]
        kind = next(((k, plot) for k, fits, plot in KINDS if fits(d["rows"])), None)
        if kind is None:
            print(f"plot_perf: {fname}: skipped (no plot for its rows: {len(d['rows'])} rows, no known fields)")
            continue
        fig = kind[1](stem, d)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, stem + ".svg"), format="svg", metadata=SAVE_META)
        plt.close(fig)
        written.append(stem + ".svg")
    return written


def check(files, plots_dir):
    with tempfile.TemporaryDirectory() as tmp:
        expected = render(files, tmp)
        have = sorted(f for f in os.listdir(plots_dir) if f.endswith(".svg")) if os.path.isdir(plots_dir) else []
        missing = sorted(set(expected) - set(have))
        extra = sorted(set(have) - set(expected))
        bad = []
        exact = matplotlib.__version__ == MATPLOTLIB_VERSION
        if not exact:
            print(f"plot_perf: matplotlib {matplotlib.__version__}, not {MATPLOTLIB_VERSION}: checking that each SVG "
                  "exists and parses, not byte identity")
        for f in sorted(set(expected) & set(have)):
            path = os.path.join(plots_dir, f)
            if exact:
                if not filecmp.cmp(path, os.path.join(tmp, f), shallow=False):
                    bad.append(f + " (differs)")
            else:
                try:
                    ET.parse(path)
                except ET.ParseError as e:
                    bad.append(f"{f} (not XML: {e})")
    problems = [f + " (missing)" for f in missing] + [f + " (no JSON draws it)" for f in extra] + bad
    if problems:
        print("plot_perf: out of date (run scripts/plot_perf.py): " + ", ".join(problems), file=sys.stderr)
        return 1
    print(f"plot_perf: {len(expected)} SVGs: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; fail when the committed SVGs are stale")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="repository root (default: the one holding this script)")
    args = ap.parse_args()
    perf_dir = os.path.join(args.root, "docs", "perf")
    plots_dir = os.path.join(perf_dir, "plots")
    try:
        files = perf_summary.load(perf_dir)
    except perf_summary.SchemaError as e:
        print(f"plot_perf: {e}", file=sys.stderr)
        return 1
    if args.check:
        return check(files, plots_dir)
    written = render(files, plots_dir)
    for f in sorted(os.listdir(plots_dir)):
        if f.endswith(".svg") and f not in written:
            os.remove(os.path.join(plots_dir, f))
    print(f"plot_perf: wrote {len(written)} SVGs to {os.path.relpath(plots_dir, args.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
