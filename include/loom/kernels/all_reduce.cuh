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
//                                Staged (p.flags & kFlagStagedOut; in symmetric, out any, shard <= the scratch):
//                                shard `me` goes into this rank's out and its scratch, and after the second
//                                barrier every rank copies the peers' shards from their scratch into its out.
//                                Same barriers, same traffic plus one local shard write; no copy after the call.
//   all_reduce_ll<T, kOp>        low-latency packets, no barrier at all: kernels/coll_ll.cuh (with the LL
//                                all_gather, reduce_scatter and all_to_all). Small messages.
#pragma once

#include "loom/kernels/coll_common.cuh"
#include "loom/kernels/coll_ll.cuh"

namespace loom::kernels::coll {

template <class T, int kOp, int kPath>
__global__ void __launch_bounds__(512) all_reduce_one_shot(Ctx ctx, Params p) {
    scatter_reduce_rounds<T, kOp, kPath>(ctx, p, /*peer_stride=*/0);  // every peer gets the whole input
}

template <class T, int kOp>
__global__ void __launch_bounds__(512) all_reduce_two_shot(Ctx ctx, Params p) {
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    // Shards of S elements (a multiple of the vector width, so every shard keeps the buffers' alignment).
    uint64_t S = (p.count + W - 1) / W;
    S = (S + kVec<T> - 1) / kVec<T> * kVec<T>;
    const uint64_t lo = S * me < p.count ? S * me : p.count;
    const uint64_t hi = lo + S < p.count ? lo + S : p.count;
    const Range r = block_share(hi - lo, kVec<T>);
    barrier_peers(ctx, p.sync, sig_value(e, 1));
    const bool staged = (p.flags & kFlagStagedOut) != 0;
    T* const stage = reinterpret_cast<T*>(p.scratch);  // staged: [0, S) holds this rank's reduced shard
    if (r.size()) {
        const T* src[kMaxLocalPeers];
        T* dst[kMaxLocalPeers];
        for (int q = 0; q < kMaxLocalPeers; ++q) {
            const int g = peer_rank(ctx, q < W ? q : me);
            src[q] = lang::symm_at(ctx, static_cast<const T*>(p.in), g) + lo + r.lo;
            // Staged: out is not symmetric (symm_at would trap on it); this rank's out and its scratch.
            dst[q] = staged ? (q == 0 ? static_cast<T*>(p.out) + lo + r.lo : stage + r.lo)
                            : lang::symm_at(ctx, static_cast<T*>(p.out), g) + lo + r.lo;
        }
        reduce_multi<T, kOp, kDepthDeep>(src, W, dst, staged ? 2 : W, r.size());
    }
    barrier_peers(ctx, p.sync, sig_value(e, 2));  // every shard has landed everywhere (staged: in every scratch);
                                                  // inputs are read
    if (!staged) return;
    // Peer q's shard from its scratch: block b reads exactly the range block b of q wrote (the same block_share of
    // the same shard length on every rank), which the per-block barrier above ordered. The next call that writes
    // a scratch meets every peer first (its entry barrier), after these reads.
    for (int j = 1; j < W; ++j) {
        const int q = (me + j) % W;
        const uint64_t qlo = S * q < p.count ? S * q : p.count;
        const uint64_t qhi = qlo + S < p.count ? qlo + S : p.count;
        const Range rq = block_share(qhi - qlo, kVec<T>);
        if (!rq.size()) continue;
        char* const dst[kMaxLocalPeers] = {reinterpret_cast<char*>(static_cast<T*>(p.out) + qlo + rq.lo)};
        copy_fanout<4>(reinterpret_cast<const char*>(lang::symm_at(ctx, stage, peer_rank(ctx, q)) + rq.lo), dst, 1,
                       rq.size() * sizeof(T), threadIdx.x, blockDim.x);
    }
}

}  // namespace loom::kernels::coll
