// The language's remote column: peers on other nodes through NVSHMEM's device calls.
//
// Compiled only into kernels built with remote peers (LOOM_REMOTE_PEERS=1, set by jit::KernelSpec::remote_peers,
// which selects nvcc and links libnvshmem_device). put / get / put_signal / notify / signal_op / barrier_all / fence /
// quiet call these for a peer that Ctx::reachable says is on another node; node-local peers keep the load/store path.
//
// Addresses: NVSHMEM's device calls take the peer's object as a symmetric address of NVSHMEM's space. The World
// registers each rank's heap with NVSHMEM (Ctx::remote_heap: the same physical memory), so a symmetric pointer p of
// Loom names remote_heap + (p - own heap) there. The local operand (put's source, get's destination) keeps its own
// address: a second alias of this rank's memory in this process could serve stale cache lines after writes through
// the first. The World also registers the heap's own address for NVSHMEM's network transports, so local operands in
// the heap work on every transport; other device memory works on NVLink (P2P) only.
//
// Ordering: a remote notify / signal_op first completes this rank's earlier NVSHMEM operations (nvshmem_quiet) and
// fences its ordinary writes at sys scope, so it is a release like the load/store one; put_signal is NVSHMEM's
// (the signal lands after the data). Waits stay local polls of this rank's own signals.
#pragma once

#include "loom/config.hpp"
#include "loom/lang/context.cuh"
#include "loom/lang/group.cuh"

#if LOOM_REMOTE_PEERS
// NVSHMEM's point-to-point device API only (puts, gets, signals, fence, quiet): the collective and tile headers that
// <nvshmem.h> / <nvshmemx.h> also pull in double the compiler front end's time for every kernel with remote peers.
// A kernel may still include the full headers itself.
#if __has_include(<device/nvshmem_defines.h>) && __has_include(<device/nvshmemx_defines.h>)
// The build options first, as <nvshmem.h> includes them.
// clang-format off
#include <non_abi/nvshmem_build_options.h>
#include <device/nvshmem_defines.h>
#include <device/nvshmemx_defines.h>
// clang-format on
#else
#include <nvshmem.h>
#include <nvshmemx.h>
#endif

