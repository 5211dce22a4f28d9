// bench-remote's kernels: the language's remote column (peers on another node, through NVSHMEM) against NVSHMEM's own
// device calls, the same pattern in each pair. Loom's are compiled with KernelSpec::remote_peers, NVSHMEM's with
// needs_nvshmem (both by the JIT's nvcc path).
//
//   remote_ping_pong / nvshmem_ping_pong  `rounds` signal round trips between this rank and `partner` in one thread:
//                                         signal_op_relaxed + signal_wait_until_relaxed (Loom, NVSHMEM's semantics;
//                                         <true>: signal_wait_until, an acquire), nvshmemx_signal_op +
//                                         nvshmem_signal_wait_until (NVSHMEM, on its own heap or on Loom's registered
//                                         one). Counters continue from `base`.
//   remote_put / nvshmem_put              block b puts chunk b of `bytes` (a multiple of 16, split in 16-byte units)
//                                         from src to the peer's dst at block scope, then completes it (quiet): Loom's
//                                         put(Block) + quiet(Block), NVSHMEM's nvshmemx_putmem_block + nvshmem_quiet.
#pragma once

#include <nvshmem.h>
#include <nvshmemx.h>

#include "loom/lang/lang.cuh"

namespace remote_bench {

template <bool kAcquire>
__global__ void remote_ping_pong(loom::Ctx ctx, uint64_t* sig, uint64_t base, uint32_t rounds, int partner,
                                 int initiator) {
    using namespace loom::lang;
    auto wait = [&](uint64_t r) {
        if constexpr (kAcquire) {
            signal_wait_until(ctx, sig, Cmp::GE, r);
        } else {
            signal_wait_until_relaxed(ctx, sig, Cmp::GE, r);
        }
    };
    for (uint64_t r = base + 1; r <= base + rounds; ++r) {
        if (!initiator) wait(r);
        signal_op_relaxed(ctx, sig, r, SignalOp::Set, partner);
        if (initiator) wait(r);
    }
}

// NVSHMEM's calls: the signal goes to the partner's `sig` (an NVSHMEM symmetric address), the wait polls `local`
// (this rank's copy, under any address that maps it).
__global__ void nvshmem_ping_pong(uint64_t* sig, uint64_t* local, uint64_t base, uint32_t rounds, int partner,
                                  int initiator) {
    for (uint64_t r = base + 1; r <= base + rounds; ++r) {
        if (!initiator) nvshmem_signal_wait_until(local, NVSHMEM_CMP_GE, r);
        nvshmemx_signal_op(sig, r, NVSHMEM_SIGNAL_SET, partner);
        if (initiator) nvshmem_signal_wait_until(local, NVSHMEM_CMP_GE, r);
    }
}

// Block b's chunk [begin, end) of `bytes`, in 16-byte units.
__device__ __forceinline__ void chunk_of(uint64_t bytes, uint64_t& begin, uint64_t& end) {
    const uint64_t units = bytes / 16, per = (units + gridDim.x - 1) / gridDim.x;
    begin = min(units, per * blockIdx.x) * 16;
    end = min(units, per * (blockIdx.x + 1)) * 16;
}

__global__ void remote_put(loom::Ctx ctx, char* dst, const char* src, uint64_t bytes, int peer) {
    using namespace loom::lang;
    uint64_t b, e;
    chunk_of(bytes, b, e);
    if (e > b) put(Block{}, ctx, dst + b, src + b, e - b, peer);
    quiet(Block{}, ctx);
}

__global__ void nvshmem_put(char* dst, const char* src, uint64_t bytes, int peer) {
    uint64_t b, e;
    chunk_of(bytes, b, e);
    if (e > b) nvshmemx_putmem_block(dst + b, src + b, e - b, peer);
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
    __syncthreads();
}

}  // namespace remote_bench
