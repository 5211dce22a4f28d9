// Hierarchical collectives: a World of several nodes (src/ops/collectives/hier/). Each op is a host-composed sequence
// of an intra-node step (node-local peers by load/store) and an inter-node step (NVSHMEM puts, through the language's
// remote column: the host compiles these kernels with remote peers). Rank r is (node n, local rank l), r = n * L + l;
// the inter-node steps of all_gather, reduce_scatter and all_reduce run among the N ranks of one local rank.
//
//   hier_all_gather_inter          own chunk into out, then put_signal to slot r of out at (m, l) for every node m:
//                                  out then holds the chunks of (m, l) for every m
//   hier_all_gather_intra          the N chunks of local rank l pushed to every node peer's out
//   hier_reduce_scatter_intra<T,O> partial[m] = op over node peers q of q's chunk (m, l) (pulled; in symmetric)
//   hier_reduce_scatter_inter<T,O> partial[m] put_signal to (m, l)'s receive slot n; out = op of own partial[n] and
//                                  the N - 1 received ones (inter_part: the exchange or the combine alone)
//   hier_all_reduce_intra<T,O>     partial = op over node peers of range l (of L ranges) of in (pulled)
//   hier_all_reduce_inter<T,O>     partial put_signal to every (m, l); range l of out = op of the N partials
//   hier_all_reduce_gather<T>      range l of out pushed to every node peer's out
//   hier_all_to_all_intra          blocks of node peers pushed by load/store (in and out symmetric)
//   hier_all_to_all_inter          blocks of every rank on another node, put_signal through NVSHMEM
//   hier_all_to_all_v_counts       (one block) the sender's own blocks checked against its in; entry barrier with
//                                  every rank; its send_counts copied into row r of the counts matrix (symmetric,
//                                  world x world) and put_signal to the same row at every rank; recv_counts filled
//   hier_all_to_all_v_data         every block to its receiver, node peers by load/store, other nodes through
//                                  NVSHMEM, each followed by a signal (zero bytes: the signal alone); rank s's
//                                  block lands at the sum of the counts the ranks before s send to that receiver,
//                                  read from the local matrix. Out of capacity traps before anything moves
//
// The intra steps of all_gather and reduce_scatter take node_subset: every node's chunks m, the other nodes' (m != n)
// or this node's (m = n) only.
//
// Synchronisation: block b of a launch pairs with block b of each peer's launch of the same kernel (same grid on every
// rank; block_share slices are equal). Every kernel first meets the peers it writes to or reads from (entry barrier,
// HierParams::sig, value (epoch << kPhaseBits) + 1: the peer is in this call, so its buffers are free), and the intra
// steps meet the node peers again at the end (their reads of this rank's in are done). So consecutive calls need no
// host barrier, and each kernel may also be launched alone (the benchmark's per-step times). Every wait is bounded
// and names the waiting rank, the step and the peer. all_to_all_v is the exception: its data kernel has no entry
// barrier and only runs after its counts kernel (one block) on the same stream, whose entry barrier with every rank
// frees the outs and the counts matrices; the data kernel's receivers wait for every sender's signal, and nothing of
// a rank is read by another (push), so neither kernel needs an exit barrier.
#pragma once

#include "loom/kernels/collectives/all_to_all.cuh"  // detail::a2av_* diagnostics
#include "loom/kernels/collectives/coll_common.cuh"

