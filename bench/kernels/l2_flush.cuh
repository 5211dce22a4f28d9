// The harness's clean L2 flush (harness.hpp: TimeOptions::flush_l2_clean): a grid-stride read of a buffer larger
// than L2, which evicts the dirty lines a memset flush leaves (their write-back then happens here, before the timed
// region) and leaves L2 holding clean lines of this buffer.
#pragma once

#include "loom/config.hpp"

namespace loom_bench {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// Reads n16 16-byte vectors of src. The XOR of what a thread read goes to *sink only when it equals `never` (the
// loads must not be dead code); sink is a word of scratch, so such a store, however unlikely, is harmless.
__global__ void read_vec16(const uint4* __restrict__ src, loom::uint64_t n16, loom::uint32_t never,
                           loom::uint32_t* sink) {
    const loom::uint64_t stride = static_cast<loom::uint64_t>(gridDim.x) * blockDim.x;
    loom::uint32_t x = 0;
    for (loom::uint64_t i = blockIdx.x * static_cast<loom::uint64_t>(blockDim.x) + threadIdx.x; i < n16; i += stride) {
        const uint4 v = src[i];
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == never) *sink = x;
}
#endif

}  // namespace loom_bench
