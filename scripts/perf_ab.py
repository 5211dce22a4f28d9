#!/usr/bin/env python3
"""Turns the results of scripts/bench_ab.sh into one docs/perf JSON file comparing two variants.

usage: scripts/perf_ab.py RESULTS BASE NEW --op NAME --command CMD --commit SHA [--note TEXT] > docs/perf/NAME.json

Each row is one benchmark case that both variants measured: loom_us is NEW's median over the rounds, the baseline
named BASE is BASE's median, speedup[BASE] = BASE / NEW (1.0: the same; > 1: NEW is faster). Rows also carry every
round's time of both variants. Python 3, standard library only.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys


def case(op, row):
    """The identity of a benchmark row: its op, shape and variant fields."""
    if op == "gemm":
        return f"gemm {row['m']}x{row['n']}x{row['k']} {row['dtype']} {row.get('variant', '')}".strip()
    if "M" in row:
        k = row.get("K_loc", row.get("K"))
        return f"{op} M={row['M']} N={row['N']} K={k} {row['dtype']}"
    plain = " plain-out" if row.get("out_plain") else ""
    return f"{op} {row['size']} {row['dtype']} {row['algo']}/{row['path']}{plain}"


def collect(results, variant):
    """{case: [loom_us per round]} and the ranks seen, over every result file of one variant."""
    times, ranks, gpu, date = {}, set(), None, None
    pattern = re.compile(rf"^(gemm|coll|overlap)-{re.escape(variant)}-(\d+)(\.json)?$")
    for entry in sorted(os.listdir(results)):
        if not pattern.match(entry):
            continue
        path = os.path.join(results, entry)
        files = [path] if os.path.isfile(path) else sorted(glob.glob(os.path.join(path, "*.json")))
        for f in files:
            with open(f) as fh:
                d = json.load(fh)
            gpu, date = d.get("gpu", gpu), d.get("date", date)
            ranks.update(d.get("ranks", []) if isinstance(d.get("ranks"), list) else [d.get("ranks", 1)])
            for row in d["rows"]:
                times.setdefault(case(d["op"], row), []).append(row["loom_us"])
    return times, ranks, gpu, date


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--op", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    base, ranks_b, gpu, date = collect(a.results, a.base)
    new, ranks_n, _, _ = collect(a.results, a.new)
    rows = []
    for key in sorted(set(base) & set(new)):
        b, n = statistics.median(base[key]), statistics.median(new[key])
        rows.append({"shape": key, "loom_us": n, "baselines": {a.base: b}, "speedup": {a.base: b / n},
                     f"{a.new}_rounds_us": new[key], f"{a.base}_rounds_us": base[key]})
    if not rows:
        sys.exit(f"{a.results}: no case measured by both {a.base} and {a.new}")
    doc = {"op": a.op, "command": a.command, "gpu": gpu or "unknown", "commit": a.commit,
           "date": (date or "")[:10], "ranks": sorted(r for r in ranks_b | ranks_n if isinstance(r, int)),
           "rows": rows}
    if a.note:
        doc["note"] = a.note
    json.dump(doc, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
