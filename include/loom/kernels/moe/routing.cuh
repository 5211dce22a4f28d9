// MoE routing on the device: top-k expert ids -> (source rank, expert)-sorted rows, and back.
//
//   moe_route_count    block b: the group histogram of entries [b * kRouteChunk, +kRouteChunk) of topk_idx
//                      (entry j = token j / topk, slot j % topk) into chunk_counts[b]; checks every id
//   moe_route_scan     one block: per group, exclusive bases of the chunks (in place), counts, block-aligned
//                      offsets; row_tokens of every padding row -1
//   moe_route_scatter  block b: each entry's row = offsets[g] + base of its chunk + its rank among the chunk's
//                      entries of group g (stable: rows of a group are in entry order), dest_rows and row_tokens
//   moe_permute        rows[r] = x[row_tokens[r]], zero rows for padding
//   moe_topk_reduce    y[t] = sum_s w[t, s] * rows[dest_rows[t, s]] in fp32
//
// No host synchronisation: sizes and offsets stay on the device; the kernels read offsets[num_groups] for the
// row count. An expert id outside [0, num_experts) (or a destination row outside the rows given to the reduce)
// is a bad routing: the thread that reads it posts a BadIndex diagnostic (lang/diag.cuh) and traps.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/config.hpp"
#include "loom/kernels/moe/routing_params.hpp"
#include "loom/lang/diag.cuh"
#include "loom/tile/convert.cuh"
#if !LOOM_NVRTC && !LOOM_NO_DEVICE_PRINTF
#include <cstdio>
#endif

namespace loom::kernels::moe {

// Cold path: an index read from `where` is out of [0, bound).
__noinline__ LOOM_DEVICE inline void bad_index(const char* tag, const void* where, int64_t value, int64_t bound) {
    lang::detail::diag_post(nullptr, DiagKind::BadIndex, -1, tag, where, 0, static_cast<uint64_t>(bound),
                            static_cast<uint64_t>(value), 0);
#if !LOOM_NO_DEVICE_PRINTF
    printf("loom: %s: block %u thread %u: index %lld at %p is out of range [0, %lld)\n", tag, blockIdx.x, threadIdx.x,
           static_cast<long long>(value), where, static_cast<long long>(bound));
#endif
    __trap();
}

LOOM_DEVICE LOOM_FORCEINLINE int32_t route_group(const RouteParams& p, int32_t entry, int32_t expert) {
    return (entry / p.topk / p.tokens_per_rank) * p.num_experts + expert;
}

// blockDim.x == kRouteChunk; dynamic smem: num_groups int32.
__global__ void __launch_bounds__(kRouteChunk) moe_route_count(RouteParams p) {
    extern __shared__ int32_t hist[];
    for (int g = threadIdx.x; g < p.num_groups; g += blockDim.x) hist[g] = 0;
    __syncthreads();
    const int64_t entries = static_cast<int64_t>(p.tokens) * p.topk;
    const int64_t j = static_cast<int64_t>(blockIdx.x) * kRouteChunk + threadIdx.x;
    if (j < entries) {
        const int32_t e = p.topk_idx[j];
        if (e < 0 || e >= p.num_experts) bad_index("moe_route topk_idx", p.topk_idx + j, e, p.num_experts);
        atomicAdd(&hist[route_group(p, static_cast<int32_t>(j), e)], 1);
        if (p.weights != nullptr) p.weights[j] = p.weights_in != nullptr ? p.weights_in[j] : 1.f;
    }
    __syncthreads();
    int32_t* out = p.chunk_counts + static_cast<int64_t>(blockIdx.x) * p.num_groups;
    for (int g = threadIdx.x; g < p.num_groups; g += blockDim.x) out[g] = hist[g];
}

// One block of kScanThreads.
__global__ void __launch_bounds__(kScanThreads) moe_route_scan(RouteParams p) {
    __shared__ int32_t padded[kMaxGroups];
    __shared__ int32_t partial[kScanThreads];
    const int G = p.num_groups;
    // Per group: exclusive scan over the chunks, in place (adjacent threads, adjacent groups: coalesced).
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
        int32_t run = 0;
        for (int c = 0; c < p.chunks; ++c) {
            int32_t* v = p.chunk_counts + static_cast<int64_t>(c) * G + g;
            const int32_t n = *v;
            *v = run;
            run += n;
        }
        p.counts[g] = run;
        padded[g] = (run + p.align - 1) / p.align * p.align;
    }
    __syncthreads();
    // Exclusive scan of the padded sizes: a contiguous segment of groups per thread, then a scan of the segments.
    const int seg = (G + blockDim.x - 1) / blockDim.x;
    const int lo = min(G, static_cast<int>(threadIdx.x) * seg), hi = min(G, lo + seg);
    int32_t sum = 0;
    for (int g = lo; g < hi; ++g) sum += padded[g];
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int d = 1; d < static_cast<int>(blockDim.x); d <<= 1) {
        const int32_t add = threadIdx.x >= static_cast<unsigned>(d) ? partial[threadIdx.x - d] : 0;
        __syncthreads();
        partial[threadIdx.x] += add;
        __syncthreads();
    }
    int32_t base = partial[threadIdx.x] - sum;
    for (int g = lo; g < hi; ++g) {
        p.offsets[g] = base;
        // Padding rows of group g: no token.
        for (int32_t r = base + p.counts[g]; r < base + padded[g]; ++r) p.row_tokens[r] = -1;
        base += padded[g];
    }
    if (threadIdx.x == blockDim.x - 1) {
        p.offsets[G] = partial[threadIdx.x];
    }
    // Rows past the last group: no token.
    const int64_t total = partial[blockDim.x - 1];
    for (int64_t r = total + threadIdx.x; r < p.max_rows; r += blockDim.x) p.row_tokens[r] = -1;
}

