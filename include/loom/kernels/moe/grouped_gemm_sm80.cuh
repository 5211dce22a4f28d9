// Portable grouped GEMM for sm_80 / sm_89 (and a fallback on Hopper): the contract of grouped_gemm.cuh with the dense
// sm_80 kernel's tile (kernels/gemm/gemm_sm80.cuh: cp.async + ldmatrix + mma.sync, 128 x 128 x 32, 256 threads).
//
// One CTA per tile of an upper bound of the tile count (the host's: ceil(max_rows / 128) + groups row blocks x
// n blocks); each CTA builds the row-block prefix from the device offsets (grouped_tiles.cuh) and walks the linear
// tiles blockIdx.x, blockIdx.x + gridDim.x, ... through the hooks' tile order (one each, unless max_rows understated
// the rows; none when its index is past the real tiles). A's rows past the group's end and
// B's rows / columns past n are read as zeros (cp.async zero-fill): B_e's base is its own expert's. Stores are masked
// to the group's rows and C's columns.
// SwiGLU: the tile's 128 B columns are, per warp column w (32 columns), 16 gate columns j0 + 16 w .. and the 16 up
// columns n / 2 + j0 + 16 w ..: each thread's fragments j and j + 2 are gate and up of the same output column; a tile
// stores 64 output columns.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/config.hpp"
#include "loom/kernels/gemm/gemm_sm80.cuh"
#include "loom/kernels/moe/grouped_gemm_params.hpp"
#include "loom/kernels/moe/grouped_tiles.cuh"

namespace loom::kernels::moe {

// One tile of grouped_gemm_sm80 (every thread of the CTA).
template <class TIn, class TOut, int STAGES, bool kBKMajor, GroupedAct kAct, class Hooks>
LOOM_DEVICE LOOM_FORCEINLINE void grouped_tile_sm80(const Hooks& hooks, const GroupedTileGrid& grid,
                                                    const GroupedGemmArgs& args, int32_t linear, TIn* smem) {
    constexpr bool kSwiGLU = kAct == GroupedAct::SwiGLU;
    constexpr int kOutCols = kSwiGLU ? kSm80BlockN / 2 : kSm80BlockN;
    const GroupedTile t = grouped_tile<kSm80BlockM>(hooks, grid, args, linear);
    if constexpr (GroupedLoadWait<Hooks>) {
        if (threadIdx.x == 0) hooks.before_load(t.group, t.row0);
        __syncthreads();
    }
    const TIn* a = static_cast<const TIn*>(args.a);
    const TIn* b =
        static_cast<const TIn*>(args.b) + static_cast<int64_t>(t.expert) * (kBKMajor ? args.n : args.k) * args.ldb;
    const int32_t col0 = t.n_block * kOutCols;
    const int32_t half = args.n / 2;
    const auto b_col = [col0, half](int r) {
        if constexpr (kSwiGLU) {
            const int w = r / 32, q = r % 32;
            return q < 16 ? col0 + 16 * w + q : half + col0 + 16 * w + (q - 16);
        } else {
            return col0 + r;
        }
    };
    float acc[4][4][4];
    sm80_tile_mainloop<TIn, STAGES, kBKMajor>(a, args.lda, t.row0, t.row0 + t.rows, b, args.ldb, args.n, args.k, b_col,
                                              acc, smem);

    const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
    const int warp_m = warp / 4, warp_n = warp % 4;
    const float s = grouped_scale(args, t.expert);
    const int32_t row_end = t.row0 + t.rows;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = t.row0 + warp_m * 64 + i * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < (kSwiGLU ? 2 : 4); ++j) {
            const int c = col0 + warp_n * (kSwiGLU ? 16 : 32) + j * 8 + 2 * (lane % 4);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float x = s * acc[i][j][2 * h], y = s * acc[i][j][2 * h + 1];
                if constexpr (kSwiGLU) {
                    x = silu(x) * (s * acc[i][j + 2][2 * h]);
                    y = silu(y) * (s * acc[i][j + 2][2 * h + 1]);
                }
                grouped_store_pair<TOut, kAct>(args, r + 8 * h, row_end, c, x, y);
            }
        }
    }
    if constexpr (GroupedStoreNotify<Hooks>) {
        __syncthreads();
        if (threadIdx.x == 0) hooks.after_store(t.group, t.row0, t.rows, t.n_block);
    }
}

// args.a / args.b: A [rows, k] (lda) and B, E experts stacked: [E * n, k] (kBKMajor) or [E * k, n] (ldb).
// Grid: (upper bound of the tiles); block: kSm80Threads; dynamic smem: gemm_sm80_smem_bytes(STAGES) +
// grouped_prefix_bytes(num_groups).
template <class TIn, class TOut, int STAGES, bool kBKMajor, int kActivation, class Hooks = GroupedNoHooks>
__global__ void __launch_bounds__(kSm80Threads)
    grouped_gemm_sm80(const GroupedGemmArgs args, const __grid_constant__ Hooks hooks) {
    constexpr GroupedAct kAct = static_cast<GroupedAct>(kActivation);
    constexpr bool kSwiGLU = kAct == GroupedAct::SwiGLU;
    static_assert(STAGES >= 2 && STAGES <= 6, "STAGES in [2, 6]");
    static_assert(sizeof(TIn) == 2, "inputs are bf16 or fp16");
    static_assert(GroupedHooks<Hooks>, "Hooks: a grouped tile order, trivially copyable (grouped_tiles.cuh)");
#if LOOM_ARCH >= 800
    constexpr int kOutCols = kSwiGLU ? kSm80BlockN / 2 : kSm80BlockN;
    extern __shared__ uint8_t smem_raw[];
    TIn* smem = reinterpret_cast<TIn*>(smem_raw);
    int32_t* prefix = reinterpret_cast<int32_t*>(smem_raw + gemm_sm80_smem_bytes(STAGES));
    __shared__ int32_t scan_scratch[32];
    build_row_block_prefix<kSm80BlockM, kSm80Threads>(args, prefix, scan_scratch);
    const GroupedTileGrid grid{prefix, args.num_groups, prefix[args.num_groups], (args.n_out + kOutCols - 1) / kOutCols,
                               args.group_m};
    for (int32_t linear = static_cast<int32_t>(blockIdx.x); linear < grid.num_tiles();
         linear += static_cast<int32_t>(gridDim.x)) {
        __syncthreads();  // the previous tile's last shared-memory reads are done before this tile's copies
        grouped_tile_sm80<TIn, TOut, STAGES, kBKMajor, kAct>(hooks, grid, args, linear, smem);
    }
#else
    __trap();
#endif
}

}  // namespace loom::kernels::moe
