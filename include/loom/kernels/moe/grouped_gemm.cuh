// Hopper grouped GEMM: for every group g, C[rows of g, :] = act(s_e x A[rows of g, :] x B_e^T), e = g % E, bf16 / fp16
// (or fp8 e4m3 with B_e as [N, K]) in, fp32 accumulate; s_e = alpha x scale_a x scale_b[e].
//
// Data path: TMA (128B swizzle) -> STAGES-deep mbarrier ring -> wgmma (both operands from shared memory) -> registers
// -> (kStagedStore) a per-warp 128B-swizzled staging buffer in shared memory -> 16-byte vector stores of whole 128-byte
// row segments (grouped_store_warp_staged), or (register epilogue) masked 4-byte pair stores straight from the
// fragments; either way clipped to the tile's group rows and to C's columns: a tile of a group's last row block never
// writes the next group's rows. A is one 2-D map over [rows, K] (a tile's A box may
// read rows past its group: they reach only rows that are never stored). B is a 3-D map over the experts [E][N][K]
// (or [E][K][N]): a box never reads another expert's weights; rows and columns past N / K are zero-filled.
// Persistent: gridDim.x <= #SMs CTAs walk the linear tiles of all groups (grouped_tiles.cuh: the row-block prefix each
// CTA builds from the device offsets, the hooks' tile order).
//
// Warp roles (BLOCK_M / 64 = 1 or 2 consumer warpgroups + 1 producer warpgroup):
//   consumers  warpgroup c computes rows [64c, 64c + 64) of the tile with wgmma m64nBLOCK_Nk16 (fp8: k32), keeps one
//              k-block of MMAs in flight, releases a slot once the MMAs that read it retired, then stores the tile
//              while the producer already streams the next tile's k-blocks. The staged epilogue is per warp (no
//              warpgroup barrier): each warp stages its 16 rows slab by slab in its own 2 KiB buffer and stores them;
//              the stores drain while the warp starts the next tile's MMAs. (A TMA store would have to stop at the
//              group's last row, which a box cannot, and needs a tensor map of C; the vector stores clip per row.)
//   producer   one thread: per tile, hooks.before_load(group, row0) (GroupedLoadWait), then per k-block: wait slot
//              empty, expect_tx, TMA A (BLOCK_M x 128 B) and B (BLOCK_N rows x 128 B; [K, N] B as 64-column boxes).
//              setmaxnreg moves its registers to the consumers.
// SwiGLU (kAct): a tile computes BLOCK_N / 2 output columns j0.. from BLOCK_N / 2 gate rows of B_e (j0..) and the
//   BLOCK_N / 2 up rows (n / 2 + j0..) side by side in its B slot, so each thread holds gate and up of the same
//   output column (accumulator fragments f and f + BLOCK_N / 16) and the epilogue multiplies them in registers.
// Block scales (kBlockScale, fp8 only; DeepSeek-V3 / DeepGEMM's promotion): one k-block is one 128-element scale
//   block of K. Per k-block the wgmma accumulate into a second register tile `part` (cleared by the first MMA), the
//   consumer waits for them, releases the slot, and promotes: acc += part x sa[row, kb] x sb[e, n block, kb]. The
//   scales are loaded from global memory before the k-block's MMAs are issued, so their latency hides behind them.
//   A tile's product columns lie in one 128-column scale block (two with SwiGLU: gate and up), so a thread needs two
//   A scales (its rows r and r + 8) and one or two B scales per k-block. Costs: no MMA of the next k-block in flight
//   during the promotion (the other consumer warpgroup's MMAs fill the gap) and BLOCK_N / 2 more registers.
// Shared memory: STAGES x (BLOCK_M + BLOCK_N) x 128 B (+ kStagedStore: BLOCK_M / 16 x 2 KiB staging) + barriers + the
// row-block prefix (grouped_gemm_params.hpp: grouped_gemm_sm90_smem_bytes).
// Hooks' ordering (GroupedStoreNotify): every consumer thread's global stores of the tile (pair stores, or the staged
// path's vector stores; both generic-proxy st.global), then a named barrier of the consumer threads, then thread 0's
// after_store, whose release publishes them: the same order with either epilogue.
// Hooks: grouped_tiles.cuh (GroupedTileOrder, GroupedLoadWait, GroupedStoreNotify).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "loom/config.hpp"
#include "loom/kernels/moe/grouped_gemm_params.hpp"
#include "loom/kernels/moe/grouped_tiles.cuh"
#include "loom/ptx/async.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/special.cuh"
#include "loom/ptx/tma.cuh"
#include "loom/ptx/wgmma.cuh"
#include "loom/tile/epilogue.cuh"
#include "loom/tile/pipeline.cuh"
#include "loom/tile/tma.cuh"
#include "loom/tile/wgmma_k_block.cuh"

