// The device handle of a Loom world: what a kernel needs to address every rank it can reach by load/store.
//
// Host code builds it (loom::World::ctx()) and passes it to kernels by value. It is plain data so that
// it compiles under the host compiler, nvcc and NVRTC alike.
#pragma once

#include "loom/config.hpp"
#if LOOM_HOST_COMPILE
#include <type_traits>
#endif

namespace loom {

struct DiagMailbox;  // loom/lang/diag.cuh

struct Ctx {
    int32_t rank;                // global rank
    int32_t world;               // number of ranks
    int32_t local_rank;          // index of this rank among the ranks of its node
    int32_t local_world;         // ranks on this node
    int32_t node;                // node index
    int32_t local_base_rank;     // global rank of local rank 0 (the ranks of a node are contiguous)
    uint64_t wait_timeout_ns;    // bound on every spin-wait; 0 = unbounded (LOOM_WAIT_TIMEOUT_MS)
    uint64_t heap_size;          // bytes of each rank's symmetric heap
    char* heap[kMaxLocalPeers];  // heap[i]: local rank i's heap, mapped into this process; back to back:
                                 // heap[i] == heap[0] + i * heap_size (the runtime maps them in one VA range)
    DiagMailbox* diag;           // timed-out waits report here (lang/diag.cuh); null: the module's global
    char* remote_heap;  // this rank's heap as NVSHMEM's symmetric address (the same physical memory, registered
                        // with NVSHMEM): what NVSHMEM's device calls take to reach a peer on another node.
                        // Null in a one-node World (NVSHMEM is not initialised there).

    LOOM_HOST_DEVICE int num_nodes() const { return world / local_world; }
    LOOM_HOST_DEVICE int node_of(int peer) const { return peer / local_world; }
    // Is `peer` reachable by load/store from this process (same node)?
    LOOM_HOST_DEVICE bool reachable(int peer) const {
        return peer >= local_base_rank && peer < local_base_rank + local_world;
    }
    // Base of `peer`'s heap in this process. Precondition: reachable(peer). Arithmetic on heap[0] rather than
    // heap[peer - local_base_rank]: a runtime index into a by-value kernel parameter makes the compiler copy the
    // whole Ctx to local memory, and every symm_at would then pay a local-memory load.
    LOOM_HOST_DEVICE char* heap_of(int peer) const {
        return heap[0] + static_cast<int64_t>(peer - local_base_rank) * static_cast<int64_t>(heap_size);
    }
    // Byte offset of `p` from the start of this rank's own heap (as unsigned: below the heap wraps to huge).
    LOOM_HOST_DEVICE uint64_t own_offset(const void* p) const {
        return static_cast<uint64_t>(static_cast<const char*>(p) - heap[0]) -
               static_cast<uint64_t>(local_rank) * heap_size;
    }
    // Is `p` inside this rank's own symmetric heap?
    LOOM_HOST_DEVICE bool is_symmetric(const void* p) const { return own_offset(p) < heap_size; }
};

// Passed by value to every kernel and compiled from this header on both sides: the layout must not drift.
static_assert(sizeof(Ctx) == 6 * 4 + 2 * 8 + kMaxLocalPeers * sizeof(char*) + sizeof(DiagMailbox*) + sizeof(char*),
              "Ctx layout changed: update this assert and every host-built Ctx");
#if LOOM_HOST_COMPILE
static_assert(std::is_trivially_copyable_v<Ctx> && std::is_standard_layout_v<Ctx>, "Ctx is passed by value");
#endif

}  // namespace loom
