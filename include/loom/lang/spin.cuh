// The one bounded spin helper behind every wait in Loom, and the wrap-safe compares it uses.
//
// With ctx.wait_timeout_ns > 0 (LOOM_WAIT_TIMEOUT_MS on the host) a wait that does not complete in time
//   1. writes a DiagRecord into the process's diagnostic mailbox (lang/diag.cuh), which the host decodes into the
//      loom::Error of the next CUDA call that reports the sticky error;
//   2. unless the kernel defines LOOM_NO_DEVICE_PRINTF 1 (every wgmma kernel must: a printf call serialises
//      wgmma), prints — the first timed-out wait of the rank's module only (it claims loom_wait_timeout_claimed),
//      one summary line:
//        loom: wait timeout: rank R: <tag>: the signal of rank P is missing at <addr>: expected <cmp> <value>,
//        observed <value>, after <ms> ms (first of this rank: block (x,y,z) thread T)
//      ("the signal of rank P is missing" when the wait names the peer that should write it); and, when
//      LOOM_LOG_LEVEL is debug (loom_wait_verbose), every timed-out wait prints its own line:
//        loom: wait timeout detail: rank R block (x,y,z) thread T tag <tag> at <addr> expected <cmp> <value>
//        observed <value> after <ms> ms
//   3. traps; the launcher then tears the job down.
// With 0 it spins forever (an explicit opt-out). Without a World (no mailbox) step 1 writes nothing.
#pragma once

#include "loom/config.hpp"
#include "loom/lang/diag.cuh"  // defines LOOM_NO_DEVICE_PRINTF (0) when the kernel did not
#if !LOOM_NVRTC && !LOOM_NO_DEVICE_PRINTF
#include <cstdio>  // device printf (NVRTC declares it built in)
#endif
#include "loom/lang/context.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/special.cuh"

