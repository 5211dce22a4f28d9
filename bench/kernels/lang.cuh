// bench-lang's kernels: signal ping-pong and puts on each device-language data path.
#pragma once

#include "loom/lang/lang.cuh"

namespace lang_bench {
using namespace loom::lang;
using loom::uint32_t;
using loom::uint64_t;

// `rounds` round trips with `partner` inside one kernel (one thread). Launch k continues the monotonic signal
// from base = k * rounds, so nothing is reset between launches. The lower rank of the pair starts.
// mode 0: release/acquire at sys scope (the default notify/wait); 1: at gpu scope; 2: relaxed signal_op at sys
// scope + the default (acquire) wait, an acquire load per poll; 3: as 2 with relaxed polls and one fence.acquire
// after them (an alternative wait, kept for comparison);
// 4: relaxed signal + relaxed poll with no acquire at all — exactly what nvshmemx_signal_op +
// nvshmem_signal_wait_until do (a volatile store, a volatile poll); 5: release as fence.release.sys + relaxed
// store (a candidate for notify's release) + the default wait.
// MODE is a template argument, as the scope and semantics are constants in a user's kernel: a runtime mode put a
// branch on the scope into every poll of the wait loop.
template <int MODE>
__device__ __forceinline__ void ping_pong_wait(const loom::Ctx& ctx, uint64_t* sig, uint64_t r, Scope scope) {
    constexpr int mode = MODE;
    if constexpr (mode == 3) {
        spin_until(ctx, "ping_pong", sig, Cmp::GE, r, [&](uint64_t& observed) {
            observed = load_relaxed(sig, scope);
            return compare(observed, Cmp::GE, r);
        });
        scope == Scope::Sys ? loom::ptx::fence_acquire_sys() : loom::ptx::fence_acquire_gpu();
    } else if constexpr (mode == 4) {
        spin_until(ctx, "ping_pong", sig, Cmp::GE, r, [&](uint64_t& observed) {
            observed = load_relaxed(sig, scope);
            return compare(observed, Cmp::GE, r);
        });
    } else {
        signal_wait_until(ctx, sig, Cmp::GE, r, scope);
    }
}
// mode 6: as 4 with the peer's signal address computed once before the loop and a bare poll loop (no bound):
// NVSHMEM's ping-pong written by hand, to tell the primitives' overhead from the hardware's.
__device__ __forceinline__ void ping_pong_bare(uint64_t* sig, uint64_t* remote, uint64_t base, uint32_t rounds,
                                               bool initiator) {
    for (uint64_t r = base + 1; r <= base + rounds; ++r) {
        if (!initiator)
            while (loom::ptx::ld_relaxed_sys(sig) < r) {
            }
        loom::ptx::st_relaxed_sys(remote, r);
        if (initiator)
            while (loom::ptx::ld_relaxed_sys(sig) < r) {
            }
    }
}
template <int MODE>
__global__ void ping_pong(loom::Ctx ctx, uint64_t* sig, uint64_t base, uint32_t rounds, int partner) {
    constexpr int mode = MODE;
    const bool initiator = rank(ctx) < partner;
    if constexpr (mode == 6) {
        ping_pong_bare(sig, symm_at(ctx, sig, partner), base, rounds, initiator);
        return;
    }
    constexpr Scope scope = mode == 1 ? Scope::Gpu : Scope::Sys;
    for (uint64_t r = base + 1; r <= base + rounds; ++r) {
        if (!initiator) ping_pong_wait<MODE>(ctx, sig, r, scope);
        if constexpr (mode == 5) {
            loom::ptx::fence_release_sys();
            loom::ptx::st_relaxed_sys(symm_at(ctx, sig, partner), r);
        } else if constexpr (mode >= 2) {
            signal_op_relaxed(ctx, sig, r, SignalOp::Set, partner, scope);
        } else {
            signal_op(ctx, sig, r, SignalOp::Set, partner, scope);
        }
        if (initiator) ping_pong_wait<MODE>(ctx, sig, r, scope);
    }
}

// As ping_pong mode 2 (relaxed signal, default wait) with the Ctx a __grid_constant__ parameter: symm_at's
// dynamic index into ctx.heap then reads the parameter bank instead of a local-memory copy of the Ctx.
__global__ void ping_pong_grid_constant(const __grid_constant__ loom::Ctx ctx, uint64_t* sig, uint64_t base,
                                        uint32_t rounds, int partner) {
    const bool initiator = rank(ctx) < partner;
    for (uint64_t r = base + 1; r <= base + rounds; ++r) {
        if (!initiator) signal_wait_until(ctx, sig, Cmp::GE, r);
        signal_op_relaxed(ctx, sig, r, SignalOp::Set, partner);
        if (initiator) signal_wait_until(ctx, sig, Cmp::GE, r);
    }
}

// Each block puts its contiguous, page-aligned share of [0, bytes) into `peer`'s dst. P: 0 ld/st, 1 TMA
// (dynamic smem = tma_staging_bytes(STAGES, kStageBytes)).
inline constexpr uint32_t kStageBytes = 32 * 1024;

template <int P, int STAGES = 4>
__global__ void put_bw(loom::Ctx ctx, char* dst, const char* src, uint64_t bytes, int peer) {
    extern __shared__ __align__(128) char smem[];
    // Shares are whole 4 KiB pages: a share that starts mid-line makes every bulk store of the block straddle
    // cache lines (partial-line writes over NVLink), which cost up to a third of the bandwidth at block counts
    // that do not divide the size.
    const uint64_t per_block = ((bytes + gridDim.x - 1) / gridDim.x + 4095) & ~uint64_t(4095);
    const uint64_t begin = per_block * blockIdx.x;
    if (begin >= bytes) return;
    const uint64_t len = bytes - begin < per_block ? bytes - begin : per_block;
    if constexpr (P == 1) {
        put_nbi(block, ctx, dst + begin, src + begin, len, peer, make_tma_staging(block, smem, STAGES, kStageBytes));
    } else {
        put_nbi(block, ctx, dst + begin, src + begin, len, peer, LdSt{});
    }
    quiet(block, ctx);
}

// As put_bw's TMA path with the bytes dealt block-cyclically in GRANULE-byte pieces (block b puts granules b, b + G,
// b + 2G, ...; one put_nbi each): at any moment the grid writes one window of G granules instead of G streams far
// apart.
template <int STAGES, uint64_t GRANULE>
__global__ void put_bw_cyclic(loom::Ctx ctx, char* dst, const char* src, uint64_t bytes, int peer) {
    extern __shared__ __align__(128) char smem[];
    const Tma t = make_tma_staging(block, smem, STAGES, kStageBytes);
    for (uint64_t begin = uint64_t(blockIdx.x) * GRANULE; begin < bytes; begin += uint64_t(gridDim.x) * GRANULE) {
        const uint64_t len = bytes - begin < GRANULE ? bytes - begin : GRANULE;
        put_nbi(block, ctx, dst + begin, src + begin, len, peer, t);
    }
    quiet(block, ctx);
}

// As put_bw's TMA path with WARPS pipelines per block: warp w of block b puts share b x WARPS + w (page-aligned)
// through its own staging area (smem + w x tma_staging_bytes(STAGES, STAGE_BYTES)), so a block keeps WARPS times the
// copies in flight at the same SM count.
template <int WARPS, int STAGES, uint32_t STAGE_BYTES>
__global__ void put_bw_warps(loom::Ctx ctx, char* dst, const char* src, uint64_t bytes, int peer) {
    extern __shared__ __align__(128) char smem[];
    const uint32_t w = threadIdx.x / 32;
    const uint64_t shares = uint64_t(gridDim.x) * WARPS;
    const uint64_t per_share = ((bytes + shares - 1) / shares + 4095) & ~uint64_t(4095);
    const uint64_t begin = per_share * (uint64_t(blockIdx.x) * WARPS + w);
    if (begin >= bytes) return;  // warp-uniform: the warp's share is past the end
    const uint64_t len = bytes - begin < per_share ? bytes - begin : per_share;
    char* staging = smem + w * tma_staging_bytes(STAGES, STAGE_BYTES);
    put_nbi(warp, ctx, dst + begin, src + begin, len, peer, make_tma_staging(warp, staging, STAGES, STAGE_BYTES));
    quiet(warp, ctx);
}

}  // namespace lang_bench
