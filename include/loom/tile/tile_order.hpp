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

// Stream-K tail (the plain GEMM's alternative to the split tail above, for a last wave more than half full): the
// tail tiles' k-blocks, flattened tile by tile into L = tail_tiles x num_k_blocks, are cut into `pieces` (= G)
// contiguous ranges of L / pieces k-blocks, piece c = [B(c), B(c + 1)) with B(c) = floor(c L / pieces), so that
// every CTA of the grid does the same share of the tail. With pieces >= tail_tiles a piece spans at most two tiles:
// its part 0 in the tile where it starts, its part 1 (maybe empty) at the start of the next. Work unit u:
//   u <  dp_tiles   the whole tile u
//   u >= dp_tiles   part (u - dp_tiles) / pieces of piece (u - dp_tiles) % pieces
// so CTA b (< pieces = G) walks its whole tiles, then part 0 and part 1 of piece b. A unit's split is its piece's
// place among the pieces that cover its tile (streamk_tile_pieces), the slot its partial sum takes.
LOOM_HOST_DEVICE inline int32_t streamk_tail_units(int32_t dp_tiles, int32_t pieces) { return dp_tiles + 2 * pieces; }

// The piece holding flattened tail k-block x: the largest c with B(c) <= x.
LOOM_HOST_DEVICE inline int32_t streamk_piece_of(int64_t x, int64_t total, int32_t pieces) {
    return static_cast<int32_t>(((x + 1) * pieces - 1) / total);
}
LOOM_HOST_DEVICE inline int64_t streamk_piece_begin(int32_t c, int64_t total, int32_t pieces) {
    return static_cast<int64_t>(c) * total / pieces;
}

// The pieces that cover tail tile `tail` (0-based among the tail tiles): the first one and how many.
LOOM_HOST_DEVICE inline void streamk_tile_pieces(int32_t tail, int32_t tail_tiles, int32_t pieces, int32_t num_k_blocks,
                                                 int32_t& first, int32_t& count) {
    const int64_t total = static_cast<int64_t>(tail_tiles) * num_k_blocks;
    const int64_t x0 = static_cast<int64_t>(tail) * num_k_blocks;
    first = streamk_piece_of(x0, total, pieces);
    count = streamk_piece_of(x0 + num_k_blocks - 1, total, pieces) - first + 1;
}

LOOM_HOST_DEVICE inline WorkUnit streamk_tail_unit(int32_t unit, int32_t dp_tiles, int32_t tail_tiles, int32_t pieces,
                                                   int32_t num_k_blocks) {
    WorkUnit w;
    if (unit < dp_tiles) {
        w.linear = unit;
        w.split = -1;
        w.kb_begin = 0;
        w.kb_count = num_k_blocks;
        return w;
    }
    const int32_t v = unit - dp_tiles;
    const int32_t c = v % pieces, part = v / pieces;
    const int64_t total = static_cast<int64_t>(tail_tiles) * num_k_blocks;
    const int64_t begin = streamk_piece_begin(c, total, pieces), end = streamk_piece_begin(c + 1, total, pieces);
    int32_t tail = static_cast<int32_t>(begin / num_k_blocks);
    int64_t lo = begin, hi = static_cast<int64_t>(tail + 1) * num_k_blocks;  // part 0: up to the tile's end
    if (part > 0) {
        ++tail;
        lo = hi;
        hi = lo + num_k_blocks;
    }
    if (hi > end) hi = end;
    w.linear = dp_tiles + tail;
    w.kb_begin = static_cast<int32_t>(lo - static_cast<int64_t>(tail) * num_k_blocks);
    w.kb_count = hi > lo ? static_cast<int32_t>(hi - lo) : 0;  // 0: part 1 of a piece inside one tile
    w.split = c - (part > 0 ? c : streamk_piece_of(static_cast<int64_t>(tail) * num_k_blocks, total, pieces));
    return w;
}

}  // namespace loom::tile
