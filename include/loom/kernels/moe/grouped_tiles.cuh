// The grouped GEMM's tile space and its hooks protocols (shared by grouped_gemm.cuh and grouped_gemm_sm80.cuh).
//
// Tile space. Group g's rows [start_g, end_g) (offsets clamped to [0, rows], end_g >= start_g) make
// ceil((end_g - start_g) / BLOCK_M) row blocks; the groups' row blocks, in group order, are the rows of one virtual
// grid of num_row_blocks x num_n tiles. Each CTA builds prefix[g] = row blocks before group g (int32[G + 1], shared
// memory) from the device offsets when it starts, so no host synchronisation and no workspace: the grid is planned on
// the host from an upper bound only. A linear tile index goes through the hooks' tile order to (row block, n block);
// the row block's group is the last g with prefix[g] <= row block (a binary search in shared memory), which skips
// empty groups by construction.
//
// Hooks (a policy is the kernels' `Hooks` template parameter: trivially copyable, a __grid_constant__ parameter;
// the kernels compile the calls of the protocols it models only):
//   GroupedTileOrder    tile_order(linear, grid, row_block, n_block)   every policy; the producer and the consumers
//                       call it with the same arguments and must get the same tile (a function of the index, the
//                       grid and the policy's fields). GroupedNoHooks: grouped raster; GroupedRotatedOrder: the same,
//                       starting at a given group's first row block (e.g. a rank's own source-rank groups first).
//   GroupedLoadWait     before_load(group, tile_row0)   the producer thread (Hopper) or every thread (sm_80, before
//                       the tile's first copy), once per tile, before its first operand load; waits (acquire) until
//                       the tile's A rows are in place. The Hopper kernel then fences the async proxy.
//                       wait_bound_ns()   that wait's bound (0: none): the Hopper consumers, waiting behind the
//                       producer, outlast it (tile::outlast_cycles), so a missing signal is reported by its name.
//   GroupedStoreNotify  after_store(group, tile_row0, rows, n_block)   thread 0, per tile, once every thread's stores
//                       of the tile are done and a barrier of the storing threads passed: all the tile's stores
//                       happen-before the call. The hook publishes with a release at its readers' scope.
// A policy states what it implements next to its definition, e.g.
//   static_assert(kernels::moe::GroupedHooks<P> && kernels::moe::GroupedLoadWait<P>);
#pragma once

#include "loom/config.hpp"
#include "loom/kernels/moe/grouped_gemm_params.hpp"
#include "loom/tile/block_scan.cuh"
#include "loom/tile/epilogue.cuh"
#include "loom/tile/tile_order.hpp"

namespace loom::kernels::moe {

// The tile space as the tile order sees it. prefix: shared memory, int32[num_groups + 1].
struct GroupedTileGrid {
    const int32_t* prefix;
    int32_t num_groups;
    int32_t num_row_blocks;  // prefix[num_groups]
    int32_t num_n;
    int32_t group_m;
    LOOM_HOST_DEVICE int32_t num_tiles() const { return num_row_blocks * num_n; }
    LOOM_HOST_DEVICE tile::TileGrid raster() const { return tile::TileGrid{num_row_blocks, num_n, group_m}; }
};

// A tile of the grouped GEMM: rows [row0, row0 + rows) of A and C (rows >= 1, all in `group`), product columns
// [n_block x BLOCK_N, ...) of expert `expert`.
struct GroupedTile {
    int32_t group, expert;
    int32_t row0, rows;
    int32_t n_block;
};

template <class H>
concept GroupedTileOrder = requires(const H& h, int32_t linear, const GroupedTileGrid& g, int32_t& rb, int32_t& nb) {
    h.tile_order(linear, g, rb, nb);
};
template <class H>
concept GroupedLoadWait = requires(const H& h, int32_t group, int32_t row0) {
    h.before_load(group, row0);
};
template <class H>
concept GroupedStoreNotify = requires(const H& h, int32_t group, int32_t row0, int32_t rows, int32_t nb) {
    h.after_store(group, row0, rows, nb);
};
template <class H>
concept GroupedHooks = GroupedTileOrder<H> && __is_trivially_copyable(H);

// The default policy: grouped raster over the row blocks, nothing else.
struct GroupedNoHooks {
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const GroupedTileGrid& g, int32_t& rb,
                                                 int32_t& nb) const {
        tile::grouped_order(linear, g.raster(), rb, nb);
    }
};
static_assert(GroupedHooks<GroupedNoHooks> && !GroupedLoadWait<GroupedNoHooks> && !GroupedStoreNotify<GroupedNoHooks>);

