// Plain-data parameters of the MoE routing kernels (kernels/moe/routing.cuh), shared by the host launcher
// (src/ops/moe/routing.cpp) and the device code.
#pragma once

#include "loom/config.hpp"

namespace loom::kernels::moe {

inline constexpr int kRouteChunk = 256;    // (token, slot) entries per block of the count and scatter kernels
inline constexpr int kMaxGroups = 8192;    // groups one routing may have (W x E); the scan keeps them in smem
inline constexpr int kScanThreads = 1024;  // threads of the single-block scan

// One routing: `tokens` tokens with `topk` expert ids each, grouped (source rank, expert): group of (t, slot) =
// (t / tokens_per_rank) * num_experts + topk_idx[t, slot].
struct RouteParams {
    const int32_t* topk_idx = nullptr;  // [tokens, topk]
    const float* weights_in = nullptr;  // [tokens, topk] or null
    int32_t tokens = 0, topk = 0, num_experts = 0, tokens_per_rank = 0, num_groups = 0, align = 1, chunks = 0;
    int64_t max_rows = 0;             // rows of row_tokens
    int32_t* chunk_counts = nullptr;  // [chunks, num_groups] scratch: counts, then exclusive bases
    int32_t* counts = nullptr;        // [num_groups]
    int32_t* offsets = nullptr;       // [num_groups + 1]
    int32_t* dest_rows = nullptr;     // [tokens * topk]
    int32_t* row_tokens = nullptr;    // [max_rows]
    float* weights = nullptr;         // [tokens * topk] or null
};

// rows[r] = x[row_tokens[r]] (a zero row where row_tokens[r] < 0), for r < offsets[num_groups]; row bytes moved
// as `words` words of the kernel's word type.
struct PermuteParams {
    const void* x = nullptr;
    void* rows = nullptr;
    int64_t x_ld_words = 0, rows_ld_words = 0, words = 0;
    const int32_t* row_tokens = nullptr;
    const int32_t* offsets = nullptr;
    int32_t num_groups = 0;
    int32_t tokens = 0;
};

// y[t, c] = sum over slots s of weights[t, s] * rows[dest_rows[t, s], c] (fp32 sum in slot order), t < tokens.
struct TopkReduceParams {
    const void* rows = nullptr;
    void* y = nullptr;
    int64_t rows_ld = 0, y_ld = 0, cols = 0;
    const int32_t* dest_rows = nullptr;
    const float* weights = nullptr;  // null: every weight 1
    int32_t tokens = 0, topk = 0;
    int64_t rows_bound = 0;  // rows of `rows`: a destination at or past it is a bad routing
};

}  // namespace loom::kernels::moe
