// Example 02: intra-node all-gather by push with put_signal (ld/st data path).
//
// out is symmetric, world * chunk bytes. Block p pushes this rank's chunk into slot `rank` of peer p's `out`
// and then sets peer p's ready[rank] to `epoch` (release: the data is visible to whoever sees the signal).
// Block 0 then waits for ready[q] >= epoch for every q: after that, every slot of `out` holds its rank's chunk.
// ready[] counters are monotonic across calls (epoch = call number), never reset.
#pragma once

#include "loom/lang/lang.cuh"

namespace example {
using namespace loom::lang;
using loom::uint32_t;
using loom::uint64_t;

// grid = world blocks; any block size.
__global__ void all_gather_push(loom::Ctx ctx, char* out, const char* in, uint64_t chunk, uint64_t* ready,
                                uint64_t epoch) {
    const int me = rank(ctx);
    const int peer = static_cast<int>(blockIdx.x);
    put_signal(block, ctx, out + me * chunk, in, chunk, &ready[me], epoch, SignalOp::Set, peer);
    if (blockIdx.x == 0) {
        for (int q = 0; q < num_ranks(ctx); ++q) wait(block, ctx, &ready[q], Cmp::GE, epoch);
    }
}

}  // namespace example
