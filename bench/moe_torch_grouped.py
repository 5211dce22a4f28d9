"""torch._grouped_mm on bench-moe grouped's shapes, as a baseline for docs/perf/grouped_gemm.json.

    python bench/moe_torch_grouped.py --out torch_grouped.json
    build/bench/bench-moe grouped --out docs/perf/grouped_gemm.json
    python bench/moe_torch_grouped.py --merge-into docs/perf/grouped_gemm.json
    build/bench/bench-moe grouped-fp8 --out docs/perf/grouped_gemm_fp8.json
    python bench/moe_torch_grouped.py --fp8 --merge-into docs/perf/grouped_gemm_fp8.json

(N, K, E, top-k) of Mixtral-8x7B, Mixtral-8x22B, Qwen1.5-MoE, DeepSeek-MoE, Qwen3-30B-A3B at 8192 and 128 tokens
(rows = tokens x top-k), uniform and skewed routing (the same sizes as bench/bench_moe.cpp's `routing`), bf16:
out[rows of e] = a[rows of e] @ w[e].T with w [E, N, K] and int32 cumulative offsets on the device. Timed with CUDA
events after an L2 flush, median of --iters runs; each row carries bench-moe's "shape" string and "baselines":
{"torch_grouped_mm": us}. --fp8: torch._scaled_grouped_mm instead, fp8 e4m3 in (random values in [-1, 1)), row-wise
fp32 scales of A [rows] and B [E, N] (ones), bf16 out, on bench-moe grouped-fp8's per-tensor rows ("... fp8e4m3"): as
"torch_scaled_grouped_mm" with use_fast_accum (products summed in the tensor cores' accumulators, as Loom's per-tensor
kernel sums them) and as "torch_scaled_grouped_mm_promoted" without. loom.grouped_gemm of the same operands (fp8: scales
of ones, per tensor) is timed in the same loop, each iteration running every call once in turn, so that torch and
Loom see the same GPU state: "loom_us_with_torch". --merge-into FILE adds those times to the rows of bench-moe's report
FILE by shape (every shape of FILE must have been timed here, except --fp8's block-scaled rows, which keep their own
baselines), recomputes each row's speedup over the torch baselines from loom_us_with_torch (the others from bench-moe's
own loom_us) and appends this command to FILE's "command".
"""
import argparse
import json
import math
import statistics
import subprocess
import sys

import torch

import loom

MODELS = [("Mixtral-8x7B", 14336, 4096, 8, 2), ("Mixtral-8x22B", 16384, 6144, 8, 2), ("Qwen1.5-MoE", 1408, 2048, 60, 4),
          ("DeepSeek-MoE", 1408, 2048, 64, 6), ("Qwen3-30B-A3B", 768, 2048, 128, 8)]


