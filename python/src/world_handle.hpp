// The Python side's World: a loom::World shared by the Python objects that use it, with deferred symmetric frees.
//
// World::free is collective (every rank frees the same pointer at the same point of the store's sequence), but a
// torch tensor's memory is released when its last reference dies, which each rank's garbage collector decides on
// its own. So a symmetric allocation that Python drops is only queued (SymAlloc's destructor, any thread); collect()
// (called by every world.empty() and at shutdown, on every rank in the same order) gathers the ranks' queues over
// the store and frees, in ascending offset order, the allocations that every rank has dropped. An allocation still
// held on some rank stays queued on the others until a later collect().
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>

#include "loom/runtime/world.hpp"

namespace loom::py {

struct WorldHandle {
    loom::World world;
    std::mutex mu;                    // guards pending and shut_down (SymAlloc's destructor may run on any thread)
    std::set<std::uint64_t> pending;  // heap offsets dropped by Python on this rank, not yet freed
    bool shut_down = false;

    explicit WorldHandle(loom::World w) : world(std::move(w)) {}
    void drop(std::uint64_t offset);  // queue a free (no-op after shutdown: the heap is gone)
    std::size_t collect();            // collective: frees what every rank dropped; returns how many
    void shutdown();                  // collective: collect(), then World::shutdown()
};

// One symmetric allocation owned by Python (the owner of the torch tensors that view it).
struct SymAlloc {
    std::shared_ptr<WorldHandle> world;
    void* ptr = nullptr;
    std::size_t bytes = 0;
    SymAlloc(std::shared_ptr<WorldHandle> w, void* p, std::size_t n) : world(std::move(w)), ptr(p), bytes(n) {}
    ~SymAlloc();
    SymAlloc(const SymAlloc&) = delete;
    SymAlloc& operator=(const SymAlloc&) = delete;
};

}  // namespace loom::py