namespace loom::kernels::moe {

// The consumer mainloop of one tile with per-128-block scales (fp8, B as [N, K]; kernel comment above): acc =
// sum over k-blocks kb of (A_kb x B_kb^T) x sa[row, kb] x sb[e, n block, kb]. One k-block = 128 fp8 = one scale block.
template <int BLOCK_N, int STAGES, bool kSwiGLU>
LOOM_DEVICE LOOM_FORCEINLINE void block_scaled_mainloop(const GroupedGemmArgs& args, const GroupedTile& t, int out_cols,
                                                        int num_k_blocks, tile::TmaPipeline<STAGES>* pipe,
                                                        tile::PipelineState<STAGES>& st, const uint8_t* smem_a,
                                                        const uint8_t* smem_b, uint32_t a_bytes, uint32_t b_bytes,
                                                        int warpgroup, int wg_thread, float (&acc)[BLOCK_N / 2],
                                                        long long wait_cycles) {
#if LOOM_SM90A
    const int warp = wg_thread / 32, lane = wg_thread % 32;
    float part[BLOCK_N / 2];
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i) acc[i] = 0.f;
    // This thread's rows (r, r + 8) of A's scales, clamped inside A (rows past A are zero-filled by TMA and never
    // stored), and the scale blocks of the tile's product columns (gate, and up with SwiGLU).
    const int32_t r = t.row0 + warpgroup * 64 + warp * 16 + lane / 4;
    const int32_t r0 = r < args.rows ? r : args.rows - 1, r1 = r + 8 < args.rows ? r + 8 : args.rows - 1;
    const float* sa0 = args.scale_a_blocks + static_cast<int64_t>(r0) * num_k_blocks;
    const float* sa1 = args.scale_a_blocks + static_cast<int64_t>(r1) * num_k_blocks;
    const int n_blocks = (args.n + kGroupedScaleBlock - 1) / kGroupedScaleBlock;
    const int32_t col0 = t.n_block * out_cols;
    const float* sb_lo =
        args.scale_b_blocks + (static_cast<int64_t>(t.expert) * n_blocks + col0 / kGroupedScaleBlock) * num_k_blocks;
    const float* sb_hi =
        kSwiGLU
            ? args.scale_b_blocks +
                  (static_cast<int64_t>(t.expert) * n_blocks + (args.n / 2 + col0) / kGroupedScaleBlock) * num_k_blocks
            : sb_lo;
    for (int kb = 0; kb < num_k_blocks; ++kb) {
        const float a0 = __ldg(sa0 + kb), a1 = __ldg(sa1 + kb), b_lo = __ldg(sb_lo + kb), b_hi = __ldg(sb_hi + kb);
        pipe->consumer_wait(st, wait_cycles);
        const uint8_t* a_tile = smem_a + st.stage * a_bytes + warpgroup * 64 * 128;
        const uint8_t* b_tile = smem_b + st.stage * b_bytes;
        ptx::wgmma_fence_operands(part);
        ptx::wgmma_fence();
        tile::wgmma_k_block<BLOCK_N, __nv_fp8_e4m3, true>(part, a_tile, b_tile, false);
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<0>();
        ptx::wgmma_fence_operands(part);
        if (wg_thread == 0) pipe->consumer_release(st.stage);
        st.advance();
        // Promotion: fragment j holds columns 8 j.. (SwiGLU: gate for j < BLOCK_N / 16, then up), h the row r + 8 h.
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j) {
            const float b = kSwiGLU && j >= BLOCK_N / 16 ? b_hi : b_lo;
            const float s0 = a0 * b, s1 = a1 * b;
            acc[4 * j + 0] += part[4 * j + 0] * s0;
            acc[4 * j + 1] += part[4 * j + 1] * s0;
            acc[4 * j + 2] += part[4 * j + 2] * s1;
            acc[4 * j + 3] += part[4 * j + 3] * s1;
        }
    }
#endif
}

