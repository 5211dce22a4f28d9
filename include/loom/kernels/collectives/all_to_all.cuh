// AllToAll over the node's symmetric heap (push: every rank writes straight into the peers' out, out symmetric;
// pull: every rank reads its blocks from the peers' in, in symmetric).
//
//   all_to_all_push<T, kPath>    equal splits: block j of my in (p.count elements) goes to slot `me` of rank
//                                j's out.
//   all_to_all_pull<T, kPath>    equal splits, out anywhere: block `me` of rank j's in comes to slot j of my out.
//                                p.round_elems != 0 (in staged through the scratch, src/ops/collectives/
//                                all_to_all/staged.cpp): in holds one round of round_elems elements of each
//                                block, packed (stride round_elems); they land at the start of out's blocks
//                                (stride p.count).
//   all_to_all_v_push<T, kPath>  variable splits, counts in device memory (MoE dispatch): p.send_counts[j]
//                                (symmetric) elements from in + send_offsets[j] (packed prefix sums when null)
//                                go to rank j, where they land packed by source rank: rank s's block starts at
//                                sum over s' < s of send_counts_{s'}[j]. The sender reads the other ranks'
//                                counts after the entry barrier, so no host round trip. recv_counts[s] (local,
//                                optional) receives what rank s sent. Out of capacity (p.count elements), or a
//                                block past the sender's in (p.in_count elements), is reported and traps (never a
//                                read or write out of bounds).
//   all_to_all_v_pull<T, kPath>  the same result with out anywhere (in symmetric): each rank reads its blocks
//                                from the senders' in (send_offsets null, or symmetric).
//   Push with out staged (p.round_elems != 0: src/ops/collectives/all_to_all/staged_v.cpp): p.out is the
//   receivers' scratch holding the window [round_base, round_base + round_elems) of their out; each block moves
//   only its part inside the window, to (its out offset - round_base). The counts are checked against the whole
//   capacity (p.count) in every round.
// Block b moves its share of every peer's block and synchronises with block b of the peers.
#pragma once

#include "loom/kernels/collectives/coll_common.cuh"

namespace loom::kernels::coll {

// Equal splits between an entry barrier (the peers' inputs are written and their outs free) and an exit barrier
// (every block landed; every peer is done with my buffers). kPull: block `me` of every peer's in comes to slot `peer`
// of my out (in symmetric); else block `peer` of my in goes to slot `me` of every peer's out (out symmetric). Peers
// first, the own block's local copy last.
template <class T, int kPath, bool kPull>
LOOM_DEVICE inline void all_to_all_equal(const Ctx& ctx, const Params& p) {
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    const uint64_t B = p.count * sizeof(T);  // out's block stride
    // Bytes of each block moved, and in's block stride: one staged round (pull with in staged), else B.
    const uint64_t moved = p.round_elems != 0 ? p.round_elems * sizeof(T) : B;
    const Range r = block_share(moved, 16);
    barrier_peers(ctx, p.sync, sig_value(e, 1));
    if (r.size()) {
        with_path<kPath>(p, [&](const auto& path) {
            for (int i = 1; i <= W; ++i) {
                const int peer = (me + i) % W;
                if constexpr (kPull)
                    lang::get_nbi(lang::block, ctx, static_cast<char*>(p.out) + peer * B + r.lo,
                                  static_cast<const char*>(p.in) + me * moved + r.lo, r.size(), peer_rank(ctx, peer),
                                  path);
                else
                    lang::put_nbi(lang::block, ctx, static_cast<char*>(p.out) + me * B + r.lo,
                                  static_cast<const char*>(p.in) + peer * moved + r.lo, r.size(), peer_rank(ctx, peer),
                                  path);
            }
            lang::quiet(lang::block, ctx);
        });
    }
    barrier_peers(ctx, p.sync, sig_value(e, 2));
}

template <class T, int kPath>
__global__ void __launch_bounds__(512) all_to_all_push(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllToAll);
    all_to_all_equal<T, kPath, false>(ctx, p);
}
template <class T, int kPath>
__global__ void __launch_bounds__(512) all_to_all_pull(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllToAll);
    all_to_all_equal<T, kPath, true>(ctx, p);
}

namespace detail {
__noinline__ LOOM_DEVICE inline void a2av_overflow(int rank, int sender, int receiver, long long offset,
                                                   long long count, unsigned long long capacity) {
    printf(
        "loom: all_to_all_v (rank %d): %lld elements from rank %d for rank %d at offset %lld exceed the out capacity "
        "of %llu elements (out.count must be the same on every rank and hold the sum of the counts sent to it)\n",
        rank, count, sender, receiver, offset, capacity);
    __trap();
}
__noinline__ LOOM_DEVICE inline void a2av_negative(int rank, int sender, int receiver, long long count) {
    printf("loom: all_to_all_v (rank %d): rank %d's send_counts[%d] = %lld is negative\n", rank, sender, receiver,
           count);
    __trap();
}
__noinline__ LOOM_DEVICE inline void a2av_past_in(int rank, int receiver, long long offset, long long count,
                                                  unsigned long long in_count) {
    printf(
        "loom: all_to_all_v (rank %d): send_offsets[%d] + send_counts[%d] = %lld + %lld is past in.count = %llu (or "
        "negative)\n",
        rank, receiver, receiver, offset, count, in_count);
    __trap();
}
}  // namespace detail

