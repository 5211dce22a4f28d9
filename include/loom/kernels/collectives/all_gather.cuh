// AllGather over the node's symmetric heap: out[r * count + i] = in of rank r [i] on every rank.
//
//   all_gather_push<T, kPath>  every rank writes its input into slot `me` of every peer's out (out symmetric).
//   all_gather_pull<T, kPath>  every rank reads slot r from every peer r's in (in symmetric). In place, rank r's
//                              input is slot r of r's out: the source is addressed there, not at this rank's in
//                              (in = out + me * count differs between ranks, so it is not a symmetric offset).
//                              p.round_elems != 0 (in staged through the scratch, src/ops/collectives/all_gather/
//                              staged.cpp): in holds one round of round_elems elements of every rank's input,
//                              which land at the start of each chunk of out (chunks still count elements apart).
//   all_gather_ring<T, kPath>  W-1 steps: at step s a rank forwards chunk (me - s) to the next rank's out, then
//                              waits for chunk (me - s - 1) from the previous one (out symmetric). Each link
//                              carries one chunk per step.
// kPath: kPathLdSt (every thread moves 16-byte vectors) or kPathTma (the block leader streams cp.async.bulk
// through smem staging). all_gather_push_fanout<kW> is push over ld/st for ranks sharing a GPU (the host picks it).
// The copy-engine paths are host-side (src/ops/collectives/all_gather/push_ce.cpp, pull_ce.cpp).
//
// Block b moves bytes [lo, hi) of every rank's chunk (block_share), and synchronises with block b of the peers.
// In-place: in == out + me * count (the own chunk is then not copied).
#pragma once

#include "loom/kernels/collectives/coll_common.cuh"

namespace loom::kernels::coll {

template <class T, int kPath>
__global__ void __launch_bounds__(512) all_gather_push(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllGather);
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    const uint64_t B = p.count * sizeof(T);
    // p.round_elems != 0 (the copy-engine path's SM share): only the first round_elems bytes of each chunk move.
    const uint64_t moved = p.round_elems != 0 ? p.round_elems : B;
    char* const mine = static_cast<char*>(p.out) + me * B;  // my chunk, in every rank's out
    const char* const src = static_cast<const char*>(p.in);
    barrier_peers(ctx, p.sync, sig_value(e, 1));  // peers' out is free (they entered this call)
    if (const Range r = block_share(moved, 16); r.size()) {
        with_path<kPath>(p, [&](const auto& path) {
            // Peers first, staggered (not every rank hits the same peer at once), the own chunk last: its local copy
            // then runs while the NVLink stores drain instead of delaying them.
            for (int i = 1; i <= W; ++i) {
                const int peer = (me + i) % W;
                if (peer == me && src == mine) continue;
                lang::put_nbi(lang::block, ctx, mine + r.lo, src + r.lo, r.size(), peer_rank(ctx, peer), path);
            }
            lang::quiet(lang::block, ctx);
        });
    }
    barrier_peers(ctx, p.sync, sig_value(e, 2));  // every peer's chunk has landed in my out
}

