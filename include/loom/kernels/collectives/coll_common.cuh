// Building blocks shared by the collective kernels: the per-call epoch, the per-block peer barrier, the split
// of a range over blocks (lang/share.cuh), element conversions and the multi-source / multi-destination reduce.
//
// Synchronisation model (see docs/collectives.md):
//   * Block b of every rank's launch pairs with block b of every peer's launch: each block handles the same
//     slice of the data on every rank, so blocks synchronise per block index and never across blocks.
//   * begin_call() reads and advances this block's epoch in device memory (SyncState::epoch[b]); nothing is
//     ever reset, so launches are stream-ordered, graph-capturable and need no host synchronisation.
//   * Every call synchronises block b with block b of every peer at least once after the call started (the
//     entry barrier, or for LL the packets every block exchanges with every peer). Scratch and LL buffers rely
//     on it: a peer that is in call e+1 has finished call e (kernel boundaries are stream-ordered).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/config.hpp"
#include "loom/kernels/collectives/coll_params.hpp"
#include "loom/lang/lang.cuh"
#include "loom/lang/profile.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/special.cuh"
#include "loom/tile/convert.cuh"

namespace loom::kernels::coll {

// Dynamic shared memory of a collective launch (TMA staging).
extern __shared__ __align__(128) char coll_smem[];

LOOM_DEVICE LOOM_FORCEINLINE uint64_t sig_value(uint64_t epoch, uint32_t phase) {
    return (epoch << kPhaseBits) + phase;
}

// Every thread of the block calls it first. Returns this launch's epoch for block slot `b` (default: this block;
// LL kernels pass each packet block they handle) (1, 2, ...). A block that calls it again (another slot) passes a
// __syncthreads first: the shared copy is rewritten.
LOOM_DEVICE inline uint64_t begin_call(SyncState* st, uint32_t b) {
    __shared__ uint64_t s_epoch;
    if (threadIdx.x == 0) {
        const uint64_t e = st->epoch[b] + 1;
        st->epoch[b] = e;
        s_epoch = e;
    }
    __syncthreads();
    return s_epoch;
}
LOOM_DEVICE inline uint64_t begin_call(SyncState* st) { return begin_call(st, blockIdx.x); }

// Global rank of local rank `i` (collectives address node peers only; the host checks world == local world).
LOOM_DEVICE LOOM_FORCEINLINE int peer_rank(const Ctx& ctx, int i) { return ctx.local_base_rank + i; }

// Every thread of the block calls it. Publishes `value` to block b of every local peer (store-release at sys
// scope, after the block synchronised: every write this block made before, local or remote, is visible to a
// peer that observes the value) and waits until every peer's block b has published at least `value`.
LOOM_DEVICE inline void barrier_peers(const Ctx& ctx, SyncState* st, uint64_t value) {
    __syncthreads();
    const int t = static_cast<int>(threadIdx.x);
    LOOM_PROF_ONLY(if (t == 0) LOOM_PROF_BEGIN(lang::kTagCollBarrier, value & 0xfffff));
    if (t < ctx.local_world) {
        lang::signal_op(ctx, &st->sig[blockIdx.x][ctx.local_rank], value, lang::SignalOp::Set, peer_rank(ctx, t));
        lang::signal_wait_until(ctx, &st->sig[blockIdx.x][t], lang::Cmp::GE, value, lang::Scope::Sys,
                                "collective barrier (value: call << 20 | phase)", peer_rank(ctx, t));
    }
    __syncthreads();
    LOOM_PROF_ONLY(if (t == 0) LOOM_PROF_END(lang::kTagCollBarrier, value & 0xfffff));
}

// Publish `value` to one peer's block b (every thread calls; release after the block synchronised).
LOOM_DEVICE inline void signal_peer(const Ctx& ctx, SyncState* st, int peer_local, uint64_t value) {
    lang::notify(lang::block, ctx, &st->sig[blockIdx.x][ctx.local_rank], peer_rank(ctx, peer_local), value,
                 lang::SignalOp::Set);
}
// Wait until peer's block b published at least `value` (every thread calls; acquire, then the block syncs).
LOOM_DEVICE inline void wait_peer(const Ctx& ctx, SyncState* st, int peer_local, uint64_t value) {
    lang::wait(lang::block, ctx, &st->sig[blockIdx.x][peer_local], lang::Cmp::GE, value);
}

using lang::block_share;  // lang/share.cuh
using lang::Range;

// The items a thread handles: [r.lo, r.hi) from r.lo + tid in steps of nt. By default the block's contiguous share
// (block_share) over the block's threads. With kFlagGridStride every thread of the grid steps over the whole range
// together, so the grid sweeps memory as one window: one H200 streams a 1 -> 8 fan-out copy at 3.6 TB/s that way,
// against 2.4-2.6 TB/s for one or two blocks per SM each streaming a contiguous slice (bench/probes/hbm_fanout.cu;
// at 1056 blocks the two layouts tie).
// Any partition suits the kernels that take it: their barriers pair block b with block b of each peer, and a
// launch completes only when all its blocks have passed them.
struct ThreadShare {
    Range r;
    uint32_t tid, nt;
};
LOOM_DEVICE LOOM_FORCEINLINE ThreadShare thread_share(const Params& p, uint64_t n, uint64_t align) {
    if (p.flags & kFlagGridStride) return {Range{0, n}, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x};
    return {block_share(n, align), threadIdx.x, blockDim.x};
}

// Block b's share of one round of a scratch loop: its share of a full round of C elements, clipped to the n
// elements of this round. Block b must own the same scratch addresses in every round, the last (shorter) one
// included: the barrier that frees a round's scratch is per block (block b with block b of each peer), so a
// block writing a range another block reduced in the previous round would race with that block (block_share(n) of
// the last round would overlap the previous round's range of a lower block).
LOOM_DEVICE LOOM_FORCEINLINE Range round_share(uint64_t C, uint64_t n, uint64_t align) {
    Range r = block_share(C, align);
    if (r.lo > n) r.lo = n;
    if (r.hi > n) r.hi = n;
    return r;
}

// ---- elements ------------------------------------------------------------------------------------------------
using tile::from_float;
using tile::to_float;

template <int kOp>
LOOM_DEVICE LOOM_FORCEINLINE float combine(float a, float b) {
    if constexpr (kOp == kOpMax) {
        return fmaxf(a, b);
    } else {
        return a + b;
    }
}

// Elements of T in a 16-byte vector.
template <class T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void unpack(const uint4& v, float (&f)[kVec<T>]) {
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) f[k] = to_float<T>(e[k]);
}
template <class T, int kOp>
LOOM_DEVICE LOOM_FORCEINLINE void unpack_combine(const uint4& v, float (&f)[kVec<T>]) {
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) f[k] = combine<kOp>(f[k], to_float<T>(e[k]));
}
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE uint4 pack(const float (&f)[kVec<T>]) {
    uint4 v;
    T* e = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) e[k] = from_float<T>(f[k]);
    return v;
}