namespace loom::kernels::coll {

namespace hier {

LOOM_DEVICE inline uint64_t begin(const HierParams& p) {
    __shared__ uint64_t s_epoch;
    if (threadIdx.x == 0) {
        const uint64_t e = p.epoch[blockIdx.x] + 1;
        p.epoch[blockIdx.x] = e;
        s_epoch = e;
    }
    __syncthreads();
    return s_epoch;
}

// This block's slot for signals from rank `src`.
LOOM_DEVICE LOOM_FORCEINLINE uint64_t* slot(const Ctx& ctx, const HierParams& p, int src) {
    return p.sig + static_cast<uint64_t>(blockIdx.x) * static_cast<uint64_t>(ctx.world) + src;
}

// The peers a step exchanges with: node peers (every local rank of this node), same-local-rank peers (this local rank
// on every node), every rank on another node, or every rank. i in [0, count()); self included but for kRemoteRanks.
enum Peers : int { kNodePeers = 0, kSameLocalRank = 1, kRemoteRanks = 2, kAllRanks = 3 };
template <int kPeers>
LOOM_DEVICE LOOM_FORCEINLINE int peer_count(const Ctx& ctx) {
    if constexpr (kPeers == kNodePeers) return ctx.local_world;
    if constexpr (kPeers == kSameLocalRank) return ctx.num_nodes();
    if constexpr (kPeers == kAllRanks) return ctx.world;
    return ctx.world - ctx.local_world;
}
template <int kPeers>
LOOM_DEVICE LOOM_FORCEINLINE int peer_at(const Ctx& ctx, int i) {
    if constexpr (kPeers == kNodePeers) return ctx.local_base_rank + i;
    if constexpr (kPeers == kSameLocalRank) return i * ctx.local_world + ctx.local_rank;
    if constexpr (kPeers == kAllRanks) return i;
    // The ranks outside this node, in order, starting after it.
    return (ctx.local_base_rank + ctx.local_world + i) % ctx.world;
}

// Every thread of the block calls it. Publishes `value` to block b of every peer of the set (release: after the block
// synchronised, so every earlier write of the block is visible) and waits until each has published at least `value`.
// All signals before any wait, so ranks never wait on each other in a cycle.
template <int kPeers>
LOOM_DEVICE inline void barrier(const Ctx& ctx, const HierParams& p, uint64_t value, const char* tag) {
    __syncthreads();
    const int n = peer_count<kPeers>(ctx);
    for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x))
        lang::signal_op(ctx, slot(ctx, p, ctx.rank), value, lang::SignalOp::Set, peer_at<kPeers>(ctx, i));
    for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) {
        const int peer = peer_at<kPeers>(ctx, i);
        lang::signal_wait_until(ctx, slot(ctx, p, peer), lang::Cmp::GE, value, lang::Scope::Sys, tag, peer);
    }
    __syncthreads();
}

// Waits (thread i for peer i) until every peer of the set other than this rank has published `value` to block b.
template <int kPeers>
LOOM_DEVICE inline void wait_all(const Ctx& ctx, const HierParams& p, uint64_t value, const char* tag) {
    const int n = peer_count<kPeers>(ctx);
    for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) {
        const int peer = peer_at<kPeers>(ctx, i);
        if (peer != ctx.rank)
            lang::signal_wait_until(ctx, slot(ctx, p, peer), lang::Cmp::GE, value, lang::Scope::Sys, tag, peer);
    }
    __syncthreads();
}

// `bytes` from this rank's src to `peer`'s dst (symmetric), then `value` published to the peer's slot of this rank:
// put_signal through NVSHMEM for a peer on another node (the signal lands after the data).
LOOM_DEVICE inline void put_signal(const Ctx& ctx, const HierParams& p, char* dst, const char* src, uint64_t bytes,
                                   int peer, uint64_t value) {
    if (bytes != 0) {
        lang::put_signal(lang::block, ctx, dst, src, bytes, slot(ctx, p, ctx.rank), value, lang::SignalOp::Set, peer);
    } else {
        lang::notify(lang::block, ctx, slot(ctx, p, ctx.rank), peer, value, lang::SignalOp::Set);
    }
}

// Whether node m's chunks are in the launch's node_subset.
LOOM_DEVICE LOOM_FORCEINLINE bool in_subset(const Ctx& ctx, const HierParams& p, int m) {
    if (p.node_subset == kHierNodesAll) return true;
    return (m == ctx.node) == (p.node_subset == kHierNodesOwn);
}

