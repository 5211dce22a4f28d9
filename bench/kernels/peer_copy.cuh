// bench-runtime's kernel: a plain vectorised copy from local memory into a peer's symmetric memory (16-byte
// loads and stores, grid-stride over all SMs). Measures what load/store through the heap mapping sustains.
#pragma once

#include "loom/config.hpp"

namespace loom_bench {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// dst may be any mapped address (a peer's heap); n16: number of 16-byte vectors. Both pointers 16-byte aligned.
__global__ void copy_vec16(uint4* __restrict__ dst, const uint4* __restrict__ src, loom::uint64_t n16) {
    const loom::uint64_t stride = static_cast<loom::uint64_t>(gridDim.x) * blockDim.x;
    loom::uint64_t i = blockIdx.x * static_cast<loom::uint64_t>(blockDim.x) + threadIdx.x;
    // Four independent vectors in flight per thread.
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        dst[i] = a;
        dst[i + stride] = b;
        dst[i + 2 * stride] = c;
        dst[i + 3 * stride] = d;
    }
    for (; i < n16; i += stride) dst[i] = src[i];
}
#endif

}  // namespace loom_bench
