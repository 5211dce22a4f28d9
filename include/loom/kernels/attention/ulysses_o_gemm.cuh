// a2a_o_gemm's fused GEMM policy (docs/attention.md "Ulysses sequence parallelism"): the output projection
// out[S / W, hidden] = gathered[S / W, Hq D] * W_o[hidden, Hq D]^T, with the persistent Hopper GEMM
// (kernels/gemm/gemm.cuh) reading the gathered operand while ulysses_o_a2a (ulysses.cuh) fills it. Before a tile's
// operands load, its producer thread waits (acquire, sys) until every rank's chunks holding the tile's rows arrived
// in this call; the kernel then fences the async proxy, so the TMA loads see them. Grouped raster order: the first
// M-blocks' tiles come first, as the chunks do.
#pragma once

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 1  // wgmma kernel in this TU: no printf anywhere (ptxas C7510)
#endif

#include "loom/kernels/attention/ulysses_params.hpp"
#include "loom/kernels/gemm/gemm.cuh"
#include "loom/lang/spin.cuh"

namespace loom::kernels::attention {

struct UlyssesOGemmHooks {
    UlyssesOHookArgs a;

    template <class Grid>
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const Grid& g, int32_t& m_block,
                                                 int32_t& n_block) const {
        tile::grouped_order(linear, g, m_block, n_block);
    }
    LOOM_DEVICE LOOM_FORCEINLINE void before_load(const tile::TileCoord& t) const {
        const int32_t first = t.row0 / a.chunk_rows, last = (t.row0 + t.rows - 1) / a.chunk_rows;
        for (int32_t c = first; c <= last; ++c)
            for (int32_t q = 0; q < a.world; ++q)
                lang::wait_ge_sys_or_trap(a.arrived + static_cast<int64_t>(q) * kUlyssesMaxChunks + c, a.epoch,
                                          a.timeout_ns, "a2a_o_gemm: GEMM waits for a chunk");
    }
    LOOM_DEVICE LOOM_FORCEINLINE uint64_t wait_bound_ns() const { return a.timeout_ns; }
};
static_assert(tile::GemmHooks<UlyssesOGemmHooks> && tile::LoadWait<UlyssesOGemmHooks> &&
              !tile::StoreNotify<UlyssesOGemmHooks> && !tile::ScalesAccumulators<UlyssesOGemmHooks>);

}  // namespace loom::kernels::attention
