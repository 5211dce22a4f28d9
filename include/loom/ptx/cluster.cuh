// Thread-block clusters (sm_90): the CTA's rank in its cluster, the cluster-wide barrier, arrivals on an mbarrier in a
// peer CTA's shared memory (distributed shared memory) and loads from it. Used by the GEMM's 2-CTA clusters, whose
// TMA multicast writes one operand tile into both CTAs' shared memory, and by the gemv kernel's K-split sums.
//
// Contracts:
// - A peer CTA's shared memory may be touched only while that CTA is alive: a kernel that arrives remotely ends
//   with cluster_sync() executed by every thread of every CTA of the cluster.
// - Barrier initialisation must be visible cluster-wide (fence_mbarrier_init + cluster_sync) before a peer
//   arrives on it or multicasts into it.
#pragma once

#include "loom/config.hpp"

namespace loom::ptx {

// This CTA's rank in its cluster (0 .. cluster size - 1); 0 without a cluster.
LOOM_DEVICE LOOM_FORCEINLINE uint32_t cluster_ctarank() {
#if LOOM_ARCH >= 900
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
#else
    return 0;
#endif
}

// Every non-exited thread of every CTA of the cluster, convergently per warp: release/acquire at cluster scope.
LOOM_DEVICE LOOM_FORCEINLINE void cluster_sync() {
#if LOOM_ARCH >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
    __syncthreads();
#endif
}

// Arrive on the mbarrier at the same shared-memory offset as `bar`, in the CTA of cluster rank `cta` (which may be
// this CTA), with mbarrier.arrive's default semantics (release at CTA scope), as CUTLASS's ClusterBarrier does.
// Enough for the GEMM's use, handing a ring slot back once the wgmma reads of it completed (wgmma.wait_group): the
// peer's producer then overwrites it with TMA, a WAR hazard on reads that are already done. An explicit
// `.release.cluster` compiles to MEMBAR.ALL.CTA + ERRBAR + CGAERRBAR before every arrive, i.e. in every k-block of
// every consumer warp: ncu showed the consumers stalled on it (41 % of their stall cycles) and the 2-CTA cluster
// GEMM ran at 0.66x cuBLASLt; without it, 0.97x. A caller that must publish its own writes to the
// peer needs a fence of its own before this arrive.
LOOM_DEVICE LOOM_FORCEINLINE void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta) {
#if LOOM_ARCH >= 900
    const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
    asm volatile(
        "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(local),
        "r"(cta)
        : "memory");
#else
    __trap();
#endif
}

// 16 bytes at the shared-memory offset of `p` in the CTA of cluster rank `cta` (distributed shared memory; the reader
// orders it after the peer's writes with a cluster barrier).
LOOM_DEVICE LOOM_FORCEINLINE float4 ld_shared_cluster_f32x4(const void* p, uint32_t cta) {
    float4 v;
#if LOOM_ARCH >= 900
    const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    asm volatile(
        "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %4, %5;\n"
        "ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [remote];\n}\n"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
        : "r"(local), "r"(cta)
        : "memory");
#else
    v = make_float4(0.f, 0.f, 0.f, 0.f);
    __trap();
#endif
    return v;
}

}  // namespace loom::ptx
