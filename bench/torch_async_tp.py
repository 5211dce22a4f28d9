#!/usr/bin/env python3
"""PyTorch baselines for bench-overlap: async tensor parallelism and PyTorch + NCCL, same shapes and timing.

Run one process per GPU (ranks on distinct GPUs; NCCL and symmetric memory need that):
    torchrun --nproc-per-node 2 bench/torch_async_tp.py --out DIR [--quick] [--iters N] [--m-list 8192,...] [--shape N,K,...]
Writes DIR/torch_tp.json (rank 0): rows {op, M, N, K, world, torch_async_tp_us, torch_nccl_sequential_us,
torch_collective_us, torch_matmul_us}. bench-overlap --torch DIR/torch_tp.json folds the first two into its
rows as baselines, so the committed docs/perf/{ag_gemm,gemm_rs}.json carry them beside Loom's figures.

Timing matches bench/harness.hpp: per run, flush L2 (write 256 MiB), align the ranks on the device (a one-element
NCCL all-reduce), then events around the op; the median per rank, reduced to the slowest rank.
Shapes are the Triton-distributed TP-MLP ones (M = 8192; --m-list for others, --shape to keep some (N, K)) that
bench-overlap uses:
    AG+GEMM: A [M/W, K] per rank, B [N/W, K]; C = all_gather(A) @ B.T          (N, K) below
    GEMM+RS: A [M, K/W], B [N, K/W]; C = reduce_scatter(A @ B.T) [M/W, N]
NVLink multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1 is set here when absent).
"""
import argparse
import json
import os
import statistics

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

AG_SHAPES = [(11008, 4096), (14336, 4096), (28672, 8192), (53248, 16384), (29568, 8192)]
RS_SHAPES = [(4096, 11008), (4096, 14336), (3584, 14336), (4608, 36864), (8192, 28672), (8192, 29568)]
M_DEFAULT = 8192


def timed(fn, iters, warmup, flush, align):
    for _ in range(warmup):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        flush.zero_()
        align()
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    med = statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(start, end))
    t = torch.tensor([med], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's median, as the harness reports
    return t.item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--quick", action="store_true", help="two shapes per op (bench-overlap --quick's)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=10)  # async TP's first calls set up its symmetric workspace
    # bench-overlap's --m; not named --m here: torchrun would take that prefix for one of its own options.
    p.add_argument("--m-list", default=str(M_DEFAULT), help="comma-separated M values (bench-overlap --m)")
    p.add_argument("--shape", default="", help="only these (N, K) of each op: N,K[,N,K...] (bench-overlap --shape)")
    a = p.parse_args()
    ms = [int(x) for x in a.m_list.split(",") if x]
    keep = [int(x) for x in a.shape.split(",") if x]
    if len(keep) % 2:
        p.error(f"--shape: expected N,K pairs, given {len(keep)} numbers")
    keep = set(zip(keep[::2], keep[1::2]))

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, W = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    from torch.distributed import _symmetric_memory as symm

    if hasattr(symm, "enable_symm_mem_for_group"):
        symm.enable_symm_mem_for_group(group.group_name)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    one = torch.zeros(1, device="cuda")

    def align():
        dist.all_reduce(one)

    torch.manual_seed(1 + rank)
    ag, rs = AG_SHAPES, RS_SHAPES
    if a.quick:
        ag, rs = [(11008, 4096), (28672, 8192)], [(4096, 11008), (8192, 28672)]
    if keep:
        ag, rs = [nk for nk in ag if nk in keep], [nk for nk in rs if nk in keep]
    rows = []

    def record(op, M, N, K, fused, seq, coll, matmul, tol):
        """Checks fused against seq on the same inputs, then times the four; one row (printed on rank 0)."""
        ref, got = seq().clone(), fused()
        err = ((got.float() - ref.float()).abs().max() / (ref.float().abs().max() + 1)).item()
        assert err < tol, f"{op}: PyTorch's fused op disagrees with its sequential one: {err}"
        t = {name: timed(fn, a.iters, a.warmup, flush, align)
             for name, fn in [("torch_async_tp_us", fused), ("torch_nccl_sequential_us", seq),
                              ("torch_collective_us", coll), ("torch_matmul_us", matmul)]}
        rows.append({"op": op, "M": M, "N": N, "K": K, "world": W, **t})
        if rank == 0:
            print(rows[-1], flush=True)

    for M, (N, K) in [(m, nk) for m in ms for nk in ag]:
        A = torch.randn(M // W, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(N // W, K, device="cuda", dtype=torch.bfloat16)
        G = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)

        def seq():
            dist.all_gather_into_tensor(G, A)
            return G @ B.T

        def fused():
            return torch.ops.symm_mem.fused_all_gather_matmul(A, [B.T], 0, group.group_name)[1][0]

        record("ag_gemm", M, N, K, fused, seq, lambda: dist.all_gather_into_tensor(G, A), lambda: G @ B.T, 2e-2)
    for M, (N, K) in [(m, nk) for m in ms for nk in rs]:
        A = torch.randn(M, K // W, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(N, K // W, device="cuda", dtype=torch.bfloat16)
        P = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        C = torch.empty(M // W, N, device="cuda", dtype=torch.bfloat16)

        def seq():
            torch.mm(A, B.T, out=P)
            dist.reduce_scatter_tensor(C, P)
            return C

        def fused():
            return torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B.T, "sum", 0, group.group_name)

        record("gemm_rs", M, N, K, fused, seq, lambda: dist.reduce_scatter_tensor(C, P),
               lambda: torch.mm(A, B.T, out=P), 5e-2)
    if rank == 0:
        doc = {"op": "torch_tp", "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
               "gpu": torch.cuda.get_device_name(), "ranks": W, "rows": rows}
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "torch_tp.json"), "w") as f:
            json.dump(doc, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
