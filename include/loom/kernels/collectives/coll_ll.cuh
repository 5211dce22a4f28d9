// Low-latency (LL) collectives: every rank writes its data as 16-byte packets {data, flag, data, flag}
// (lang::LL16) into the LL area of every peer and the receivers poll their packets. No barrier, no fence, no
// separate signal: one store per packet and peer on the sender, one poll per packet and peer on the receiver, so
// a call costs about one one-way trip. Small messages only (16 bytes move for every 8 of data; capacity
// kMaxLLBlocks x kLLPacketsPerBlock x 8 bytes per chunk).
//
//   all_reduce_ll<T, kOp>       every rank sends in[0, count) to every peer; out = op over sources.
//   reduce_scatter_ll<T, kOp>   rank j gets in[j*count, +count) of every rank; out[0, count) = op over sources.
//   all_gather_ll<T>            every rank sends in[0, count) to every peer; out[q*count, +count) = source q's.
//   all_to_all_ll<T>            rank j gets in[j*count, +count) of every rank; out[q*count, +count) = source q's.
//
// Reductions combine the sources in rank order 0, 1, ... in fp32 (bitwise the same result on every rank). A
// rank's own contribution is read from its input directly, never sent to itself. Neither in nor out need be
// symmetric (only the LL area is).
//
// LL area (per rank): [parity 2][block kMaxLLBlocks][source W][kLLPacketsPerBlock] — a fixed layout: the region
// of (parity, block b, source q) does not depend on the launch's packets per block (p.ll_packets <= the stride),
// so it is only ever written by block b of rank q, whose flags are block b's epochs. Block b's epoch is monotonic,
// hence every stale packet there carries a flag < the current epoch and never matches (flags are the low 32
// bits of the epoch: a match would need 2^32 launches of one block). The stride is not p.ll_packets: a launch
// with another packet count would read packets left by *another* block, whose epoch may equal this block's
// current one — block epochs differ, e.g. the copy-engine barriers advance only block 0 — and accept stale data.
// Parity: block b of a launch uses the parity of its epoch. Overwriting is safe: a peer writes parity p of my
// region in its call e only after receiving my block b's packets of call e-1 (every LL kernel sends from every
// block to every peer) or passing a barrier with my block b in a call between, so my block b has finished every
// call <= e-2, the last one that used parity p before e. (Consecutive LL calls alternate parities; with other
// collectives in between, parities may repeat, and the barrier of the call in between gives the same guarantee.)
#pragma once

#include "loom/kernels/collectives/coll_common.cuh"

namespace loom::kernels::coll {

enum : int { kLLAllReduce = 0, kLLAllGather = 1, kLLReduceScatter = 2, kLLAllToAll = 3 };

// Elements [el, el + E) of src[0, n) as the 8 data bytes of one packet (zero past n). One 8-byte load when the
// packet is whole and aligned, else element by element (odd counts, byte chunks at odd offsets).
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE uint64_t ll_pack(const T* src, uint64_t el, uint64_t n) {
    constexpr int E = 8 / static_cast<int>(sizeof(T));
    const T* s = src + el;
    if (el + E <= n && (reinterpret_cast<uint64_t>(s) & 7) == 0) return *reinterpret_cast<const uint64_t*>(s);
    uint64_t v = 0;
    T* t = reinterpret_cast<T*>(&v);
    for (int k = 0; k < E; ++k)
        if (el + k < n) t[k] = s[k];
    return v;
}
// The inverse: packet data into dst[el, el + E), clipped at n.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void ll_unpack(T* dst, uint64_t el, uint64_t n, uint64_t v) {
    constexpr int E = 8 / static_cast<int>(sizeof(T));
    T* d = dst + el;
    if (el + E <= n && (reinterpret_cast<uint64_t>(d) & 7) == 0) {
        *reinterpret_cast<uint64_t*>(d) = v;
        return;
    }
    const T* t = reinterpret_cast<const T*>(&v);
    for (int k = 0; k < E; ++k)
        if (el + k < n) d[k] = t[k];
}
// Bounded poll of one packet of this rank until both halves carry `flag`; returns its 8 data bytes.
LOOM_DEVICE LOOM_FORCEINLINE uint64_t ll_poll(const Ctx& ctx, const lang::LL16* pk, uint32_t flag) {
    uint4 v;
    lang::spin_until(ctx, "ll_recv", pk, lang::Cmp::EQ, flag, [&](uint64_t& observed) {
        v = ptx::ld_volatile_v4(pk);
        observed = v.y != flag ? v.y : v.w;
        return v.y == flag && v.w == flag;
    });
    return static_cast<uint64_t>(v.x) | (static_cast<uint64_t>(v.z) << 32);
}

