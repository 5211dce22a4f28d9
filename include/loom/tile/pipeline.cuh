// mbarrier pipelines: a ring of STAGES shared-memory slots passed between a producer (TMA) and consumers
// (tensor cores), each slot guarded by a "full" barrier (data landed) and an "empty" barrier (slot released).
//
//   producer:  wait empty[s] (parity ph ^ 1) -> arrive_expect_tx full[s] -> TMA loads complete_tx full[s]
//   consumer:  wait full[s]  (parity ph)     -> read slot s               -> arrive empty[s]
//
// Iteration i uses slot i % STAGES with phase parity (i / STAGES) & 1; producer and consumers walk the same
// sequence of iterations, so their PipelineState advances in lock-step. A fresh barrier is in phase 0, so the
// producer's first wait on empty (parity 1, "the phase before 0") succeeds at once.
#pragma once

#include "loom/config.hpp"
#include "loom/lang/diag.cuh"
#include "loom/ptx/cluster.cuh"
#include "loom/ptx/mbarrier.cuh"

namespace loom::tile {

// Bound on one mbarrier wait before the kernel reports and traps (~17 s at 2 GHz): a pipeline stall this long is a
// deadlock (a missing arrive, a wrong expect_tx byte count or a TMA fault), never slowness. The host sees the
// trap as cudaErrorLaunchFailure / an illegal-instruction error from the next synchronising call.
inline constexpr long long kMbarrierTimeoutCycles = 1ll << 35;

// Waits for the phase of `bar` with `parity`. The fast path is a single try_wait; only a miss reads the clock.
// On timeout: a DiagRecord (kind Mbarrier: tag, barrier address, expected parity, the raw barrier word, cycles
// waited) goes to the process's diagnostic mailbox, found through the module global loom_diag_mailbox that the
// JIT sets at load (these waits have no Ctx, and the GEMM's parameters stay as they are); then trap. No printf,
// on purpose: a function call anywhere in a wgmma kernel makes ptxas serialise every wgmma ("wgmma pipeline
// crossing function boundary", C7510), which costs ~20% of the GEMM's throughput; the record is written inline.
// Without a mailbox (a module not loaded by Loom's JIT, or no World) it only traps.
// `bound_cycles` (> 0) replaces the bound for a wait that may legitimately last longer (outlast_cycles, below); 0 waits
// without one.
LOOM_DEVICE LOOM_FORCEINLINE void mbarrier_wait(uint64_t* bar, uint32_t parity, const char* tag,
                                                long long bound_cycles = kMbarrierTimeoutCycles) {
    if (ptx::mbarrier_try_wait_parity(bar, parity)) return;
    const long long start = clock64();
    while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
        const long long waited = clock64() - start;
        if (bound_cycles > 0 && waited > bound_cycles) {
            const uint64_t word = *static_cast<volatile uint64_t*>(bar);  // opaque state, for the report only
            lang::detail::diag_post(nullptr, DiagKind::Mbarrier, -1, tag, bar, 0, parity, word,
                                    static_cast<uint64_t>(waited));
            __trap();
        }
    }
}

// The consumers' bound in a kernel whose producer waits on other ranks before its loads (a hooked GEMM's
// before_load, bounded by `producer_bound_ns`, the World's wait bound; 0: unbounded): the consumers wait behind it, so
// their bound outlasts it (2 cycles per ns covers clocks up to 2 GHz) and the producer's wait, which names the missing
// signal, reports first. A wait of the producer that ends in time ends the consumers' too.
LOOM_DEVICE LOOM_FORCEINLINE long long outlast_cycles(uint64_t producer_bound_ns) {
    return producer_bound_ns == 0 ? 0 : static_cast<long long>(2 * producer_bound_ns) + kMbarrierTimeoutCycles;
}
// The consumers' bound of a kernel with hooks `Hooks`: outlast_cycles of hooks.wait_bound_ns() where the producer
// waits before its loads (kProducerWaits: the kernel's load-wait concept), else the default. Read from the
// __grid_constant__ hooks at the wait, not held across the mainloop.
template <bool kProducerWaits, class Hooks>
LOOM_DEVICE LOOM_FORCEINLINE long long consumer_wait_cycles(const Hooks& hooks) {
    if constexpr (kProducerWaits) {
        return outlast_cycles(hooks.wait_bound_ns());
    } else {
        (void)hooks;
        return kMbarrierTimeoutCycles;
    }
}

