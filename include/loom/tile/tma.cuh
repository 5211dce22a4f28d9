// TMA tiles: loading 2-D boxes of a row-major global matrix into 128B-swizzled shared memory.
//
// The host encodes one tensor map per operand (loom/runtime/tma.hpp, make_tma_2d) with a box of
// kSwizzleElems (one 128-byte row) by `rows`; the swizzle pattern TMA writes is the one wgmma's 128B-swizzle
// descriptors read (wgmma.cuh), so tiles go from global memory to the tensor cores untouched.
#pragma once

#include "loom/config.hpp"
#include "loom/ptx/tma.cuh"

namespace loom::tile {

using ptx::TmaDescriptor;

// Elements of T in one 128-byte swizzle row: the K extent of one K-major box (64 for bf16/fp16).
template <class T>
inline constexpr int kSwizzleElems = 128 / static_cast<int>(sizeof(T));

// Bytes of a 128B-swizzled box of `rows` rows; it must start 1024-byte aligned (8 rows = one swizzle atom).
LOOM_HOST_DEVICE constexpr uint32_t swizzled_box_bytes(int rows) { return static_cast<uint32_t>(rows) * 128u; }

// Load a K-major tile: `rows` rows starting at row r0, kSwizzleElems columns starting at column c0 (one box).
LOOM_DEVICE LOOM_FORCEINLINE void tma_load_tile(void* smem, const TmaDescriptor* tmap, uint64_t* bar, int c0, int r0) {
    ptx::tma_load_2d(smem, tmap, bar, c0, r0);
}

// Load an MN-major tile of `kCols` columns (a multiple of the swizzle width) by the box's rows: kCols / 64
// boxes side by side in global memory, stacked one after the other in shared memory (each rows * 128 bytes).
template <int kCols, int kBoxCols, int kBoxRows>
LOOM_DEVICE LOOM_FORCEINLINE void tma_load_tile_mn(void* smem, const TmaDescriptor* tmap, uint64_t* bar, int c0,
                                                   int r0) {
    static_assert(kCols % kBoxCols == 0, "MN-major tile width must be a multiple of the box width");
#pragma unroll
    for (int j = 0; j < kCols / kBoxCols; ++j)
        ptx::tma_load_2d(static_cast<char*>(smem) + j * swizzled_box_bytes(kBoxRows), tmap, bar, c0 + j * kBoxCols, r0);
}

}  // namespace loom::tile
