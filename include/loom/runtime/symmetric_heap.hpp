// The intra-node symmetric heap: one cuMemCreate allocation per rank, every node peer's allocation mapped into
// one contiguous virtual range of every process of the node.
//
// Layout in each process: [heap of local rank 0][heap of local rank 1]...[heap of local rank L-1], each
// size() bytes, so a symmetric pointer's peer copy is base(peer) + (p - base(local_rank())). Allocation within
// the heap (offsets) is the World's business; this class only owns the memory and the mappings.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "loom/runtime/env.hpp"
#include "loom/runtime/store.hpp"

namespace loom {

class SymmetricHeap {
  public:
    // Collective over the world (every rank calls it with the same bytes, at the same point of the store's
    // collective sequence): creates this rank's allocation on `device` (the current device), exchanges POSIX
    // file descriptors with the ranks of the node over Unix-domain sockets, maps all of them, grants
    // read/write access to every device used by the node's ranks that this process can see, and zeroes this
    // rank's heap. Returns once every rank's heap is zeroed and mapped everywhere (it ends on a store barrier),
    // so peers may write into it right away. `bytes` is rounded up to the allocation granularity.
    // Raises loom::Error("no GPU: <reason>") without a usable GPU.
    SymmetricHeap(Store& store, const RankInfo& info, int device, std::size_t bytes);
    // Local and non-collective: synchronizes the device, unmaps and releases. A peer still writing into this
    // rank's memory does not fault: the physical memory lives until every process has released its handle.
    ~SymmetricHeap();
    SymmetricHeap(const SymmetricHeap&) = delete;
    SymmetricHeap& operator=(const SymmetricHeap&) = delete;

    std::size_t size() const;         // bytes per rank
    std::size_t granularity() const;  // allocation granularity; every heap base is aligned to it
    int local_rank() const;
    int local_world_size() const;
    int device() const;
    char* base(int local_peer) const;  // local_peer's heap as mapped in this process
    char* local_base() const { return base(local_rank()); }
    const std::vector<int>& access_devices() const;  // devices granted access to the mapping in this process

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace loom
