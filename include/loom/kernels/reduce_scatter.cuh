// ReduceScatter over the node's symmetric heap: out[i] = op over ranks r of in_r[me * count + i], fp32
// accumulation for 16-bit types, sources combined in rank order 0, 1, ... on every rank.
//
//   reduce_scatter_pull<T, kOp>          each rank reads its chunk from every peer's in (in symmetric) and
//                                        reduces in registers: one pass, no scratch (NCCL's symmetric RS).
//   reduce_scatter_scatter<T, kOp, kPath> scatter then local reduce: each rank pushes chunk j of its input into
//                                        slot `me` of rank j's scratch, then reduces its W slots locally. Any in
//                                        (not symmetric); large counts go through scratch in rounds of
//                                        p.round_elems elements per peer.
// Block b handles elements [lo, hi) of the chunk (block_share) and synchronises with block b of the peers.
// In-place: out == in + me * count.
#pragma once

#include "loom/kernels/coll_common.cuh"

namespace loom::kernels::coll {

template <class T, int kOp>
__global__ void __launch_bounds__(512) reduce_scatter_pull(Ctx ctx, Params p) {
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    const Range r = block_share(p.count, kVec<T>);
    const T* const in = static_cast<const T*>(p.in);
    barrier_peers(ctx, p.sync, sig_value(e, 1));  // peers' inputs are written
    if (r.size()) {
        const T* src[kMaxLocalPeers];
        T* dst[kMaxLocalPeers];
        for (int q = 0; q < kMaxLocalPeers; ++q) {
            src[q] = q < W ? lang::symm_at(ctx, in, peer_rank(ctx, q)) + me * p.count + r.lo : nullptr;
            dst[q] = static_cast<T*>(p.out) + r.lo;
        }
        reduce_multi<T, kOp>(src, W, dst, 1, r.size());
    }
    barrier_peers(ctx, p.sync, sig_value(e, 2));  // every peer has read my input
}

template <class T, int kOp, int kPath>
__global__ void __launch_bounds__(512) reduce_scatter_scatter(Ctx ctx, Params p) {
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    const uint64_t C = p.round_elems;  // per peer per round; scratch holds W x C elements
    const T* const in = static_cast<const T*>(p.in);
    T* const scratch = reinterpret_cast<T*>(p.scratch);
    barrier_peers(ctx, p.sync, sig_value(e, 1));
    uint32_t phase = 2;
    for (uint64_t base = 0; base < p.count; base += C) {
        const uint64_t n = p.count - base < C ? p.count - base : C;
        const Range r = block_share(n, kVec<T>);
        if (r.size()) {
            with_path<kPath>(p, [&](const auto& path) {
                for (int i = 0; i < W; ++i) {
                    const int peer = (me + i) % W;
                    lang::put_nbi(lang::block, ctx, scratch + me * C + r.lo, in + peer * p.count + base + r.lo,
                                  r.size() * sizeof(T), peer_rank(ctx, peer), path);
                }
                lang::quiet(lang::block, ctx);
            });
        }
        barrier_peers(ctx, p.sync, sig_value(e, phase++));  // every contribution of this round has landed
        if (r.size()) {
            const T* src[kMaxLocalPeers];
            T* dst[kMaxLocalPeers];
            for (int q = 0; q < kMaxLocalPeers; ++q) {
                src[q] = scratch + (q < W ? q : 0) * C + r.lo;
                dst[q] = static_cast<T*>(p.out) + base + r.lo;
            }
            reduce_multi<T, kOp>(src, W, dst, 1, r.size());
        }
        // Before the next round overwrites the peers' scratch, they must have reduced this one. After the last
        // round the next call's entry barrier gives the same guarantee.
        if (base + C < p.count) barrier_peers(ctx, p.sync, sig_value(e, phase++));
    }
}

}  // namespace loom::kernels::coll
