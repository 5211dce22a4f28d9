// One k-block of a consumer warpgroup's MMAs: the four wgmma k-steps over one 128-byte-wide stage of A and B in
// shared memory, 128B-swizzled as the TMA loads of tile/tma.cuh leave them.
//
// Contract: a_tile is the warpgroup's 64 rows of A (K-major, 8-row atoms 1024 B apart); b_tile is B's stage,
// K-major ([BLOCK_N rows, 128 B]) or N-major (64-column boxes of kBlockK k-rows x 128 B side by side). With
// accumulate false the first k-step overwrites acc, otherwise every step adds to it. The caller fences the operands
// before and commits / waits the group after: only the issue of the MMAs is shared.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "loom/config.hpp"
#include "loom/ptx/wgmma.cuh"
#include "loom/tile/epilogue.cuh"
#include "loom/tile/tma.cuh"

namespace loom::tile {

template <int BLOCK_N, class TIn, bool kBKMajor>
LOOM_DEVICE LOOM_FORCEINLINE void wgmma_k_block(float (&acc)[BLOCK_N / 2], const uint8_t* a_tile, const uint8_t* b_tile,
                                                bool accumulate) {
    constexpr bool kFp8 = kSameType<TIn, __nv_fp8_e4m3>;
    constexpr bool kBF16 = kSameType<TIn, __nv_bfloat16>;
    constexpr int kBlockK = 128 / static_cast<int>(sizeof(TIn));  // elements of one 128-byte row
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        // K-major, 128B swizzle: 8-row atoms 1024 B apart; a k16 (fp8: k32) step is 32 B along the row.
        const uint64_t da = ptx::wgmma_smem_desc(a_tile + kk * 32, 0, 1024, ptx::SmemSwizzle::B128);
        uint64_t db;
        if constexpr (kBKMajor) {
            db = ptx::wgmma_smem_desc(b_tile + kk * 32, 0, 1024, ptx::SmemSwizzle::B128);
        } else {
            // N-major: 64-column boxes (kBlockK k-rows x 128 B) side by side (LBO), 8-k-row atoms 1024 B apart
            // (SBO); a k16 step is 16 rows = 2 KiB.
            db = ptx::wgmma_smem_desc(b_tile + kk * 2048, swizzled_box_bytes(kBlockK), 1024, ptx::SmemSwizzle::B128);
        }
        const int scale_d = (accumulate || kk > 0) ? 1 : 0;
        if constexpr (kFp8) {
            ptx::wgmma_m64k32_e4m3<BLOCK_N>(acc, da, db, scale_d);
        } else {
            ptx::wgmma_m64k16<BLOCK_N, kBF16, 0, kBKMajor ? 0 : 1>(acc, da, db, scale_d);
        }
    }
}

}  // namespace loom::tile