// reduce_multi's vector loop for nsrc <= kS sources: kU vectors per thread and source per iteration, every load of
// an iteration issued before the first combine, so a thread waits one (NVLink) latency per kS x kU vectors.
template <class T, int kOp, int kS, int kU>
LOOM_DEVICE LOOM_FORCEINLINE void reduce_vectors(const T* const (&src)[kMaxLocalPeers], int nsrc,
                                                 T* const (&dst)[kMaxLocalPeers], int ndst, uint64_t nv, uint32_t tid,
                                                 uint32_t nt) {
    constexpr int E = kVec<T>;
    for (uint64_t i0 = tid; i0 < nv; i0 += kU * nt) {
        uint4 v[kU][kS];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const uint64_t i = i0 + u * nt < nv ? i0 + u * nt : i0;  // past the end: reload i0 (not stored)
#pragma unroll
            for (int s = 0; s < kS; ++s)
                if (s < nsrc) v[u][s] = ptx::ld_v4(reinterpret_cast<const uint4*>(src[s]) + i);
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            float acc[E];
            unpack<T>(v[u][0], acc);
#pragma unroll
            for (int s = 1; s < kS; ++s)
                if (s < nsrc) unpack_combine<T, kOp>(v[u][s], acc);
            const uint4 r = pack<T>(acc);
            const uint64_t i = i0 + u * nt;
            if (i < nv) {
#pragma unroll
                for (int d = 0; d < kMaxLocalPeers; ++d)
                    if (d < ndst) ptx::st_v4(reinterpret_cast<uint4*>(dst[d]) + i, r);
            }
        }
    }
}

