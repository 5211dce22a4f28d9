// loom::World: one per process; rank facts, bootstrap store, device, and the symmetric heap.
//
// Nodes: the ranks of one node share the fd-mapped symmetric heap and reach each other by load/store (Ctx::heap). A
// World of several nodes (num_nodes() > 1: hosts, or LOOM_NODE_SIZE's emulated nodes) also initialises NVSHMEM (unique
// id over the store) and registers each rank's heap with it, so peers on other nodes are reached through NVSHMEM's
// device calls (Ctx::remote_heap; kernels compiled with KernelSpec::remote_peers). A one-node World never touches
// NVSHMEM.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>

#include "loom/lang/context.cuh"
#include "loom/runtime/env.hpp"
#include "loom/runtime/store.hpp"
#include "loom/runtime/symmetric_heap.hpp"
#include "loom/runtime/world_state.hpp"

namespace loom {

class SymmetricHeap;

struct WorldOptions {
    std::size_t symmetric_size = 0;  // 0: LOOM_SYMMETRIC_SIZE, default 1 GiB
    // The collectives' symmetric scratch (one-shot, scatter and ring rounds, the hierarchical forms' partials), taken
    // from the heap at the first collective that needs it; at least 1 MiB. A call that needs more raises, naming this.
    std::size_t coll_scratch = std::size_t{64} << 20;
    int device = -1;          // -1: LOOM_DEVICE, else local_rank % visible devices
    bool create_heap = true;  // false: store + rank facts only (CPU tests, tools)
    bool bind_device = true;  // false (only with create_heap = false): never touch CUDA; device() is -1
};

class World {
  public:
    // From the process's settings (settings().rank: the environment, read once; see RankInfo for the conventions).
    static World from_env(const WorldOptions& opts = {});
    World(const RankInfo& info, const WorldOptions& opts);
    ~World();  // collective when the heap exists; bounded even if a peer has died
    World(World&&) noexcept;
    World& operator=(World&&) noexcept;

    int rank() const;
    int world_size() const;
    int local_rank() const;
    int local_world_size() const;
    int node() const;       // this rank's node: rank / local_world_size
    int num_nodes() const;  // world_size / local_world_size (LOOM_NODE_SIZE splits hosts into emulated nodes)
    int node_of(int peer) const;
    int device() const;
    // WorldOptions::coll_scratch. set_coll_scratch changes it for the scratch the collectives create next (after
    // release_states("collectives/scratch"), or at their first use); every rank sets the same value. At least 1 MiB.
    std::size_t coll_scratch() const;
    void set_coll_scratch(std::size_t bytes);
    const RankInfo& info() const;
    Store& store();

    void barrier(const std::string& tag = "");  // host barrier over the store

    // Collective symmetric allocation: every rank calls with the same count; same offset everywhere.
    // A rank asking for a different size gets an error (on every rank), never corruption.
    void* alloc_bytes(std::size_t bytes, std::size_t alignment = 256);
    template <class T>
    T* alloc(std::size_t n) {
        return static_cast<T*>(alloc_bytes(n * sizeof(T), alignof(T) > 256 ? alignof(T) : 256));
    }
    void free(void* p);  // collective; raises for a pointer not returned by alloc

    bool is_symmetric(const void* p, std::size_t bytes = 1) const;
    // The live allocation of this rank's symmetric heap (alloc_bytes' pointer and size) that holds byte p; nullopt
    // outside the heap or in its free space.
    struct Allocation {
        const void* start = nullptr;
        std::size_t bytes = 0;
    };
    std::optional<Allocation> symmetric_allocation(const void* p) const;
    // Address of `p` (a symmetric pointer of this rank) in `peer`'s heap, as mapped in this process.
    void* peer_ptr(const void* p, int peer) const;
    template <class T>
    T* peer_ptr(T* p, int peer) const {
        return static_cast<T*>(peer_ptr(static_cast<const void*>(p), peer));
    }

    Ctx ctx() const;  // the device handle
    SymmetricHeap& heap();

    // Per-World op state (world_state.hpp): the S under S::kKey, constructed as S(*this) on first use (collective
    // when S's constructor is: every rank then makes the same first call). Calls on one World come from one thread
    // at a time, as every collective's do.
    template <class S>
    S& state() {
        static_assert(std::is_base_of_v<WorldState, S>, "World::state<S>: S derives from loom::WorldState");
        if (WorldState* s = find_state(S::kKey, typeid(S))) return static_cast<S&>(*s);
        return static_cast<S&>(adopt_state(S::kKey, typeid(S), std::make_unique<S>(*this)));
    }
    // The S if it exists, else nullptr (creates nothing: e.g. a CUDA-graph capture, which may not create state).
    template <class S>
    S* find_state() {
        return static_cast<S*>(find_state(S::kKey, typeid(S)));
    }
    // Releases every state whose key starts with `prefix` ("" for all): synchronises the device, meets the peers, then
    // calls release() and destroys each, in key order. Collective. The next use creates a state anew.
    void release_states(std::string_view prefix);

    // Explicit, idempotent; the destructor calls it. Synchronizes the device, then a bounded barrier over the
    // store (60 s, at most LOOM_STORE_TIMEOUT_MS) so rank 0 keeps serving the store until every rank is done with
    // it; a rank that never arrives (it died) is reported on stderr and local resources are released anyway. Never
    // throws. Every other call on a World that is shut down raises.
    void shutdown();
    bool is_shut_down() const;

    struct Impl;

  private:
    WorldState* find_state(std::string_view key, const std::type_info& type);
    WorldState& adopt_state(std::string_view key, const std::type_info& type, std::unique_ptr<WorldState> s);
    Impl& live() const;
    void init(const RankInfo& info, const WorldOptions& opts);  // raises when moved from or shut down
    std::unique_ptr<Impl> impl_;
};

}  // namespace loom
