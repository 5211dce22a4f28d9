// A user's own kernel, compiled at run time by Loom's JIT: it lives beside the example, not in Loom's tree,
// and uses Loom's headers (the Ctx device handle) from the copy embedded in libloom.
#pragma once

#include "loom/lang/context.cuh"

namespace user {

// y[i] = a * x[i] + (rank + 1), vectorised by kVec elements per thread.
template <int kVec>
__global__ void scale_by_rank(loom::Ctx ctx, float a, const float* __restrict__ x, float* __restrict__ y, int n) {
    const int base = (blockIdx.x * blockDim.x + threadIdx.x) * kVec;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
        const int i = base + v;
        if (i < n) y[i] = a * x[i] + static_cast<float>(ctx.rank + 1);
    }
}

}  // namespace user
