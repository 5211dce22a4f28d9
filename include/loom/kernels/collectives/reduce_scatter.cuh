// ReduceScatter over the node's symmetric heap: out[i] = op over ranks r of in_r[me * count + i], fp32
// accumulation for 16-bit types, sources combined in rank order 0, 1, ... on every rank.
//
//   reduce_scatter_pull<T, kOp, kDepth>  each rank reads its chunk from every peer's in (in symmetric) and
//                                        reduces in registers: one pass, no scratch (NCCL's symmetric RS).
//                                        kDepth: reduce_multi's vectors in flight (kDepthGrid with ranks
//                                        sharing a GPU, where the grid strides: thread_share); kW > 0: the
//                                        world size at compile time (only its pointers live in registers).
//   reduce_scatter_scatter<T, kOp, kPath> scatter then local reduce: each rank pushes chunk j of its input into
//                                        slot `me` of rank j's scratch, then reduces its W slots locally. Any in
//                                        (not symmetric); large counts go through scratch in rounds of
//                                        p.round_elems elements per peer.
//   reduce_scatter_ring<T, kOp>          W-1 steps around the ring (NCCL's ring): at step s a rank reduces
//                                        the partial of chunk (me - s - 1) it received at step s-1 with its own
//                                        input chunk and stores the result straight into slot s of the next
//                                        rank's scratch; after the last step it adds its own chunk `me` to what
//                                        arrived and writes out. Each link carries one chunk per step (bandwidth
//                                        optimal); any in (not symmetric), in-place allowed; rounds of
//                                        p.round_elems elements when a chunk exceeds scratch / (W - 1). Partial
//                                        sums travel in T, so 16-bit results are rounded at every hop and the
//                                        sources are combined in ring order (c+1, ..., c-1, c) for chunk c: the
//                                        result is the same on every rank (one owner per chunk) but not bitwise
//                                        that of pull / scatter.
//   reduce_scatter_ce_reduce<T, kOp>     one round's local reduce of the copy-engine scatter (the pushes are
//                                        cudaMemcpyAsync on side streams;
//                                        src/ops/collectives/reduce_scatter/scatter_ce.cpp pipelines the rounds).
// Block b handles elements [lo, hi) of the chunk (block_share) and synchronises with block b of the peers.
// In-place: out == in + me * count.
#pragma once

#include "loom/kernels/collectives/coll_common.cuh"

namespace loom::kernels::coll {

// kDepthGrid compiles for two blocks per SM (64 registers), though the host launches one per SM of the rank's share:
// that code ran faster (2 ranks on one H200, 1 GiB: 780 us against 924 with the register cap of one block per SM).
template <class T, int kOp, int kDepth = kDepthDeep, int kW = 0>
__global__ void __launch_bounds__(512, kDepth == kDepthGrid ? 2 : 1) reduce_scatter_pull(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollReduceScatter);
    const uint64_t e = begin_call(p.sync);
    const int W = kW > 0 ? kW : ctx.local_world, me = ctx.local_rank;
    const ThreadShare s = thread_share(p, p.count, kVec<T>);
    const T* const in = static_cast<const T*>(p.in);
    barrier_peers(ctx, p.sync, sig_value(e, 1));  // peers' inputs are written
    if (s.r.size()) {
        const T* src[kMaxLocalPeers];
        T* dst[kMaxLocalPeers];
        for (int q = 0; q < kMaxLocalPeers; ++q) {
            src[q] = q < W ? lang::symm_at(ctx, in, peer_rank(ctx, q)) + me * p.count + s.r.lo : nullptr;
            dst[q] = static_cast<T*>(p.out) + s.r.lo;
        }
        reduce_multi<T, kOp, kDepth>(src, W, dst, 1, s.r.size(), s.tid, s.nt);
    }
    barrier_peers(ctx, p.sync, sig_value(e, 2));  // every peer has read my input
}

template <class T, int kOp, int kPath>
__global__ void __launch_bounds__(512) reduce_scatter_scatter(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollReduceScatter);
    scatter_reduce_rounds<T, kOp, kPath>(ctx, p, /*peer_stride=*/p.count);
}

