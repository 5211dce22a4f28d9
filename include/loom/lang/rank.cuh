// Rank facts and symmetric addressing from the Ctx (Triton-distributed's rank / num_ranks / symm_at).
//
// symm_at is base-offset arithmetic on the Ctx peer table: no library call, no memory access. A peer outside
// this node is not load/store reachable; asking for it is a checked error (diagnostic + trap). Such peers are
// reached through put / get / put_signal / notify / signal_op in kernels compiled with remote peers (remote.cuh).
#pragma once

#include "loom/config.hpp"
#include "loom/lang/diag.cuh"  // LOOM_NO_DEVICE_PRINTF, the mailbox record
#if !LOOM_NVRTC && !LOOM_NO_DEVICE_PRINTF
#include <cstdio>  // device printf (NVRTC declares it built in)
#endif
#include "loom/lang/context.cuh"

namespace loom::lang {

LOOM_DEVICE LOOM_FORCEINLINE int rank(const Ctx& ctx) { return ctx.rank; }
LOOM_DEVICE LOOM_FORCEINLINE int num_ranks(const Ctx& ctx) { return ctx.world; }
LOOM_DEVICE LOOM_FORCEINLINE int local_rank(const Ctx& ctx) { return ctx.local_rank; }
LOOM_DEVICE LOOM_FORCEINLINE int local_world(const Ctx& ctx) { return ctx.local_world; }
LOOM_DEVICE LOOM_FORCEINLINE bool reachable(const Ctx& ctx, int peer) { return ctx.reachable(peer); }

namespace detail {
// symm_at's failure: what it reports, by value (a reference to the kernel's by-value Ctx would copy the whole Ctx to
// local memory in every kernel's prologue; see spin.cuh's wait_timeout).
struct PeerFault {
    DiagMailbox* diag;
    const char* own_heap;
    uint64_t heap_size;
    int rank, world, node, local_base_rank, local_world;
};
#if LOOM_NO_DEVICE_PRINTF
// Mailbox record only (lang/diag.cuh), inlined: a call would serialise wgmma.
LOOM_DEVICE LOOM_FORCEINLINE void peer_fault(PeerFault f, const void* p, int peer) {
    diag_post(f.diag, DiagKind::BadPeer, f.rank, "symm_at", p, 0, static_cast<uint64_t>(peer),
              static_cast<uint64_t>(f.local_base_rank) | (static_cast<uint64_t>(f.local_world) << 32), 0);
    __trap();
}
#else
__noinline__ LOOM_DEVICE inline void peer_fault(PeerFault f, const void* p, int peer) {
    diag_post(f.diag, DiagKind::BadPeer, f.rank, "symm_at", p, 0, static_cast<uint64_t>(peer),
              static_cast<uint64_t>(f.local_base_rank) | (static_cast<uint64_t>(f.local_world) << 32), 0);
    const bool other_node =
        peer >= 0 && peer < f.world && (peer < f.local_base_rank || peer >= f.local_base_rank + f.local_world);
    if (other_node) {
        printf(
            "loom: symm_at: rank %d block (%u,%u,%u) thread %u: peer %d is on node %d (this rank: node %d, ranks "
            "%d..%d): not load/store reachable; %s\n",
            f.rank, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, peer, peer / f.local_world, f.node,
            f.local_base_rank, f.local_base_rank + f.local_world - 1,
            LOOM_REMOTE_PEERS ? "reach it with put / get / put_signal / notify / signal_op, not symm_at"
                              : "compile the kernel with remote peers (jit::KernelSpec::remote_peers)");
    } else {
        printf(
            "loom: symm_at: rank %d block (%u,%u,%u) thread %u: peer %d is not load/store reachable (local ranks "
            "%d..%d of %d) or %p is not in this rank's symmetric heap [%p, +%llu)\n",
            f.rank, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, peer, f.local_base_rank,
            f.local_base_rank + f.local_world - 1, f.world, p, f.own_heap,
            static_cast<unsigned long long>(f.heap_size));
    }
    __trap();
}
#endif
LOOM_DEVICE LOOM_FORCEINLINE void bad_peer(const Ctx& ctx, const void* p, int peer) {
    peer_fault(PeerFault{ctx.diag, ctx.heap_of(ctx.rank), ctx.heap_size, ctx.rank, ctx.world, ctx.node,
                         ctx.local_base_rank, ctx.local_world},
               p, peer);
}
}  // namespace detail

// `p` (a pointer into this rank's symmetric heap) as seen in `peer`'s heap, mapped into this process.
// Checked: peer reachable and p symmetric (two compares; the failing path is out of line). The heaps are back to
// back (Ctx::heap), so the answer is p + (peer - rank) * heap_size: no table lookup, no memory access.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE T* symm_at(const Ctx& ctx, T* p, int peer) {
    if (!ctx.reachable(peer) || ctx.own_offset(p) >= ctx.heap_size) detail::bad_peer(ctx, p, peer);
    char* c = const_cast<char*>(static_cast<const char*>(static_cast<const void*>(p)));
    return static_cast<T*>(
        static_cast<void*>(c + static_cast<int64_t>(peer - ctx.rank) * static_cast<int64_t>(ctx.heap_size)));
}

}  // namespace loom::lang