namespace loom::lang::remote {

// NVSHMEM's symmetric address of `p`, a symmetric pointer of this rank (the peer's object at the same offset).
LOOM_DEVICE LOOM_FORCEINLINE void* addr(const Ctx& ctx, const void* p) {
    return static_cast<void*>(ctx.remote_heap + ctx.own_offset(p));
}

// ---- put / get at thread, warp and block scope (every thread of the group calls) -------------------------------
LOOM_DEVICE LOOM_FORCEINLINE void put(Thread, const Ctx& ctx, void* dst, const void* src, uint64_t bytes, int peer,
                                      bool nbi) {
    if (nbi)
        nvshmem_putmem_nbi(addr(ctx, dst), src, bytes, peer);
    else
        nvshmem_putmem(addr(ctx, dst), src, bytes, peer);
}
LOOM_DEVICE LOOM_FORCEINLINE void put(Warp, const Ctx& ctx, void* dst, const void* src, uint64_t bytes, int peer,
                                      bool nbi) {
    if (nbi)
        nvshmemx_putmem_nbi_warp(addr(ctx, dst), src, bytes, peer);
    else
        nvshmemx_putmem_warp(addr(ctx, dst), src, bytes, peer);
}
LOOM_DEVICE LOOM_FORCEINLINE void put(Block, const Ctx& ctx, void* dst, const void* src, uint64_t bytes, int peer,
                                      bool nbi) {
    if (nbi)
        nvshmemx_putmem_nbi_block(addr(ctx, dst), src, bytes, peer);
    else
        nvshmemx_putmem_block(addr(ctx, dst), src, bytes, peer);
}

LOOM_DEVICE LOOM_FORCEINLINE void get(Thread, const Ctx& ctx, void* dst, const void* src, uint64_t bytes, int peer,
                                      bool nbi) {
    if (nbi)
        nvshmem_getmem_nbi(dst, addr(ctx, src), bytes, peer);
    else
        nvshmem_getmem(dst, addr(ctx, src), bytes, peer);
}
LOOM_DEVICE LOOM_FORCEINLINE void get(Warp, const Ctx& ctx, void* dst, const void* src, uint64_t bytes, int peer,
                                      bool nbi) {
    if (nbi)
        nvshmemx_getmem_nbi_warp(dst, addr(ctx, src), bytes, peer);
    else
        nvshmemx_getmem_warp(dst, addr(ctx, src), bytes, peer);
}
LOOM_DEVICE LOOM_FORCEINLINE void get(Block, const Ctx& ctx, void* dst, const void* src, uint64_t bytes, int peer,
                                      bool nbi) {
    if (nbi)
        nvshmemx_getmem_nbi_block(dst, addr(ctx, src), bytes, peer);
    else
        nvshmemx_getmem_block(dst, addr(ctx, src), bytes, peer);
}

// ---- put_signal: the data, then `sig` set / added at the peer (NVSHMEM orders the signal after the data) ----
LOOM_DEVICE LOOM_FORCEINLINE int signal_kind(bool add) { return add ? NVSHMEM_SIGNAL_ADD : NVSHMEM_SIGNAL_SET; }

LOOM_DEVICE LOOM_FORCEINLINE void put_signal(Thread, const Ctx& ctx, void* dst, const void* src, uint64_t bytes,
                                             uint64_t* sig, uint64_t value, bool add, int peer) {
    nvshmem_putmem_signal(addr(ctx, dst), src, bytes, static_cast<uint64_t*>(addr(ctx, sig)), value, signal_kind(add),
                          peer);
}
LOOM_DEVICE LOOM_FORCEINLINE void put_signal(Warp, const Ctx& ctx, void* dst, const void* src, uint64_t bytes,
                                             uint64_t* sig, uint64_t value, bool add, int peer) {
    nvshmemx_putmem_signal_warp(addr(ctx, dst), src, bytes, static_cast<uint64_t*>(addr(ctx, sig)), value,
                                signal_kind(add), peer);
}
LOOM_DEVICE LOOM_FORCEINLINE void put_signal(Block, const Ctx& ctx, void* dst, const void* src, uint64_t bytes,
                                             uint64_t* sig, uint64_t value, bool add, int peer) {
    nvshmemx_putmem_signal_block(addr(ctx, dst), src, bytes, static_cast<uint64_t*>(addr(ctx, sig)), value,
                                 signal_kind(add), peer);
}

// ---- signals, fence, quiet (one thread) ----------------------------------------------------------------------
// Release: this thread's (and, cumulatively, its group's) ordinary writes at sys scope, this rank's NVSHMEM
// operations complete, then the signal.
LOOM_DEVICE LOOM_FORCEINLINE void signal_release(const Ctx& ctx, uint64_t* sig, uint64_t value, bool add, int peer) {
    __threadfence_system();
    nvshmem_quiet();
    nvshmemx_signal_op(static_cast<uint64_t*>(addr(ctx, sig)), value, signal_kind(add), peer);
}
LOOM_DEVICE LOOM_FORCEINLINE void signal_relaxed(const Ctx& ctx, uint64_t* sig, uint64_t value, bool add, int peer) {
    nvshmemx_signal_op(static_cast<uint64_t*>(addr(ctx, sig)), value, signal_kind(add), peer);
}
// Only in a World of several nodes (remote_heap set): in a one-node World NVSHMEM is not initialised.
LOOM_DEVICE LOOM_FORCEINLINE void fence(const Ctx& ctx) {
    if (ctx.remote_heap) nvshmem_fence();
}
LOOM_DEVICE LOOM_FORCEINLINE void quiet(const Ctx& ctx) {
    if (ctx.remote_heap) nvshmem_quiet();
}

}  // namespace loom::lang::remote
#endif  // LOOM_REMOTE_PEERS