template <class T, int kOp>
__global__ void __launch_bounds__(512) reduce_scatter_ring(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollReduceScatter);
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    const int next = (me + 1) % W, prev = (me + W - 1) % W;
    const uint64_t C = p.round_elems;  // per step slot per round; scratch holds (W - 1) x C elements
    const T* const in = static_cast<const T*>(p.in);
    T* const scratch = reinterpret_cast<T*>(p.scratch);
    T* const out = static_cast<T*>(p.out);
    // Entry barrier: every peer finished its previous collective, so its scratch (my `next`'s slots) is free.
    barrier_peers(ctx, p.sync, sig_value(e, 1));
    uint32_t phase = 2;  // one counter for ring signals and barriers: what a peer publishes to me only grows
    for (uint64_t base = 0; base < p.count; base += C) {
        const uint64_t n = p.count - base < C ? p.count - base : C;
        const Range r = round_share(C, n, kVec<T>);  // same addresses every round (see round_share)
        for (int s = 0; s + 1 < W; ++s) {
            const int c = (me - s - 1 + 2 * W) % W;  // chunk whose partial I extend and forward at this step
            if (r.size()) {
                // sources: my input chunk c, and (s > 0) the partial of chunk c that prev stored in my slot s-1.
                const T* src[kMaxLocalPeers];
                T* dst[kMaxLocalPeers];
                for (int q = 0; q < kMaxLocalPeers; ++q) {
                    src[q] = q == 0 && s > 0 ? scratch + (s - 1) * C + r.lo : in + c * p.count + base + r.lo;
                    dst[q] = lang::symm_at(ctx, scratch + s * C + r.lo, peer_rank(ctx, next));
                }
                reduce_multi<T, kOp>(src, s > 0 ? 2 : 1, dst, 1, r.size());
                ptx::fence_acq_rel_sys();  // this thread's remote stores, before the block's release below
            }
            signal_peer(ctx, p.sync, next, sig_value(e, phase));  // slot s of next is written
            wait_peer(ctx, p.sync, prev, sig_value(e, phase));    // my slot s is written
            ++phase;
        }
        if (r.size()) {
            const T* src[kMaxLocalPeers];
            T* dst[kMaxLocalPeers];
            for (int q = 0; q < kMaxLocalPeers; ++q) {
                src[q] = q == 0 && W > 1 ? scratch + (W - 2) * C + r.lo : in + me * p.count + base + r.lo;
                dst[q] = out + base + r.lo;  // may alias in's chunk me: same element, same thread
            }
            reduce_multi<T, kOp>(src, W > 1 ? 2 : 1, dst, 1, r.size());
        }
        // Before the next round prev overwrites my slots, I must have consumed them (and every rank its own):
        // a barrier. After the last round the next call's entry barrier gives the same guarantee.
        if (base + C < p.count) barrier_peers(ctx, p.sync, sig_value(e, phase++));
    }
}

// One round of the copy-engine reduce_scatter (src/ops/collectives/reduce_scatter/scatter_ce.cpp: every rank pushes its
// part for rank q into slot `me` of q's scratch with the copy engine, round by round, double-buffered): out[0, count) =
// op over sources in rank order of (q == me ? in : scratch + q * round_elems), each [0, count). The host orders it
// after every peer's push of the round (stream waits) and signals the peers after it.
template <class T, int kOp>
__global__ void __launch_bounds__(512) reduce_scatter_ce_reduce(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollReduceScatter);
    const int W = ctx.local_world, me = ctx.local_rank;
    const Range r = block_share(p.count, kVec<T>);
    if (!r.size()) return;
    const T* src[kMaxLocalPeers];
    T* dst[kMaxLocalPeers];
#pragma unroll
    for (int q = 0; q < kMaxLocalPeers; ++q) {
        src[q] = q < W && q != me ? reinterpret_cast<const T*>(p.scratch) + q * p.round_elems + r.lo
                                  : static_cast<const T*>(p.in) + r.lo;
        dst[q] = static_cast<T*>(p.out) + r.lo;
    }
    reduce_multi<T, kOp>(src, W, dst, 1, r.size());
}

}  // namespace loom::kernels::coll
