#!/usr/bin/env python3
"""Validates docs/perf/*.json and generates the performance summaries from them.

usage: scripts/perf_summary.py [--check] [--root DIR]

Writes docs/perf/README.md (a "Plots" section showing each docs/perf/plots/*.svg, which scripts/plot_perf.py
draws, then one section per JSON file: command, GPU, commit, date and a table of its rows) and the summary table of README.md between <!-- perf-summary:begin --> and <!-- perf-summary:end -->.
--check writes nothing: it fails when either file differs from what the JSON generates.
Exits non-zero naming the file and field when a JSON file breaks the schema:

  {"op": str, "command": str, "gpu": str, "commit": str, "date": "YYYY-MM-DD...", "ranks": [int, ...],
   "note": str (optional), "runs": [{"commit", "date", "command", "ranks", "machine"}, ...] (optional),
   "rows": [{"shape": str, "loom_us": number, "baselines": {name: us}, "speedup": {name: ratio}, ...}, ...]}

speedup[name] = baselines[name] / loom_us (> 1: Loom is faster); a row may carry further fields.
Python 3, standard library only.
"""
import argparse
import glob
import json
import math
import os
import re
import sys

TOP_REQUIRED = {"op": str, "command": str, "gpu": str, "commit": str, "date": str, "ranks": list, "rows": list}
TOP_OPTIONAL = {"note": str, "runs": list}
RUN_FIELDS = {"commit": str, "date": str, "command": str}
BEGIN, END = "<!-- perf-summary:begin -->", "<!-- perf-summary:end -->"


class SchemaError(Exception):
    pass


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate(name, d):
    def fail(field, why):
        raise SchemaError(f"{name}: {field}: {why}")

    if not isinstance(d, dict):
        fail("(top level)", "expected an object")
    for key, typ in TOP_REQUIRED.items():
        if key not in d:
            fail(key, "missing")
        if not isinstance(d[key], typ) or (typ is str and not d[key].strip()):
            fail(key, f"expected a non-empty {typ.__name__}, got {d[key]!r:.60}")
    for key in d:
        if key not in TOP_REQUIRED and key not in TOP_OPTIONAL:
            fail(key, "unknown top-level field (allowed: " + ", ".join([*TOP_REQUIRED, *TOP_OPTIONAL]) + ")")
        if key in TOP_OPTIONAL and not isinstance(d[key], TOP_OPTIONAL[key]):
            fail(key, f"expected a {TOP_OPTIONAL[key].__name__}")
    if not re.match(r"\d{4}-\d{2}-\d{2}", d["date"]):
        fail("date", f"expected YYYY-MM-DD..., got {d['date']!r}")
    if not d["ranks"] or not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in d["ranks"]):
        fail("ranks", f"expected a non-empty list of positive integers, got {d['ranks']!r}")
    for i, run in enumerate(d.get("runs", [])):
        if not isinstance(run, dict):
            fail(f"runs[{i}]", "expected an object")
        for key, typ in RUN_FIELDS.items():
            if not isinstance(run.get(key), typ):
                fail(f"runs[{i}].{key}", f"expected a {typ.__name__}")
    if not d["rows"]:
        fail("rows", "empty")
    for i, row in enumerate(d["rows"]):
        where = f"rows[{i}]"
        if not isinstance(row, dict):
            fail(where, "expected an object")
        if not isinstance(row.get("shape"), str) or not row["shape"].strip():
            fail(f"{where}.shape", f"expected a non-empty string, got {row.get('shape')!r}")
        if not is_number(row.get("loom_us")) or row["loom_us"] <= 0:
            fail(f"{where}.loom_us", f"expected a positive number, got {row.get('loom_us')!r}")
        for key in ("baselines", "speedup"):
            m = row.get(key)
            if not isinstance(m, dict):
                fail(f"{where}.{key}", f"expected an object {{name: number}}, got {m!r:.60}")
            for k, v in m.items():
                if not is_number(v):
                    fail(f"{where}.{key}.{k}", f"expected a number, got {v!r}")
        for k in row["speedup"]:
            if k not in row["baselines"]:
                fail(f"{where}.speedup.{k}", "no baseline of that name")