// Every block this rank sends lies in its in: checked by the sender on its own counts and offsets before the entry
// barrier, so a rank with a bad block stops there and no peer reads past its in.
LOOM_DEVICE inline void all_to_all_v_check_sends(const Ctx& ctx, const Params& p) {
    if (threadIdx.x != 0) return;
    long long packed = 0;
    for (int j = 0; j < ctx.local_world; ++j) {
        const long long cnt = p.send_counts[j];
        if (cnt < 0) detail::a2av_negative(ctx.rank, ctx.rank, peer_rank(ctx, j), cnt);
        const long long src = p.send_offsets ? p.send_offsets[j] : packed;
        if (src < 0 || static_cast<unsigned long long>(src) > p.in_count ||
            static_cast<unsigned long long>(cnt) > p.in_count - static_cast<unsigned long long>(src))
            detail::a2av_past_in(ctx.rank, peer_rank(ctx, j), src, cnt, p.in_count);
        packed += cnt;
    }
}

// Variable splits (see the top of the file). Push: block j of mine goes to rank j. kPull: rank j's block for me comes
// here — everything a receiver needs is on the senders, read after the entry barrier: their counts (symmetric), the
// block's offset in their in (packed: the prefix sum of their counts; else their send_offsets, symmetric then) and
// where it lands here (the counts of the ranks before them). Every count is checked before anything moves.
template <class T, int kPath, bool kPull>
LOOM_DEVICE inline void all_to_all_v_body(const Ctx& ctx, const Params& p) {
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    char* const out = static_cast<char*>(p.out);
    const char* const in = static_cast<const char*>(p.in);
    all_to_all_v_check_sends(ctx, p);
    barrier_peers(ctx, p.sync, sig_value(e, 1));  // every rank's counts and inputs are written
    // Per peer j (the receiver when pushing, the sender when pulling): the block's offset in the receiver's out, its
    // count, and its offset in the sender's in.
    __shared__ long long s_out_off[kMaxLocalPeers], s_cnt[kMaxLocalPeers], s_in_off[kMaxLocalPeers];
    if (threadIdx.x == 0) {
        for (int j = 0; j < W; ++j) {
            const int sender = kPull ? j : me, receiver = kPull ? me : j;
            const int64_t* const sc = lang::symm_at(ctx, p.send_counts, peer_rank(ctx, sender));
            long long off = 0;
            for (int s = 0; s < sender; ++s) off += lang::symm_at(ctx, p.send_counts, peer_rank(ctx, s))[receiver];
            const long long cnt = sc[receiver];
            if (cnt < 0) detail::a2av_negative(ctx.rank, peer_rank(ctx, sender), peer_rank(ctx, receiver), cnt);
            if (off < 0 || static_cast<unsigned long long>(off) > p.count ||
                static_cast<unsigned long long>(cnt) > p.count - static_cast<unsigned long long>(off))
                detail::a2av_overflow(ctx.rank, peer_rank(ctx, sender), peer_rank(ctx, receiver), off, cnt, p.count);
            long long src = 0;
            if (p.send_offsets)
                src = kPull ? lang::symm_at(ctx, p.send_offsets, peer_rank(ctx, sender))[receiver]
                            : p.send_offsets[receiver];
            else
                for (int k = 0; k < receiver; ++k) src += sc[k];
            s_out_off[j] = off;
            s_cnt[j] = cnt;
            s_in_off[j] = src;
        }
        if (blockIdx.x == 0 && p.recv_counts)
            for (int s = 0; s < W; ++s) p.recv_counts[s] = lang::symm_at(ctx, p.send_counts, peer_rank(ctx, s))[me];
    }
    __syncthreads();
    with_path<kPath>(p, [&](const auto& path) {
        for (int i = 0; i < W; ++i) {
            const int peer = (me + i) % W;
            long long dst_off = s_out_off[peer], src_off = s_in_off[peer], cnt = s_cnt[peer];
            if constexpr (!kPull) {
                if (p.round_elems != 0) {  // out staged: only the part inside this round's window, window-relative
                    const long long lo = static_cast<long long>(p.round_base);
                    const long long hi = lo + static_cast<long long>(p.round_elems);
                    const long long a = dst_off > lo ? dst_off : lo;
                    const long long b = dst_off + cnt < hi ? dst_off + cnt : hi;
                    cnt = b > a ? b - a : 0;
                    src_off += a - dst_off;
                    dst_off = a - lo;
                }
            }
            const uint64_t B = static_cast<uint64_t>(cnt) * sizeof(T);
            const Range r = block_share(B, 16);
            if (!r.size()) continue;
            char* const d = out + dst_off * sizeof(T) + r.lo;
            const char* const src = in + src_off * sizeof(T) + r.lo;
            if constexpr (kPull)
                lang::get_nbi(lang::block, ctx, d, src, r.size(), peer_rank(ctx, peer), path);
            else
                lang::put_nbi(lang::block, ctx, d, src, r.size(), peer_rank(ctx, peer), path);
        }
        lang::quiet(lang::block, ctx);
    });
    barrier_peers(ctx, p.sync, sig_value(e, 2));  // every block landed; peers have read my counts (and in)
}

template <class T, int kPath>
__global__ void __launch_bounds__(512) all_to_all_v_push(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllToAll);
    all_to_all_v_body<T, kPath, false>(ctx, p);
}
template <class T, int kPath>
__global__ void __launch_bounds__(512) all_to_all_v_pull(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllToAll);
    all_to_all_v_body<T, kPath, true>(ctx, p);
}

}  // namespace loom::kernels::coll
