// bench-lang's NVSHMEM baseline: the same ping-pong with nvshmemx_signal_op + nvshmem_signal_wait_until
// (compiled by the JIT's nvcc path with KernelSpec::needs_nvshmem).
#pragma once

#include <nvshmem.h>
#include <nvshmemx.h>

namespace lang_bench {

__global__ void nvshmem_ping_pong(uint64_t* sig, uint64_t base, unsigned rounds, int partner, int initiator) {
    for (uint64_t r = base + 1; r <= base + rounds; ++r) {
        if (initiator) {
            nvshmemx_signal_op(sig, r, NVSHMEM_SIGNAL_SET, partner);
            nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, r);
        } else {
            nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, r);
            nvshmemx_signal_op(sig, r, NVSHMEM_SIGNAL_SET, partner);
        }
    }
}

}  // namespace lang_bench
