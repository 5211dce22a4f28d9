// Persistent tile schedulers and the GEMM overlap hooks.
//
// A persistent kernel launches about one CTA per SM; CTA b walks the linear tile indices b, b + gridDim.x, ...
// and a policy maps each linear index to an output tile. The default order is grouped ("swizzled") raster:
// `group_m` consecutive M-blocks are swept across all N-blocks before the next group, so the CTAs running at
// the same time share A rows and B columns in L2.
//
// Overlap hooks (template policy of the GEMM kernels; the default GemmNoHooks compiles to nothing):
//   tile_order(linear, grid, m_block, n_block)
//                        which output tile the linear index is: a custom order, e.g. rank-rotated so an
//                        AllGather+GEMM starts with the rows this rank already holds. grid is the scheduler's
//                        (a template parameter): a FastTileGrid (host-made, with the grouped order's divisors:
//                        grouped_order / rotated_order given it divide by multiplying) or a plain TileGrid.
//   before_load(tile)    called by the producer thread before the first TMA load of the tile's operands; waits
//                        (acquire) on a signal that the operands are in place. The kernel then issues
//                        fence.proxy.async.global so the TMA (async proxy) reads what the acquire made visible.
//   kRedirectsA          a_source(tile, map, row) (producer thread, per tile, after before_load) may point the
//                        tile's A loads at another tensor map (a __grid_constant__ parameter's, e.g. one inside the
//                        hooks: the kernel takes them __grid_constant__) and row; prefetch_a() (thread 0, once)
//                        prefetches that map. AllGather+GEMM reads this rank's own rows from its shard in place.
//   after_store(tile)    called by one consumer thread after every consumer thread stored its part of the
//                        tile and passed a named barrier, so all the tile's stores happen-before the call;
//                        the hook publishes with a release at its readers' scope (e.g. red.release.sys).
//   kEpilogueHooks       the hooks take over the TMA-store epilogue; each consumer warpgroup stages its whole
//                        64 x BLOCK_N part of the tile (not two rotating slabs). init_cta() (thread 0, before the
//                        CTA's first barrier); before_epilogue<TOut, BLOCK_M, BLOCK_N>(tile) (every consumer thread,
//                        before the tile is staged: the staging buffers must be free when it returns);
//                        store_tile<TOut, BLOCK_M, BLOCK_N>(tmap_d, staging, tile, n) (every thread of the warpgroup,
//                        once its part is staged and fenced: stores, sends or combines it; the accumulators are
//                        dead); finish<BLOCK_M>() (every consumer thread, after the CTA's last tile).
//                        GEMM+AllReduce's fused epilogue (kernels/gemm_ar.cuh) sends and sums its parts there.
//   kAccEpilogue         the hooks see the fp32 accumulators before the kernel's own epilogue (the plain per-warp
//                        TMA stores): init_cta() as above; epilogue_acc<TOut, BLOCK_M, BLOCK_N>(acc, tile) (every
//                        consumer thread after the mainloop: may send the accumulators elsewhere and return false, so
//                        the tile is not stored, or change them and return true); d_row_offset() (the stored tile goes
//                        to row t.row0 - offset of D); finish<BLOCK_M>() (every consumer thread, after the CTA's last
//                        tile). GEMM+ReduceScatter's fused epilogue (kernels/gemm_rs.cuh) pushes peers' tiles and sums
//                        its own there.
//   kAccRingCopies       (optional member, with kAccEpilogue; false when absent) copies of the tile's accumulators
//                        that the kernel adds after epilogue_acc returned true, streamed through the TMA ring: each
//                        copy is a whole tile of TOut in fragment order (warpgroup c's 64 x BLOCK_N part at
//                        c x 64 x BLOCK_N x sizeof(TOut), its thread i's 16-byte vector v at byte 16 (128 v + i) of the
//                        part), added in copy order. ring_copies<TOut, BLOCK_M, BLOCK_N>(tile) (the producer thread and
//                        every consumer thread, the same answer: how many, 0 for none); ring_wait<...>(tile) (the
//                        producer thread, after the tile's last k-block and before its copies' loads: waits, acquire,
//                        until every copy is in place; the kernel then fences the async proxy); ring_copy<...>(tile)
//                        and ring_copy_stride() (the producer thread: copy c at ring_copy + c x stride). The producer
//                        bulk-copies each part into the B slot of a ring stage (BLOCK_N x 128 bytes: one part of 16-bit
//                        TOut, half of an fp32 one), the consumers add their part from shared memory and release the
//                        stage. Nothing polls global memory on the consumers' path. GEMM+ReduceScatter's fused epilogue
//                        adds peers' copies there.
//   kSideWarps           (optional member; false when absent) the producer warpgroup's three warps that issue no TMA
//                        (32-127 of it) run side_warps<TOut, BLOCK_M, BLOCK_N>(thread) (thread 0-95) concurrently
//                        with the whole GEMM, and the CTA ends when they return. Neither role then changes its
//                        register budget (setmaxnreg): every thread keeps the launch bound's, which is what ptxas
//                        compiles the consumers for anyway. GEMM+ReduceScatter's fused pull (kernels/gemm_rs_pull.cuh)
//                        reduces the rank's own tiles there.
// Hooks objects are __grid_constant__ kernel parameters: trivially copyable runtime values (ranks, signal pointers,
// a tensor map).
#pragma once

