// AllReduce over the node's symmetric heap: out[i] = op over ranks of in_r[i], fp32 accumulation for 16-bit
// types, sources combined in rank order 0, 1, ... so every rank gets bitwise the same result.
//
//   all_reduce_one_shot<T, kOp>  push the whole input into slot `me` of every peer's scratch, meet, reduce the
//                                W slots locally (rounds of p.round_elems when the input exceeds the scratch).
//                                Any in/out (not symmetric), in-place allowed. Latency: 2 barriers + W copies.
//                                kPath: the push goes through ld/st or TMA bulk copies (kPathTma: the block
//                                leader streams W copies while the SM's other threads idle until the reduce).
//   all_reduce_two_shot<T, kOp>  each rank reduces shard `me` from every peer's in and stores the result into
//                                shard `me` of every peer's out in the same pass (reduce-scatter + all-gather
//                                fused, NCCL's RSxLD/AGxST). in and out symmetric; in-place allowed (shard me of
//                                a peer's in is read only by me, before I write it).
//                                Staged (p.flags & kFlagStagedOut; in symmetric, out any): shard `me` goes into
//                                this rank's out and its scratch, and after the second barrier every rank copies
//                                the peers' shards from their scratch into its out (rounds of p.round_elems when
//                                a shard outgrows the scratch). Same traffic plus one local shard write; no copy
//                                after the call.
//   all_reduce_ll<T, kOp>        low-latency packets, no barrier at all: kernels/coll_ll.cuh (with the LL
//                                all_gather, reduce_scatter and all_to_all). Small messages.
#pragma once

#include "loom/kernels/collectives/coll_common.cuh"
#include "loom/kernels/collectives/coll_ll.cuh"

namespace loom::kernels::coll {

template <class T, int kOp, int kPath>
__global__ void __launch_bounds__(512) all_reduce_one_shot(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllReduce);
    scatter_reduce_rounds<T, kOp, kPath>(ctx, p, /*peer_stride=*/0);  // every peer gets the whole input
}

// Element range [lo, hi) of rank q's shard (S elements each, the last ones short or empty).
LOOM_DEVICE LOOM_FORCEINLINE void shard_of(uint64_t S, uint64_t count, int q, uint64_t& lo, uint64_t& hi) {
    lo = S * q < count ? S * q : count;
    hi = lo + S < count ? lo + S : count;
}

// Staged two-shot (out not symmetric), after the entry barrier: in rounds of C = p.round_elems elements of each
// shard (the scratch holds one round), rank me reduces round k of its shard into its out and its scratch, the ranks
// meet, and each copies round k of every peer's shard from that peer's scratch into its out. Block b writes and
// reads the same scratch range in every round (round_share) and pairs with block b of every peer, so the per-block
// barriers order every access: after phase 2 + 2k the staged round is visible; after 3 + 2k (between rounds) every
// peer has copied it out and the scratch may be refilled. The next call that writes a scratch meets every peer first
// (its entry barrier).
template <class T, int kOp>
LOOM_DEVICE inline void two_shot_staged(const Ctx& ctx, const Params& p, uint64_t e, uint64_t S) {
    const int W = ctx.local_world, me = ctx.local_rank;
    const uint64_t C = p.round_elems;
    T* const stage = reinterpret_cast<T*>(p.scratch);
    T* const out = static_cast<T*>(p.out);
    uint64_t lo, hi;
    shard_of(S, p.count, me, lo, hi);
    const uint64_t rounds = (S + C - 1) / C;  // the same on every rank
    for (uint64_t k = 0; k < rounds; ++k) {
        const uint64_t a = lo + k * C < hi ? lo + k * C : hi;
        const Range r = round_share(C, (a + C < hi ? a + C : hi) - a, kVec<T>);
        if (r.size()) {
            const T* src[kMaxLocalPeers];
            T* dst[kMaxLocalPeers] = {out + a + r.lo, stage + r.lo};
            for (int q = 0; q < kMaxLocalPeers; ++q)
                src[q] = lang::symm_at(ctx, static_cast<const T*>(p.in), peer_rank(ctx, q < W ? q : me)) + a + r.lo;
            reduce_multi<T, kOp, kDepthDeep>(src, W, dst, 2, r.size());
        }
        barrier_peers(ctx, p.sync, sig_value(e, static_cast<uint32_t>(2 + 2 * k)));  // round k staged everywhere
        for (int j = 1; j < W; ++j) {
            const int q = (me + j) % W;
            uint64_t qlo, qhi;
            shard_of(S, p.count, q, qlo, qhi);
            const uint64_t qa = qlo + k * C < qhi ? qlo + k * C : qhi;
            const Range rq = round_share(C, (qa + C < qhi ? qa + C : qhi) - qa, kVec<T>);
            if (!rq.size()) continue;
            char* const dst[kMaxLocalPeers] = {reinterpret_cast<char*>(out + qa + rq.lo)};
            copy_fanout<4>(reinterpret_cast<const char*>(lang::symm_at(ctx, stage, peer_rank(ctx, q)) + rq.lo), dst, 1,
                           rq.size() * sizeof(T), threadIdx.x, blockDim.x);
        }
        if (k + 1 < rounds) barrier_peers(ctx, p.sync, sig_value(e, static_cast<uint32_t>(3 + 2 * k)));
    }
}

template <class T, int kOp>
__global__ void __launch_bounds__(512) all_reduce_two_shot(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllReduce);
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    // Shards of S elements (a multiple of the vector width, so every shard keeps the buffers' alignment).
    uint64_t S = (p.count + W - 1) / W;
    S = (S + kVec<T> - 1) / kVec<T> * kVec<T>;
    barrier_peers(ctx, p.sync, sig_value(e, 1));
    if (p.flags & kFlagStagedOut) {
        two_shot_staged<T, kOp>(ctx, p, e, S);
        return;
    }
    uint64_t lo, hi;
    shard_of(S, p.count, me, lo, hi);
    const Range r = block_share(hi - lo, kVec<T>);
    if (r.size()) {
        const T* src[kMaxLocalPeers];
        T* dst[kMaxLocalPeers];
        for (int q = 0; q < kMaxLocalPeers; ++q) {
            const int g = peer_rank(ctx, q < W ? q : me);
            src[q] = lang::symm_at(ctx, static_cast<const T*>(p.in), g) + lo + r.lo;
            dst[q] = lang::symm_at(ctx, static_cast<T*>(p.out), g) + lo + r.lo;
        }
        reduce_multi<T, kOp, kDepthDeep>(src, W, dst, W, r.size());
    }
    barrier_peers(ctx, p.sync, sig_value(e, 2));  // every shard has landed everywhere; inputs are read
}

}  // namespace loom::kernels::coll
