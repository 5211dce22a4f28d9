#!/usr/bin/env python3
"""Host time per op call from Python against the same call from C++ (µs): how much the Python layer adds.

    loomrun -n 2 python bench/py_call_overhead.py [--iters 200] [--out docs/perf]

For each op (all_reduce of 1024 floats, gemm 128x128x128 bf16, gemm_ar 16x1024x256 bf16) and each way of calling it,
the host time of `iters` back-to-back calls on the same tensors (no synchronisation inside the loop; few enough
calls that the launch queue never fills), median of 9 repetitions:
    cpp       the C++ op in a C++ loop (loom._C.cpp_call_us: the same views, no Python)
    _C        the extension's binding, called from Python (DLPack conversion, GIL release)
    loom      the public function (loom.all_reduce(..., out=...)): argument parsing, the current stream
    torch.ops the registered custom op (torch.ops.loom.<op>_into): the dispatcher as torch.compile's graphs call it
Writes py_call_overhead.json under --out (rank 0), in docs/perf's schema (scripts/perf_summary.py).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import time

import torch

import loom
from loom import _C
from loom._enums import parse


SHAPES = {"all_reduce": "1024 f32", "gemm": "128x128x128 bf16", "gemm_ar": "16x1024x256 bf16"}


def host_us(fn, iters, reps=9):
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / iters)
        torch.cuda.synchronize()
    return statistics.median(samples)


def cpp_us(world, op, a, b, c, iters, reps=9):
    s = torch.cuda.current_stream().cuda_stream
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        samples.append(_C.cpp_call_us(world._h, op, a, b, c, s, iters))
        torch.cuda.synchronize()
    return statistics.median(samples)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--out", default="")
    a = p.parse_args()
    world = loom.init()
    h, n = world._h, a.iters
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    algo_auto, path_auto, op_sum = _C.CollAlgo.Auto, _C.DataPath.Auto, _C.ReduceOp.Sum

    x = world.empty((1024,), torch.float32)
    x.normal_()
    y = torch.empty_like(x)
    ga, gb = (torch.randn(128, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    gc = torch.empty(128, 128, device="cuda", dtype=torch.bfloat16)
    ra = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    rb = torch.randn(1024, 256, device="cuda", dtype=torch.bfloat16)
    rc = torch.empty(16, 1024, device="cuda", dtype=torch.bfloat16)
    ar_algo = parse(_C.ArAlgo, "auto", "algo")
    cases = {
        "all_reduce": ((x, x, y), {
            "_C": lambda: _C.all_reduce(h, x, y, stream(), algo_auto, path_auto, op_sum, 0),
            "loom": lambda: loom.all_reduce(x, out=y, world=world),
            "torch.ops": lambda: torch.ops.loom.all_reduce_into(x, y, world.id, "auto", "auto", "sum", 0),
        }),
        "gemm": ((ga, gb, gc), {
            "_C": lambda: _C.gemm(ga, gb, gc, stream()),
            "loom": lambda: loom.gemm(ga, gb, out=gc),
            "torch.ops": lambda: torch.ops.loom.gemm_into(ga, gb, gc, None, None, None, 1.0, 0.0, False),
        }),
        "gemm_ar": ((ra, rb, rc), {
            "_C": lambda: _C.gemm_ar(h, ra, rb, rc, stream(), ar_algo),
            "loom": lambda: loom.gemm_ar(ra, rb, out=rc, world=world),
            "torch.ops": lambda: torch.ops.loom.gemm_ar_into(ra, rb, rc, world.id, "auto", 1.0, None, None, 0, 0),
        }),
    }
    rows = []
    for op, ((ta, tb, tc), ways) in cases.items():
        for fn in ways.values():  # warm-up: state, JIT compiles, config choice
            fn()
        torch.cuda.synchronize()
        world.barrier(op)
        us = {"cpp": cpp_us(world, op, ta, tb, tc, n)}
        for way, fn in ways.items():
            world.barrier(f"{op}/{way}")
            us[way] = host_us(fn, n)
        us = {k: max(world.all_gather_object(v, f"{op}/{k}/max")) for k, v in us.items()}
        base = {k: round(v, 3) for k, v in us.items() if k != "loom"}
        rows.append({"shape": SHAPES[op], "op": op, "loom_us": round(us["loom"], 3), "baselines": base,
                     "speedup": {k: round(v / us["loom"], 3) for k, v in base.items()}})
        if world.rank == 0:
            print(f"{op:>10}: " + "  ".join(f"{k} {v:6.2f} us" for k, v in us.items())
                  + f"  (python adds {us['loom'] - us['cpp']:.2f} us)", flush=True)
    if a.out and world.rank == 0:
        commit = os.environ.get("LOOM_GIT_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
        doc = {"op": "py_call_overhead", "command": f"loomrun -n {world.world_size} python bench/py_call_overhead.py",
               "gpu": torch.cuda.get_device_name(), "commit": commit, "date": datetime.date.today().isoformat(),
               "ranks": [world.world_size],
               "note": f"host us per call (loom_us: the public Python function); baselines: the same call from C++ "
                       f"(cpp), through the extension (_C), through torch.ops; torch {torch.__version__}",
               "rows": rows}
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "py_call_overhead.json"), "w") as f:
            json.dump(doc, f, indent=1)
    world.shutdown()


if __name__ == "__main__":
    main()
