// The demo's kernel: every rank writes a rank-specific pattern into its own slot of every peer's copy of a
// symmetric buffer. Compiled at run time by Loom's JIT; the host includes it for pattern() only.
#pragma once

#include "loom/lang/context.cuh"
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include "loom/lang/rank.cuh"
#endif

namespace hello {

// What rank `src` writes at element i of its slot in rank `dst`'s buffer (never 0: a zeroed slot fails).
LOOM_HOST_DEVICE inline loom::uint64_t pattern(int src, int dst, loom::uint64_t i) {
    return (static_cast<loom::uint64_t>(src + 1) << 48) | (static_cast<loom::uint64_t>(dst + 1) << 40) | (i + 1);
}

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// buf: symmetric, local_world slots of n elements. Slot [local_rank] of peer p's copy <- pattern(rank, p, i).
__global__ void write_to_peers(loom::Ctx ctx, loom::uint64_t* buf, loom::uint64_t n) {
    const loom::uint64_t stride = static_cast<loom::uint64_t>(gridDim.x) * blockDim.x;
    for (int p = 0; p < ctx.local_world; ++p) {
        const int peer = ctx.local_base_rank + p;
        loom::uint64_t* slot = loom::lang::symm_at(ctx, buf, peer) + static_cast<loom::uint64_t>(ctx.local_rank) * n;
        for (loom::uint64_t i = blockIdx.x * static_cast<loom::uint64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
            slot[i] = pattern(ctx.rank, peer, i);
    }
}
#endif

}  // namespace hello
