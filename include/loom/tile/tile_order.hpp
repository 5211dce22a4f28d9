// Tile grids and tile orders, host and device: the persistent GEMM's scheduler (tile/scheduler.cuh) walks them,
// and the host plans and communication kernels of the overlapped ops follow the same order
// (kernels/overlap_params.hpp).
#pragma once

#include "loom/config.hpp"

namespace loom::tile {

struct TileGrid {
    int32_t num_m;    // M-blocks
    int32_t num_n;    // N-blocks
    int32_t group_m;  // M-blocks per raster group (>= 1)
    LOOM_HOST_DEVICE int32_t num_tiles() const { return num_m * num_n; }
};

// An output tile: block coordinates and the element rectangle it covers (clipped to the matrix).
struct TileCoord {
    int32_t m_block, n_block;
    int32_t row0, col0;  // first row / column
    int32_t rows, cols;  // extent inside the matrix (<= BLOCK_M / BLOCK_N at the tails)
};

// Grouped raster order over a grid of num_m x num_n blocks: linear index -> (m_block, n_block).
LOOM_HOST_DEVICE inline void grouped_order(int32_t linear, const TileGrid& g, int32_t& m_block, int32_t& n_block) {
    const int32_t per_group = g.group_m * g.num_n;
    const int32_t group = linear / per_group;
    const int32_t first_m = group * g.group_m;
    const int32_t rows_in_group = (g.num_m - first_m) < g.group_m ? (g.num_m - first_m) : g.group_m;
    const int32_t in_group = linear - group * per_group;
    m_block = first_m + in_group % rows_in_group;
    n_block = in_group / rows_in_group;
}

// Rank-rotated order for the overlapped GEMMs: the grouped order over M-blocks shifted by `shift_m` blocks (e.g.
// the first block of this rank's rows), wrapping around, so the tiles whose operands are local come first.
// Contract: 0 <= shift_m < num_m (the host's plans guarantee it). The wrap is a compare and subtract: a `% num_m`
// in the consumers' tile loop, next to 128 live accumulators, made the 128 x 256 GEMM spill 48 / 12 bytes; this
// form has none (tests/unit/test_overlap_compile.cpp).
LOOM_HOST_DEVICE inline void rotated_order(int32_t linear, const TileGrid& g, int32_t shift_m, int32_t& m_block,
                                           int32_t& n_block) {
    grouped_order(linear, g, m_block, n_block);
    m_block += shift_m;
    if (m_block >= g.num_m) m_block -= g.num_m;
}

}  // namespace loom::tile
