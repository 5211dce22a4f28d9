// Hopper GEMM: D[M, N] = alpha * A[M, K] * B^T + beta * D + bias[N], bf16/fp16 in, fp32 accumulate.
//
// Data path: TMA (128B swizzle) -> STAGES-deep mbarrier ring in shared memory -> wgmma (both operands from
// shared memory) -> registers -> vectorised global stores. Persistent: gridDim.x <= #SMs CTAs walk the output
// tiles in the order of the Hooks policy (loom/tile/scheduler.cuh).
//
// Warp roles (BLOCK_M / 64 consumer warpgroups + 1 producer warpgroup, one CTA per SM):
//   consumers  warpgroup c computes rows [64c, 64c + 64) of the tile with wgmma m64nBLOCK_Nk16, keeps one
//              k-block of MMAs in flight, releases a slot when the MMAs that read it retired, then runs the
//              epilogue while the producer already streams the next tile's k-blocks.
//   producer   one thread: per tile, hooks.before_load(), then per k-block: wait slot empty, expect_tx, TMA A
//              (BLOCK_M x 64) and B (BLOCK_N x 64, or 64 x BLOCK_N when B is [K, N]). setmaxnreg moves its
//              registers to the consumers (40 / 232 per thread).
// Shared memory: STAGES x (BLOCK_M + BLOCK_N) x 128 B (+ barriers, + 1 KiB alignment slack):
//   128 x 256, 4 stages = 192 KiB.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/config.hpp"
#include "loom/kernels/gemm_params.hpp"
#include "loom/ptx/tma.cuh"
#include "loom/ptx/wgmma.cuh"
#include "loom/tile/epilogue.cuh"
#include "loom/tile/pipeline.cuh"
#include "loom/tile/scheduler.cuh"
#include "loom/tile/tma.cuh"

