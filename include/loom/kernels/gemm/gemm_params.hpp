// Plain-data parameters of the GEMM kernels, shared by the device templates (gemm.cuh, gemm_sm80.cuh) and
// the host launchers (src/ops/gemm/launch_sm90.cpp, launch_sm80.cpp). Compiles under the host compiler, nvcc and NVRTC.
#pragma once

#include "loom/config.hpp"
#include "loom/tile/tile_order.hpp"
#if defined(__CUDACC__)
#include "loom/tile/epilogue.cuh"
#endif

namespace loom::kernels {

// Runtime arguments shared by the GEMM kernels. Plain data; the host builds them in one place (gemm_whole_tile_args in
// src/ops/gemm/launch_sm90.cpp); the split-tail fields keep their defaults outside a split-tail launch
// (gemm_bind_split_tail).
struct GemmArgs {
    void* d;           // [m, n] row-major output (also the beta input)
    const void* bias;  // [n] or null
    int64_t ldd;       // elements
    int32_t m, n, k;
    float alpha, beta;
    // Rows of A's TMA box when A has fewer rows than BLOCK_M (skinny M: the box is M rounded up to 8 instead of
    // BLOCK_M, so the loads fetch no out-of-bounds rows, which would make a skinny GEMM slower than one of BLOCK_M
    // rows); 0: BLOCK_M. The smem rows past the box hold stale data, which reaches only output rows >= m (never
    // stored). Honoured for loads through the kernel's own tmap_a.
    int32_t a_box_rows = 0;
    // Split-K tail (gemm_sm90_tma_wgmma<..., kSplitTail = true> only; tile_order.hpp: split_tail_unit): tiles
    // [0, dp_tiles) run whole, each later tile as tail_splits K-splits. partials: [tail tile][split] slots of
    // BLOCK_M x BLOCK_N fp32 (gemm_split_tail_slot_floats); tile_counters: one arrival counter per tail tile,
    // zero before the launch and left zero after it. tail_splits 1: no split tail (the rest unused). The counts
    // below are the host's, so that the kernel reads them from the constant bank instead of holding registers.
    float* partials = nullptr;
    uint32_t* tile_counters = nullptr;
    int32_t dp_tiles = 0;
    int32_t tail_splits = 1;   // <= 256
    int32_t work_units = 0;    // dp_tiles + tail tiles x tail_splits
    int32_t num_k_blocks = 0;  // ceil(k / gemm_block_k(input element bytes))
    // Device scales (one float each, read when the kernel runs, so a scale computed on the GPU needs no host
    // synchronisation: fp8's dynamic per-tensor scales, as torch._scaled_mm's scale_a / scale_b); null: 1. The
    // products are scaled by alpha times these: in the affine epilogue (TBias != void), or, with the hooks
    // tile::ScalesAccumulators names (tile/hooks.cuh), on the accumulators right after the mainloop.
    const float* scale_a = nullptr;
    const float* scale_b = nullptr;
    // The Hopper kernel's tile grid (tile::scheduler_grid of m, n and the config) with its grouped order's divisors.
    tile::FastTileGrid grid{};
};
// The kernels take GemmArgs by value. Past 128 bytes the compiler passes it otherwise and the 128 x 256 kernels with
// an affine epilogue spill 400-600 bytes (tests/unit/test_gemm_compile.cpp checks for spills).
static_assert(sizeof(GemmArgs) <= 128, "GemmArgs: keep it within 128 bytes (see above)");

// The weight-streaming kernel for decode-sized M (kernels/gemm/gemv.cuh).
inline constexpr int kGemvRows = 64;  // rows of B per CTA: 4 warps x 16
inline constexpr int kGemvThreads = 128;
inline constexpr int kGemvSliceBytes = 256;  // bytes of each row per ring stage: 16 chunks of 16 B
inline constexpr int kGemvMaxM = 32;         // 4 n8 tiles of A's rows
inline constexpr int kGemvMaxStages = 8;
// Shared memory of one ring stage and of the ring, for m_tiles n8 tiles of A's rows.
LOOM_HOST_DEVICE constexpr int gemv_stage_bytes(int m_tiles) { return (kGemvRows + 8 * m_tiles) * kGemvSliceBytes; }
LOOM_HOST_DEVICE constexpr int gemv_smem_bytes(int m_tiles, int stages) { return stages * gemv_stage_bytes(m_tiles); }
// 256-byte K-slices of a row of k_bytes (the last one partial).
LOOM_HOST_DEVICE constexpr int64_t gemv_slices(int64_t k_bytes) {
    return (k_bytes + kGemvSliceBytes - 1) / kGemvSliceBytes;
}
// fp32 floats of one K-split's partial slot: every thread's m_tiles accumulator quads.
LOOM_HOST_DEVICE constexpr int gemv_slot_floats(int m_tiles) { return kGemvThreads * 4 * m_tiles; }
// The most K-splits summed in a cluster (distributed shared memory) rather than through a workspace: the portable
// cluster size. A split's slot fits in the smallest ring.
inline constexpr int kGemvMaxClusterSplits = 8;
static_assert(gemv_slot_floats(4) * 4 <= gemv_smem_bytes(4, 2), "gemv: a split's partial must fit in its ring");

#if defined(__CUDACC__)
// The product of GemmArgs' device scales (1 without them).
LOOM_DEVICE LOOM_FORCEINLINE float gemm_device_scales(const GemmArgs& args) {
    float s = 1.f;
    if (args.scale_a != nullptr) s *= *args.scale_a;
    if (args.scale_b != nullptr) s *= *args.scale_b;
    return s;
}

// The global-store epilogue of D = scale * acc + beta * D + bias (tile/epilogue.cuh) for these arguments, with the
// products scaled by `scale` (alpha times the device scales, or 1 where the accumulators already carry them).
template <class TOut, class TBias>
LOOM_DEVICE LOOM_FORCEINLINE tile::EpilogueParams<TOut, TBias> gemm_epilogue_params(const GemmArgs& args, float scale) {
    return {
        static_cast<TOut*>(args.d), args.ldd, static_cast<const TBias*>(args.bias), args.m, args.n, scale, args.beta};
}
#endif

// A k-block of the Hopper kernel in elements of the input type: one 128-byte swizzle row (64 bf16 / fp16, 128 fp8).
LOOM_HOST_DEVICE constexpr int gemm_block_k(int in_elem_bytes) { return 128 / in_elem_bytes; }

// TMA-store epilogue of gemm_sm90_tma_wgmma: output slabs of 128 bytes per row (one 128B swizzle span,
// gemm_store_box_cols(sizeof(TOut)) columns). The plain epilogue is per warp: each consumer warp stages its 16 rows
// of a slab in one of its buffers (kGemmWarpStoreBytes each) and stores them itself, so D's tensor map has boxes of
// kGemmStoreBoxRows = 16 rows. A BLOCK_N that is not a multiple of the slab width ends with a slab that overlaps the
// one before it (columns [BLOCK_N - width, BLOCK_N) of the tile): the columns stored twice get the same values both
// times, and no store reaches past the tile. With epilogue hooks a warpgroup stages its whole 64-row part
// (kGemmStoreBufBytes per slab) and D's map has 64-row boxes (kGemmWholeTileBoxRows).
inline constexpr uint32_t kGemmStoreBufBytes = 64u * 128u;
inline constexpr int kGemmStoreBoxRows = 16;
inline constexpr int kGemmWholeTileBoxRows = 64;
inline constexpr uint32_t kGemmWarpStoreBytes = static_cast<uint32_t>(kGemmStoreBoxRows) * 128u;
LOOM_HOST_DEVICE constexpr int gemm_store_box_cols(int out_elem_bytes) { return 128 / out_elem_bytes; }

// Staging buffers per consumer warp of the plain epilogue: two (double-buffered TMA stores) with one or two consumer
// warpgroups; one with three (BLOCK_M = 192), whose 3 x 16 KiB of double buffers would leave room for only three
// stages of a 192 x 160 tile, against four with 3 x 8 KiB.
LOOM_HOST_DEVICE constexpr int gemm_warp_store_bufs(int block_m) { return block_m >= 192 ? 1 : 2; }

// Bytes of one consumer warpgroup's staging buffers: gemm_warp_store_bufs per warp (4 x 2 KiB each), or, with
// epilogue hooks (whole_tile_out_bytes = the output element size), the warpgroup's whole 64 x BLOCK_N part of the tile.
LOOM_HOST_DEVICE constexpr uint32_t gemm_staging_bytes_per_wg(int block_m, int block_n, int whole_tile_out_bytes) {
    return whole_tile_out_bytes > 0 ? static_cast<uint32_t>(block_n * whole_tile_out_bytes) * 64u
                                    : static_cast<uint32_t>(gemm_warp_store_bufs(block_m)) * 4u * kGemmWarpStoreBytes;
}

// Dynamic shared memory of gemm_sm90_tma_wgmma: STAGES x (A + B tiles), the epilogue's staging buffers, the
// barriers, 1 KiB alignment slack.
LOOM_HOST_DEVICE constexpr uint32_t gemm_sm90_smem_bytes(int block_m, int block_n, int stages,
                                                         int whole_tile_out_bytes = 0) {
    return static_cast<uint32_t>(stages) * static_cast<uint32_t>(block_m + block_n) * 128u +
           static_cast<uint32_t>(block_m / 64) * gemm_staging_bytes_per_wg(block_m, block_n, whole_tile_out_bytes) +
           static_cast<uint32_t>(stages) * 16u + 1024u;
}

// K-clusters (gemm_sm90_tma_wgmma's CLUSTER_K > 1): each rank's fp32 partial of the tile goes into its ring and
// staging buffers, which must hold BLOCK_M x BLOCK_N floats: the fewest stages (at least 2) whose ring does.
LOOM_HOST_DEVICE constexpr int gemm_sm90_cluster_k_min_stages(int block_m, int block_n) {
    const uint32_t partial = static_cast<uint32_t>(block_m) * static_cast<uint32_t>(block_n) * 4u;
    const uint32_t staging = static_cast<uint32_t>(block_m / 64) * gemm_staging_bytes_per_wg(block_m, block_n, 0);
    const uint32_t stage = static_cast<uint32_t>(block_m + block_n) * 128u;
    const int s = partial > staging ? static_cast<int>((partial - staging + stage - 1) / stage) : 0;
    return s < 2 ? 2 : s;
}

// sm_90's opt-in dynamic shared memory per block; the kernel's bound on STAGES; and the most STAGES (<= cap) whose
// footprint fits in that memory. Deep rings matter only for small tiles (64 x 64: 16 KiB a stage), whose skinny GEMMs
// stream B from memory and need many k-blocks in flight per SM.
inline constexpr uint32_t kGemmSm90MaxSmem = 227u * 1024u;
inline constexpr int kGemmSm90MaxStages = 16;
LOOM_HOST_DEVICE constexpr int gemm_sm90_max_stages(int block_m, int block_n, int whole_tile_out_bytes = 0,
                                                    int cap = kGemmSm90MaxStages) {
    int s = cap;
    while (s > 2 && gemm_sm90_smem_bytes(block_m, block_n, s, whole_tile_out_bytes) > kGemmSm90MaxSmem) --s;
    return s;
}

// The ring depth every planner takes (heuristic, overlapped ops, bench-gemm's alternatives): the most stages that
// fit, at most kGemmPlanMaxStages. Only tiles of <= 192 rows + columns get past 6 (64 x 64: 13 fit, 64 x 128 and
// 128 x 64: 8); the large tiles of big GEMMs fit 4-6. Skinny GEMMs (M <= 128, one M-block) stream B from memory and
// run 3-5 % faster with 8-13 stages than with 6; 12 and 13 tie 10 (docs/perf/gemm_skinny.json).
inline constexpr int kGemmPlanMaxStages = 12;
LOOM_HOST_DEVICE constexpr int gemm_sm90_plan_stages(int block_m, int block_n, int whole_tile_out_bytes = 0) {
    return gemm_sm90_max_stages(block_m, block_n, whole_tile_out_bytes, kGemmPlanMaxStages);
}

// Split-tail workspace: floats of one partial-accumulator slot (one tail tile, one split).
LOOM_HOST_DEVICE constexpr int64_t gemm_split_tail_slot_floats(int block_m, int block_n) {
    return static_cast<int64_t>(block_m) * block_n;
}

// The sm_80 kernel's fixed tile: 128 x 128 x 32, 256 threads.
inline constexpr int kSm80BlockM = 128, kSm80BlockN = 128, kSm80BlockK = 32, kSm80Threads = 256;

LOOM_HOST_DEVICE constexpr uint32_t gemm_sm80_smem_bytes(int stages) {
    return static_cast<uint32_t>(stages) * (kSm80BlockM + kSm80BlockN) * kSm80BlockK * 2u;
}

// The fp8 e4m3 mainloop's (sm80_tile_mainloop_e4m3): STAGES fp8 k-tiles (8 KiB each) + two bf16 k-tiles (16 KiB each).
LOOM_HOST_DEVICE constexpr uint32_t gemm_sm80_e4m3_smem_bytes(int stages) {
    return static_cast<uint32_t>(stages) * (kSm80BlockM + kSm80BlockN) * kSm80BlockK + gemm_sm80_smem_bytes(2);
}

}  // namespace loom::kernels
