// bench-lang's kernels: signal ping-pong and puts on each device-language data path.
#pragma once

#include "loom/lang/lang.cuh"

namespace lang_bench {
using namespace loom::lang;
using loom::uint32_t;
using loom::uint64_t;

// `rounds` round trips with `partner` inside one kernel (one thread). Launch k continues the monotonic signal
// from base = k * rounds, so nothing is reset between launches. The even rank of the pair starts.
__global__ void ping_pong(loom::Ctx ctx, uint64_t* sig, uint64_t base, uint32_t rounds, int partner, Scope scope) {
    const bool initiator = rank(ctx) < partner;
    for (uint64_t r = base + 1; r <= base + rounds; ++r) {
        if (initiator) {
            signal_op(ctx, sig, r, SignalOp::Set, partner, scope);
            signal_wait_until(ctx, sig, Cmp::GE, r, scope);
        } else {
            signal_wait_until(ctx, sig, Cmp::GE, r, scope);
            signal_op(ctx, sig, r, SignalOp::Set, partner, scope);
        }
    }
}

// Each block puts its contiguous, 16-byte aligned share of [0, bytes) into `peer`'s dst. P: 0 ld/st, 1 TMA
// (dynamic smem = tma_staging_bytes(kStages, kStageBytes)).
inline constexpr uint32_t kStages = 4;
inline constexpr uint32_t kStageBytes = 32 * 1024;

template <int P>
__global__ void put_bw(loom::Ctx ctx, char* dst, const char* src, uint64_t bytes, int peer) {
    extern __shared__ __align__(128) char smem[];
    const uint64_t per_block = ((bytes + gridDim.x - 1) / gridDim.x + 15) & ~uint64_t(15);
    const uint64_t begin = per_block * blockIdx.x;
    if (begin >= bytes) return;
    const uint64_t len = bytes - begin < per_block ? bytes - begin : per_block;
    if constexpr (P == 1) {
        put_nbi(block, ctx, dst + begin, src + begin, len, peer, make_tma_staging(block, smem, kStages, kStageBytes));
    } else {
        put_nbi(block, ctx, dst + begin, src + begin, len, peer, LdSt{});
    }
    quiet(block, ctx);
}

}  // namespace lang_bench
