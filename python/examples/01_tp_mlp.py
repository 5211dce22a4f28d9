#!/usr/bin/env python3
"""01: a tensor-parallel MLP layer, ag_gemm -> activation -> gemm_rs, against the same layer in plain torch +
torch.distributed.

    loomrun -n 2 python python/examples/01_tp_mlp.py          (ranks may share one GPU)
    torchrun --nproc-per-node 2 python/examples/01_tp_mlp.py   (a GPU per rank, or MPS started first)

Rank r holds rows r of the tokens x [T / W, H], columns r of W1 ([F / W, H]) and of W2 ([H, F / W]):
    h = gelu(all_gather(x) @ W1_r.T)     [T, F / W]       loom.ag_gemm: the GEMM consumes rows as they arrive
    y = reduce_scatter(h @ W2_r.T)       [T / W, H]       loom.gemm_rs: tiles reduced as the GEMM stores them
The reference runs the unfused sequence with torch.distributed (NCCL with a GPU per rank, else gloo on the CPU).
"""
import argparse

import torch
import torch.distributed as dist

import loom


def shards(world, tokens, hidden, ffn, dtype):
    """The same full tensors on every rank (one seed), and this rank's shards of them."""
    W, r = world.world_size, world.rank
    g = torch.Generator(device="cuda").manual_seed(1234)
    x = torch.randn(tokens, hidden, generator=g, device="cuda").to(dtype)
    w1 = (torch.randn(ffn, hidden, generator=g, device="cuda") / hidden**0.5).to(dtype)
    w2 = (torch.randn(hidden, ffn, generator=g, device="cuda") / ffn**0.5).to(dtype)
    t, f = tokens // W, ffn // W
    return x[r * t:(r + 1) * t].contiguous(), w1[r * f:(r + 1) * f].contiguous(), w2[:, r * f:(r + 1) * f].contiguous()


def loom_layer(world, x, w1, w2):
    h = torch.nn.functional.gelu(loom.ag_gemm(x, w1, world=world))
    return loom.gemm_rs(h, w2, world=world)


def torch_layer(group, x, w1, w2, on_gpu):
    dev = x.device if on_gpu else torch.device("cpu")
    dt = x.dtype if on_gpu else torch.float32
    x, w1, w2 = (t.to(dev, dt) for t in (x, w1, w2))
    W, r = dist.get_world_size(group), dist.get_rank(group)
    if on_gpu:
        gathered = torch.empty(W * x.shape[0], x.shape[1], device=dev, dtype=dt)
        dist.all_gather_into_tensor(gathered, x, group=group)
    else:  # gloo: the list forms
        parts = [torch.empty_like(x) for _ in range(W)]
        dist.all_gather(parts, x, group=group)
        gathered = torch.cat(parts)
    p = torch.nn.functional.gelu(gathered @ w1.T) @ w2.T
    rows = p.shape[0] // W
    if on_gpu:
        y = torch.empty(rows, p.shape[1], device=dev, dtype=dt)
        dist.reduce_scatter_tensor(y, p, group=group)
        return y
    dist.all_reduce(p, group=group)
    return p[r * rows:(r + 1) * rows]


def run(world, tokens=4096, hidden=4096, ffn=16384, dtype=torch.bfloat16, iters=0):
    """Relative error of Loom's layer against torch.distributed's on this rank; with iters, prints both times."""
    gpu_per_rank = torch.cuda.device_count() >= world.local_world_size
    group = world.init_torch_distributed("nccl" if gpu_per_rank else "gloo")
    x, w1, w2 = shards(world, tokens, hidden, ffn, dtype)
    y = loom_layer(world, x, w1, w2)
    ref = torch_layer(group, x, w1, w2, gpu_per_rank).to(y.device, torch.float64)
    err = ((y.double() - ref).norm() / ref.norm()).item()
    if iters:
        for name, fn in [("loom", lambda: loom_layer(world, x, w1, w2))] + (
                [("torch+nccl", lambda: torch_layer(group, x, w1, w2, True))] if gpu_per_rank else []):
            fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            if world.rank == 0:
                print(f"{name:>10}: {start.elapsed_time(end) * 1e3 / iters:9.1f} us per layer")
    return err


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=16384)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    world = loom.init()
    err = run(world, a.tokens, a.hidden, a.ffn, iters=a.iters)
    ok = err < 2e-2
    print(f"rank {world.rank}: {'OK' if ok else 'FAILED'}: relative error {err:.2e} against torch.distributed")
    dist.destroy_process_group()
    world.shutdown()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