// dst[0, n) = op over the node's ranks q (in local-rank order, fp32) of their copy of src[0, n) (src symmetric),
// 16-byte vectors where every address allows (reduce_multi), by the block's threads.
template <class T, int kOp>
LOOM_DEVICE LOOM_FORCEINLINE void reduce_node_peers(const Ctx& ctx, const T* src, T* dst, uint64_t n) {
    if (n == 0) return;
    const T* srcs[kMaxLocalPeers] = {};
    T* dsts[kMaxLocalPeers] = {dst};
#pragma unroll
    for (int q = 0; q < kMaxLocalPeers; ++q)
        if (q < ctx.local_world) srcs[q] = lang::symm_at(ctx, src, ctx.local_base_rank + q);
    reduce_multi<T, kOp, kDepthDeep>(srcs, ctx.local_world, dsts, 1, n);
}

template <class T, int kOp>
LOOM_DEVICE LOOM_FORCEINLINE float load_combine(float acc, const T* src, bool first) {
    const float v = to_float<T>(*src);
    return first ? v : combine<kOp>(acc, v);
}

}  // namespace hier

// ---- all_gather: p.count bytes per rank; out symmetric ------------------------------------------------------------
__global__ void __launch_bounds__(512) hier_all_gather_inter(Ctx ctx, HierParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllGather);
    const uint64_t e = hier::begin(p);
    const uint64_t B = p.count;
    char* const mine = static_cast<char*>(p.out) + static_cast<uint64_t>(ctx.rank) * B;
    const char* const in = static_cast<const char*>(p.in);
    hier::barrier<hier::kSameLocalRank>(ctx, p, sig_value(e, 1),
                                        "hierarchical all_gather, inter-node entry barrier (same local rank)");
    const Range r = block_share(B, 16);
    if (r.size() && in != mine) lang::put(lang::block, ctx, mine + r.lo, in + r.lo, r.size(), ctx.rank);
    lang::fence(lang::block, ctx);  // the own chunk is written before NVSHMEM reads it
    __syncthreads();
    const int N = ctx.num_nodes();
    for (int k = 1; k < N; ++k) {
        const int peer = ((ctx.node + k) % N) * ctx.local_world + ctx.local_rank;
        hier::put_signal(ctx, p, mine + r.lo, mine + r.lo, r.size(), peer, sig_value(e, 2));
    }
    hier::wait_all<hier::kSameLocalRank>(ctx, p, sig_value(e, 2),
                                         "hierarchical all_gather, inter-node: chunk from the same local rank");
    lang::quiet(lang::block, ctx);
}

__global__ void __launch_bounds__(512) hier_all_gather_intra(Ctx ctx, HierParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllGather);
    const uint64_t e = hier::begin(p);
    const uint64_t B = p.count;
    char* const out = static_cast<char*>(p.out);
    hier::barrier<hier::kNodePeers>(ctx, p, sig_value(e, 1), "hierarchical all_gather, intra-node entry barrier");
    const Range r = block_share(B, 16);
    const int L = ctx.local_world, N = ctx.num_nodes();
    if (r.size()) {
        for (int k = 1; k < L; ++k) {
            const int peer = ctx.local_base_rank + (ctx.local_rank + k) % L;
            for (int m = 0; m < N; ++m) {
                if (!hier::in_subset(ctx, p, m)) continue;
                char* const c = out + static_cast<uint64_t>(m * L + ctx.local_rank) * B + r.lo;
                lang::put_nbi(lang::block, ctx, c, c, r.size(), peer);
            }
        }
    }
    lang::quiet(lang::block, ctx);
    hier::barrier<hier::kNodePeers>(ctx, p, sig_value(e, 2),
                                    "hierarchical all_gather, intra-node: node peers' chunks landed");
}

