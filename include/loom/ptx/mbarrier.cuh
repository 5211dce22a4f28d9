// mbarrier: the shared-memory transaction barrier (sm_80+; expect_tx and cluster forms sm_90+).
//
// An mbarrier completes a phase when its pending arrival count reaches zero and (sm_90) its transaction
// count is balanced by the bytes that async copies (TMA) reported with complete_tx. Waiters poll the parity
// of the phase they wait for: phase k completes -> try_wait.parity(k & 1) succeeds.
// Addresses are generic pointers to __shared__ uint64_t; the wrappers convert them.
#pragma once

#include "loom/config.hpp"

namespace loom::ptx {

LOOM_DEVICE LOOM_FORCEINLINE uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One thread initialises; the init must be made visible (fence_mbarrier_init + a CTA/cluster barrier) before
// any other thread or the async proxy uses the barrier.
LOOM_DEVICE LOOM_FORCEINLINE void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}

// Makes earlier mbarrier.init visible to the async proxy and to the cluster (sm_90).
LOOM_DEVICE LOOM_FORCEINLINE void fence_mbarrier_init() {
#if LOOM_ARCH >= 900
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Arrive (release at CTA scope): this thread's earlier shared-memory accesses happen before the phase completes.
LOOM_DEVICE LOOM_FORCEINLINE void mbarrier_arrive(uint64_t* bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_addr(bar)) : "memory");
}

// Arrive and add `bytes` to the transaction count the phase waits for (the TMA copies then complete_tx them).
LOOM_DEVICE LOOM_FORCEINLINE void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if LOOM_ARCH >= 900
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
#else
    __trap();
#endif
}

// One bounded poll (acquire at CTA scope): true once the phase with this parity has completed. The hardware
// may suspend the thread for a while inside the instruction, so a loop around it is not a hot spin.
LOOM_DEVICE LOOM_FORCEINLINE bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
    uint32_t done;
#if LOOM_ARCH >= 900
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
#else
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
#endif
    return done != 0;
}

}  // namespace loom::ptx