def load(perf_dir):
    files = {}
    for path in sorted(glob.glob(os.path.join(perf_dir, "*.json"))):
        name = os.path.basename(path)
        try:
            with open(path) as f:
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise SchemaError(f"{name}: not JSON: {e}")
        validate(name, d)
        files[name] = d
    if not files:
        raise SchemaError(f"{perf_dir}: no *.json files")
    return files


# ---- formatting ---------------------------------------------------------------------------------------------


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def fmt_us(us):
    if us >= 1000:
        return f"{us:,.0f}"
    if us >= 10:
        return f"{us:.1f}"
    return f"{us:.2f}"


def fmt_ratio(r):
    return f"{r:.3f}"


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def ranks_of(row):
    for key in ("ranks", "world"):
        if isinstance(row.get(key), int):
            return row[key]
    return None


def variant_of(row, shape_key, multi_dtype):
    parts = []
    for key in ("sweep", "variant", "case"):
        if key in row and str(row[key]) != shape_key:
            parts.append(str(row[key]))
    if "algo" in row:
        parts.append(f"{row['algo']}/{row['path']}" if "path" in row else str(row["algo"]))
    elif "path" in row:
        parts.append(str(row["path"]))
    if "metric" in row and row["metric"] != shape_key:
        parts.append(str(row["metric"]))
    if "timing" in row:
        parts.append(str(row["timing"]))
    if "run" in row:
        parts.append(f"run {row['run']}")
    if row.get("out_plain"):
        parts.append("plain out")
    if multi_dtype and "dtype" in row:
        parts.append(str(row["dtype"]))
    return " ".join(parts)


def file_section(name, d):
    rows = d["rows"]
    machines = []
    for r in rows:
        m = r.get("machine")
        if m and m not in machines:
            machines.append(m)
    letter = {m: chr(ord("A") + i) for i, m in enumerate(machines)}
    multi_dtype = len({r["dtype"] for r in rows if "dtype" in r}) > 1
    variants = [variant_of(r, r["shape"], multi_dtype) for r in rows]
    has_variant = any(variants)
    has_ranks = any(ranks_of(r) is not None for r in rows)
    ranks = ", ".join(str(r) for r in d["ranks"])
    out = [f"## {name[:-5]}", ""]
    out.append(f"- op `{d['op']}`; GPU {d['gpu']}; ranks {ranks}; commit `{d['commit']}`; date {d['date']}")
    out.append(f"- command: `{d['command']}`")
    for run in d.get("runs", []):
        where = f" ({run['machine']})" if run.get("machine") else ""
        out.append(f"- run at `{run['commit']}`, {run['date']}{where}: `{run['command']}`")
    for m in machines:
        out.append(f"- machine {letter[m]}: {m}")
    if d.get("note"):
        out += ["", d["note"]]
    head = ["shape"] + (["variant"] if has_variant else []) + (["ranks"] if has_ranks else [])
    head += (["machine"] if machines else []) + ["Loom µs", "speedup (baseline µs / Loom µs)"]
    out += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, v in zip(rows, variants):
        line = [r["shape"]] + ([v] if has_variant else [])
        if has_ranks:
            line.append("" if ranks_of(r) is None else str(ranks_of(r)))
        if machines:
            line.append(letter.get(r.get("machine"), ""))
        line.append(fmt_us(r["loom_us"]))
        line.append(", ".join(f"{k} {fmt_ratio(x)}" for k, x in r["speedup"].items()))
        out.append("| " + " | ".join(cell(x) for x in line) + " |")
    return out


def plots_section(plots):
    """plots: the SVG file names under docs/perf/plots/, each drawn from the JSON file of the same stem."""
    out = ["## Plots", "",
           "Drawn by `scripts/plot_perf.py` from the JSON files (`--check` verifies the committed SVGs); each plot's",
           "title says which rows it shows.", ""]
    for svg in plots:
        stem = svg[:-4]
        out += [f"![{stem}](plots/{svg})", "", f"[{svg}](plots/{svg}), from [{stem}](#{stem})", ""]
    return out[:-1]