// ---- reduce_scatter: p.count = C elements of out; in (W x C) symmetric; scratch: partial[N][C], recv[N][C] ----
template <class T, int kOp>
__global__ void __launch_bounds__(512) hier_reduce_scatter_intra(Ctx ctx, HierParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollReduceScatter);
    const uint64_t e = hier::begin(p);
    const uint64_t C = p.count;
    const T* const in = static_cast<const T*>(p.in);
    T* const partial = reinterpret_cast<T*>(p.scratch);
    hier::barrier<hier::kNodePeers>(ctx, p, sig_value(e, 1), "hierarchical reduce_scatter, intra-node entry barrier");
    const Range r = block_share(C, kVec<T>);
    const int L = ctx.local_world, N = ctx.num_nodes();
    for (int m = 0; m < N; ++m) {
        if (!hier::in_subset(ctx, p, m)) continue;
        const uint64_t chunk = static_cast<uint64_t>(m * L + ctx.local_rank) * C + r.lo;
        hier::reduce_node_peers<T, kOp>(ctx, in + chunk, partial + m * p.stride + r.lo, r.size());
    }
    hier::barrier<hier::kNodePeers>(ctx, p, sig_value(e, 2),
                                    "hierarchical reduce_scatter, intra-node: node peers read this rank's in");
}

template <class T, int kOp>
__global__ void __launch_bounds__(512) hier_reduce_scatter_inter(Ctx ctx, HierParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollReduceScatter);
    const uint64_t e = hier::begin(p);
    const uint64_t C = p.count, S = p.stride;
    T* const partial = reinterpret_cast<T*>(p.scratch);
    T* const recv = partial + static_cast<uint64_t>(ctx.num_nodes()) * S;
    T* const out = static_cast<T*>(p.out);
    const Range r = block_share(C, 16 / sizeof(T));
    const int N = ctx.num_nodes(), n = ctx.node;
    if (p.inter_part != kHierInterCombine) {
        hier::barrier<hier::kSameLocalRank>(ctx, p, sig_value(e, 1),
                                            "hierarchical reduce_scatter, inter-node entry barrier (same local rank)");
        for (int k = 1; k < N; ++k) {
            const int m = (n + k) % N;  // partial[m] belongs to (m, l); it lands in its recv slot n
            hier::put_signal(ctx, p, reinterpret_cast<char*>(recv + n * S + r.lo),
                             reinterpret_cast<const char*>(partial + m * S + r.lo), r.size() * sizeof(T),
                             m * ctx.local_world + ctx.local_rank, sig_value(e, 2));
        }
        hier::wait_all<hier::kSameLocalRank>(
            ctx, p, sig_value(e, 2), "hierarchical reduce_scatter, inter-node: partial from the same local rank");
    }
    if (p.inter_part == kHierInterExchange) {
        lang::quiet(lang::block, ctx);
        return;
    }
    if (N <= kMaxLocalPeers) {  // own partial first, then the received ones in node order (as the loop below)
        const T* srcs[kMaxLocalPeers] = {};
        T* dsts[kMaxLocalPeers] = {out + r.lo};
#pragma unroll
        for (int k = 0; k < kMaxLocalPeers; ++k) {
            const int m = k - 1 + (k - 1 >= n);  // source k >= 1: the (k - 1)-th node other than n
            if (k < N) srcs[k] = k == 0 ? partial + n * S + r.lo : recv + m * S + r.lo;
        }
        if (r.size()) reduce_multi<T, kOp, kDepthDeep>(srcs, N, dsts, 1, r.size());
    } else {
        for (uint64_t i = r.lo + threadIdx.x; i < r.hi; i += blockDim.x) {
            float acc = to_float<T>(partial[n * S + i]);
            for (int m = 0; m < N; ++m)
                if (m != n) acc = combine<kOp>(acc, to_float<T>(recv[m * S + i]));
            out[i] = from_float<T>(acc);
        }
    }
    lang::quiet(lang::block, ctx);
}

// ---- all_reduce: p.count = C elements; in and out symmetric; range l = [l * S, min(C, (l + 1) * S)), S = stride;
// scratch: partial[S], recv[N][S] --------------------------------------------------------------------------------
LOOM_DEVICE LOOM_FORCEINLINE Range hier_range(uint64_t C, uint64_t S, int l) {
    const uint64_t lo = static_cast<uint64_t>(l) * S;
    return Range{lo < C ? lo : C, lo + S < C ? lo + S : C};
}