// dst[d][i] = op over s of src[s][i], i in [0, n), for d < ndst and s < nsrc (1 <= nsrc, ndst <= kMaxLocalPeers),
// accumulated in fp32 in source order 0, 1, ... (the same order on every rank). Threads tid of nt (the block's
// threads by default, or a thread_share) call it with the same arguments; thread t handles vectors t, t + nt, ...;
// each element is read from all
// sources and written to all destinations by the same thread, so a destination may alias a source element by
// element (in-place). 16-byte vectors when every pointer is 16-byte aligned, scalars otherwise and for the tail.
template <class T, int kOp, int kDepth = kDepthOne>
LOOM_DEVICE inline void reduce_multi(const T* const (&src)[kMaxLocalPeers], int nsrc, T* const (&dst)[kMaxLocalPeers],
                                     int ndst, uint64_t n, uint32_t tid = threadIdx.x, uint32_t nt = blockDim.x) {
    constexpr int E = kVec<T>;
    uint64_t mis = 0;
#pragma unroll
    for (int s = 0; s < kMaxLocalPeers; ++s)
        if (s < nsrc) mis |= reinterpret_cast<uint64_t>(src[s]);
#pragma unroll
    for (int d = 0; d < kMaxLocalPeers; ++d)
        if (d < ndst) mis |= reinterpret_cast<uint64_t>(dst[d]);
    const uint64_t nv = (mis & 15) == 0 ? n / E : 0;
    // kDepthDeep: 8 vectors in flight per thread (2 sources x 4 iterations, 4 x 2, or 8 x 1).
    if constexpr (kDepth == kDepthOne) {
        reduce_vectors<T, kOp, kMaxLocalPeers, 1>(src, nsrc, dst, ndst, nv, tid, nt);
    } else if constexpr (kDepth == kDepthGrid) {
        if (nsrc <= 2)
            reduce_vectors<T, kOp, 2, 2>(src, nsrc, dst, ndst, nv, tid, nt);
        else if (nsrc <= 4)
            reduce_vectors<T, kOp, 4, 2>(src, nsrc, dst, ndst, nv, tid, nt);
        else
            reduce_vectors<T, kOp, kMaxLocalPeers, 1>(src, nsrc, dst, ndst, nv, tid, nt);
    } else if (nsrc <= 2) {
        reduce_vectors<T, kOp, 2, 4>(src, nsrc, dst, ndst, nv, tid, nt);
    } else if (nsrc <= 4) {
        reduce_vectors<T, kOp, 4, 2>(src, nsrc, dst, ndst, nv, tid, nt);
    } else {
        reduce_vectors<T, kOp, kMaxLocalPeers, 1>(src, nsrc, dst, ndst, nv, tid, nt);
    }
    for (uint64_t i = nv * E + tid; i < n; i += nt) {
        float acc = to_float<T>(src[0][i]);
#pragma unroll
        for (int s = 1; s < kMaxLocalPeers; ++s)
            if (s < nsrc) acc = combine<kOp>(acc, to_float<T>(src[s][i]));
        const T r = from_float<T>(acc);
#pragma unroll
        for (int d = 0; d < kMaxLocalPeers; ++d)
            if (d < ndst) dst[d][i] = r;
    }
}

