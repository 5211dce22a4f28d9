// The waits inside the overlapped ops' hooked GEMMs (kernels/{ag_gemm,gemm_rs}.cuh).
#pragma once

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 1  // included next to a wgmma kernel: no printf anywhere (ptxas C7510)
#endif

#include "loom/config.hpp"
#include "loom/lang/lang.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/special.cuh"

namespace loom::kernels::overlap {

// Bounded acquire-spin of one thread for `*sig >= target` (wrap-safe) that traps on timeout without printing:
// it runs inside the wgmma kernel, where any call (printf) would make ptxas serialise the MMAs. The clock is read
// only after 1024 missed polls. The host sees the trap as a launch failure from its next synchronising call; with
// LOOM_DIAG_MAILBOX=1 the error names this wait (`what`; the record's rank is filled in by the host: the hooks
// have no Ctx).
LOOM_DEVICE LOOM_FORCEINLINE void wait_ge_trap(const uint64_t* sig, uint64_t target, uint64_t timeout_ns,
                                               const char* what) {
    uint64_t start = 0;
    for (uint32_t it = 1;; ++it) {
        if (static_cast<int64_t>(ptx::ld_acquire_sys(sig) - target) >= 0) return;
        if (timeout_ns != 0 && (it & 1023u) == 0) {
            const uint64_t now = ptx::globaltimer();
            if (start == 0) {
                start = now;
            } else if (now - start > timeout_ns) {
                lang::detail::diag_post(nullptr, DiagKind::Signal, -1, what, sig, static_cast<uint32_t>(lang::Cmp::GE),
                                        target, ptx::ld_acquire_sys(sig), now - start);
                __trap();
            }
        }
    }
}

}  // namespace loom::kernels::overlap