// The same wait, bounded by a count of polls instead of the clock and with no report before the trap: for waits in
// code with no registers to spare (the consumers' epilogue, 128 accumulators live under a 168-register cap), where
// the report's stores and the 64-bit clock made ptxas spill. Each try_wait may suspend the thread for a while, so
// 2^30 polls bound the wait at seconds to minutes: a deadlock, never slowness.
LOOM_DEVICE LOOM_FORCEINLINE void mbarrier_wait_lean(uint64_t* bar, uint32_t parity) {
    uint32_t polls = 0;
    while (!ptx::mbarrier_try_wait_parity(bar, parity))
        if (++polls == (1u << 30)) __trap();
}

// Position in the ring: slot index and the phase parity of the current pass.
template <int STAGES>
struct PipelineState {
    uint32_t stage = 0;
    uint32_t phase = 0;
    LOOM_DEVICE LOOM_FORCEINLINE void advance() {
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
};

// The barriers of a STAGES-deep TMA pipeline, placed in shared memory by the kernel.
template <int STAGES>
struct TmaPipeline {
    uint64_t full[STAGES];
    uint64_t empty[STAGES];

    // One thread; then fence_mbarrier_init() and a CTA barrier before use. `consumer_arrivals`: arrivals that
    // release a slot (one per consumer warpgroup in Loom's GEMM).
    LOOM_DEVICE void init(uint32_t consumer_arrivals) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            ptx::mbarrier_init(&full[s], 1);
            ptx::mbarrier_init(&empty[s], consumer_arrivals);
        }
        ptx::fence_mbarrier_init();
    }

    // Producer (one thread): wait until slot st.stage is free, then announce `bytes` of TMA traffic for it.
    LOOM_DEVICE LOOM_FORCEINLINE uint64_t* producer_acquire(const PipelineState<STAGES>& st, uint32_t bytes) {
        mbarrier_wait(&empty[st.stage], st.phase ^ 1, "pipeline empty");
        ptx::mbarrier_arrive_expect_tx(&full[st.stage], bytes);
        return &full[st.stage];
    }

    // Consumer (every thread that reads the slot): wait until its TMA bytes have landed.
    LOOM_DEVICE LOOM_FORCEINLINE void consumer_wait(const PipelineState<STAGES>& st,
                                                    long long bound_cycles = kMbarrierTimeoutCycles) {
        mbarrier_wait(&full[st.stage], st.phase, "pipeline full", bound_cycles);
    }
    LOOM_DEVICE LOOM_FORCEINLINE void consumer_wait_lean(const PipelineState<STAGES>& st) {
        mbarrier_wait_lean(&full[st.stage], st.phase);
    }

    // Consumer (one thread per arriving unit, after its reads of the slot are complete): hand the slot back.
    LOOM_DEVICE LOOM_FORCEINLINE void consumer_release(uint32_t stage) { ptx::mbarrier_arrive(&empty[stage]); }

    // Cluster form (TMA multicast): slot s of every CTA is also written by its peers' multicasts, so a peer's
    // producer may refill it only after this CTA's consumers are done with it too. Each arriving warp calls this
    // with all its lanes; lane c < kCluster arrives on CTA c's empty[stage] (init with consumer_arrivals counting
    // the arriving warps of the whole cluster).
    template <int kCluster>
    LOOM_DEVICE LOOM_FORCEINLINE void consumer_release_cluster(uint32_t stage, uint32_t lane) {
        if (lane < static_cast<uint32_t>(kCluster)) ptx::mbarrier_arrive_cluster(&empty[stage], lane);
    }
};

}  // namespace loom::tile