def perf_readme(files, plots=()):
    out = [
        "# Measured performance",
        "",
        "Generated by `scripts/perf_summary.py` from `docs/perf/*.json`; edit the JSON, not this page. Each section",
        "is one file: the command that produced it, the GPU, the commit and date, and every row. Loom µs is the",
        "median time of Loom's op; speedup is a baseline's time over Loom's (> 1: Loom is faster), both measured",
        "in the same run. The JSON files hold further per-row fields (TFLOP/s, bandwidths, configs, checks).",
        "",
    ]
    out += ["- [Plots](#plots)"] if plots else []
    out += [f"- [{n[:-5]}](#{n[:-5]})" for n in files]
    if plots:
        out += [""] + plots_section(plots)
    for name, d in files.items():
        out += [""] + file_section(name, d)
    return "\n".join(out) + "\n"


# ---- the README's headline table ----------------------------------------------------------------------------

TWO_GPUS = "2 H200, NVLink"
SHARED8 = "8 ranks on 1 H200"


def distinct(r):
    return r.get("shared_gpu") is False and not r.get("out_plain")


# (what, setup, file, row filter, [(baseline, shown as)])
HEADLINES = [
    ("GEMM bf16, 13 TP-MLP shapes", "1 H200", "gemm.json", lambda r: r.get("variant") == "heuristic",
     [("cublaslt", "cuBLASLt")]),
    ("GEMM fp8 e4m3, same shapes", "1 H200", "gemm_fp8.json", lambda r: r.get("variant") == "heuristic",
     [("cublaslt", "cuBLASLt fast-accum"), ("cublaslt_promoted", "cuBLASLt default")]),
    ("GEMM bf16, M ≤ 128 (decode)", "1 H200", "gemm_skinny.json", lambda r: r.get("variant") == "heuristic",
     [("cublaslt", "cuBLASLt")]),
    ("AllGather+GEMM, M = 8192", TWO_GPUS, "ag_gemm.json", lambda r: r.get("world") == 2 and r.get("M") == 8192,
     [("nccl_allgather_then_cublaslt", "NCCL + cuBLASLt"), ("torch_async_tp", "PyTorch async TP"),
      ("loom_allgather_then_gemm", "Loom sequence")]),
    ("AllGather+GEMM, M = 512-4096", TWO_GPUS, "ag_gemm.json", lambda r: r.get("world") == 2 and r.get("M") != 8192,
     [("nccl_allgather_then_cublaslt", "NCCL + cuBLASLt"), ("loom_allgather_then_gemm", "Loom sequence")]),
    ("GEMM+ReduceScatter, M = 8192", TWO_GPUS, "gemm_rs.json", lambda r: r.get("world") == 2 and r.get("M") == 8192,
     [("cublaslt_then_nccl_reducescatter", "NCCL + cuBLASLt"), ("torch_async_tp", "PyTorch async TP"),
      ("loom_gemm_then_reduce_scatter", "Loom sequence")]),
    ("GEMM+ReduceScatter, M = 512-4096", TWO_GPUS, "gemm_rs.json",
     lambda r: r.get("world") == 2 and r.get("M") != 8192,
     [("cublaslt_then_nccl_reducescatter", "NCCL + cuBLASLt"), ("loom_gemm_then_reduce_scatter", "Loom sequence")]),
    ("GEMM+AllReduce, M ≤ 128", TWO_GPUS, "gemm_ar.json", lambda r: r.get("world") == 2 and r.get("M", 0) <= 128
     and "two H200s" in r.get("machine", ""), [("cublaslt_then_nccl_allreduce", "NCCL + cuBLASLt"),
                                               ("loom_gemm_then_all_reduce", "Loom sequence")]),
    ("AllGather+GEMM", SHARED8, "ag_gemm.json", lambda r: r.get("world") == 8,
     [("loom_allgather_then_gemm", "Loom sequence")]),
    ("GEMM+ReduceScatter", SHARED8, "gemm_rs.json", lambda r: r.get("world") == 8,
     [("loom_gemm_then_reduce_scatter", "Loom sequence")]),
    ("AllGather, 1 KiB-1 GiB (Auto)", TWO_GPUS, "all_gather.json", lambda r: r["algo"] == "auto" and distinct(r),
     [("nccl", "NCCL")]),
    ("ReduceScatter, 1 KiB-1 GiB (Auto)", TWO_GPUS, "reduce_scatter.json",
     lambda r: r["algo"] == "auto" and distinct(r), [("nccl", "NCCL")]),
    ("AllReduce, 1 KiB-1 GiB (Auto)", TWO_GPUS, "all_reduce.json", lambda r: r["algo"] == "auto" and distinct(r),
     [("nccl", "NCCL")]),
    ("AllToAll, 1 KiB-1 GiB (Auto)", TWO_GPUS, "all_to_all.json", lambda r: r["algo"] == "auto" and distinct(r),
     [("nccl", "NCCL")]),
    ("Signal round trip, NVSHMEM's semantics", TWO_GPUS, "lang_signal.json",
     lambda r: r.get("metric") == "signal_round_trip_us" and "two H200s" in r.get("machine", ""),
     [("nvshmem", "NVSHMEM")]),
]


