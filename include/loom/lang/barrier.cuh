// Cross-rank barriers over monotonic per-peer counters: no reset kernel, the epoch lives in device memory.
//
// State: one BarrierState per rank in the symmetric heap (world.alloc<lang::BarrierState>(1), zeroed once at
// allocation; never again). arrivals[i] counts the barriers local rank i has entered; epoch counts this rank's
// own barriers. Barrier number e (1, 2, ...) adds 1 to arrivals[me] on every peer (release) and waits until
// arrivals[i] >= e for every peer i (acquire): no rank leaves barrier e before every rank entered it, and every
// write made before the barrier on any rank is visible after it on every rank (at sys scope).
//
// Launch requirements:
//   barrier_all(g, ctx, st)     g is a Thread, Warp or Block: exactly one group per rank uses `st` at a time
//                               (a second concurrent caller would double-count arrivals).
//   barrier_all(grid, ctx, st)  every block of the grid calls it; all blocks must be co-resident (cooperative
//                               launch, or a grid no larger than one wave); otherwise it deadlocks (and the
//                               bounded wait reports it). Uses st.grid_arrivals for the intra-rank grid sync.
#pragma once

#include "loom/config.hpp"
#include "loom/lang/context.cuh"
#include "loom/lang/group.cuh"
#include "loom/lang/rank.cuh"
#include "loom/lang/signal.cuh"
#include "loom/lang/spin.cuh"
#include "loom/ptx/memory.cuh"

namespace loom::lang {

struct BarrierState {
    uint64_t epoch;          // barriers this rank has completed (read/written by the barrier's group only)
    uint64_t grid_arrivals;  // block arrivals at grid barriers on this rank (monotonic)
    uint64_t reserved[6];
    uint64_t arrivals[kMaxLocalPeers];  // arrivals[i]: barriers local rank i has entered (written by rank i)
};

template <class G>
LOOM_DEVICE LOOM_FORCEINLINE void barrier_all(G g, const Ctx& ctx, BarrierState* st) {
    if (ctx.world != ctx.local_world) detail::bad_peer(ctx, st, ctx.world - 1);  // needs NVSHMEM routing
    g.sync();  // the group's earlier writes are ordered before the releases below
    const uint64_t e = st->epoch + 1;
    const uint32_t n = static_cast<uint32_t>(ctx.local_world);
    for (uint32_t i = g.rank(); i < n; i += g.size()) {  // arrive everywhere first, then wait
        BarrierState* remote = symm_at(ctx, st, ctx.local_base_rank + static_cast<int>(i));
        ptx::red_add_release_sys(&remote->arrivals[ctx.local_rank], uint64_t(1));
    }
    for (uint32_t i = g.rank(); i < n; i += g.size())
        spin_wait(ctx, "barrier_all", &st->arrivals[i], Cmp::GE, e, Scope::Sys,
                  ctx.local_base_rank + static_cast<int>(i));
    g.sync();
    if (g.leader()) st->epoch = e;
}

namespace detail {
// All blocks of this grid (co-resident) meet. Generation-free: block arrival n (0-based) belongs to grid sync
// number n / num_blocks, which completes when the counter reaches the next multiple of num_blocks.
LOOM_DEVICE LOOM_FORCEINLINE void grid_sync(const Ctx& ctx, uint64_t* counter) {
    __syncthreads();
    if (Block{}.leader()) {
        const uint64_t nb = Grid{}.num_blocks();
        const uint64_t old = ptx::atom_add_acq_rel_gpu(counter, uint64_t(1));
        const uint64_t target = (old / nb + 1) * nb;
        spin_wait(ctx, "grid_sync", counter, Cmp::GE, target, Scope::Gpu);
    }
    __syncthreads();
}
}  // namespace detail

// Grid-wide cross-rank barrier: every block of every rank's grid enters before any leaves.
LOOM_DEVICE inline void barrier_all(Grid grid_tag, const Ctx& ctx, BarrierState* st) {
    detail::grid_sync(ctx, &st->grid_arrivals);
    if (grid_tag.block_rank() == 0) barrier_all(Block{}, ctx, st);
    detail::grid_sync(ctx, &st->grid_arrivals);
}

}  // namespace loom::lang