// Grouped raster rotated to start at group first_group's first row block (wrapping around). 0 <= first_group <=
// num_groups (num_groups: no rotation).
struct GroupedRotatedOrder {
    int32_t first_group;
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const GroupedTileGrid& g, int32_t& rb,
                                                 int32_t& nb) const {
        tile::grouped_order(linear, g.raster(), rb, nb);
        rb += g.prefix[first_group];
        if (rb >= g.num_row_blocks) rb -= g.num_row_blocks;
    }
};
static_assert(GroupedHooks<GroupedRotatedOrder>);

#if defined(__CUDACC__)

// Group g's rows [start, end), clamped to [0, rows] with end >= start (offsets that are not non-decreasing never
// reach outside C).
LOOM_DEVICE LOOM_FORCEINLINE void group_rows(const GroupedGemmArgs& args, int32_t g, int32_t& start, int32_t& end) {
    const int32_t lo = __ldg(args.offsets + g), hi = __ldg(args.offsets + g + 1);
    start = lo < 0 ? 0 : (lo > args.rows ? args.rows : lo);
    end = hi < start ? start : (hi > args.rows ? args.rows : hi);
}

// Every thread of the CTA (kThreads of them, a multiple of 32, <= 1024): prefix[g] = row blocks of the groups before
// g, g in [0, num_groups]. Returns after a __syncthreads (the prefix visible to all). scratch: 32 ints of shared
// memory.
template <int BLOCK_M, int kThreads>
LOOM_DEVICE void build_row_block_prefix(const GroupedGemmArgs& args, int32_t* prefix, int32_t* scratch) {
    static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32");
    auto blocks = [&](int g) {
        int32_t s, e;
        group_rows(args, g, s, e);
        return (e - s + BLOCK_M - 1) / BLOCK_M;
    };
    tile::block_exclusive_prefix(args.num_groups, blocks, prefix, scratch, kThreads);
}

// The group of row block rb (0 <= rb < prefix[G]): the last g < G with prefix[g] <= rb (never an empty group).
LOOM_DEVICE LOOM_FORCEINLINE int32_t group_of_row_block(const GroupedTileGrid& grid, int32_t rb) {
    int32_t lo = 0, hi = grid.num_groups - 1;  // answer in [lo, hi]
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (grid.prefix[mid] <= rb) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// The tile of linear index `linear` in the hooks' order.
template <int BLOCK_M, class Hooks>
LOOM_DEVICE LOOM_FORCEINLINE GroupedTile grouped_tile(const Hooks& hooks, const GroupedTileGrid& grid,
                                                      const GroupedGemmArgs& args, int32_t linear) {
    int32_t rb, nb;
    hooks.tile_order(linear, grid, rb, nb);
    GroupedTile t;
    t.group = group_of_row_block(grid, rb);
    t.expert = t.group % args.num_experts;
    int32_t start, end;
    group_rows(args, t.group, start, end);
    t.row0 = start + (rb - grid.prefix[t.group]) * BLOCK_M;
    t.rows = end - t.row0 < BLOCK_M ? end - t.row0 : BLOCK_M;
    t.n_block = nb;
    return t;
}

// The products' scale of expert e: alpha x scale_a x scale_b[e] (absent scales 1).
LOOM_DEVICE LOOM_FORCEINLINE float grouped_scale(const GroupedGemmArgs& args, int32_t e) {
    float s = args.alpha;
    if (args.scale_a != nullptr) s *= *args.scale_a;
    if (args.scale_b != nullptr) s *= args.scale_b[e];
    return s;
}

LOOM_DEVICE LOOM_FORCEINLINE float gelu_erf(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
LOOM_DEVICE LOOM_FORCEINLINE float silu(float x) { return x / (1.f + __expf(-x)); }

// The element-wise activation of a scaled pair (GeLU; SwiGLU is applied where gate and up meet, None is identity).
template <GroupedAct kAct>
LOOM_DEVICE LOOM_FORCEINLINE void grouped_activate(float& x, float& y) {
    if constexpr (kAct == GroupedAct::GeLU) {
        x = gelu_erf(x);
        y = gelu_erf(y);
    }
}

// Stores the pair (x, y) of product columns (col, col + 1) of row `row` (None / GeLU), or (kAct SwiGLU) the pair
// silu(gate) * up of output columns (col, col + 1): masked to rows < row_end and columns < n_out (even).
template <class TOut, GroupedAct kAct>
LOOM_DEVICE LOOM_FORCEINLINE void grouped_store_pair(const GroupedGemmArgs& args, int32_t row, int32_t row_end,
                                                     int32_t col, float x, float y) {
    if (row >= row_end || col >= args.n_out) return;
    grouped_activate<kAct>(x, y);
    TOut* p = static_cast<TOut*>(args.c) + static_cast<int64_t>(row) * args.ldc + col;
    tile::store_pair(p, x, y);
}

#endif  // __CUDACC__

}  // namespace loom::kernels::moe