namespace loom::kernels {

// TIn: __nv_bfloat16 or __half. TOut: __nv_bfloat16, __half or float. TBias: any of those (unused when
// args.bias is null). kBKMajor: B is [N, K] row-major (K contiguous); otherwise B is [K, N] row-major.
template <class TIn, class TOut, class TBias, int BLOCK_M, int BLOCK_N, int STAGES, bool kBKMajor,
          class Hooks = tile::GemmNoHooks>
__global__ void __launch_bounds__(128 * (BLOCK_M / 64 + 1), 1)
    gemm_sm90_tma_wgmma(const __grid_constant__ ptx::TmaDescriptor tmap_a,
                        const __grid_constant__ ptx::TmaDescriptor tmap_b, const GemmArgs args, const Hooks hooks) {
    static_assert(BLOCK_M == 64 || BLOCK_M == 128, "BLOCK_M is 64 (one consumer) or 128 (two consumers)");
    static_assert(BLOCK_N % 16 == 0 && BLOCK_N >= 16 && BLOCK_N <= 256, "BLOCK_N: multiple of 16 in [16, 256]");
    static_assert(kBKMajor || BLOCK_N % 64 == 0, "B as [K, N] needs BLOCK_N a multiple of 64");
    static_assert(STAGES >= 2 && STAGES <= 8, "STAGES in [2, 8]");
    static_assert(sizeof(TIn) == 2, "inputs are bf16 or fp16");
#if LOOM_SM90A
    constexpr int kConsumers = BLOCK_M / 64;
    constexpr bool kBF16 = tile::kSameType<TIn, __nv_bfloat16>;
    constexpr uint32_t kABytes = tile::swizzled_box_bytes(BLOCK_M);  // (BLOCK_M, 64) bf16
    constexpr uint32_t kBBytes = tile::swizzled_box_bytes(BLOCK_N);  // (BLOCK_N, 64) bf16
    constexpr int kProducerRegs = 40;
    constexpr int kConsumerRegs = kConsumers == 2 ? 232 : 240;

    extern __shared__ uint8_t smem_raw[];
    // 128B-swizzled TMA boxes and wgmma descriptors need 1024-byte aligned tiles.
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uint64_t>(smem_raw) + 1023) & ~uint64_t(1023));
    uint8_t* smem_a = smem;
    uint8_t* smem_b = smem + STAGES * kABytes;
    auto* pipe = reinterpret_cast<tile::TmaPipeline<STAGES>*>(smem_b + STAGES * kBBytes);

    const int warpgroup = static_cast<int>(threadIdx.x) / 128;
    const int wg_thread = static_cast<int>(threadIdx.x) % 128;
    if (threadIdx.x == 0) {
        pipe->init(kConsumers * 4);  // one arrival per consumer warp releases a slot
        ptx::tma_prefetch_descriptor(&tmap_a);
        ptx::tma_prefetch_descriptor(&tmap_b);
    }
    __syncthreads();

    tile::PersistentScheduler<BLOCK_M, BLOCK_N, Hooks> sched(args.m, args.n, args.group_m);
    const int num_k_blocks = (args.k + kGemmBlockK - 1) / kGemmBlockK;
    tile::TileCoord t;

    if (warpgroup == kConsumers) {
        // ---- producer warpgroup: one thread issues every TMA ------------------------------------------------
        ptx::setmaxnreg_dec<kProducerRegs>();
        if (wg_thread == 0) {
            tile::PipelineState<STAGES> st;
            while (sched.next_tile(hooks, t)) {
                if constexpr (Hooks::kWaitsBeforeLoad) {
                    hooks.before_load(t);
                    ptx::fence_proxy_async_global();
                }
                for (int kb = 0; kb < num_k_blocks; ++kb) {
                    uint64_t* full = pipe->producer_acquire(st, kABytes + kBBytes);
                    const int k0 = kb * kGemmBlockK;
                    tile::tma_load_tile(smem_a + st.stage * kABytes, &tmap_a, full, k0, t.row0);
                    if constexpr (kBKMajor) {
                        tile::tma_load_tile(smem_b + st.stage * kBBytes, &tmap_b, full, k0, t.col0);
                    } else {
                        tile::tma_load_tile_mn<BLOCK_N, 64, kGemmBlockK>(smem_b + st.stage * kBBytes, &tmap_b, full,
                                                                         t.col0, k0);
                    }
                    st.advance();
                }
            }
        }
    } else {
        // ---- consumer warpgroups: wgmma over the ring, then the epilogue -----------------------------------
        ptx::setmaxnreg_inc<kConsumerRegs>();
        const int warp = wg_thread / 32, lane = wg_thread % 32;
        const tile::EpilogueParams<TOut, TBias> epi{static_cast<TOut*>(args.d),
                                                    args.ldd,
                                                    static_cast<const TBias*>(args.bias),
                                                    args.m,
                                                    args.n,
                                                    args.alpha,
                                                    args.beta};
        float acc[BLOCK_N / 2];
        tile::PipelineState<STAGES> st;
        while (sched.next_tile(hooks, t)) {
            uint32_t prev_stage = 0;
            for (int kb = 0; kb < num_k_blocks; ++kb) {
                pipe->consumer_wait(st);
                const uint8_t* a_tile = smem_a + st.stage * kABytes + warpgroup * 64 * 128;
                const uint8_t* b_tile = smem_b + st.stage * kBBytes;
                ptx::wgmma_fence_operands(acc);
                ptx::wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < kGemmBlockK / 16; ++kk) {
                    // K-major, 128B swizzle: 8-row atoms 1024 B apart; a k16 step is 32 B along the row.
                    const uint64_t da = ptx::wgmma_smem_desc(a_tile + kk * 32, 0, 1024, ptx::SmemSwizzle::B128);
                    uint64_t db;
                    if constexpr (kBKMajor) {
                        db = ptx::wgmma_smem_desc(b_tile + kk * 32, 0, 1024, ptx::SmemSwizzle::B128);
                    } else {
                        // N-major: 64-column boxes (64 k-rows x 128 B) side by side 8 KiB apart (LBO), 8-k-row
                        // atoms 1024 B apart (SBO); a k16 step is 16 rows = 2 KiB.
                        db = ptx::wgmma_smem_desc(b_tile + kk * 2048, tile::swizzled_box_bytes(kGemmBlockK), 1024,
                                                  ptx::SmemSwizzle::B128);
                    }
                    ptx::wgmma_m64k16<BLOCK_N, kBF16, 0, kBKMajor ? 0 : 1>(acc, da, db, (kb > 0 || kk > 0) ? 1 : 0);
                }
                ptx::wgmma_commit_group();
                ptx::wgmma_fence_operands(acc);
                // Keep this k-block's MMAs in flight; the previous k-block's have retired, so its slot is free.
                ptx::wgmma_wait_group<1>();
                if (kb > 0 && lane == 0) pipe->consumer_release(prev_stage);
                prev_stage = st.stage;
                st.advance();
            }
            ptx::wgmma_wait_group<0>();
            ptx::wgmma_fence_operands(acc);
            if (num_k_blocks > 0 && lane == 0) pipe->consumer_release(prev_stage);
            if (num_k_blocks == 0) {
#pragma unroll
                for (int i = 0; i < BLOCK_N / 2; ++i) acc[i] = 0.f;
            }

            // Epilogue: thread owns (row 16w + lane/4 (+8), cols 8j + 2(lane%4) + {0,1}) of its 64-row slab.
            const int row = t.row0 + warpgroup * 64 + warp * 16 + lane / 4;
            const int col = t.col0 + 2 * (lane % 4);
#pragma unroll
            for (int j = 0; j < BLOCK_N / 8; ++j) {
                epi.store(row, col + 8 * j, acc[4 * j + 0], acc[4 * j + 1]);
                epi.store(row + 8, col + 8 * j, acc[4 * j + 2], acc[4 * j + 3]);
            }
            if constexpr (Hooks::kNotifiesAfterStore) {
                ptx::named_barrier_sync(1, kConsumers * 128);
                if (threadIdx.x == 0) hooks.after_store(t);
            }
        }
    }
#else
    __trap();  // compiled only to keep one TU for every arch; launched only on sm_90a
#endif
}

}  // namespace loom::kernels