// The staged epilogue of one consumer warp (kStagedStore): its 16 rows of the tile, act(s x acc), slab by slab (128
// bytes of output columns each: 64 of bf16 / fp16, 32 of fp32). Per slab the warp writes its fragments as pairs into
// its 16 x 128 B buffer, 128B-swizzled (16-byte chunk c of row r at chunk c ^ (r % 8): the pair stores of one
// instruction, 8 rows x 4 lanes, hit 32 distinct banks, as do the 16-byte reads of a quarter warp, one row), then
// reads it back one row per 8 lanes and stores whole 128-byte row segments with 16-byte vector stores: 4 per thread per
// slab instead of 2 x (slab columns / 8) 4-byte pair stores, each instruction 4 full 128-byte lines rather than 8 rows
// x 16 bytes. Rows at or past the group's end (t.row0 + t.rows: the next group's rows) and columns past n_out are never
// written (n_out and every slab's first column are multiples of 8, so a 16-byte chunk is either wholly inside or past
// n_out). The stores are fire-and-forget: the warp goes on to the next slab and then the next tile's MMAs while they
// drain, and no other warp waits for it. The buffer is the warp's own: __syncwarp orders its reuse (also across
// tiles); global visibility for after_store is the caller's barrier, as with the register epilogue.
// acc: the thread's fragments as the mainloop left them (SwiGLU: gate fragments [0, BLOCK_N / 16), then up).
// stage: the consumer warps' buffers, kGroupedWarpStageBytes each in thread order. The thread's coordinates come from
// an unhoisted %tid.x: held across the mainloop (beside the accumulators) they made the GeLU kernels spill.
template <class TOut, int BLOCK_N, GroupedAct kAct>
LOOM_DEVICE LOOM_FORCEINLINE void grouped_store_warp_staged(const GroupedGemmArgs& args, const GroupedTile& t, float s,
                                                            const float (&acc)[BLOCK_N / 2], uint8_t* stage) {
    constexpr bool kSwiGLU = kAct == GroupedAct::SwiGLU;
    constexpr int kOutCols = kSwiGLU ? BLOCK_N / 2 : BLOCK_N;
    constexpr int kSize = static_cast<int>(sizeof(TOut));
    constexpr int kSlabCols = 128 / kSize;
    constexpr int kSlabs = (kOutCols + kSlabCols - 1) / kSlabCols;
    constexpr int kVec = 16 / kSize;              // elements of one 16-byte chunk
    const uint32_t tid = ptx::tid_x_unhoisted();  // a consumer thread: < BLOCK_M / 64 x 128
    const int lane = static_cast<int>(tid % 32), chunk = lane % 8;
    uint8_t* const buf = stage + (tid / 32) * kGroupedWarpStageBytes;
    const int32_t warp_row0 = t.row0 + static_cast<int32_t>(tid / 32) * 16;  // warpgroup g, warp w: 64 g + 16 w
    const int32_t row_end = t.row0 + t.rows;
    const int32_t tile_col0 = t.n_block * kOutCols;
#pragma unroll
    for (int slab = 0; slab < kSlabs; ++slab) {
        const int32_t slab_col0 = tile_col0 + slab * kSlabCols;
        if (slab_col0 >= args.n_out) break;  // uniform: the rest of the tile is past n_out
        // The slab's fragments: all kSlabCols / 8, or fewer in the last slab of a tile narrower than whole slabs.
        const int frags = kOutCols - slab * kSlabCols < kSlabCols ? (kOutCols - slab * kSlabCols) / 8 : kSlabCols / 8;
        __syncwarp();  // the warp's reads of the previous slab (maybe the previous tile's) are done
#pragma unroll
        for (int f = 0; f < kSlabCols / 8; ++f) {
            if (f >= frags) break;
            const int j = slab * (kSlabCols / 8) + f;
            const uint32_t byte = static_cast<uint32_t>(8 * f + 2 * (lane % 4)) * kSize;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t r = static_cast<uint32_t>(lane / 4 + 8 * h);
                const uint32_t off = r * 128u + ((((byte >> 4) ^ (r & 7u)) << 4) | (byte & 15u));
                float x = s * acc[4 * j + 2 * h], y = s * acc[4 * j + 2 * h + 1];
                if constexpr (kSwiGLU) {
                    constexpr int kUp = BLOCK_N / 16 * 4;
                    x = silu(x) * (s * acc[kUp + 4 * j + 2 * h]);
                    y = silu(y) * (s * acc[kUp + 4 * j + 2 * h + 1]);
                }
                grouped_activate<kAct>(x, y);
                tile::store_pair(reinterpret_cast<TOut*>(buf + off), x, y);
            }
        }
        __syncwarp();  // the slab staged: every lane reads rows other lanes wrote
        const int32_t col = slab_col0 + chunk * kVec;
        if (chunk * kVec < frags * 8 && col < args.n_out) {
            // All four rows' loads, then their stores (both volatile asm: kept in this order), so that the four
            // shared-memory latencies overlap.
            uint4 v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint32_t r = static_cast<uint32_t>(4 * i + lane / 8);
                v[i] = ptx::ld_shared_v4(buf + r * 128u + ((static_cast<uint32_t>(chunk) ^ (r & 7u)) << 4));
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int32_t row = warp_row0 + 4 * i + lane / 8;
                if (row < row_end)
                    ptx::st_v4(static_cast<TOut*>(args.c) + static_cast<int64_t>(row) * args.ldc + col, v[i]);
            }
        }
    }
}