template <class T, int kOp>
__global__ void __launch_bounds__(512) hier_all_reduce_intra(Ctx ctx, HierParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllReduce);
    const uint64_t e = hier::begin(p);
    const Range own = hier_range(p.count, p.stride, ctx.local_rank);
    const T* const in = static_cast<const T*>(p.in) + own.lo;
    T* const partial = reinterpret_cast<T*>(p.scratch);
    hier::barrier<hier::kNodePeers>(ctx, p, sig_value(e, 1), "hierarchical all_reduce, intra-node entry barrier");
    const Range r = block_share(own.size(), kVec<T>);
    hier::reduce_node_peers<T, kOp>(ctx, in + r.lo, partial + r.lo, r.size());
    hier::barrier<hier::kNodePeers>(ctx, p, sig_value(e, 2),
                                    "hierarchical all_reduce, intra-node: node peers read this rank's in");
}

template <class T, int kOp>
__global__ void __launch_bounds__(512) hier_all_reduce_inter(Ctx ctx, HierParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllReduce);
    const uint64_t e = hier::begin(p);
    const uint64_t S = p.stride;
    const Range own = hier_range(p.count, S, ctx.local_rank);
    T* const partial = reinterpret_cast<T*>(p.scratch);
    T* const recv = partial + S;
    T* const out = static_cast<T*>(p.out) + own.lo;
    hier::barrier<hier::kSameLocalRank>(ctx, p, sig_value(e, 1),
                                        "hierarchical all_reduce, inter-node entry barrier (same local rank)");
    const Range r = block_share(own.size(), 16 / sizeof(T));
    const int N = ctx.num_nodes(), n = ctx.node;
    for (int k = 1; k < N; ++k) {
        const int m = (n + k) % N;
        hier::put_signal(ctx, p, reinterpret_cast<char*>(recv + n * S + r.lo),
                         reinterpret_cast<const char*>(partial + r.lo), r.size() * sizeof(T),
                         m * ctx.local_world + ctx.local_rank, sig_value(e, 2));
    }
    hier::wait_all<hier::kSameLocalRank>(ctx, p, sig_value(e, 2),
                                         "hierarchical all_reduce, inter-node: partial from the same local rank");
    // Every node reduces in node order, so every node's copy of the range is bitwise equal.
    if (N <= kMaxLocalPeers) {
        const T* srcs[kMaxLocalPeers] = {};
        T* dsts[kMaxLocalPeers] = {out + r.lo};
#pragma unroll
        for (int m = 0; m < kMaxLocalPeers; ++m)
            if (m < N) srcs[m] = m == n ? partial + r.lo : recv + m * S + r.lo;
        if (r.size()) reduce_multi<T, kOp, kDepthDeep>(srcs, N, dsts, 1, r.size());
    } else {
        for (uint64_t i = r.lo + threadIdx.x; i < r.hi; i += blockDim.x) {
            float acc = 0.f;
            for (int m = 0; m < N; ++m)
                acc = hier::load_combine<T, kOp>(acc, m == n ? partial + i : recv + m * S + i, m == 0);
            out[i] = from_float<T>(acc);
        }
    }
    lang::quiet(lang::block, ctx);
}

template <class T>
__global__ void __launch_bounds__(512) hier_all_reduce_gather(Ctx ctx, HierParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllReduce);
    const uint64_t e = hier::begin(p);
    const Range own = hier_range(p.count, p.stride, ctx.local_rank);
    char* const out = reinterpret_cast<char*>(static_cast<T*>(p.out) + own.lo);
    hier::barrier<hier::kNodePeers>(ctx, p, sig_value(e, 1),
                                    "hierarchical all_reduce, intra-node all_gather entry barrier");
    const Range r = block_share(own.size() * sizeof(T), 16);
    const int L = ctx.local_world;
    if (r.size())
        for (int k = 1; k < L; ++k)
            lang::put_nbi(lang::block, ctx, out + r.lo, out + r.lo, r.size(),
                          ctx.local_base_rank + (ctx.local_rank + k) % L);
    lang::quiet(lang::block, ctx);
    hier::barrier<hier::kNodePeers>(ctx, p, sig_value(e, 2),
                                    "hierarchical all_reduce, intra-node all_gather: node peers' ranges landed");
}