def summary_table(files):
    out = [
        "Loom's time against each baseline's in the same run (baseline µs / Loom µs, > 1: Loom is faster):",
        "geomean over the rows, and the range. Generated by `scripts/perf_summary.py` from `docs/perf/`, whose",
        "[README](docs/perf/README.md) has every row.",
        "",
        "| what | setup | against | geomean | range | source |",
        "|---|---|---|---|---|---|",
    ]
    for what, setup, name, where, baselines in HEADLINES:
        if name not in files:
            raise SchemaError(f"{name}: missing (a headline of the README summary reads it)")
        rows = [r for r in files[name]["rows"] if where(r)]
        for key, shown in baselines:
            xs = [r["speedup"][key] for r in rows if key in r["speedup"]]
            if not xs:
                raise SchemaError(f"{name}: no row for the headline '{what}' has speedup.{key}")
            spread = f"{min(xs):.2f}-{max(xs):.2f}×" if len(xs) > 1 else "-"
            rows_word = "row" if len(xs) == 1 else "rows"
            line = [what, setup, shown, f"{geomean(xs):.3f}×", spread,
                    f"[{name}](docs/perf/README.md#{name[:-5]}), {len(xs)} {rows_word}"]
            out.append("| " + " | ".join(cell(x) for x in line) + " |")
    return out


def with_summary(readme, table):
    b, e = readme.find(BEGIN), readme.find(END)
    if b < 0 or e < b:
        raise SchemaError(f"README.md: the markers {BEGIN} / {END} are missing")
    return readme[: b + len(BEGIN)] + "\n" + "\n".join(table) + "\n" + readme[e:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; fail when a generated file is stale")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="repository root (default: the one holding this script)")
    args = ap.parse_args()
    perf_dir = os.path.join(args.root, "docs", "perf")
    readme_path = os.path.join(args.root, "README.md")
    try:
        files = load(perf_dir)
        with open(readme_path) as f:
            readme = f.read()
        plots_dir = os.path.join(perf_dir, "plots")
        plots = sorted(f for f in os.listdir(plots_dir) if f.endswith(".svg")) if os.path.isdir(plots_dir) else []
        outputs = {os.path.join(perf_dir, "README.md"): perf_readme(files, plots),
                   readme_path: with_summary(readme, summary_table(files))}
    except SchemaError as e:
        print(f"perf_summary: {e}", file=sys.stderr)
        return 1
    stale = []
    for path, text in outputs.items():
        old = open(path).read() if os.path.exists(path) else None
        if old == text:
            continue
        if args.check:
            stale.append(os.path.relpath(path, args.root))
        else:
            with open(path, "w") as f:
                f.write(text)
    if stale:
        print("perf_summary: out of date (run scripts/perf_summary.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    print(f"perf_summary: {len(files)} files, {sum(len(d['rows']) for d in files.values())} rows: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
