#!/usr/bin/env python3
"""00: symmetric tensors and a notify / wait kernel written from Python.

    loomrun -n 2 python python/examples/00_symmetric_tensors.py

Every rank allocates the same tensors in its symmetric heap (world.empty), reads its right-hand neighbour's copy
directly (world.peer), then runs a kernel compiled from the source below by Loom's JIT: block 0 pushes this rank's
values into the next rank's inbox and raises that rank's signal (release), then waits for its own signal (acquire).
"""
import torch

import loom

KERNEL = r"""
#include "loom/lang/lang.cuh"

namespace demo {
using namespace loom::lang;

// One block: push `bytes` of `mine` into the next rank's `inbox` and set its `ready` to `epoch` (release: the data is
// visible to whoever sees the signal); then wait until this rank's own `ready` reaches `epoch` (acquire).
__global__ void pass_right(loom::Ctx ctx, char* inbox, const char* mine, loom::uint64_t bytes, loom::uint64_t* ready,
                           loom::uint64_t epoch) {
    const int next = (rank(ctx) + 1) % num_ranks(ctx);
    put_signal(block, ctx, inbox, mine, bytes, ready, epoch, SignalOp::Set, next);
    wait(block, ctx, ready, Cmp::GE, epoch);
}

}  // namespace demo
"""


def main():
    world = loom.init()
    W, me, n = world.world_size, world.rank, 1 << 16
    nxt, prev = (me + 1) % W, (me - 1) % W

    x = world.empty((n,), torch.float32)
    x.copy_(torch.arange(n, device="cuda", dtype=torch.float32) + 1000 * me)
    inbox = world.empty((n,), torch.float32)
    inbox.fill_(float("nan"))
    ready = world.zeros((1,), torch.int64)  # a 64-bit signal, monotonic
    torch.cuda.synchronize()
    world.barrier("filled")  # every rank's tensors are written before anyone reads them

    peek = world.peer(x, nxt)[:3].tolist()  # a load through the peer mapping
    print(f"rank {me}: rank {nxt}'s x starts {peek}")

    kernel = loom.jit.compile(KERNEL, "demo::pass_right")
    print(f"rank {me}: {kernel} {kernel.info['compiler']}, {kernel.info['registers']} registers, "
          f"{'cache hit' if kernel.info['from_cache'] else 'compiled'} in {kernel.info['seconds']:.2f} s")
    kernel.launch(1, 256, world.ctx(), inbox, x, loom.jit.u64(x.numel() * 4), ready, loom.jit.u64(1))
    torch.cuda.synchronize()

    want = torch.arange(n, device="cuda", dtype=torch.float32) + 1000 * prev
    bad = (inbox != want).sum().item()
    print(f"rank {me}: {'OK' if bad == 0 else 'FAILED'}: inbox holds rank {prev}'s values ({bad} of {n} wrong), "
          f"signal {ready.item()}")
    world.barrier("done")
    world.shutdown()
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