// blockDim.x == kRouteChunk.
__global__ void __launch_bounds__(kRouteChunk) moe_route_scatter(RouteParams p) {
    __shared__ int32_t grp[kRouteChunk];
    const int64_t entries = static_cast<int64_t>(p.tokens) * p.topk;
    const int64_t j = static_cast<int64_t>(blockIdx.x) * kRouteChunk + threadIdx.x;
    int32_t g = -1;
    if (j < entries) {
        const int32_t e = p.topk_idx[j];
        if (e < 0 || e >= p.num_experts) bad_index("moe_route topk_idx", p.topk_idx + j, e, p.num_experts);
        g = route_group(p, static_cast<int32_t>(j), e);
    }
    grp[threadIdx.x] = g;
    __syncthreads();
    if (g < 0) return;
    int32_t before = 0;  // this chunk's earlier entries of group g
    for (int i = 0; i < static_cast<int>(threadIdx.x); ++i) before += grp[i] == g;
    const int32_t row = p.offsets[g] + p.chunk_counts[static_cast<int64_t>(blockIdx.x) * p.num_groups + g] + before;
    p.dest_rows[j] = row;
    p.row_tokens[row] = static_cast<int32_t>(j / p.topk);
}

// W: the word type a row is moved in (uint4, unsigned int, unsigned short, unsigned char). Grid-strided over rows,
// a warp per row.
template <class W>
__global__ void __launch_bounds__(256) moe_permute(PermuteParams p) {
    const int64_t rows = p.offsets[p.num_groups];
    const int lane = threadIdx.x % 32;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    const W* x = static_cast<const W*>(p.x);
    W* out = static_cast<W*>(p.rows);
    for (int64_t r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
        const int32_t t = p.row_tokens[r];
        if (t >= p.tokens) bad_index("moe_permute row_tokens", p.row_tokens + r, t, p.tokens);
        W* dst = out + r * p.rows_ld_words;
        if (t < 0) {
            for (int64_t w = lane; w < p.words; w += 32) dst[w] = W{};
        } else {
            const W* src = x + static_cast<int64_t>(t) * p.x_ld_words;
            for (int64_t w = lane; w < p.words; w += 32) dst[w] = src[w];
        }
    }
}

using tile::from_float;
using tile::to_float;

// Tin: the rows' element type, Tout: y's. Grid-strided over tokens, a block per token, threads over columns.
template <class Tin, class Tout>
__global__ void __launch_bounds__(256) moe_topk_reduce(TopkReduceParams p) {
    constexpr int kMaxTopk = 32;
    __shared__ int64_t row[kMaxTopk];
    __shared__ float w[kMaxTopk];
    const Tin* rows = static_cast<const Tin*>(p.rows);
    Tout* y = static_cast<Tout*>(p.y);
    for (int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
        __syncthreads();  // the previous token's row / w are read
        if (threadIdx.x < static_cast<unsigned>(p.topk)) {
            const int64_t j = t * p.topk + threadIdx.x;
            const int32_t r = p.dest_rows[j];
            if (r < 0 || r >= p.rows_bound) bad_index("moe_topk_reduce dest_rows", p.dest_rows + j, r, p.rows_bound);
            row[threadIdx.x] = r;
            w[threadIdx.x] = p.weights != nullptr ? p.weights[j] : 1.f;
        }
        __syncthreads();
        for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
            float acc = 0.f;
            for (int s = 0; s < p.topk; ++s) acc += w[s] * to_float<Tin>(rows[row[s] * p.rows_ld + c]);
            y[t * p.y_ld + c] = from_float<Tout>(acc);
        }
    }
}

}  // namespace loom::kernels::moe
