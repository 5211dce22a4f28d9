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

// n / d for 0 <= n < 2^31 by a multiply-high, an add and a shift, with d (1 <= d < 2^31) fixed in advance: with
// l = ceil(log2 d) and mul = floor(2^32 (2^l - d) / d) + 1, n / d = (umulhi(n, mul) + n) >> l (Granlund and
// Montgomery's round-up method; the sum stays below 2^32 because umulhi(n, mul) < n). A division by a runtime value is
// ~15 dependent instructions on the GPU (a float reciprocal and corrections).
struct FastDiv {
    uint32_t mul;
    uint32_t shift;

    LOOM_HOST_DEVICE static constexpr FastDiv of(int32_t d) {
        uint32_t l = 0;
        while ((uint64_t{1} << l) < static_cast<uint64_t>(d)) ++l;
        const uint64_t m =
            ((uint64_t{1} << 32) * ((uint64_t{1} << l) - static_cast<uint64_t>(d))) / static_cast<uint64_t>(d);
        return FastDiv{static_cast<uint32_t>(m + 1), l};
    }
    LOOM_HOST_DEVICE int32_t div(int32_t n) const {
        const uint32_t u = static_cast<uint32_t>(n);
#if defined(__CUDA_ARCH__)
        const uint32_t hi = __umulhi(u, mul);
#else
        const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(u) * mul) >> 32);
#endif
        return static_cast<int32_t>((hi + u) >> shift);
    }
};

// A tile grid with its grouped order's divisors, made once on the host (FastTileGrid::of) and passed to the persistent
// GEMM in its arguments: the scheduler then maps a tile index with multiplies and shifts read from the constant bank.
// (Two divisions by runtime values were a chain of ~30 dependent instructions on the boundary between two tiles, where
// the tensor cores idle.) Packed into 28 bytes: GemmArgs must stay within 128 (its static
// assert says why).
struct FastTileGrid : TileGrid {
    uint32_t mul[3];   // FastDiv multipliers: by group_m x num_n, by group_m, by the last group's M-blocks
    uint8_t shift[3];  // and their shifts

    LOOM_HOST_DEVICE FastDiv per_group() const { return FastDiv{mul[0], shift[0]}; }
    LOOM_HOST_DEVICE FastDiv group_rows() const { return FastDiv{mul[1], shift[1]}; }
    LOOM_HOST_DEVICE FastDiv last_rows() const { return FastDiv{mul[2], shift[2]}; }

    LOOM_HOST_DEVICE static constexpr FastTileGrid of(const TileGrid& g) {
        const int32_t groups = (g.num_m + g.group_m - 1) / g.group_m;
        const FastDiv d[3] = {FastDiv::of(g.group_m * g.num_n), FastDiv::of(g.group_m),
                              FastDiv::of(g.num_m - (groups - 1) * g.group_m)};
        return FastTileGrid{
            g,
            {d[0].mul, d[1].mul, d[2].mul},
            {static_cast<uint8_t>(d[0].shift), static_cast<uint8_t>(d[1].shift), static_cast<uint8_t>(d[2].shift)}};
    }
};

// The grid the persistent GEMM's scheduler walks (tile/scheduler.cuh): ceil(ceil(m / block_m) / cluster_m) x
// ceil(n / block_n) tiles (of clusters along M), raster groups of max(group_m / cluster_m, 1); the host makes it, with
// its divisors, for GemmArgs::grid. (PersistentScheduler recounts the blocks on the device with the same formula.)
LOOM_HOST_DEVICE constexpr TileGrid scheduler_grid(int64_t m, int64_t n, int block_m, int block_n, int cluster_m,
                                                   int group_m) {
    const int64_t blocks_m = (m + block_m - 1) / block_m;
    const int32_t num_m = static_cast<int32_t>((blocks_m + cluster_m - 1) / cluster_m);
    // A group of more rows than the grid has is one group of all of them (the same order), and keeps group_m x num_n
    // inside int32.
    const int32_t g = group_m / cluster_m < num_m ? group_m / cluster_m : num_m;
    return TileGrid{num_m, static_cast<int32_t>((n + block_n - 1) / block_n), g < 1 ? 1 : g};
}

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
// The same order with the host's divisors (0 <= linear < num_tiles).
LOOM_HOST_DEVICE inline void grouped_order(int32_t linear, const FastTileGrid& g, int32_t& m_block, int32_t& n_block) {
    const int32_t group = g.per_group().div(linear);
    const int32_t first_m = group * g.group_m;
    const bool last = g.num_m - first_m < g.group_m;
    const int32_t rows_in_group = last ? g.num_m - first_m : g.group_m;
    const int32_t in_group = linear - group * (g.group_m * g.num_n);
    n_block = (last ? g.last_rows() : g.group_rows()).div(in_group);
    m_block = first_m + (in_group - n_block * rows_in_group);
}

// Rank-rotated order for the overlapped GEMMs: the grouped order over M-blocks shifted by `shift_m` blocks (e.g.
// the first block of this rank's rows), wrapping around, so the tiles whose operands are local come first.
// Contract: 0 <= shift_m < num_m (the host's plans guarantee it). The wrap is a compare and subtract: a `% num_m`
// in the consumers' tile loop, next to 128 live accumulators, made the 128 x 256 GEMM spill 48 / 12 bytes; this
// form has none (tests/unit/test_overlap_compile.cpp). Grid: TileGrid, or FastTileGrid (the GEMM's scheduler's).
template <class Grid>
LOOM_HOST_DEVICE inline void rotated_order(int32_t linear, const Grid& g, int32_t shift_m, int32_t& m_block,
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
