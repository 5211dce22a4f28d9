// Plain-data parameters of the grouped GEMM kernels (grouped_gemm.cuh, grouped_gemm_sm80.cuh), shared with their host
// launcher (src/ops/moe/grouped_gemm_launch.cpp). Compiles under the host compiler, nvcc and NVRTC.
#pragma once

#include "loom/config.hpp"

namespace loom::kernels::moe {

// The epilogue's activation (a template argument: it changes the code), as loom::MoeActivation.
enum class GroupedAct : int {
    None = 0,
    SwiGLU = 1,  // C[:, j] = silu(X[:, j]) * X[:, n / 2 + j] of the product X (gate columns, then up columns)
    GeLU = 2,    // C = X * Phi(X) (erf form, torch's default)
};

// Runtime arguments of the grouped kernels. Group g owns rows [offsets[g], offsets[g + 1]) of A and C (clamped to
// [0, rows]) and multiplies with expert g % num_experts.
struct GroupedGemmArgs {
    void* c;  // [rows, n_out] row-major, ldc elements
    int64_t ldc;
    const int32_t* offsets;  // device int32[num_groups + 1]
    const void* a;           // sm_80 kernel only (the Hopper kernel loads through its tensor maps)
    const void* b;
    int64_t lda, ldb;  // sm_80 kernel only
    int32_t num_groups;
    int32_t num_experts;
    int32_t rows;   // A's and C's rows
    int32_t n;      // columns of each expert's product
    int32_t n_out;  // columns of C: n, or n / 2 with SwiGLU
    int32_t k;
    int32_t group_m;  // raster group of the tile order (row blocks swept together)
    float alpha;
    const float* scale_a;  // 1 float or null
    const float* scale_b;  // num_experts floats or null
    // Per-128-block scales (fp8, the kernels' kBlockScale variant only): A [rows, k_blocks], B [num_experts, ceil(n /
    // 128), k_blocks] fp32 row-major, k_blocks = ceil(k / 128). Null otherwise.
    const float* scale_a_blocks;
    const float* scale_b_blocks;
};

// Elements of one scale block along K and N (DeepSeek-V3's 1 x 128 activation and 128 x 128 weight blocks).
inline constexpr int kGroupedScaleBlock = 128;

// Shared memory of the grouped kernels' row-block prefix: int32[num_groups + 1] (tile/grouped order, below), 16-byte
// rounded.
LOOM_HOST_DEVICE constexpr uint32_t grouped_prefix_bytes(int num_groups) {
    return (static_cast<uint32_t>(num_groups + 1) * 4u + 15u) / 16u * 16u;
}

// The staged epilogue's buffer of one consumer warp: its 16 rows x 128 bytes of one output slab, 128B-swizzled.
inline constexpr uint32_t kGroupedWarpStageBytes = 16u * 128u;

// Dynamic shared memory of grouped_gemm_sm90: STAGES x (A + B tiles) (128 B per row), with the staged epilogue
// (kStagedStore) one kGroupedWarpStageBytes buffer per consumer warp (8 KiB per 64 rows of the tile), the barriers,
// the prefix, 1 KiB alignment slack.
LOOM_HOST_DEVICE constexpr uint32_t grouped_gemm_sm90_smem_bytes(int block_m, int block_n, int stages, int num_groups,
                                                                 bool staged_store = false) {
    return static_cast<uint32_t>(stages) * static_cast<uint32_t>(block_m + block_n) * 128u +
           (staged_store ? static_cast<uint32_t>(block_m / 16) * kGroupedWarpStageBytes : 0u) +
           static_cast<uint32_t>(stages) * 16u + grouped_prefix_bytes(num_groups) + 1024u;
}

// Static shared memory of either grouped kernel besides its dynamic bytes: the row-block prefix scan's scratch (32
// ints). The two together stay within the device's opt-in limit (kGemmSm90MaxSmem on Hopper).
inline constexpr uint32_t kGroupedStaticSmemBytes = 32u * 4u;

// The most groups one launch takes: the prefix lives in shared memory (16 KiB at this bound).
inline constexpr int kGroupedMaxGroups = 4095;

}  // namespace loom::kernels::moe