#include "loom/config.hpp"
#include "loom/tile/tile_order.hpp"

namespace loom::tile {

// Whether a hooks policy runs side warps (kSideWarps above); a policy without the member runs none.
template <class Hooks>
inline constexpr bool kHasSideWarps = requires {
    requires Hooks::kSideWarps;
};
// Whether accumulator hooks stream copies of the tile through the ring (kAccRingCopies above).
template <class Hooks>
inline constexpr bool kHasAccRingCopies = requires {
    requires Hooks::kAccRingCopies;
};

// Policies whose kernel scales the accumulators right after the mainloop (GemmArgs::alpha times the device scales)
// instead of in the affine epilogue: accumulator hooks, which send and sum the accumulators themselves, and policies
// that say so (kScalesAccumulators: AgGemmHooks, whose 128 x 256 fp32-output epilogue spilled with a runtime scale).
// The host launchers mirror the choice (src/ops/overlap/overlap_state.hpp: ScaleAt).
template <class Hooks>
inline constexpr bool kScalesAccumulators = Hooks::kAccEpilogue || requires {
    requires Hooks::kScalesAccumulators;
};

// The default policy: grouped raster order, no waits, no notifications.
struct GemmNoHooks {
    static constexpr bool kWaitsBeforeLoad = false;
    static constexpr bool kRedirectsA = false;
    static constexpr bool kNotifiesAfterStore = false;
    static constexpr bool kEpilogueHooks = false;
    static constexpr bool kAccEpilogue = false;
    template <class Grid>
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const Grid& g, int32_t& m_block,
                                                 int32_t& n_block) const {
        grouped_order(linear, g, m_block, n_block);
    }
    LOOM_DEVICE LOOM_FORCEINLINE void before_load(const TileCoord&) const {}
    LOOM_DEVICE LOOM_FORCEINLINE void after_store(const TileCoord&) const {}
};

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
template <int BLOCK_M, int BLOCK_N, class Hooks, int CLUSTER_M = 1, bool kFastOrder = true>
struct PersistentScheduler {
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
        next = static_cast<int32_t>(blockIdx.x) / CLUSTER_M;
        rank = static_cast<int32_t>(blockIdx.x) % CLUSTER_M;
    }

    LOOM_DEVICE LOOM_FORCEINLINE bool next_tile(const Hooks& hooks, TileCoord& t) {
        if (next >= grid.num_tiles()) return false;
        set_tile(hooks, next, t);
        next += static_cast<int32_t>(gridDim.x) / CLUSTER_M;
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
        next += static_cast<int32_t>(gridDim.x) / CLUSTER_M;
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
