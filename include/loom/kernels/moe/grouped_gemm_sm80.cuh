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
// fp8 e4m3 (B as [N, K]; sm_80 has no fp8 MMA): sm80_tile_mainloop_e4m3 (gemm_sm80.cuh) copies the fp8 bytes with
// cp.async and converts them in shared memory to bf16, exactly, for the bf16 mma.sync path; zero-filled rows and K
// tails convert to zeros.
// Block scales (kBlockScale, fp8): one 128-element scale block of K is 4 k-tiles of 32. The k-tiles' MMAs accumulate
// into a second register tile `part`; after a block's last k-tile (or K's last) the thread promotes, acc += part x
// sa[row, kb] x sb[e, n block, kb], in fp32, and clears part. A tile's 128 product columns (each SwiGLU half's 64)
// lie in one 128-column scale block (with SwiGLU n / 2 is a multiple of 128), so a thread needs the A scales of its 8
// rows and one B scale (two with SwiGLU: gate and up) per block; it loads a block's scales right after promoting the
// previous block, so they arrive while the block's MMAs run. Costs: the second register tile, 64 FMAs per 128 K.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "loom/config.hpp"
#include "loom/kernels/gemm/gemm_sm80.cuh"
#include "loom/kernels/moe/grouped_gemm_params.hpp"
#include "loom/kernels/moe/grouped_tiles.cuh"

namespace loom::kernels::moe {

// The per-128-block scales one thread of a tile needs (kBlockScale): A's of its rows r0 + 16 i + 8 h (i < 4, h < 2;
// clamped into A: rows past the group are zero-filled, their products 0) and the tile's B scale block (gate, and up
// with SwiGLU), one scale block kb at a time.
struct Sm80BlockScales {
    const float* a;     // scale_a_blocks of row r0 (this thread's first row; A's last row when r0 is past A)
    const float* b_lo;  // scale_b_blocks of (expert, the gate's or the tile's n block), k_blocks floats
    const float* b_hi;  // SwiGLU: the up half's; else b_lo
    int32_t rows_left;  // rows of A from that row on (>= 1)
    int32_t k_blocks;
    float sa[4][2], sb_lo, sb_hi;

    LOOM_DEVICE LOOM_FORCEINLINE void load(int kb) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int32_t dr = 16 * i + 8 * h < rows_left ? 16 * i + 8 * h : rows_left - 1;
                sa[i][h] = __ldg(a + static_cast<int64_t>(dr) * k_blocks + kb);
            }
        sb_lo = __ldg(b_lo + kb);
        sb_hi = __ldg(b_hi + kb);
    }
};

// One tile of grouped_gemm_sm80 (every thread of the CTA).
template <class TIn, class TOut, int STAGES, bool kBKMajor, GroupedAct kAct, bool kBlockScale, class Hooks>
LOOM_DEVICE LOOM_FORCEINLINE void grouped_tile_sm80(const Hooks& hooks, const GroupedTileGrid& grid,
                                                    const GroupedGemmArgs& args, int32_t linear, uint8_t* smem) {
    constexpr bool kSwiGLU = kAct == GroupedAct::SwiGLU;
    constexpr bool kFp8 = tile::kSameType<TIn, __nv_fp8_e4m3>;
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
    if constexpr (kFp8) {
        const uint8_t* a8 = reinterpret_cast<const uint8_t*>(a);
        const uint8_t* b8 = reinterpret_cast<const uint8_t*>(b);
        if constexpr (kBlockScale) {
            // Fragment (i, j, e) of acc: row 64 warp_m + 16 i + lane / 4 + 8 (e / 2), B column 32 warp_n + 8 j + ..
            // (SwiGLU: gate for j < 2, up for j >= 2).
            const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp_m = tid / 32 / 4;
            const int32_t r0 = t.row0 + warp_m * 64 + lane / 4;
            const int k_blocks = (args.k + kGroupedScaleBlock - 1) / kGroupedScaleBlock;
            const int n_blocks = (args.n + kGroupedScaleBlock - 1) / kGroupedScaleBlock;
            const float* sb = args.scale_b_blocks + static_cast<int64_t>(t.expert) * n_blocks * k_blocks;
            const float* sb_lo = sb + static_cast<int64_t>(col0 / kGroupedScaleBlock) * k_blocks;
            const int32_t a_row = r0 < args.rows ? r0 : args.rows - 1;
            const float* sb_hi =
                kSwiGLU ? sb + static_cast<int64_t>((half + col0) / kGroupedScaleBlock) * k_blocks : sb_lo;
            Sm80BlockScales sc{args.scale_a_blocks + static_cast<int64_t>(a_row) * k_blocks, sb_lo, sb_hi,
                               args.rows - a_row, k_blocks};
            sc.load(0);
            sm80_zero(acc);
            constexpr int kTilesPerBlock = kGroupedScaleBlock / kSm80BlockK;
            const int num_k_tiles = (args.k + kSm80BlockK - 1) / kSm80BlockK;
            float part[4][4][4];
            // After a scale block's last k-tile: acc += part x the block's scales, part := 0, the next block's scales.
            const auto promote = [&](int kt) {
                if ((kt + 1) % kTilesPerBlock != 0 && kt + 1 != num_k_tiles) return;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float s_b = kSwiGLU && j >= 2 ? sc.sb_hi : sc.sb_lo;
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            acc[i][j][e] += part[i][j][e] * (sc.sa[i][e / 2] * s_b);
                            part[i][j][e] = 0.f;
                        }
                    }
                }
                const int kb = kt / kTilesPerBlock;
                if (kb + 1 < k_blocks) sc.load(kb + 1);
            };
            sm80_tile_mainloop_e4m3<STAGES>(a8, args.lda, t.row0, t.row0 + t.rows, b8, args.ldb, args.n, args.k, b_col,
                                            part, smem, promote);
        } else {
            sm80_tile_mainloop_e4m3<STAGES>(a8, args.lda, t.row0, t.row0 + t.rows, b8, args.ldb, args.n, args.k, b_col,
                                            acc, smem, [](int) {});
        }
    } else {
        sm80_tile_mainloop<TIn, STAGES, kBKMajor>(a, args.lda, t.row0, t.row0 + t.rows, b, args.ldb, args.n, args.k,
                                                  b_col, acc, reinterpret_cast<TIn*>(smem));
    }

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

