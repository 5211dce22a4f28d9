// A CTA-wide exclusive prefix sum over a count function: each thread sums a contiguous run of items, the warps scan
// their threads' sums with shuffles, and warp 0 scans the warp totals.
#pragma once

#include "loom/config.hpp"

namespace loom::tile {

// Every thread of the CTA calls it alike; threads = blockDim.x, a multiple of 32 and at most 1024 (a constant at
// the call lets the compiler fold it). out[i] = items(0) + ... + items(i - 1) for i in [0, n]; items(i) is evaluated
// twice, by the one thread owning i. scratch: 32 int32 of shared memory. Ends with a __syncthreads, out visible to
// the CTA.
template <class F>
LOOM_DEVICE LOOM_FORCEINLINE void block_exclusive_prefix(int n, const F& items, int32_t* out, int32_t* scratch,
                                                         int threads) {
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    const int per = (n + threads - 1) / threads;
    const int i0 = tid * per < n ? tid * per : n, i1 = i0 + per < n ? i0 + per : n;
    int32_t mine = 0;
    for (int i = i0; i < i1; ++i) mine += items(i);
    int32_t incl = mine;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
        const int32_t v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += v;
    }
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int32_t w = lane < threads / 32 ? scratch[lane] : 0;
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
            const int32_t v = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d) w += v;
        }
        if (lane < threads / 32) scratch[lane] = w;  // inclusive over the warps
    }
    __syncthreads();
    int32_t run = (warp > 0 ? scratch[warp - 1] : 0) + incl - mine;
    for (int i = i0; i < i1; ++i) {
        out[i] = run;
        run += items(i);
    }
    if (tid == threads - 1) out[n] = scratch[threads / 32 - 1];
    __syncthreads();
}

}  // namespace loom::tile