// ---- all_to_all: p.count bytes per peer; in and out symmetric ------------------------------------------------------
__global__ void __launch_bounds__(512) hier_all_to_all_intra(Ctx ctx, HierParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllToAll);
    const uint64_t e = hier::begin(p);
    const uint64_t B = p.count;
    const char* const in = static_cast<const char*>(p.in);
    char* const mine = static_cast<char*>(p.out) + static_cast<uint64_t>(ctx.rank) * B;  // my block, at every peer
    hier::barrier<hier::kNodePeers>(ctx, p, sig_value(e, 1), "hierarchical all_to_all, intra-node entry barrier");
    const Range r = block_share(B, 16);
    const int L = ctx.local_world;
    if (r.size())
        for (int k = 1; k <= L; ++k) {  // peers first, the own block last
            const int peer = ctx.local_base_rank + (ctx.local_rank + k) % L;
            lang::put_nbi(lang::block, ctx, mine + r.lo, in + static_cast<uint64_t>(peer) * B + r.lo, r.size(), peer);
        }
    lang::quiet(lang::block, ctx);
    hier::barrier<hier::kNodePeers>(ctx, p, sig_value(e, 2),
                                    "hierarchical all_to_all, intra-node: node peers' blocks landed");
}

__global__ void __launch_bounds__(512) hier_all_to_all_inter(Ctx ctx, HierParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllToAll);
    const uint64_t e = hier::begin(p);
    const uint64_t B = p.count;
    const char* const in = static_cast<const char*>(p.in);
    char* const mine = static_cast<char*>(p.out) + static_cast<uint64_t>(ctx.rank) * B;
    hier::barrier<hier::kRemoteRanks>(ctx, p, sig_value(e, 1),
                                      "hierarchical all_to_all, inter-node entry barrier (ranks on other nodes)");
    const Range r = block_share(B, 16);
    const int R = hier::peer_count<hier::kRemoteRanks>(ctx);
    for (int k = 0; k < R; ++k) {
        // Staggered by local rank: the node peers start on different remote ranks.
        const int peer = hier::peer_at<hier::kRemoteRanks>(ctx, (k + ctx.local_rank) % R);
        hier::put_signal(ctx, p, mine + r.lo, in + static_cast<uint64_t>(peer) * B + r.lo, r.size(), peer,
                         sig_value(e, 2));
    }
    hier::wait_all<hier::kRemoteRanks>(ctx, p, sig_value(e, 2),
                                       "hierarchical all_to_all, inter-node: block from a rank on another node");
    lang::quiet(lang::block, ctx);
}

// ---- all_to_all_v: p.count = capacity of out (elements, the same on every rank); in and out symmetric --------------
namespace hier {

// Every block this rank sends lies in its in, and no count is negative: checked by thread 0 on the rank's own counts
// and offsets before the entry barrier, so a rank with a bad block stops there and sends nothing.
LOOM_DEVICE inline void a2av_check_sends(const Ctx& ctx, const HierParams& p) {
    if (threadIdx.x != 0) return;
    long long packed = 0;
    for (int j = 0; j < ctx.world; ++j) {
        const long long cnt = p.send_counts[j];
        if (cnt < 0) detail::a2av_negative(ctx.rank, ctx.rank, j, cnt);
        const long long src = p.send_offsets ? p.send_offsets[j] : packed;
        if (src < 0 || static_cast<unsigned long long>(src) > p.in_count ||
            static_cast<unsigned long long>(cnt) > p.in_count - static_cast<unsigned long long>(src))
            detail::a2av_past_in(ctx.rank, j, src, cnt, p.in_count);
        packed += cnt;
    }
}

}  // namespace hier

