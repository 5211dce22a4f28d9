#!/usr/bin/env python3
"""02: Loom's ops from Python against torch.distributed (NCCL) and PyTorch's async TP
(torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter).

    torchrun --nproc-per-node 2 python/examples/02_bench.py    (a GPU per rank: every baseline)
    loomrun -n 2 python python/examples/02_bench.py            (ranks sharing a GPU: Loom only; NCCL and symmetric
                                                                 memory need a GPU per rank)

Timing: per run, align the ranks on the device (loom.barrier_on_stream), then CUDA events around the op; the median
per rank, the slowest rank's reported (rank 0 prints). Sizes: --coll-bytes for the collectives, --m/--n/--k for the
overlapped GEMMs (AG+GEMM: A [M / W, K], B [N / W, K]; GEMM+RS: A [M, K / W], B [N, K / W]).
"""
import argparse
import os
import statistics

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")  # NVLink multicast stays off
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import loom  # noqa: E402


def timed(world, fn, iters, warmup=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        loom.barrier_on_stream(world)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return max(world.all_gather_object(statistics.median(times), "bench"))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--coll-bytes", default="1M,16M,256M")
    p.add_argument("--m", type=int, default=8192)
    p.add_argument("--n", type=int, default=11008)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    world = loom.init()
    W, me = world.world_size, world.rank
    gpu_per_rank = torch.cuda.device_count() >= world.local_world_size
    group = world.init_torch_distributed("nccl") if gpu_per_rank else None
    if group is not None:
        from torch.distributed import _symmetric_memory as symm

        if hasattr(symm, "enable_symm_mem_for_group"):
            symm.enable_symm_mem_for_group(group.group_name)
    elif me == 0:
        print("ranks share a GPU: NCCL and PyTorch's symmetric memory baselines skipped")
    rows = []

    def row(what, size, **times):
        rows.append((what, size, times))
        if me == 0:
            cells = "  ".join(f"{k} {v:9.1f} us" for k, v in times.items())
            ratio = [f"{k}/loom {v / times['loom']:.2f}x" for k, v in times.items() if k != "loom"]
            print(f"{what:>15} {size:>12}  {cells}  {'  '.join(ratio)}", flush=True)

    for text in a.coll_bytes.split(","):
        nbytes = int(text[:-1]) << {"K": 10, "M": 20, "G": 30}[text[-1]] if text[-1] in "KMG" else int(text)
        n = nbytes // 2 // W * W
        x = world.empty((n,), torch.bfloat16)
        x.normal_()
        out = world.empty((n * W,), torch.bfloat16)
        small = torch.empty(n // W, dtype=torch.bfloat16, device="cuda")
        cases = {
            "all_gather": (lambda: loom.all_gather(x, out=out),
                           lambda: dist.all_gather_into_tensor(out, x)),
            "reduce_scatter": (lambda: loom.reduce_scatter(x, out=small),
                               lambda: dist.reduce_scatter_tensor(small, x)),
            "all_reduce": (lambda: loom.all_reduce(x, out=out[:n]),
                           lambda: dist.all_reduce(x)),
            "all_to_all": (lambda: loom.all_to_all(x, out=out[:n]),
                           lambda: dist.all_to_all_single(out[:n], x)),
        }
        for name, (lf, tf) in cases.items():
            t = {"loom": timed(world, lf, a.iters)}
            if group is not None:
                t["nccl"] = timed(world, tf, a.iters)
            row(name, f"{n * 2 >> 10} KiB", **t)
        del x, out

    M, N, K = a.m, a.n, a.k
    A = torch.randn(M // W, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(N // W, K, device="cuda", dtype=torch.bfloat16)
    G = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)
    t = {"loom": timed(world, lambda: loom.ag_gemm(A, B), a.iters)}
    if group is not None:
        def seq():
            dist.all_gather_into_tensor(G, A)
            return G @ B.T
        t["nccl+mm"] = timed(world, seq, a.iters)
        t["async_tp"] = timed(world, lambda: torch.ops.symm_mem.fused_all_gather_matmul(
            A, [B.T], 0, group.group_name), a.iters)
    row("ag_gemm", f"{M}x{N}x{K}", **t)

    A = torch.randn(M, K // W, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(N, K // W, device="cuda", dtype=torch.bfloat16)
    P = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    C = torch.empty(M // W, N, device="cuda", dtype=torch.bfloat16)
    t = {"loom": timed(world, lambda: loom.gemm_rs(A, B), a.iters)}
    if group is not None:
        def seq_rs():
            torch.mm(A, B.T, out=P)
            dist.reduce_scatter_tensor(C, P)
        t["nccl+mm"] = timed(world, seq_rs, a.iters)
        t["async_tp"] = timed(world, lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(
            A, B.T, "sum", 0, group.group_name), a.iters)
    row("gemm_rs", f"{M}x{N}x{K}", **t)

    if group is not None:
        dist.destroy_process_group()
    world.shutdown()


if __name__ == "__main__":
    main()
