// bench-ep's NVSHMEM baseline: Loom's throughput-mode dispatch / combine algorithm (kernels/moe/ep_dispatch.cuh,
// ep_combine.cuh) with every transfer between ranks written against NVSHMEM's device API, as DeepEP's kernels are.
// The buffers the peers write (EpParams::sig, counts_all, recv_x, pair_rows, pair_weights, combine_rows) are in
// NVSHMEM's heap; the Ctx gives only rank, world size and the wait bound (no peer is reached through it).
//
//   count, index, arrive   Loom's ep_layout_count / ep_layout_index / ep_dispatch_arrive (local work; the arrive's
//                          waits are loads of this rank's own signals)
//   nv_ep_layout_scan      Loom's scan with the exchange as one nvshmem_putmem_signal_nbi of the totals row per rank
//   nv_ep_dispatch_push    a warp per token: per destination rank, the row by nvshmemx_putmem_nbi_warp straight
//                          from x, the pair record by nvshmem_int_p / nvshmem_float_p; each thread completes its puts
//                          (nvshmem_quiet) before the block's ticket; the last block sets arrived[me] by
//                          nvshmemx_signal_op at every rank
//   nv_ep_combine_send     Loom's per-pair partial sums (local; pairs of one slot skipped), then combined[me] by
//                          nvshmemx_signal_op
//   nv_ep_combine_reduce   Loom's token reduce, each partial (a one-slot pair's expert row) read in place at its rank
//                          through nvshmem_ptr
// The combine's expert_out must be in NVSHMEM's heap with the same row stride on every rank (bench-ep passes the
// version's own recv_x).
// Waits are Loom's bounded ones (a timeout traps with a named diagnostic). Compiled by the JIT's nvcc path with
// KernelSpec::needs_nvshmem. One node (the pushes read x, which is not registered with a network transport).
#pragma once

#include <nvshmem.h>
#include <nvshmemx.h>

#include "loom/kernels/moe/ep_combine.cuh"

namespace ep_bench {

using namespace loom::kernels::moe;
using loom::Ctx;

__global__ void __launch_bounds__(kEpScanThreads) nv_ep_layout_scan(Ctx ctx, EpParams p) {
    __shared__ EpScanShared sh;
    const int W = ctx.world, me = ctx.rank, C = ep_cols(p, W);
    ep_scan_totals(p, W, sh);
    int32_t* const own_row = p.counts_all + static_cast<int64_t>(me) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) own_row[c] = sh.tot[c];
    __syncthreads();
    for (int d = threadIdx.x; d < W; d += blockDim.x) {
        if (d == me) {
            __threadfence_system();
            nvshmemx_signal_op(p.sig->counts_ready + me, sh.epoch, NVSHMEM_SIGNAL_SET, me);
        } else {
            nvshmem_putmem_signal_nbi(own_row, own_row, sizeof(int32_t) * static_cast<size_t>(C),
                                      p.sig->counts_ready + me, sh.epoch, NVSHMEM_SIGNAL_SET, d);
        }
    }
    for (int d = threadIdx.x; d < W; d += blockDim.x)
        ep_wait(ctx.wait_timeout_ns, p.sig->counts_ready + d, sh.epoch, "nv_ep_layout_scan: waits for a rank's counts");
    __syncthreads();
    ep_scan_layout(p, W, me, ctx.local_world, sh);
}

__global__ void __launch_bounds__(kEpThreads) nv_ep_dispatch_push(Ctx ctx, EpParams p) {
    const int W = ctx.world, me = ctx.rank;
    const int lane = threadIdx.x % 32;
    const bool move = p.dev->overflow == 0;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    const uint4* x = static_cast<const uint4*>(p.x);
    const size_t row_bytes = static_cast<size_t>(p.row_words) * 16;
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; move && t < p.tokens;
         t += warps) {
        const EpSlot sl = ep_slot(p, t, lane);
        const int32_t row = sl.row;
        const float w = sl.w;
        const EpDests dests = ep_dests(sl.e, p.local_experts);
        for (unsigned m = dests.first; m != 0; m &= m - 1) {
            const int f = __ffs(m) - 1;
            const int d = __shfl_sync(0xffffffffu, dests.rank, f);
            const int32_t first = __shfl_sync(0xffffffffu, row, f);
            const int32_t q = p.token_pair[t * W + d];
            if (first < 0 || first >= p.capacity)
                bad_index("nv_ep_dispatch_push entry_row", p.entry_row, first, p.capacity);
            if (q < 0 || q >= p.pair_capacity)
                bad_index("nv_ep_dispatch_push token_pair", p.token_pair, q, p.pair_capacity);
            const int64_t rec = static_cast<int64_t>(q) * p.topk;
            if (lane < p.topk) {
                nvshmem_int_p(p.pair_rows + rec + lane, dests.rank == d ? row : -1, d);
                nvshmem_float_p(p.pair_weights + rec + lane, w, d);
            }
            nvshmemx_putmem_nbi_warp(static_cast<uint4*>(p.recv_x) + static_cast<int64_t>(first) * p.row_words,
                                     x + t * p.x_ld_words, row_bytes, d);
        }
    }
    nvshmem_quiet();  // this thread's puts are complete before the block's ticket
    if (ep_last_block(&p.dev->push_ticket)) {
        const uint64_t epoch = p.dev->dispatch_calls;
        for (int j = 1; j <= W; ++j) {  // peers first, own last
            const int d = me + j < W ? me + j : me + j - W;
            nvshmemx_signal_op(p.sig->arrived + me, epoch, NVSHMEM_SIGNAL_SET, d);
        }
    }
}

__global__ void __launch_bounds__(kEpThreads) nv_ep_combine_send(Ctx ctx, EpParams p) {
    __shared__ uint64_t s_epoch;
    __shared__ EpPairSlots sl;
    const int W = ctx.world, me = ctx.rank;
    if (threadIdx.x == 0) s_epoch = loom::lang::launch_epoch_enter(&p.dev->combine);
    const int32_t pairs = p.dev->overflow == 0 ? p.dev->recv_pairs : 0;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    for (int64_t q = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; q < pairs; q += warps)
        ep_pair_partial(p, q, sl, true);  // one-slot pairs: read in place by the token's rank
    if (ep_last_block(&p.dev->send_ticket))
        for (int d = 0; d < W; ++d) nvshmemx_signal_op(p.sig->combined + me, s_epoch, NVSHMEM_SIGNAL_SET, d);
}

__global__ void __launch_bounds__(kEpThreads) nv_ep_combine_reduce(Ctx ctx, EpParams p) {
    __shared__ const uint4* s_src[kEpThreads / 32][32];
    __shared__ float s_w[kEpThreads / 32][32];
    const int W = ctx.world;
    const uint64_t epoch = p.dev->combine.calls;
    for (int d = threadIdx.x; d < W; d += blockDim.x)
        ep_wait(ctx.wait_timeout_ns, p.sig->combined + d, epoch, "nv_ep_combine_reduce: waits for a rank's partials");
    __syncthreads();
    if (p.dev->overflow != 0) return;
    const auto source_of = [&](int d, int32_t q, int32_t row, bool single) -> EpPartialSource {
        if (single)
            return {
                static_cast<const uint4*>(nvshmem_ptr(p.expert_out, d)) + static_cast<int64_t>(row) * p.out_ld_words,
                true};
        return {static_cast<const uint4*>(nvshmem_ptr(p.combine_rows, d)) + static_cast<int64_t>(q) * p.row_words,
                false};
    };
    ep_reduce_tokens(p, W, source_of, s_src, s_w);
}

}  // namespace ep_bench