// TIn: __nv_bfloat16, __half, or __nv_fp8_e4m3 (kBKMajor only). TOut: __nv_bfloat16, __half or float. kBKMajor: B_e
// is [N, K] (tmap_b over [E][N][K], boxes of BLOCK_N rows, BLOCK_N / 2 with SwiGLU); else [K, N] (tmap_b over
// [E][K][N], boxes of 64 columns x 128 B rows of K). tmap_a: A [rows, K], boxes of BLOCK_M rows x 128 B.
// kBlockScale: args.scale_a_blocks / scale_b_blocks (both non-null) scale each 128-K block (fp8 in; BLOCK_N, or
// BLOCK_N / 2 with SwiGLU, divides 128; with SwiGLU n / 2 is a multiple of 128). kStagedStore: the staged epilogue
// (grouped_store_warp_staged: shared memory, 16-byte stores; C 16-byte aligned with a row stride of a multiple of 16
// bytes, which the host checks); false: pair stores from registers.
template <class TIn, class TOut, int BLOCK_M, int BLOCK_N, int STAGES, bool kBKMajor, int kActivation,
          class Hooks = GroupedNoHooks, bool kBlockScale = false, bool kStagedStore = false>
__global__ void __launch_bounds__(128 * (BLOCK_M / 64 + 1), 1)
    grouped_gemm_sm90(const __grid_constant__ ptx::TmaDescriptor tmap_a,
                      const __grid_constant__ ptx::TmaDescriptor tmap_b, const GroupedGemmArgs args,
                      const __grid_constant__ Hooks hooks) {
    constexpr GroupedAct kAct = static_cast<GroupedAct>(kActivation);
    constexpr bool kSwiGLU = kAct == GroupedAct::SwiGLU;
    static_assert(BLOCK_M == 64 || BLOCK_M == 128, "BLOCK_M is 64 or 128 (one or two consumer warpgroups)");
    static_assert(BLOCK_N % 16 == 0 && BLOCK_N >= 16 && BLOCK_N <= 256, "BLOCK_N: multiple of 16 in [16, 256]");
    static_assert(kBKMajor || BLOCK_N % (kSwiGLU ? 128 : 64) == 0,
                  "B as [K, N] needs BLOCK_N a multiple of 64 (of 128 with SwiGLU: 64-column boxes per half)");
    static_assert(!kSwiGLU || BLOCK_N % 32 == 0, "SwiGLU halves the tile: BLOCK_N / 2 a multiple of 16");
    static_assert(STAGES >= 2 && STAGES <= 16, "STAGES in [2, 16]");
    constexpr bool kFp8 = tile::kSameType<TIn, __nv_fp8_e4m3>;
    static_assert(sizeof(TIn) == 2 || (kFp8 && kBKMajor), "inputs are bf16 or fp16, or fp8 e4m3 with B as [N, K]");
    static_assert(GroupedHooks<Hooks>, "Hooks: a grouped tile order, trivially copyable (grouped_tiles.cuh)");
    static_assert(!kBlockScale || (kFp8 && kGroupedScaleBlock % (kSwiGLU ? BLOCK_N / 2 : BLOCK_N) == 0),
                  "block scales: fp8 in, a tile's columns (per SwiGLU half) within one 128-column scale block");
#if LOOM_SM90A
    constexpr int kConsumers = BLOCK_M / 64;
    constexpr int kThreads = 128 * (kConsumers + 1);
    constexpr bool kBF16 = tile::kSameType<TIn, __nv_bfloat16>;
    constexpr int kBlockK = 128 / static_cast<int>(sizeof(TIn));     // elements of one 128-byte row
    constexpr uint32_t kABytes = tile::swizzled_box_bytes(BLOCK_M);  // (BLOCK_M, kBlockK)
    constexpr uint32_t kBBytes = tile::swizzled_box_bytes(BLOCK_N);  // (BLOCK_N, kBlockK)
    constexpr int kProducerRegs = 40;
    constexpr auto at_most = [](int v, int cap) { return v < cap ? v : cap; };
    constexpr int kLaunchRegs = at_most(65536 / kThreads / 8 * 8, 248);
    constexpr int kConsumerRegs = at_most(((kConsumers + 1) * kLaunchRegs - kProducerRegs) / kConsumers / 8 * 8, 240);
    constexpr int kOutCols = kSwiGLU ? BLOCK_N / 2 : BLOCK_N;  // output columns of a tile

    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uint64_t>(smem_raw) + 1023) & ~uint64_t(1023));
    uint8_t* smem_a = smem;
    uint8_t* smem_b = smem + STAGES * kABytes;
    // kStagedStore: one kGroupedWarpStageBytes buffer per consumer warp (1024-aligned, after the B ring). Spelled as
    // smem_raw + offset so that the compiler sees a shared-memory address (st.shared, not generic stores; the
    // alignment above goes through an integer).
    uint8_t* smem_stage = smem_raw + ((smem_b + STAGES * kBBytes) - smem_raw);
    constexpr uint32_t kStageBytes = kStagedStore ? kConsumers * 4 * kGroupedWarpStageBytes : 0u;
    auto* pipe = reinterpret_cast<tile::TmaPipeline<STAGES>*>(smem_stage + kStageBytes);
    int32_t* prefix = reinterpret_cast<int32_t*>(reinterpret_cast<uint8_t*>(pipe) + sizeof(tile::TmaPipeline<STAGES>));
    __shared__ int32_t scan_scratch[kGroupedStaticSmemBytes / 4];  // the scan takes 32

    if (threadIdx.x == 0) {
        pipe->init(kConsumers);  // one arrival per consumer warpgroup releases a slot
        ptx::tma_prefetch_descriptor(&tmap_a);
        ptx::tma_prefetch_descriptor(&tmap_b);
    }
    build_row_block_prefix<BLOCK_M, kThreads>(args, prefix, scan_scratch);  // ends with __syncthreads
    const GroupedTileGrid grid{prefix, args.num_groups, prefix[args.num_groups], (args.n_out + kOutCols - 1) / kOutCols,
                               args.group_m};
    const int32_t num_tiles = grid.num_tiles();
    const int num_k_blocks = (args.k + kBlockK - 1) / kBlockK;
    const int warpgroup = static_cast<int>(threadIdx.x) / 128;
    const int wg_thread = static_cast<int>(threadIdx.x) % 128;

    if (warpgroup == kConsumers) {
        // ---- producer warpgroup: one thread issues every TMA ------------------------------------------------
        ptx::setmaxnreg_dec<kProducerRegs>();
        if (wg_thread == 0) {
            tile::PipelineState<STAGES> st;
            for (int32_t linear = blockIdx.x; linear < num_tiles; linear += gridDim.x) {
                const GroupedTile t = grouped_tile<BLOCK_M>(hooks, grid, args, linear);
                if constexpr (GroupedLoadWait<Hooks>) {
                    hooks.before_load(t.group, t.row0);
                    ptx::fence_proxy_async_global();
                }
                const int32_t col0 = t.n_block * kOutCols;  // first product column (SwiGLU: of the gate half)
                for (int kb = 0; kb < num_k_blocks; ++kb) {
                    uint64_t* full = pipe->producer_acquire(st, kABytes + kBBytes);
                    const int k0 = kb * kBlockK;
                    uint8_t* b_slot = smem_b + st.stage * kBBytes;
                    tile::tma_load_tile(smem_a + st.stage * kABytes, &tmap_a, full, k0, t.row0);
                    if constexpr (kBKMajor) {
                        if constexpr (kSwiGLU) {
                            ptx::tma_load_3d(b_slot, &tmap_b, full, k0, col0, t.expert);
                            ptx::tma_load_3d(b_slot + tile::swizzled_box_bytes(BLOCK_N / 2), &tmap_b, full, k0,
                                             args.n / 2 + col0, t.expert);
                        } else {
                            ptx::tma_load_3d(b_slot, &tmap_b, full, k0, col0, t.expert);
                        }
                    } else {
                        // 64-column boxes (kBlockK k-rows x 128 B each) side by side; SwiGLU: gate boxes, then up.
#pragma unroll
                        for (int j = 0; j < BLOCK_N / 64; ++j) {
                            const int c = kSwiGLU && j >= BLOCK_N / 128 ? args.n / 2 + col0 + 64 * (j - BLOCK_N / 128)
                                                                        : col0 + 64 * j;
                            ptx::tma_load_3d(b_slot + j * tile::swizzled_box_bytes(kBlockK), &tmap_b, full, c, k0,
                                             t.expert);
                        }
                    }
                    st.advance();
                }
            }
        }
    } else {
        // ---- consumer warpgroups: wgmma over the ring, then the masked register epilogue ----------------------
        ptx::setmaxnreg_inc<kConsumerRegs>();
        const int warp = wg_thread / 32, lane = wg_thread % 32;
        float acc[BLOCK_N / 2];
        tile::PipelineState<STAGES> st;
        for (int32_t linear = blockIdx.x; linear < num_tiles; linear += gridDim.x) {
            const GroupedTile t = grouped_tile<BLOCK_M>(hooks, grid, args, linear);
            if constexpr (kBlockScale) {
                block_scaled_mainloop<BLOCK_N, STAGES, kSwiGLU>(
                    args, t, kOutCols, num_k_blocks, pipe, st, smem_a, smem_b, kABytes, kBBytes, warpgroup, wg_thread,
                    acc, tile::consumer_wait_cycles<GroupedLoadWait<Hooks>>(hooks));
            } else {
                uint32_t prev_stage = 0;
                for (int kb = 0; kb < num_k_blocks; ++kb) {
                    pipe->consumer_wait(st, tile::consumer_wait_cycles<GroupedLoadWait<Hooks>>(hooks));
                    const uint8_t* a_tile = smem_a + st.stage * kABytes + warpgroup * 64 * 128;
                    const uint8_t* b_tile = smem_b + st.stage * kBBytes;
                    ptx::wgmma_fence_operands(acc);
                    ptx::wgmma_fence();
                    tile::wgmma_k_block<BLOCK_N, TIn, kBKMajor>(acc, a_tile, b_tile, kb > 0);
                    ptx::wgmma_commit_group();
                    ptx::wgmma_fence_operands(acc);
                    ptx::wgmma_wait_group<1>();
                    if (kb > 0 && wg_thread == 0) pipe->consumer_release(prev_stage);
                    prev_stage = st.stage;
                    st.advance();
                }
                ptx::wgmma_wait_group<0>();
                ptx::wgmma_fence_operands(acc);
                if (wg_thread == 0) pipe->consumer_release(prev_stage);
            }

            // Epilogue: thread owns (row 16 warp + lane / 4 (+8), columns 8 j + 2 (lane % 4) + {0, 1}) of its
            // warpgroup's 64 rows; SwiGLU: gate in fragments [0, BLOCK_N / 16), up in the next BLOCK_N / 16.
            const float s = grouped_scale(args, t.expert);
            if constexpr (kStagedStore) {
                grouped_store_warp_staged<TOut, BLOCK_N, kAct>(args, t, s, acc, smem_stage);
            } else {
                const int32_t row = t.row0 + warpgroup * 64 + warp * 16 + lane / 4;
                const int32_t row_end = t.row0 + t.rows;
                const int32_t col = t.n_block * kOutCols + 2 * (lane % 4);
#pragma unroll
                for (int j = 0; j < kOutCols / 8; ++j) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float x = s * acc[4 * j + 2 * h], y = s * acc[4 * j + 2 * h + 1];
                        if constexpr (kSwiGLU) {
                            constexpr int kUp = BLOCK_N / 16 * 4;
                            x = silu(x) * (s * acc[kUp + 4 * j + 2 * h]);
                            y = silu(y) * (s * acc[kUp + 4 * j + 2 * h + 1]);
                        }
                        grouped_store_pair<TOut, kAct>(args, row + 8 * h, row_end, col + 8 * j, x, y);
                    }
                }
            }
            if constexpr (GroupedStoreNotify<Hooks>) {
                ptx::named_barrier_sync(1, kConsumers * 128);
                if (threadIdx.x == 0) hooks.after_store(t.group, t.row0, t.rows, t.n_block);
            }
        }
    }
#else
    __trap();  // compiled only to keep one TU for every arch; launched only on sm_90a
#endif
}

}  // namespace loom::kernels::moe
