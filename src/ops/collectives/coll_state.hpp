// The collectives' state, owned by the World (World::state<S>(), world_state.hpp) under keys "collectives/<name>":
// each algorithm or data path owns one small state that declares its own footprint and is created by its first call.
//
//   collectives/core                      every call: the sync block (symmetric, 9 KiB), the Budget, the plan cache
//   collectives/scratch                   one-shot, scatter, ring, scatter/ce, the staged paths:
//                                         WorldOptions::coll_scratch bytes symmetric (64 MiB by default)
//   collectives/ll                        the LL kernels: the LL area, 2 MiB x world size symmetric (coll_ll.hpp)
//   collectives/copy_engine               the copy-engine paths: side streams and events (copy_engine.hpp)
//   collectives/barrier                   the one-block barrier kernel, loaded (barrier.hpp)
//   collectives/all_gather/push_ce        its stream signals, 4 x kMaxLocalPeers x 8 bytes symmetric
//   collectives/reduce_scatter/scatter_ce its stream signals, 2 x kMaxLocalPeers x 8 bytes symmetric
//
// The states holding signals (core, ll and the two copy-engine paths') are zeroed when created, which synchronises the
// device and meets the peers: a call captured in a CUDA graph cannot create them (coll::state raises). Calls on one
// World come from one thread at a time, as for every collective. release_collective_state(world) is
// world.release_states("collectives/").
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "loom/kernels/collectives/coll_params.hpp"
#include "loom/runtime/world_state.hpp"
#include "ops/collectives/coll_launch.hpp"

namespace loom::coll {

// Every call's state, created by the first collective call on a World (collective: every rank makes the same first
// call). Raises for a world the collectives do not support (more than one node, more than kMaxLocalPeers ranks).
struct Core final : WorldState {
    static constexpr const char* kKey = "collectives/core";
    explicit Core(World& world);
    void release(World& world) override;

    // Per-rank synchronisation block of every kernel (kernels::coll::SyncState: per-block epochs and peer signals),
    // symmetric, zeroed once when the state is created and never reset afterwards.
    kernels::coll::SyncState* sync = nullptr;
    Budget budget;
    PlanCache plans;

    // Kernel arguments with the sync block set (the other state pointers null).
    kernels::coll::Params params() const;
};

// The symmetric scratch of the algorithms that stage data in the peers' memory (one-shot and staged two-shot
// all_reduce; scatter, ring and scatter/ce reduce_scatter). Neither zeroed nor met over: every kernel that writes a
// peer's scratch meets that peer first (its entry barrier), and the copy-engine scatter follows a barrier kernel; so
// its creation (an allocation) may happen during a CUDA-graph capture: world.state<Scratch>().
struct Scratch final : WorldState {
    static constexpr const char* kKey = "collectives/scratch";
    explicit Scratch(World& world);
    void release(World& world) override;

    char* data = nullptr;
    std::size_t bytes = 0;  // World::coll_scratch(), at least 1 MiB

    // Sets p.scratch and p.scratch_bytes.
    void attach(kernels::coll::Params& p) const;
};

// Raises, naming `op` and the state's key, when `stream` is capturing a CUDA graph.
void check_not_capturing(cudaStream_t stream, const char* op, const char* key);
// The state S of `world`, created on first use (World::state), for a state whose creation synchronises the device
// and meets the peers, which a thread capturing a CUDA graph on `stream` must not do: then raises.
template <class S>
S& state(World& world, cudaStream_t stream, const char* op) {
    if (S* s = world.find_state<S>()) return *s;
    check_not_capturing(stream, op, S::kKey);
    return world.state<S>();
}

// The core state (coll::state<Core>).
inline Core& core(World& world, cudaStream_t stream, const char* op) { return state<Core>(world, stream, op); }

}  // namespace loom::coll
