// One-instruction wrappers for the async proxy (sm_90): proxy fences, mbarriers, bulk copies (cp.async.bulk).
//
// Shared-memory operands are 32-bit shared-window addresses (smem_addr()). Bulk copies need 16-byte aligned
// addresses and a size that is a multiple of 16. sm_90-only instructions are compiled only for LOOM_ARCH >= 900;
// on older archs they trap (the language layer static_asserts before reaching them), so every header still
// compiles for sm_80.
#pragma once

#include "loom/config.hpp"
// smem_addr, mbarrier_{init,arrive,arrive_expect_tx,try_wait_parity}, fence_mbarrier_init (mbarrier.cuh) and
// fence_proxy_async_global (tma.cuh) are defined beside the tensor-map wrappers; this header adds the rest.
#include "loom/ptx/mbarrier.cuh"
#include "loom/ptx/tma.cuh"

namespace loom::ptx {

// Reached only when an sm_90 instruction is used on an older arch.
LOOM_DEVICE LOOM_FORCEINLINE void unsupported_arch() { __trap(); }

// ---- proxy fences --------------------------------------------------------------------------------------------
// Orders this thread's generic-proxy accesses (ordinary ld/st) with async-proxy accesses (TMA / bulk copies) to
// the given state space. Needed e.g. between ordinary stores to a buffer and a bulk copy that reads it, or
// between a bulk copy's writes (after its completion) and a generic-proxy release that publishes them.
LOOM_DEVICE LOOM_FORCEINLINE void fence_proxy_async() {
#if LOOM_ARCH >= 900
    asm volatile("fence.proxy.async;" ::: "memory");
#else
    unsupported_arch();
#endif
}
LOOM_DEVICE LOOM_FORCEINLINE void fence_proxy_async_shared_cta() {
#if LOOM_ARCH >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
    unsupported_arch();
#endif
}
// ---- mbarrier additions (shared::cta, 64-bit) ----------------------------------------------------------------
LOOM_DEVICE LOOM_FORCEINLINE void mbarrier_inval(uint64_t* bar) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}
LOOM_DEVICE LOOM_FORCEINLINE void mbarrier_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
#if LOOM_ARCH >= 900
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(tx_bytes)
                 : "memory");
#else
    unsupported_arch();
#endif
}
// ---- shared memory --------------------------------------------------------------------------------------------
// One 16-byte load from shared memory (16-byte aligned), e.g. of a slot a bulk copy filled once its mbarrier phase
// completed. Volatile: a loop of them stays in program order with the arithmetic between (the compiler may not hoist
// every load of an unrolled loop ahead of it, which costs a register per word).
LOOM_DEVICE LOOM_FORCEINLINE uint4 ld_shared_v4(const void* p) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(smem_addr(p))
                 : "memory");
    return v;
}
// One 16-byte store to shared memory (16-byte aligned). Volatile, as ld_shared_v4.
LOOM_DEVICE LOOM_FORCEINLINE void st_shared_v4(void* p, const uint4& v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr(p)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// ---- bulk copies (cp.async.bulk, sm_90) ----------------------------------------------------------------------
// global -> shared::cta; completion: `bytes` transaction bytes on `bar` (pair with mbarrier_arrive_expect_tx).
LOOM_DEVICE LOOM_FORCEINLINE void cp_async_bulk_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes,
                                                    uint64_t* bar) {
#if LOOM_ARCH >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(smem_dst)),
                 "l"(gmem_src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
#else
    unsupported_arch();
#endif
}
// shared::cta -> global (this rank's memory or a mapped peer's: any generic address of global memory);
// completion through bulk groups: cp_async_bulk_commit_group + cp_async_bulk_wait_group{,_read}.
LOOM_DEVICE LOOM_FORCEINLINE void cp_async_bulk_s2g(void* gmem_dst, const void* smem_src, uint32_t bytes) {
#if LOOM_ARCH >= 900
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem_dst),
                 "r"(smem_addr(smem_src)), "r"(bytes)
                 : "memory");
#else
    unsupported_arch();
#endif
}
// A hint: bring [gmem, gmem + bytes) of global memory into L2 (bytes and the address multiples of 16). No completion
// to wait for and nothing to order: data written there later is still read correctly (L2 is coherent for it).
LOOM_DEVICE LOOM_FORCEINLINE void cp_async_bulk_prefetch_l2(const void* gmem, uint32_t bytes) {
#if LOOM_ARCH >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(gmem), "r"(bytes) : "memory");
#else
    unsupported_arch();
#endif
}
LOOM_DEVICE LOOM_FORCEINLINE void cp_async_bulk_commit_group() {
#if LOOM_ARCH >= 900
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#else
    unsupported_arch();
#endif
}
// Wait until at most N committed bulk groups of this thread are pending (writes complete and visible to this
// thread). The _read form only waits until their shared-memory sources have been read (smem reusable).
template <int N>
LOOM_DEVICE LOOM_FORCEINLINE void cp_async_bulk_wait_group() {
#if LOOM_ARCH >= 900
    asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
#else
    unsupported_arch();
#endif
}
template <int N>
LOOM_DEVICE LOOM_FORCEINLINE void cp_async_bulk_wait_group_read() {
#if LOOM_ARCH >= 900
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
#else
    unsupported_arch();
#endif
}

}  // namespace loom::ptx