// One packet block of an LL call. p.count: elements per chunk (all_reduce: the buffer; all_gather: per rank;
// reduce_scatter: of out; all_to_all: per peer). Packet block b handles packets [b * P, b * P + P) of every chunk,
// P = p.ll_packets, and pairs with packet block b of every peer (its epoch, its region of the LL area).
template <class T, int kOp, int kMode>
LOOM_DEVICE inline void ll_exchange_block(const Ctx& ctx, const Params& p, uint32_t b) {
    constexpr int E = 8 / static_cast<int>(sizeof(T));  // elements per packet
    constexpr bool kChunkPerPeer = kMode == kLLReduceScatter || kMode == kLLAllToAll;
    constexpr bool kReduce = kMode == kLLAllReduce || kMode == kLLReduceScatter;
    const int W = ctx.local_world, me = ctx.local_rank;
    const uint64_t n = p.count, P = p.ll_packets;
    const uint64_t first = static_cast<uint64_t>(b) * P;
    const uint64_t total = (n + E - 1) / E;
    const uint64_t mine = total > first ? (total - first < P ? total - first : P) : 0;
    const T* const in = static_cast<const T*>(p.in);
    T* const out = static_cast<T*>(p.out);
    const T* const own = in + (kChunkPerPeer ? me * n : 0);  // what this rank contributes to itself
    // The first packet's data, and this rank's own share of it, are loaded before the epoch (begin_call's load and
    // block barrier), so the global-memory latencies overlap and none is left behind the poll: small messages have
    // one packet per thread. (All-reduce and all-gather send their own share: one load.)
    const uint64_t v0 = !kChunkPerPeer && threadIdx.x < mine ? ll_pack(in, (first + threadIdx.x) * E, n) : 0;
    const uint64_t own0 = kChunkPerPeer && threadIdx.x < mine ? ll_pack(own, (first + threadIdx.x) * E, n) : v0;
    const uint64_t e = begin_call(p.sync, b);
    const uint32_t flag = static_cast<uint32_t>(e);
    constexpr uint64_t S = kLLPacketsPerBlock;  // fixed stride of one (block, source) region
    lang::LL16* const region =
        reinterpret_cast<lang::LL16*>(p.ll) + ((e & 1) * kMaxLLBlocks + b) * static_cast<uint64_t>(W) * S;
    // Send packet i of the chunk for each peer (not to myself).
    for (uint64_t i = threadIdx.x; i < mine; i += blockDim.x) {
        const uint64_t el = (first + i) * E;
        uint64_t v = kChunkPerPeer ? 0 : i == threadIdx.x ? v0 : ll_pack(in, el, n);
        for (int j = 1; j < W; ++j) {
            const int peer = (me + j) % W;
            if (kChunkPerPeer) v = ll_pack(in + peer * n, el, n);
            const uint4 pkt = make_uint4(static_cast<uint32_t>(v), flag, static_cast<uint32_t>(v >> 32), flag);
            ptx::st_volatile_v4(lang::symm_at(ctx, region + me * S + i, peer_rank(ctx, peer)), pkt);
        }
    }
    // Receive. The thread that sent packet i receives packet i of every source, so an in-place call reads its
    // input's elements before it overwrites them.
    for (uint64_t i = threadIdx.x; i < mine; i += blockDim.x) {
        const uint64_t el = (first + i) * E;
        if constexpr (kReduce) {
            float acc[E];
            for (int q = 0; q < W; ++q) {
                const uint64_t v = q != me            ? ll_poll(ctx, region + q * S + i, flag)
                                   : i == threadIdx.x ? own0
                                                      : ll_pack(own, el, n);
                const T* t = reinterpret_cast<const T*>(&v);
#pragma unroll
                for (int k = 0; k < E; ++k)
                    acc[k] = q == 0 ? to_float<T>(t[k]) : combine<kOp>(acc[k], to_float<T>(t[k]));
            }
            for (int k = 0; k < E; ++k)
                if (el + k < n) out[el + k] = from_float<T>(acc[k]);
        } else {
            for (int q = 0; q < W; ++q) {
                T* const dst = out + q * n;
                if (q == me) {
                    if (dst != own) ll_unpack(dst, el, n, i == threadIdx.x ? own0 : ll_pack(own, el, n));
                } else {
                    ll_unpack(dst, el, n, ll_poll(ctx, region + q * S + i, flag));
                }
            }
        }
    }
}

// The launch's blocks deal the packet blocks: block x handles x, x + gridDim.x, ... in that order on every rank. With
// as many blocks as packet blocks (one each) that is the plain scheme; with fewer (ranks sharing a GPU without an MPS
// share each: setup_ll keeps the grid to the SM budget, so that every rank's blocks are resident at once) a block
// waits only for peers' packet blocks that their resident blocks reach in the same order, so no wait depends on a
// block that cannot run.
template <class T, int kOp, int kMode>
LOOM_DEVICE inline void ll_exchange(const Ctx& ctx, const Params& p) {
    // Launched programmatically (setup_ll): wait for the stream's previous kernel before touching memory, then let
    // the next call's launch begin, so back-to-back calls hide their launch latency behind this one.
    ptx::griddep_wait();
    ptx::griddep_launch_dependents();
    for (uint32_t b = blockIdx.x; b < p.ll_blocks; b += gridDim.x) {
        if (b != blockIdx.x) __syncthreads();  // begin_call rewrites its shared epoch
        ll_exchange_block<T, kOp, kMode>(ctx, p, b);
    }
}

template <class T, int kOp>
__global__ void __launch_bounds__(512) all_reduce_ll(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollLowLatency);
    ll_exchange<T, kOp, kLLAllReduce>(ctx, p);
}
template <class T, int kOp>
__global__ void __launch_bounds__(512) reduce_scatter_ll(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollLowLatency);
    ll_exchange<T, kOp, kLLReduceScatter>(ctx, p);
}
template <class T>
__global__ void __launch_bounds__(512) all_gather_ll(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollLowLatency);
    ll_exchange<T, kOpSum, kLLAllGather>(ctx, p);
}
template <class T>
__global__ void __launch_bounds__(512) all_to_all_ll(Ctx ctx, Params p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagCollKernel, lang::kCollLowLatency);
    ll_exchange<T, kOpSum, kLLAllToAll>(ctx, p);
}

}  // namespace loom::kernels::coll