// TIn: __nv_bfloat16, __half, or __nv_fp8_e4m3 (kBKMajor only). TOut: __nv_bfloat16, __half or float.
// args.a / args.b: A [rows, k] (lda) and B, E experts stacked: [E * n, k] (kBKMajor) or [E * k, n] (ldb).
// kBlockScale: args.scale_a_blocks / scale_b_blocks (both non-null) scale each 128-K block (fp8 in; with SwiGLU n / 2
// a multiple of 128).
// Grid: (upper bound of the tiles); block: kSm80Threads; dynamic smem: gemm_sm80_smem_bytes(STAGES) (fp8:
// gemm_sm80_e4m3_smem_bytes(STAGES)) + grouped_prefix_bytes(num_groups).
template <class TIn, class TOut, int STAGES, bool kBKMajor, int kActivation, class Hooks = GroupedNoHooks,
          bool kBlockScale = false>
__global__ void __launch_bounds__(kSm80Threads)
    grouped_gemm_sm80(const GroupedGemmArgs args, const __grid_constant__ Hooks hooks) {
    constexpr GroupedAct kAct = static_cast<GroupedAct>(kActivation);
    constexpr bool kSwiGLU = kAct == GroupedAct::SwiGLU;
    constexpr bool kFp8 = tile::kSameType<TIn, __nv_fp8_e4m3>;
    static_assert(STAGES >= 2 && STAGES <= 6, "STAGES in [2, 6]");
    static_assert(sizeof(TIn) == 2 || (kFp8 && kBKMajor), "inputs are bf16 or fp16, or fp8 e4m3 with B as [N, K]");
    static_assert(!kBlockScale || kFp8, "block scales: fp8 in");
    static_assert(GroupedHooks<Hooks>, "Hooks: a grouped tile order, trivially copyable (grouped_tiles.cuh)");
#if LOOM_ARCH >= 800
    constexpr int kOutCols = kSwiGLU ? kSm80BlockN / 2 : kSm80BlockN;
    extern __shared__ uint8_t smem_raw[];
    constexpr uint32_t kMainloopBytes = kFp8 ? gemm_sm80_e4m3_smem_bytes(STAGES) : gemm_sm80_smem_bytes(STAGES);
    int32_t* prefix = reinterpret_cast<int32_t*>(smem_raw + kMainloopBytes);
    __shared__ int32_t scan_scratch[kGroupedStaticSmemBytes / 4];  // the scan takes 32
    build_row_block_prefix<kSm80BlockM, kSm80Threads>(args, prefix, scan_scratch);
    const GroupedTileGrid grid{prefix, args.num_groups, prefix[args.num_groups], (args.n_out + kOutCols - 1) / kOutCols,
                               args.group_m};
    for (int32_t linear = static_cast<int32_t>(blockIdx.x); linear < grid.num_tiles();
         linear += static_cast<int32_t>(gridDim.x)) {
        __syncthreads();  // the previous tile's last shared-memory reads are done before this tile's copies
        grouped_tile_sm80<TIn, TOut, STAGES, kBKMajor, kAct, kBlockScale>(hooks, grid, args, linear, smem_raw);
    }
#else
    __trap();
#endif
}

}  // namespace loom::kernels::moe
