// Persistent tile scheduler of the Hopper GEMM.
//
// A persistent kernel launches about one CTA per SM; CTA b walks the linear tile indices b, b + gridDim.x, ...
// and the hooks policy's tile order (tile/hooks.cuh: TileOrder) maps each linear index to an output tile. The default
// order (GemmNoHooks) is grouped ("swizzled") raster: `group_m` consecutive M-blocks are swept across all N-blocks
// before the next group, so the CTAs running at the same time share A rows and B columns in L2.
#pragma once

#include "loom/config.hpp"
#include "loom/tile/hooks.cuh"
#include "loom/tile/tile_order.hpp"

namespace loom::tile {

// A compile-time bool, as a constructor's tag.
template <bool B>
struct BoolConstant {
    static constexpr bool value = B;
};

// The scheduler's grid type: with kFastOrder the host's divisors come along (FastTileGrid), else the plain TileGrid,
// whose order divides.
template <bool kFastOrder>
struct SchedulerGridOf {
    using type = FastTileGrid;
};
template <>
struct SchedulerGridOf<false> {
    using type = TileGrid;
};

// Walks this CTA's tiles: blockIdx.x, blockIdx.x + gridDim.x, ... Producer and consumers each own a copy and
// see the same sequence (next_tile), or, with the split-K tail of the plain GEMM, the same work units (next_unit).
//
// With CLUSTER_M > 1 (clusters of CLUSTER_M consecutive CTAs along x, sharing the B tile by TMA multicast) the
// policy orders cluster tiles: a grid of ceil(num_m / CLUSTER_M) x num_n, cluster c walking c, c + #clusters,
// ...; CTA rank r of the cluster takes M-block CLUSTER_M * m + r. Every CTA of a cluster thus walks the same
// number of tiles (the multicast needs all of them); a rank whose M-block lies past M gets rows <= 0 (its loads
// are zero-filled, its stores clipped, its hooks skipped).
//
// With CLUSTER_K > 1 (clusters of CLUSTER_K consecutive CTAs along x that split each tile's K; CLUSTER_M 1) every CTA
// of a cluster takes the cluster's tiles, the same ones: cluster c walks c, c + #clusters, ...
template <int BLOCK_M, int BLOCK_N, TileOrder Hooks, int CLUSTER_M = 1, bool kFastOrder = true, int CLUSTER_K = 1>
struct PersistentScheduler {
    static_assert(CLUSTER_M == 1 || CLUSTER_K == 1, "clusters along M or along K, not both");
    static constexpr int kClusterSize = CLUSTER_M * CLUSTER_K;
    // scheduler_grid(m, n, ...), with the host's divisors when kFastOrder (the hooks' orders then multiply and shift
    // instead of dividing: hooks take either grid type).
    using Grid = typename SchedulerGridOf<kFastOrder>::type;
    Grid grid;
    int32_t m, n;
    int32_t next;
    int32_t rank;

    // g: the host's scheduler_grid with its divisors (GemmArgs::grid). kCountBlocks: the M- and N-block counts are
    // computed here (scheduler_grid's formula, in 32 bits: keep the two alike), divisions by the compile-time tile
    // sizes, rather than read from g in the parameters where used:
    // read there, they made GEMM+ReduceScatter's fused-epilogue kernels spill 16-20 bytes; the split-tail kernels
    // (kCountBlocks false) spilled 4-16 bytes the other way.
    template <bool kCountBlocks>
    LOOM_DEVICE PersistentScheduler(int32_t m_, int32_t n_, const FastTileGrid& g, BoolConstant<kCountBlocks>)
        : grid(static_cast<const Grid&>(g)), m(m_), n(n_) {
        if constexpr (kCountBlocks) {
            grid.num_m = ((m + BLOCK_M - 1) / BLOCK_M + CLUSTER_M - 1) / CLUSTER_M;
            grid.num_n = (n + BLOCK_N - 1) / BLOCK_N;
        }
        next = static_cast<int32_t>(blockIdx.x) / kClusterSize;
        rank = static_cast<int32_t>(blockIdx.x) % CLUSTER_M;
    }

    LOOM_DEVICE LOOM_FORCEINLINE bool next_tile(const Hooks& hooks, TileCoord& t) {
        if (next >= grid.num_tiles()) return false;
        set_tile(hooks, next, t);
        next += static_cast<int32_t>(gridDim.x) / kClusterSize;
        return true;
    }
    // next_tile in two steps, for a caller that looks a tile up early and keeps it in few registers: the policy's
    // order (the divisions) gives the tile's blocks, m_block -1 when this CTA has no tile left; set_blocks then
    // fills in the rest of the coordinates.
    LOOM_DEVICE LOOM_FORCEINLINE void next_blocks(const Hooks& hooks, int32_t& m_block, int32_t& n_block) {
        if (next >= grid.num_tiles()) {
            m_block = -1;
            return;
        }
        hooks.tile_order(next, grid, m_block, n_block);
        next += static_cast<int32_t>(gridDim.x) / kClusterSize;
    }
    LOOM_DEVICE LOOM_FORCEINLINE void set_blocks(int32_t m_block, int32_t n_block, TileCoord& t) const {
        t.m_block = m_block * CLUSTER_M + rank;
        t.n_block = n_block;
        set_extent(t);
    }

    // Split-K tail (tile_order.hpp: split_tail_unit; single-CTA tiles only): walks work units instead of tiles.
    // `t` is the unit's tile in the policy's order, `w` its split and k-blocks. units (split_tail_units),
    // dp_tiles, splits and num_k_blocks are the launch's: the producer and the consumers pass the same values and so
    // see the same units.
    LOOM_DEVICE LOOM_FORCEINLINE bool next_unit(const Hooks& hooks, int32_t units, int32_t dp_tiles, int32_t splits,
                                                int32_t num_k_blocks, TileCoord& t, WorkUnit& w) {
        static_assert(CLUSTER_M == 1, "the split tail walks single-CTA tiles");
        if (next >= units) return false;
        w = split_tail_unit(next, dp_tiles, splits, num_k_blocks);
        set_tile(hooks, w.linear, t);
        next += static_cast<int32_t>(gridDim.x);
        return true;
    }

  private:
    LOOM_DEVICE LOOM_FORCEINLINE void set_tile(const Hooks& hooks, int32_t linear, TileCoord& t) const {
        hooks.tile_order(linear, grid, t.m_block, t.n_block);
        t.m_block = t.m_block * CLUSTER_M + rank;
        set_extent(t);
    }
    LOOM_DEVICE LOOM_FORCEINLINE void set_extent(TileCoord& t) const {
        t.row0 = t.m_block * BLOCK_M;
        t.col0 = t.n_block * BLOCK_N;
        t.rows = (m - t.row0) < BLOCK_M ? (m - t.row0) : BLOCK_M;
        t.cols = (n - t.col0) < BLOCK_N ? (n - t.col0) : BLOCK_N;
    }
};

}  // namespace loom::tile