namespace loom::lang {

// Compares of a monotonic counter against a target. Counters may wrap: compares are made on the signed
// difference (observed - target), so GE means "at or past target" as long as the two are within 2^63.
enum class Cmp : int { EQ, NE, GE, GT, LE, LT };

// `d` is the signed difference observed - target, taken in the counter's own width.
template <class Signed>
LOOM_DEVICE LOOM_FORCEINLINE bool compare_difference(Signed d, Cmp cmp) {
    switch (cmp) {
        case Cmp::EQ:
            return d == 0;
        case Cmp::NE:
            return d != 0;
        case Cmp::GE:
            return d >= 0;
        case Cmp::GT:
            return d > 0;
        case Cmp::LE:
            return d <= 0;
        case Cmp::LT:
            return d < 0;
    }
    return false;
}
LOOM_DEVICE LOOM_FORCEINLINE bool compare(uint64_t observed, Cmp cmp, uint64_t target) {
    return compare_difference(static_cast<int64_t>(observed - target), cmp);
}
LOOM_DEVICE LOOM_FORCEINLINE bool compare(uint32_t observed, Cmp cmp, uint32_t target) {
    return compare_difference(static_cast<int32_t>(observed - target), cmp);
}

LOOM_DEVICE LOOM_FORCEINLINE const char* cmp_name(Cmp cmp) {
    switch (cmp) {
        case Cmp::EQ:
            return "==";
        case Cmp::NE:
            return "!=";
        case Cmp::GE:
            return ">=";
        case Cmp::GT:
            return ">";
        case Cmp::LE:
            return "<=";
        case Cmp::LT:
            return "<";
    }
    return "?";
}

namespace detail {
// The cold paths take the Ctx fields they report by value: a reference to the kernel's by-value Ctx would make the
// compiler copy the whole Ctx to local memory in every kernel's prologue, and the hot path's later reads of it
// would then be local-memory loads (slow after a wait's acquire invalidates L1).
#if LOOM_NO_DEVICE_PRINTF
// Cold path, mailbox only. Inlined: an out-of-line call would itself serialise wgmma.
LOOM_DEVICE LOOM_FORCEINLINE void wait_timeout(DiagMailbox* diag, int rank, const char* tag, int peer, const void* addr,
                                               Cmp cmp, uint64_t expected, uint64_t observed, uint64_t elapsed_ns) {
    (void)peer;
    diag_post(diag, DiagKind::Signal, rank, tag, addr, static_cast<uint32_t>(cmp), expected, observed, elapsed_ns);
    __trap();
}
#else
// Cold path: mailbox record, then the printed diagnostic (the rank's summary by the first wait to claim it; every
// wait's own line at debug level), then trap. Kept out of line so the spin loop stays small.
__noinline__ LOOM_DEVICE inline void wait_timeout(DiagMailbox* diag, int rank, const char* tag, int peer,
                                                  const void* addr, Cmp cmp, uint64_t expected, uint64_t observed,
                                                  uint64_t elapsed_ns) {
    diag_post(diag, DiagKind::Signal, rank, tag, addr, static_cast<uint32_t>(cmp), expected, observed, elapsed_ns);
    const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const auto e = static_cast<unsigned long long>(expected), o = static_cast<unsigned long long>(observed);
    const auto ms = static_cast<unsigned long long>(elapsed_ns / 1000000ull);
    if (ptx::atom_cas_relaxed_gpu(&loom_wait_timeout_claimed, 0u, 1u) == 0u) {
        if (peer >= 0) {
            printf(
                "loom: wait timeout: rank %d: %s: the signal of rank %d is missing at %p: expected %s %llu, observed "
                "%llu, after %llu ms (first of this rank: block (%u,%u,%u) thread %u)\n",
                rank, tag, peer, addr, cmp_name(cmp), e, o, ms, blockIdx.x, blockIdx.y, blockIdx.z, thread);
        } else {
            printf(
                "loom: wait timeout: rank %d: %s: a signal is missing at %p: expected %s %llu, observed %llu, after "
                "%llu ms (first of this rank: block (%u,%u,%u) thread %u)\n",
                rank, tag, addr, cmp_name(cmp), e, o, ms, blockIdx.x, blockIdx.y, blockIdx.z, thread);
        }
    }
    if (loom_wait_verbose != 0u) {
        printf(
            "loom: wait timeout detail: rank %d block (%u,%u,%u) thread %u tag %s at %p expected %s %llu observed "
            "%llu after %llu ms\n",
            rank, blockIdx.x, blockIdx.y, blockIdx.z, thread, tag, addr, cmp_name(cmp), e, o, ms);
    }
    __trap();
}
#endif
}  // namespace detail

// Spin until poll(observed) returns true. `poll` performs the (acquire/volatile) load itself and stores what it
// saw in `observed` (uint64_t&) for the diagnostic; `addr`, `cmp` and `expected` describe the wait for it.
// Called by one thread; returns the last observed value. The clock (globaltimer, a slow special register) is
// first read after 1024 unsuccessful polls and then every 1024 polls, so short waits never touch it; the
// timeout is therefore measured from a few microseconds into the wait.
// `peer`: the rank whose write completes the wait (named in the diagnostic), or -1 when the waiter cannot say.
template <class Poll>
LOOM_DEVICE LOOM_FORCEINLINE uint64_t spin_until(const Ctx& ctx, const char* tag, int peer, const void* addr, Cmp cmp,
                                                 uint64_t expected, Poll&& poll) {
    uint64_t observed = 0;
    const uint64_t timeout = ctx.wait_timeout_ns;
    uint64_t start = 0;
    for (uint32_t iter = 1;; ++iter) {
        if (poll(observed)) return observed;
        if (timeout && (iter & 1023) == 0) {
            const uint64_t now = ptx::globaltimer();
            if (start == 0) {
                start = now;
            } else if (now - start > timeout) {
                detail::wait_timeout(ctx.diag, ctx.rank, tag, peer, addr, cmp, expected, observed, now - start);
            }
        }
    }
}
template <class Poll>
LOOM_DEVICE LOOM_FORCEINLINE uint64_t spin_until(const Ctx& ctx, const char* tag, const void* addr, Cmp cmp,
                                                 uint64_t expected, Poll&& poll) {
    return spin_until(ctx, tag, -1, addr, cmp, expected, static_cast<Poll&&>(poll));
}

// What a timed-out wait reports (spin_or_trap).
struct WaitValues {
    uint64_t expected;
    uint64_t observed;
};

// One thread's bounded spin for device code that has no Ctx (the overlapped GEMMs' hooks, inside wgmma kernels):
// until done() returns true. Never prints (a printf call would make ptxas serialise the MMAs): on timeout
// (timeout_ns > 0) it posts a DiagRecord tagged `tag` to the process's mailbox (the host fills in the rank) with
// `addr`, `cmp` and report()'s WaitValues, and traps; the clock is read only after 1024 missed polls. report() runs
// on the cold path only, so a target that done() re-reads from memory need not stay in registers over the spin.
template <class Done, class Report>
LOOM_DEVICE LOOM_FORCEINLINE void spin_or_trap(uint64_t timeout_ns, const char* tag, const void* addr, Cmp cmp,
                                               Done&& done, Report&& report) {
    uint64_t start = 0;
    for (uint32_t it = 1;; ++it) {
        if (done()) return;
        if (timeout_ns != 0 && (it & 1023u) == 0) {
            const uint64_t now = ptx::globaltimer();
            if (start == 0) {
                start = now;
            } else if (now - start > timeout_ns) {
                const WaitValues v = report();
                detail::diag_post(nullptr, DiagKind::Signal, -1, tag, addr, static_cast<uint32_t>(cmp), v.expected,
                                  v.observed, now - start);
                __trap();
            }
        }
    }
}

// spin_or_trap for an acquire (sys scope) *sig >= target (wrap-safe).
LOOM_DEVICE LOOM_FORCEINLINE void wait_ge_sys_or_trap(const uint64_t* sig, uint64_t target, uint64_t timeout_ns,
                                                      const char* tag) {
    spin_or_trap(
        timeout_ns, tag, sig, Cmp::GE, [&] { return static_cast<int64_t>(ptx::ld_acquire_sys(sig) - target) >= 0; },
        [&] {
            return WaitValues{target, ptx::ld_acquire_sys(sig)};
        });
}

}  // namespace loom::lang
