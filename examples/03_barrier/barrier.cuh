// Example 03: barrier_all rounds, checking that no rank passes a barrier early.
//
// Before barrier r every rank writes r into its slot on every peer (relaxed stores); barrier_all is a release
// on the way in and an acquire on the way out, so after barrier r every slot this rank holds must be >= r.
// A rank that passed early would see a slot still at r-1.
#pragma once

#include "loom/lang/lang.cuh"

namespace example {
using namespace loom::lang;
using loom::uint32_t;
using loom::uint64_t;

// One block; *early counts slots seen behind; *elapsed_ns the time of all rounds.
__global__ void barrier_rounds(loom::Ctx ctx, BarrierState* st, uint64_t* slots, uint32_t rounds, uint32_t* early,
                               uint64_t* elapsed_ns) {
    const uint32_t peers = static_cast<uint32_t>(local_world(ctx));
    const uint64_t start = loom::ptx::globaltimer();
    uint32_t behind = 0;
    for (uint64_t r = 1; r <= rounds; ++r) {
        if (threadIdx.x < peers)
            loom::ptx::st_relaxed_sys(&symm_at(ctx, slots, ctx.local_base_rank + int(threadIdx.x))[local_rank(ctx)], r);
        barrier_all(block, ctx, st);
        if (threadIdx.x < peers) behind += loom::ptx::ld_relaxed_sys(&slots[threadIdx.x]) < r;
    }
    if (behind) atomicAdd(early, behind);
    if (threadIdx.x == 0) *elapsed_ns = loom::ptx::globaltimer() - start;
}

}  // namespace example