def routing(rows: int, e: int, skewed: bool):
    """bench_moe.cpp's routing(): uniform, or weight (i + 1)^-1.2 to expert (7919 i) mod E (the same sizes)."""
    s = [rows // e + (1 if i < rows % e else 0) for i in range(e)]
    if not skewed:
        return s
    w = [0.0] * e
    for i in range(e):
        w[(7919 * i) % e] = (1.0 / (i + 1)) ** 1.2
    total = sum(w)
    s = [math.floor(rows * x / total) for x in w]
    i = 0
    while sum(s) < rows:
        s[i] += 1
        i = (i + 1) % e
    return s


def shape_of(name: str, n: int, k: int, e: int, topk: int, tokens: int, routing_name: str, fp8: bool) -> str:
    """bench_moe.cpp grouped's (fp8: grouped-fp8's per-tensor) "shape" string of a row."""
    return f"{name} E={e} N={n} K={k} tokens={tokens} top{topk} {routing_name} {'fp8e4m3' if fp8 else 'bf16'}"


def is_block_row(row: dict) -> bool:
    return row.get("shape", "").endswith(" block128")


def load_report(path: str, shapes: set) -> dict:
    """bench-moe's report `path`, checked before any timing: every row's shape (but block-scaled ones) timed here."""
    with open(path) as f:
        doc = json.load(f)
    missing = [r.get("shape") for r in doc.get("rows", []) if r.get("shape") not in shapes and not is_block_row(r)]
    if not doc.get("rows") or missing:
        sys.exit(f"--merge-into {path}: expected rows whose shapes bench-moe grouped writes, "
                 f"given {len(doc.get('rows', []))} rows, {len(missing)} of other shapes, e.g. {missing[:1]}")
    return doc


def merge_into(path: str, doc: dict, rows_out: list, command: str) -> None:
    """Adds each row's torch baseline times and loom_us_with_torch to the row of the same shape in `doc`, recomputes
    its speedups and writes it to `path`."""
    times = {r["shape"]: r for r in rows_out}
    for row in doc["rows"]:
        mine = times.get(row["shape"])
        if mine is not None:
            row["baselines"].update(mine["baselines"])
            row["loom_us_with_torch"] = mine["loom_us_with_torch"]
        row["speedup"] = {name: us / (row["loom_us_with_torch"] if name in TORCH_BASELINES else row["loom_us"])
                          for name, us in row["baselines"].items()}
    if command not in doc["command"]:
        doc["command"] += "; " + command
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print(f"merged {', '.join(sorted({b for t in times.values() for b in t['baselines']}))} and loom_us_with_torch "
          f"into {len(times)} rows of {path}")


TORCH_BASELINES = ("torch_grouped_mm", "torch_scaled_grouped_mm", "torch_scaled_grouped_mm_promoted")


def time_us(fns, iters: int) -> list:
    """Median µs of each of `fns`, timed interleaved: every iteration runs each once, after an L2 flush."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(5):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(iters):
        for fn, t in zip(fns, times):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            t.append(start.elapsed_time(end) * 1e3)
    return [statistics.median(t) for t in times]


def check_same(theirs, ours, rows: int, sizes: list, name: str) -> None:
    """torch's and Loom's outputs agree (both are fp32 sums of the same products rounded to bf16): relative
    Frobenius difference under 1e-2, so that the timings compare the same work."""
    diff = (theirs.float() - ours.float()).norm() / max(theirs.float().norm().item(), 1e-30)
    if not diff < 1e-2:
        sys.exit(f"{name}: loom.grouped_gemm differs from torch's by {diff:.3g} (relative) on {rows} rows, "
                 f"groups {sizes[:4]}...")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--merge-into", default="", metavar="FILE",
                   help="bench-moe grouped's report: add torch_grouped_mm to its rows by shape, recompute speedup")
    p.add_argument("--fp8", action="store_true",
                   help="torch._scaled_grouped_mm (fp8 e4m3, row-wise scales) on bench-moe grouped-fp8's shapes")
    args = p.parse_args()
    baseline = "torch_scaled_grouped_mm" if args.fp8 else "torch_grouped_mm"
    shapes = {shape_of(name, n, k, e, topk, tokens, rname, args.fp8)
              for name, n, k, e, topk in MODELS for tokens in (8192, 128) for rname in ("uniform", "skewed")}
    report = load_report(args.merge_into, shapes) if args.merge_into else None
    if report is not None and report.get("gpu") != torch.cuda.get_device_name():
        sys.exit(f"--merge-into {args.merge_into}: expected a report from this GPU ({torch.cuda.get_device_name()}), "
                 f"given one from {report.get('gpu')!r}")
    rows_out = []
    for name, n, k, e, topk in MODELS:
        for tokens in (8192, 128):
            for skewed in (False, True):
                rows = tokens * topk
                sizes = routing(rows, e, skewed)
                offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
                offs0 = torch.cat([torch.zeros(1, device="cuda", dtype=torch.int32), offs])  # Loom's: G + 1 offsets
                out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
                if args.fp8:
                    a = (torch.rand(rows, k, device="cuda") * 2 - 1).to(torch.float8_e4m3fn)
                    w = (torch.rand(e, n, k, device="cuda") * 2 - 1).to(torch.float8_e4m3fn)
                    sa = torch.ones(rows, device="cuda", dtype=torch.float32)
                    sb = torch.ones(e, n, device="cuda", dtype=torch.float32)
                    fn = lambda: torch._scaled_grouped_mm(a, w.transpose(-2, -1), sa, sb, offs=offs,  # noqa
                                                          out_dtype=torch.bfloat16, use_fast_accum=True)
                    promoted = lambda: torch._scaled_grouped_mm(a, w.transpose(-2, -1), sa, sb,  # noqa
                                                                offs=offs, out_dtype=torch.bfloat16)
                    one, ones_e = torch.ones(1, device="cuda"), torch.ones(e, device="cuda")
                    mine = lambda: loom.grouped_gemm(a, w, offs0, out=out, scale_a=one, scale_b=ones_e)  # noqa
                else:
                    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                    w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
                    fn = lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)  # noqa
                    mine = lambda: loom.grouped_gemm(a, w, offs0, out=out)  # noqa
                fns = [fn, mine] + ([promoted] if args.fp8 else [])
                timed = time_us(fns, args.iters)
                us, loom_us = timed[0], timed[1]
                baselines = {baseline: us}
                if args.fp8:
                    baselines[baseline + "_promoted"] = timed[2]
                check_same(fn(), mine(), rows, sizes, name)
                flops = 2.0 * rows * n * k
                print(f"{name:14s} {tokens:6d} {'skewed' if skewed else 'uniform':8s} {us:9.1f} us "
                      f"{flops / us / 1e6:7.1f} TFLOP/s  loom {loom_us:9.1f} us ({us / loom_us:.3f}x)")
                rname = "skewed" if skewed else "uniform"
                rows_out.append({"shape": shape_of(name, n, k, e, topk, tokens, rname, args.fp8), "model": name, "n": n,
                                 "k": k, "experts": e, "topk": topk, "tokens": tokens, "rows": rows, "routing": rname,
                                 "dtype": "f8e4m3 row-wise" if args.fp8 else "bf16", "baselines": baselines,
                                 "loom_us_with_torch": loom_us})
                del a, w, out
    doc = {"op": "grouped_gemm_torch", "command": "python bench/moe_torch_grouped.py" + (" --fp8" if args.fp8 else ""),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip(),
           "rows": rows_out}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    if report is not None:
        merge_into(args.merge_into, report, rows_out,
                   f"python bench/moe_torch_grouped.py {'--fp8 ' if args.fp8 else ''}"
                   f"{f'--iters {args.iters} ' if args.iters != 30 else ''}--merge-into {args.merge_into}")


if __name__ == "__main__":
    main()
