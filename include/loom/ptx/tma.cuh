// Tensor-memory-accelerator copies (cp.async.bulk.tensor, sm_90): 2-D tiles between global memory described
// by a host-encoded tensor map (loom/runtime/tma.hpp) and shared memory.
//
// Contracts:
// - `tmap` is the generic address of a CUtensorMap-sized, 64-byte aligned descriptor that lives in kernel
//   parameter space (__grid_constant__) or global memory.
// - Coordinates are in elements, innermost first (c0 = column, c1 = row). Out-of-bounds elements of a load are
//   zero-filled and still counted in the completed transaction bytes; out-of-bounds elements of a store are
//   not written.
// - A load completes on an mbarrier (complete_tx::bytes); a store is tracked by bulk groups of the issuing
//   thread (commit, then wait).
// - Shared memory written by generic stores must be fenced with fence_proxy_async_smem() before a TMA store
//   reads it.
#pragma once

#include "loom/config.hpp"

namespace loom::ptx {

// The descriptor as kernels receive it: 128 bytes, 64-byte aligned, bit-identical to CUtensorMap.
struct alignas(64) TmaDescriptor {
    uint64_t opaque[16];
};

LOOM_DEVICE LOOM_FORCEINLINE void tma_prefetch_descriptor(const TmaDescriptor* tmap) {
#if LOOM_ARCH >= 900
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
#endif
}

// Load the box at (c0, c1) into smem_dst (aligned as the swizzle requires: 1024 B for 128B swizzle) and report
// its bytes to `bar`. Issued by one thread.
LOOM_DEVICE LOOM_FORCEINLINE void tma_load_2d(void* smem_dst, const TmaDescriptor* tmap, uint64_t* bar, int32_t c0,
                                              int32_t c1) {
#if LOOM_ARCH >= 900
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
        "[%2];\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(c0),
        "r"(c1)
        : "memory");
#else
    __trap();
#endif
}

// Load the 3-D box at (c0, c1, c2) (c2 the outermost dimension, e.g. the expert of stacked weights [E][rows][cols]):
// as tma_load_2d, with the bounds of every dimension zero-filling what lies outside it.
LOOM_DEVICE LOOM_FORCEINLINE void tma_load_3d(void* smem_dst, const TmaDescriptor* tmap, uint64_t* bar, int32_t c0,
                                              int32_t c1, int32_t c2) {
#if LOOM_ARCH >= 900
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
        "[%2];\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(c0),
        "r"(c1), "r"(c2)
        : "memory");
#else
    __trap();
#endif
}

// Multicast load: the box at (c0, c1) lands at the same shared-memory offset as smem_dst in every CTA of the
// cluster whose bit is set in cta_mask, and each of those CTAs' mbarrier at bar's offset gets complete_tx of
// the box's bytes. Issued by one thread; every destination must have initialised its barrier (cluster-wide
// visible) and freed the slot.
LOOM_DEVICE LOOM_FORCEINLINE void tma_load_2d_multicast(void* smem_dst, const TmaDescriptor* tmap, uint64_t* bar,
                                                        int32_t c0, int32_t c1, uint16_t cta_mask) {
#if LOOM_ARCH >= 900
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
        "[%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(c0),
        "r"(c1), "h"(cta_mask)
        : "memory");
#else
    __trap();
#endif
}

// Store the box at (c0, c1) from smem_src. Issued by one thread; completes with tma_store_commit/wait.
LOOM_DEVICE LOOM_FORCEINLINE void tma_store_2d(const TmaDescriptor* tmap, const void* smem_src, int32_t c0,
                                               int32_t c1) {
#if LOOM_ARCH >= 900
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                     reinterpret_cast<uint64_t>(tmap)),
                 "r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_src))), "r"(c0), "r"(c1)
                 : "memory");
#else
    __trap();
#endif
}

LOOM_DEVICE LOOM_FORCEINLINE void tma_store_commit() {
#if LOOM_ARCH >= 900
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// At most N committed store groups of this thread still read their shared-memory source (the buffer may be
// reused once this returns).
template <int N>
LOOM_DEVICE LOOM_FORCEINLINE void tma_store_wait_read() {
#if LOOM_ARCH >= 900
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}

// At most N committed store groups of this thread are incomplete: the writes of the others are performed
// (visible to this thread; publish them to others with a release).
template <int N>
LOOM_DEVICE LOOM_FORCEINLINE void tma_store_wait() {
#if LOOM_ARCH >= 900
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Orders this thread's earlier generic-proxy shared-memory writes before later async-proxy (TMA, wgmma)
// accesses of shared memory.
LOOM_DEVICE LOOM_FORCEINLINE void fence_proxy_async_smem() {
#if LOOM_ARCH >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Orders this thread's generic-proxy view of global memory (e.g. data acquired from a peer's flag) before its
// later async-proxy global accesses (TMA loads).
LOOM_DEVICE LOOM_FORCEINLINE void fence_proxy_async_global() {
#if LOOM_ARCH >= 900
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

}  // namespace loom::ptx
