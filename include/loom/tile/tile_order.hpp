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

// Split-K tail of the persistent GEMM (tile/scheduler.cuh, kernels/gemm.cuh; docs/gemm.md "Split-K tail"): with G
// persistent CTAs the full waves' tiles, linear indices [0, dp_tiles), run whole, and each of the remaining
// tail tiles is split `splits` ways along K so that the last, partial wave fills more SMs. Work unit u:
//   u <  dp_tiles   the whole tile u (k-blocks [0, num_k_blocks))
//   u >= dp_tiles   split (u - dp_tiles) % splits of tile dp_tiles + (u - dp_tiles) / splits
// CTA b walks units b, b + G, ... The k-blocks are dealt as evenly as possible: split j gets q + (j < r) blocks,
// q = num_k_blocks / splits, r = num_k_blocks % splits, split 0 first (no products that overflow int32).
struct WorkUnit {
    int32_t linear;    // linear tile index (the tile order maps it to an output tile)
    int32_t split;     // -1: the whole tile; else the split in [0, splits)
    int32_t kb_begin;  // first k-block
    int32_t kb_count;  // k-blocks (>= 1 when num_k_blocks >= splits)
};

LOOM_HOST_DEVICE inline int32_t split_tail_units(int32_t tiles, int32_t dp_tiles, int32_t splits) {
    return dp_tiles + (tiles - dp_tiles) * splits;
}

LOOM_HOST_DEVICE inline WorkUnit split_tail_unit(int32_t unit, int32_t dp_tiles, int32_t splits, int32_t num_k_blocks) {
    WorkUnit w;
    if (unit < dp_tiles) {
        w.linear = unit;
        w.split = -1;
        w.kb_begin = 0;
        w.kb_count = num_k_blocks;
        return w;
    }
    const int32_t v = unit - dp_tiles;
    const int32_t tail = v / splits;
    w.linear = dp_tiles + tail;
    w.split = v - tail * splits;
    const int32_t q = num_k_blocks / splits, r = num_k_blocks - q * splits;
    w.kb_begin = w.split * q + (w.split < r ? w.split : r);
    w.kb_count = q + (w.split < r ? 1 : 0);
    return w;
}

}  // namespace loom::tile
