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
//   all_reduce_ll<T, kOp>        low-latency packets (flag in data, lang::LL16 layout): no barrier at all. Each
//                                rank writes its input as 16-byte packets {data, flag, data, flag} into the LL
//                                area of every peer; receivers poll their packets and reduce. Small messages.
//
// LL area (per rank): [parity 2][block kMaxLLBlocks][source W][kLLPacketsPerBlock] — a fixed layout: the region
// of (parity, block b, source q) does not depend on the launch's packets per block (p.ll_packets <= the stride),
// so it is only ever written by block b of rank q, whose flags are block b's epochs. Block b's epoch is monotonic,
// hence every stale packet there carries a flag < the current epoch and never matches (flags are the low 32
// bits of the epoch: a match would need 2^32 launches of one block). (Until 2026-11 the stride was
// p.ll_packets: a launch with another packet count read packets left by *another* block, whose epoch may equal
// this block's current one — block epochs differ, e.g. the copy-engine barriers advance only block 0 — and
// accepted stale data: the graph-replay failure.)
// Parity: block b of a launch uses the parity of its epoch. Overwriting is safe: a peer writes parity p of my
// region in its call e only after receiving my block b's packets of call e-1 (or passing a barrier with my
// block b in a call between), so my block b has finished every call <= e-2, the last one that used parity p
// before e. (Consecutive LL calls alternate parities; with other collectives in between, parities may repeat,
// and the barrier of the call in between gives the same guarantee.)
#pragma once

#include "loom/kernels/coll_common.cuh"

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
    if (r.size()) {
        const T* src[kMaxLocalPeers];
        T* dst[kMaxLocalPeers];
        for (int q = 0; q < kMaxLocalPeers; ++q) {
            const int g = peer_rank(ctx, q < W ? q : me);
            src[q] = lang::symm_at(ctx, static_cast<const T*>(p.in), g) + lo + r.lo;
            dst[q] = lang::symm_at(ctx, static_cast<T*>(p.out), g) + lo + r.lo;
        }
        reduce_multi<T, kOp>(src, W, dst, W, r.size());
    }
    barrier_peers(ctx, p.sync, sig_value(e, 2));  // every shard has landed everywhere; inputs are read
}

template <class T, int kOp>
__global__ void __launch_bounds__(512) all_reduce_ll(Ctx ctx, Params p) {
    constexpr int E = 8 / static_cast<int>(sizeof(T));  // elements per packet
    const uint64_t e = begin_call(p.sync);
    const int W = ctx.local_world, me = ctx.local_rank;
    const uint32_t flag = static_cast<uint32_t>(e);
    const uint64_t P = p.ll_packets;
    // This block's packets: [first, first + P) of the message; region of (parity, block) in the LL area.
    const uint64_t first = static_cast<uint64_t>(blockIdx.x) * P;
    const uint64_t total = (p.count + E - 1) / E;
    const uint64_t mine = total > first ? (total - first < P ? total - first : P) : 0;
    constexpr uint64_t S = kLLPacketsPerBlock;  // fixed stride of one (block, source) region
    lang::LL16* const region =
        reinterpret_cast<lang::LL16*>(p.ll) + ((e & 1) * kMaxLLBlocks + blockIdx.x) * static_cast<uint64_t>(W) * S;
    const T* const in = static_cast<const T*>(p.in);
    T* const out = static_cast<T*>(p.out);
    // Send: packet i carries elements [(first + i) * E, +E) (zero-padded past count).
    for (uint64_t i = threadIdx.x; i < mine; i += blockDim.x) {
        const uint64_t el = (first + i) * E;
        uint32_t w[2] = {0, 0};
        T* t = reinterpret_cast<T*>(w);
        for (int k = 0; k < E; ++k)
            if (el + k < p.count) t[k] = in[el + k];
        const uint4 pkt = make_uint4(w[0], flag, w[1], flag);
        for (int j = 0; j < W; ++j) {
            const int peer = (me + j) % W;
            ptx::st_volatile_v4(lang::symm_at(ctx, region + me * S + i, peer_rank(ctx, peer)), pkt);
        }
    }
    // Receive and reduce in source order.
    for (uint64_t i = threadIdx.x; i < mine; i += blockDim.x) {
        float acc[E];
        for (int q = 0; q < W; ++q) {
            const lang::LL16* pk = region + q * S + i;
            uint4 v;
            lang::spin_until(ctx, "all_reduce_ll", pk, lang::Cmp::EQ, flag, [&](uint64_t& observed) {
                v = ptx::ld_volatile_v4(pk);
                observed = v.y != flag ? v.y : v.w;
                return v.y == flag && v.w == flag;
            });
            const uint32_t w[2] = {v.x, v.z};
            const T* t = reinterpret_cast<const T*>(w);
#pragma unroll
            for (int k = 0; k < E; ++k) acc[k] = q == 0 ? to_float<T>(t[k]) : combine<kOp>(acc[k], to_float<T>(t[k]));
        }
        const uint64_t el = (first + i) * E;
        for (int k = 0; k < E; ++k)
            if (el + k < p.count) out[el + k] = from_float<T>(acc[k]);
    }
}

}  // namespace loom::kernels::coll