// dst[d][0, bytes) = src[0, bytes) for d < ndst: each 16-byte vector is loaded once (kU in flight per thread) and
// stored to every destination in order d = 0, 1, ... Threads tid of nt (a thread_share) call it with the same
// arguments; 16-byte vectors when src and every destination are 16-byte aligned, bytes otherwise and for the tail.
template <int kU>
LOOM_DEVICE inline void copy_fanout(const char* src, char* const (&dst)[kMaxLocalPeers], int ndst, uint64_t bytes,
                                    uint32_t tid, uint32_t nt) {
    uint64_t mis = reinterpret_cast<uint64_t>(src);
#pragma unroll
    for (int d = 0; d < kMaxLocalPeers; ++d)
        if (d < ndst) mis |= reinterpret_cast<uint64_t>(dst[d]);
    const uint64_t nv = (mis & 15) == 0 ? bytes / 16 : 0;
    const uint4* const vs = reinterpret_cast<const uint4*>(src);
    uint64_t i = tid;
    for (; i + (kU - 1) * nt < nv; i += kU * nt) {
        uint4 v[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) v[u] = ptx::ld_v4_na(vs + i + u * nt);
#pragma unroll
        for (int d = 0; d < kMaxLocalPeers; ++d)
            if (d < ndst) {
#pragma unroll
                for (int u = 0; u < kU; ++u) ptx::st_v4(reinterpret_cast<uint4*>(dst[d]) + i + u * nt, v[u]);
            }
    }
    for (; i < nv; i += nt) {
        const uint4 v = ptx::ld_v4_na(vs + i);
#pragma unroll
        for (int d = 0; d < kMaxLocalPeers; ++d)
            if (d < ndst) ptx::st_v4(reinterpret_cast<uint4*>(dst[d]) + i, v);
    }
    for (uint64_t k = nv * 16 + tid; k < bytes; k += nt) {
        const char c = src[k];
#pragma unroll
        for (int d = 0; d < kMaxLocalPeers; ++d)
            if (d < ndst) dst[d][k] = c;
    }
}

// Calls f(path) with the block's data path: lang::LdSt, or a TMA staging area carved from the dynamic shared
// memory (p.stages x p.stage_bytes; the host sizes the launch's smem with lang::tma_staging_bytes).
template <int kPath, class F>
LOOM_DEVICE LOOM_FORCEINLINE void with_path(const Params& p, F&& f) {
    if constexpr (kPath == kPathTma) {
        const lang::Tma t = lang::make_tma_staging(lang::block, coll_smem, p.stages, p.stage_bytes);
        f(t);
    } else {
        f(lang::LdSt{});
    }
}

// A one-block launch that only meets every peer: the copy-engine data path puts one before and one after its
// cudaMemcpyAsync calls (entry: peers' buffers are ready; exit: every peer's copies are complete). p.hold_ns > 0
// (loom::barrier_on_stream's hold, for benchmarks): the launch then ends that long after the barrier, so that what
// each rank enqueued behind it is already queued on every rank when the ranks leave it together.
__global__ void __launch_bounds__(32) coll_barrier(Ctx ctx, Params p) {
    const uint64_t e = begin_call(p.sync);
    barrier_peers(ctx, p.sync, sig_value(e, 1));
    if (p.hold_ns != 0 && threadIdx.x == 0) {
        const uint64_t until = ptx::globaltimer() + p.hold_ns;
        while (ptx::globaltimer() < until) {
        }
    }
}

// Scatter-then-reduce in rounds of p.round_elems, shared by one-shot AllReduce and scatter ReduceScatter: every
// block pushes its share of the chunk destined to peer q (in + q * peer_stride: 0 when every peer gets the same
// data) into slot `me` of q's scratch, the peers meet, and each reduces its W slots in rank order into out.
// Every thread of every block calls it once per launch.
template <class T, int kOp, int kPath>
LOOM_DEVICE inline void scatter_reduce_rounds(const Ctx& ctx, const Params& p, uint64_t peer_stride) {
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    const uint64_t C = p.round_elems;  // per peer per round; scratch holds W x C elements
    const T* const in = static_cast<const T*>(p.in);
    T* const scratch = reinterpret_cast<T*>(p.scratch);
    barrier_peers(ctx, p.sync, sig_value(e, 1));
    uint32_t phase = 2;
    // The data path (TMA staging: mbarriers initialised once per launch) spans every round.
    with_path<kPath>(p, [&](const auto& path) {
        for (uint64_t base = 0; base < p.count; base += C) {
            const uint64_t n = p.count - base < C ? p.count - base : C;
            const Range r = round_share(C, n, kVec<T>);
            if (r.size()) {
                for (int i = 0; i < W; ++i) {
                    const int peer = (me + i) % W;
                    lang::put_nbi(lang::block, ctx, scratch + me * C + r.lo, in + peer * peer_stride + base + r.lo,
                                  r.size() * sizeof(T), peer_rank(ctx, peer), path);
                }
                lang::quiet(lang::block, ctx);
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
    });
}

}  // namespace loom::kernels::coll
