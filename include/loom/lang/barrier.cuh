// Cross-rank barriers over monotonic per-peer counters: no reset kernel, the epoch lives in device memory.
//
// State: one BarrierState per rank in the symmetric heap (world.alloc<lang::BarrierState>(1), zeroed once at
// allocation; never again). arrivals[i] counts the barriers local rank i has entered; epoch counts this rank's
// own barriers. Barrier number e (1, 2, ...) adds 1 to arrivals[me] on every peer (release) and waits until
// arrivals[i] >= e for every peer i (acquire): no rank leaves barrier e before every rank entered it, and every
// write made before the barrier on any rank is visible after it on every rank (at sys scope).
//
// Several nodes (kernels compiled with remote peers, lang/remote.cuh): a barrier is two node-local rounds around an
// inter-node step. Each rank completes its NVSHMEM operations (quiet), meets its node (arrivals >= 2e - 1), signals
// the ranks of its local rank on every other node through NVSHMEM (node_arrivals += 1 there) and waits for theirs
// (node_arrivals >= e * (nodes - 1)), then meets its node again (arrivals >= 2e). Without remote peers a barrier in a
// World of several nodes traps with a diagnostic.
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
#include "loom/lang/remote.cuh"
#include "loom/lang/signal.cuh"
#include "loom/lang/spin.cuh"
#include "loom/ptx/memory.cuh"

namespace loom::lang {

struct BarrierState {
    uint64_t epoch;          // barriers this rank has completed (read/written by the barrier's group only)
    uint64_t grid_arrivals;  // block arrivals at grid barriers on this rank (monotonic)
    uint64_t node_arrivals;  // inter-node steps of the ranks of this local rank on other nodes (several nodes only)
    uint64_t reserved[5];
    uint64_t arrivals[kMaxLocalPeers];  // arrivals[i]: barriers local rank i has entered (written by rank i)
};

namespace detail {
// One node-local round: arrive at every rank of the node, then wait until each has arrived `target` times.
template <class G>
LOOM_DEVICE LOOM_FORCEINLINE void node_round(G g, const Ctx& ctx, BarrierState* st, uint64_t target) {
    const uint32_t n = static_cast<uint32_t>(ctx.local_world);
    for (uint32_t i = g.rank(); i < n; i += g.size()) {  // arrive everywhere first, then wait
        BarrierState* peer = symm_at(ctx, st, ctx.local_base_rank + static_cast<int>(i));
        ptx::red_add_release_sys(&peer->arrivals[ctx.local_rank], uint64_t(1));
    }
    for (uint32_t i = g.rank(); i < n; i += g.size())
        spin_wait(ctx, "barrier_all", &st->arrivals[i], Cmp::GE, target, Scope::Sys,
                  ctx.local_base_rank + static_cast<int>(i));
}

#if LOOM_REMOTE_PEERS
template <class G>
LOOM_DEVICE LOOM_FORCEINLINE void barrier_all_nodes(G g, const Ctx& ctx, BarrierState* st) {
    g.sync();
    if (g.leader()) {  // this rank's puts to other nodes are delivered before anyone leaves
        __threadfence_system();
        remote::quiet(ctx);
    }
    g.sync();
    const uint64_t e = st->epoch + 1;
    node_round(g, ctx, st, 2 * e - 1);
    g.sync();
    if (g.leader()) {
        const int nodes = ctx.num_nodes();
        for (int k = 1; k < nodes; ++k) {
            const int peer = ((ctx.node + k) % nodes) * ctx.local_world + ctx.local_rank;
            // A release: what this rank observed in the node round (its node's quiet puts) happens before the
            // peer's wait.
            remote::signal_release(ctx, &st->node_arrivals, 1, /*add=*/true, peer);
        }
        spin_wait(ctx, "barrier_all_nodes", &st->node_arrivals, Cmp::GE, e * static_cast<uint64_t>(nodes - 1),
                  Scope::Sys);
    }
    g.sync();
    node_round(g, ctx, st, 2 * e);
    g.sync();
    if (g.leader()) st->epoch = e;
}
#endif
}  // namespace detail

template <class G>
LOOM_DEVICE LOOM_FORCEINLINE void barrier_all(G g, const Ctx& ctx, BarrierState* st) {
#if LOOM_REMOTE_PEERS
    if (ctx.world != ctx.local_world) return detail::barrier_all_nodes(g, ctx, st);
#else
    // Peers on other nodes: the diagnostic names the last rank's node and asks for remote peers.
    if (ctx.world != ctx.local_world) detail::bad_peer(ctx, st, ctx.world - 1);
#endif
    g.sync();  // the group's earlier writes are ordered before the releases below
    const uint64_t e = st->epoch + 1;
    detail::node_round(g, ctx, st, e);
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