// One block. After it, on every rank: p.counts[s * world + j] = what rank s sends to rank j in this call.
__global__ void __launch_bounds__(512) hier_all_to_all_v_counts(Ctx ctx, HierParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllToAll);
    const uint64_t e = hier::begin(p);
    const int W = ctx.world, me = ctx.rank;
    hier::a2av_check_sends(ctx, p);
    // Every rank is in this call: its out is free, and its data kernel of the previous call, the last reader of its
    // counts matrix, is done.
    hier::barrier<hier::kAllRanks>(ctx, p, sig_value(e, 1), "hierarchical all_to_all_v, entry barrier (every rank)");
    int64_t* const row = p.counts + static_cast<uint64_t>(me) * W;
    for (int j = static_cast<int>(threadIdx.x); j < W; j += static_cast<int>(blockDim.x)) row[j] = p.send_counts[j];
    lang::fence(lang::block, ctx);  // the row is written before NVSHMEM reads it
    __syncthreads();
    for (int k = 1; k < W; ++k)
        hier::put_signal(ctx, p, reinterpret_cast<char*>(row), reinterpret_cast<const char*>(row),
                         sizeof(int64_t) * static_cast<uint64_t>(W), (me + k) % W, sig_value(e, 2));
    hier::wait_all<hier::kAllRanks>(ctx, p, sig_value(e, 2), "hierarchical all_to_all_v: send_counts from a rank");
    if (p.recv_counts)
        for (int s = static_cast<int>(threadIdx.x); s < W; s += static_cast<int>(blockDim.x))
            p.recv_counts[s] = p.counts[static_cast<uint64_t>(s) * W + me];
    lang::quiet(lang::block, ctx);
}

// After hier_all_to_all_v_counts on the same stream (same call). Peers are visited from me + 1 on, the own block
// last, kChunk at a time: thread t works out the t-th one's destination, count and source, then the block moves them.
__global__ void __launch_bounds__(512) hier_all_to_all_v_data(Ctx ctx, HierParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollAllToAll);
    constexpr int kChunk = 512;
    const uint64_t e = hier::begin(p);
    const int W = ctx.world, me = ctx.rank;
    const uint64_t es = p.elem_bytes;
    const int64_t* const C = p.counts;  // C[s * W + j]: elements s sends to j
    const int64_t* const mine = C + static_cast<uint64_t>(me) * W;
    const char* const in = static_cast<const char*>(p.in);
    char* const out = static_cast<char*>(p.out);
    __shared__ long long s_dst[kChunk], s_cnt[kChunk], s_src[kChunk];
    for (int base = 0; base < W; base += kChunk) {
        const int n = W - base < kChunk ? W - base : kChunk;
        __syncthreads();  // the previous chunk's entries are used
        for (int t = static_cast<int>(threadIdx.x); t < n; t += static_cast<int>(blockDim.x)) {
            const int j = (me + 1 + base + t) % W;
            long long off = 0;  // where my block lands in j's out: after the blocks of the ranks before me
            for (int s = 0; s < me; ++s) off += C[static_cast<uint64_t>(s) * W + j];
            const long long cnt = mine[j];
            if (static_cast<unsigned long long>(off) > p.count ||
                static_cast<unsigned long long>(cnt) > p.count - static_cast<unsigned long long>(off))
                detail::a2av_overflow(ctx.rank, me, j, off, cnt, p.count);
            long long src = 0;
            if (p.send_offsets)
                src = p.send_offsets[j];
            else
                for (int k = 0; k < j; ++k) src += mine[k];
            s_dst[t] = off;
            s_cnt[t] = cnt;
            s_src[t] = src;
        }
        __syncthreads();
        for (int t = 0; t < n; ++t) {
            const int j = (me + 1 + base + t) % W;
            const Range r = block_share(static_cast<uint64_t>(s_cnt[t]) * es, 16);
            char* const d = out + static_cast<uint64_t>(s_dst[t]) * es + r.lo;
            const char* const src = in + static_cast<uint64_t>(s_src[t]) * es + r.lo;
            if (j != me)
                hier::put_signal(ctx, p, d, src, r.size(), j, sig_value(e, 1));  // zero bytes: the signal alone
            else if (r.size())
                lang::put(lang::block, ctx, d, src, r.size(), me);
        }
    }
    hier::wait_all<hier::kAllRanks>(ctx, p, sig_value(e, 1), "hierarchical all_to_all_v: blocks from a rank");
    lang::quiet(lang::block, ctx);
}

}  // namespace loom::kernels::coll
