// Kernels of tests/dist/test_symmetric_heap.cpp, compiled by Loom's JIT. Plain CUDA on the Ctx fields (no
// loom/lang), so a failure here points at the heap and its mappings, not at the device language.
#pragma once

#include "loom/lang/context.cuh"

namespace loom_test {

// The word that rank `src` writes at index i of its slot in rank `dst`'s buffer. Distinct for every (src, dst,
// i) in the tests' range and never 0 or 0xffffffff for small i (a zeroed or poisoned word never passes).
LOOM_HOST_DEVICE inline loom::uint32_t symm_pattern(int src, int dst, loom::uint64_t i) {
    loom::uint32_t v = static_cast<loom::uint32_t>(src + 1) << 28 ^ static_cast<loom::uint32_t>(dst + 1) << 24 ^
                       static_cast<loom::uint32_t>(i & 0xffffff);
    return v == 0xffffffffu ? 0x12345678u : v;
}

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// `buf` is a symmetric buffer of local_world * n words. This rank writes slot [local_rank] of every local peer's
// copy (its own included) with symm_pattern(rank, peer, i). Grid-stride; any grid.
__global__ void write_pattern_to_peers(loom::Ctx ctx, loom::uint32_t* buf, loom::uint64_t n) {
    const loom::uint64_t offset = reinterpret_cast<char*>(buf) - ctx.heap[ctx.local_rank];
    const loom::uint64_t stride = static_cast<loom::uint64_t>(gridDim.x) * blockDim.x;
    for (int p = 0; p < ctx.local_world; ++p) {
        loom::uint32_t* dst =
            reinterpret_cast<loom::uint32_t*>(ctx.heap[p] + offset) + static_cast<loom::uint64_t>(ctx.local_rank) * n;
        const int peer = ctx.local_base_rank + p;
        for (loom::uint64_t i = blockIdx.x * static_cast<loom::uint64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
            dst[i] = symm_pattern(ctx.rank, peer, i);
    }
}
#endif

}  // namespace loom_test