// Push for ranks sharing a GPU, where every byte, the own chunk's too, goes through the one GPU's memory: each
// 16-byte vector of the input is loaded once and stored into every rank's out (copy_fanout), by a grid-strided
// share (thread_share; the host sets kFlagGridStride); kW, the world size, is compiled in (only its destination
// pointers live in registers). Moves bytes. Compiled for two blocks per SM (64 registers), as measured (the host
// launches at most one per SM).
template <int kW>
__global__ void __launch_bounds__(512, 2) all_gather_push_fanout(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllGather);
    const uint64_t e = begin_call(p.sync);
    const int me = ctx.local_rank;
    const uint64_t B = p.count;
    char* const mine = static_cast<char*>(p.out) + me * B;  // my chunk, in every rank's out
    const char* const src = static_cast<const char*>(p.in);
    barrier_peers(ctx, p.sync, sig_value(e, 1));  // peers' out is free (they entered this call)
    const ThreadShare s = thread_share(p, B, 16);
    if (s.r.size()) {
        // Destination d is rank (me + 1 + d) % kW: the peers staggered, the own chunk last (left out in place).
        char* dst[kMaxLocalPeers];
#pragma unroll
        for (int d = 0; d < kMaxLocalPeers; ++d)
            dst[d] = d < kW ? static_cast<char*>(lang::symm_at(ctx, mine + s.r.lo, peer_rank(ctx, (me + 1 + d) % kW)))
                            : nullptr;
        // Four vectors in flight per thread; two past four destinations, whose pointers need the registers.
        copy_fanout<kW <= 4 ? 4 : 2>(src + s.r.lo, dst, src == mine ? kW - 1 : kW, s.r.size(), s.tid, s.nt);
    }
    lang::quiet(lang::block, ctx);
    barrier_peers(ctx, p.sync, sig_value(e, 2));  // every peer's chunk has landed in my out
}

template <class T, int kPath>
__global__ void __launch_bounds__(512) all_gather_pull(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllGather);
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    const uint64_t B = p.count * sizeof(T);
    const uint64_t moved = p.round_elems != 0 ? p.round_elems * sizeof(T) : B;  // bytes of each chunk moved
    const Range r = block_share(moved, 16);
    char* const out = static_cast<char*>(p.out);
    const char* const in = static_cast<const char*>(p.in);
    const bool in_place = in == out + me * B;     // then every rank is in place (same options on every rank)
    barrier_peers(ctx, p.sync, sig_value(e, 1));  // peers' inputs are written (they entered this call)
    if (r.size()) {
        with_path<kPath>(p, [&](const auto& path) {
            for (int i = 1; i <= W; ++i) {  // peers first, the own chunk's local copy last
                const int peer = (me + i) % W;
                if (peer == me && in_place) continue;
                // Rank `peer`'s input, as a pointer of mine that symm_at maps to it: in place, it sits in the
                // peer's out at slot `peer` (not at my `in`, which is slot `me`); otherwise at my `in` (same offset).
                const char* const src = in_place ? out + peer * B : in;
                lang::get_nbi(lang::block, ctx, out + peer * B + r.lo, src + r.lo, r.size(), peer_rank(ctx, peer),
                              path);
            }
            lang::quiet(lang::block, ctx);
        });
    }
    barrier_peers(ctx, p.sync, sig_value(e, 2));  // every peer has read my input: the caller may overwrite it
}

template <class T, int kPath>
__global__ void __launch_bounds__(512) all_gather_ring(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllGather);
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    const int next = (me + 1) % W, prev = (me + W - 1) % W;
    const uint64_t B = p.count * sizeof(T);
    const Range r = block_share(B, 16);
    char* const out = static_cast<char*>(p.out);
    const char* const in = static_cast<const char*>(p.in);
    barrier_peers(ctx, p.sync, sig_value(e, 1));  // full entry barrier (scratch/LL reuse relies on it)
    with_path<kPath>(p, [&](const auto& path) {
        if (r.size() && in != out + me * B)
            lang::put(lang::block, ctx, out + me * B + r.lo, in + r.lo, r.size(), ctx.rank, path);
        for (int s = 0; s + 1 < W; ++s) {
            const int c = (me - s + W) % W;  // chunk forwarded at this step (s = 0: my own)
            if (r.size())
                lang::put(lang::block, ctx, out + c * B + r.lo, (s == 0 ? in : out + c * B) + r.lo, r.size(),
                          peer_rank(ctx, next), path);
            signal_peer(ctx, p.sync, next, sig_value(e, 2 + s));
            wait_peer(ctx, p.sync, prev, sig_value(e, 2 + s));  // chunk (me - s - 1) is in my out
        }
    });
}

}  // namespace loom::kernels::coll
