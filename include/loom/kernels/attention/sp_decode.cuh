// Sequence-parallel decode: the combine of every rank's partial (O, LSE), exchanged as low-latency packets or
// directly (the host picks by the payload: docs/attention.md).
//
//   sp_decode_combine<T, D>   grid = the row blocks (<= kSpMaxBlocks), kSpThreads threads. Block b owns rows
//                             [row0 + b x rows_per_block, +rows_per_block) (row = batch x num_q_heads + q head) on
//                             every rank. It merges this rank's split partials of its rows (decode_split's output),
//                             sends them to every peer as LL16 packets {data, flag, data, flag}: per row D / 2
//                             packets of O (two fp32 each) and one {LSE (log2), 0}; then polls every peer's packets
//                             of its rows and writes O = sum_q w_q O_q / sum_q w_q, w_q = 2^(LSE_q - max), and
//                             LSE = ln(sum_q 2^LSE_q). Sources are combined in rank order 0, 1, ..., so every rank
//                             computes bitwise the same result.
//
// Flags and the LL area (the argument of kernels/collectives/coll_ll.cuh, with this kernel's own area and epochs):
// block b advances its epoch e (SpParams::epoch[b], this rank's memory, never reset) once per launch; the flag is the
// low 32 bits of e, so a stale packet never matches (that would take 2^32 launches of one block). The area is
// [parity 2][block kSpMaxBlocks][source W][kSpPacketsPerBlock]: region (e & 1, b, q) is only ever written by block b
// of rank q, with block b's flags. A peer writes parity p of my region in its launch e only after it received my
// block b's packets of launch e - 1 — every block sends at least one packet to every peer per launch (each block
// has at least one row) — so my block b has finished launch e - 2, the last that read parity p. No barrier, no
// reset between calls; stream-ordered, so a CUDA graph replays it as is.
//
//   sp_decode_combine_direct<T, D>   the same blocks and rows, the same area and epochs, without packets: block b
//                             merges its rows' split partials into region (e & 1, b, me) of every rank as plain fp32
//                             (O rows, then the LSEs), then sets flag [b][me] to e on every peer (release); it waits
//                             (acquire) until every source's flag [b][q] reaches e and combines the regions. Half the
//                             bytes of the packets, and one flag per block and source instead of one per 8 bytes: the
//                             form for large payloads (many rows); the packets' for small ones (one hop, no flag
//                             round trip). The parities are reused as the packets' are: a source sets flag e + 1 of
//                             block b only in its launch e + 1, after its launch e waited for my flag e, so a flag
//                             past e (GE) still means that region parity e & 1 holds launch e's data.
//
//   sp_decode_combine_two_shot<T, D>   the same blocks, rows, area and epochs; each rank owns (combines) rows
//                             [q x own_rows, +own_rows) of every block. Shot 1: block b sends its merged partial of
//                             each row to the row's owner only (region (e & 1, b, me) there), flag [b][me] = e on
//                             every peer, and waits for every source's. Shot 2: it combines the rows it owns (rank
//                             order: the same bits as the other exchanges), writes them to its own O and, as T with
//                             their LSEs, to region (e & 1, b, me) of every peer past the partials
//                             (sp_two_shot_final_offset), then final_flags [b][me] = e on every peer; it waits for
//                             every owner's and copies their rows into O. A rank sends about 1.5 x its partials' bytes
//                             instead of W - 1 times them, for a second flag round trip: the form for many rows and
//                             ranks. The parity argument is the direct one: shot 1 of launch e + 2 follows this
//                             rank's launch e + 1, which waited for every peer's shot-1 flag of e + 1, so every peer
//                             had finished launch e (both shots' reads).
#pragma once

#include "loom/config.hpp"
#include "loom/kernels/attention/decode.cuh"
#include "loom/lang/context.cuh"
#include "loom/lang/ll.cuh"
#include "loom/lang/rank.cuh"
#include "loom/lang/signal.cuh"
#include "loom/lang/spin.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/special.cuh"

namespace loom::kernels::attention {

// Bounded poll of one packet until both halves carry `flag`; returns its two data words as floats.
LOOM_DEVICE LOOM_FORCEINLINE float2 sp_poll(const Ctx& ctx, const lang::LL16* pk, uint32_t flag, int peer) {
    uint4 v;
    lang::spin_until(ctx, "sp_decode_attention: partials packet", peer, pk, lang::Cmp::EQ, flag,
                     [&](uint64_t& observed) {
                         v = ptx::ld_volatile_v4(pk);
                         observed = v.y != flag ? v.y : v.w;
                         return v.y == flag && v.w == flag;
                     });
    return make_float2(__uint_as_float(v.x), __uint_as_float(v.z));
}

// Block blockIdx.x's rows [r_lo, r_lo + nrows) (nrows >= 1: the host sizes the grid) and this launch's epoch e: the
// block's counter p.epoch[b] + 1, stored back by thread 0. Every thread of the block calls (one barrier), first: the
// combine launches programmatically after the split kernel whose partials it reads (or after the previous combine
// launch of the same call), and griddep_wait() holds every thread until that kernel has completed.
struct SpBlock {
    int r_lo, nrows;
    uint64_t e;
};
LOOM_DEVICE LOOM_FORCEINLINE SpBlock sp_block(const SpParams& p, int32_t row0) {
    ptx::griddep_wait();
    __shared__ uint64_t s_epoch;
    const int b = static_cast<int>(blockIdx.x);
    if (threadIdx.x == 0) {
        const uint64_t e = p.epoch[b] + 1;
        p.epoch[b] = e;
        s_epoch = e;
    }
    __syncthreads();
    const int r_lo = row0 + b * p.rows_per_block;
    const int r_hi = r_lo + p.rows_per_block < p.rows ? r_lo + p.rows_per_block : p.rows;
    return SpBlock{r_lo, r_hi - r_lo, s_epoch};
}

// The W regions of kSpRegionFloats floats that block b uses in launch e (parity e & 1) in the plain-fp32 exchanges
// (direct, two shots): region q is written only by source rank q.
LOOM_DEVICE LOOM_FORCEINLINE float* sp_float_regions(const SpParams& p, uint64_t e, int b, int W) {
    return static_cast<float*>(p.ll) + ((e & 1) * kSpMaxBlocks + b) * static_cast<uint64_t>(W) * kSpRegionFloats;
}

// The sources' partials of N columns of one row merged online, in the order added (rank order): running max of the
// log2-domain LSEs, sums rescaled to it.
template <int N>
struct SpMerge {
    float mx, sum, acc[N];
    LOOM_DEVICE LOOM_FORCEINLINE SpMerge() : mx(neg_inf()), sum(0.f) {
#pragma unroll
        for (int k = 0; k < N; ++k) acc[k] = 0.f;
    }
    LOOM_DEVICE LOOM_FORCEINLINE void add(float lse2, const float (&v)[N]) {
        const float nmx = fmaxf(mx, lse2);
        const float ref = nmx == neg_inf() ? 0.f : nmx;
        const float c = fast_exp2(mx - ref), w = fast_exp2(lse2 - ref);
        sum = sum * c + w;
#pragma unroll
        for (int k = 0; k < N; ++k) acc[k] = acc[k] * c + w * v[k];
        mx = nmx;
    }
    // Merged value k (0 where no source has a token of the row), and the merged LSE, natural log (-inf where none has).
    LOOM_DEVICE LOOM_FORCEINLINE float value(int k) const { return sum > 0.f ? acc[k] / sum : 0.f; }
    LOOM_DEVICE LOOM_FORCEINLINE float lse() const { return sum > 0.f ? (mx + log2f(sum)) * kLn2 : neg_inf(); }
    // out[0, N) = the merged values; *lse (when non-null) = the merged LSE.
    template <class T>
    LOOM_DEVICE LOOM_FORCEINLINE void store(T* out, float* lse_out) const {
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = from_float<T>(value(k));
        if (lse_out != nullptr) *lse_out = lse();
    }
};

template <class T, int D>
__global__ void __launch_bounds__(kSpThreads) sp_decode_combine(Ctx ctx, SpParams p, int32_t row0) {
    constexpr int kPairs = D / 2;    // O packets per row
    constexpr int kPk = kPairs + 1;  // + the LSE packet
    constexpr uint64_t S = kSpPacketsPerBlock;
    const int W = ctx.local_world, me = ctx.local_rank;
    const int b = static_cast<int>(blockIdx.x);
    const SpBlock blk = sp_block(p, row0);
    const int r_lo = blk.r_lo, nrows = blk.nrows;
    const uint64_t e = blk.e;
    const uint32_t flag = static_cast<uint32_t>(e);
    lang::LL16* const region =
        static_cast<lang::LL16*>(p.ll) + ((e & 1) * kSpMaxBlocks + b) * static_cast<uint64_t>(W) * S;

    // Send this rank's merged partials of the block's rows to every peer.
    for (int i = static_cast<int>(threadIdx.x); i < nrows * kPk; i += kSpThreads) {
        const int r = r_lo + i / kPk, k = i % kPk;
        const float* po = p.part_o + static_cast<int64_t>(r) * p.splits * D;
        const float* pl = p.part_lse + static_cast<int64_t>(r) * p.splits;
        float o[2];
        const float lse2 = merge_splits<2>(po, pl, p.splits, D, k < kPairs ? 2 * k : 0, o);
        const float x = k < kPairs ? o[0] : lse2, y = k < kPairs ? o[1] : 0.f;
        const uint4 pkt = make_uint4(__float_as_uint(x), flag, __float_as_uint(y), flag);
        for (int j = 1; j < W; ++j) {
            const int peer = ctx.local_base_rank + (me + j) % W;
            ptx::st_volatile_v4(lang::symm_at(ctx, region + me * S + i, peer), pkt);
        }
    }
    // Receive and combine, sources in rank order (online: running max, rescaled sums).
    for (int i = static_cast<int>(threadIdx.x); i < nrows * kPairs; i += kSpThreads) {
        const int rr = i / kPairs, k = i % kPairs;
        const int r = r_lo + rr;
        SpMerge<2> m;
        for (int q = 0; q < W; ++q) {
            float lse2, o[2];
            if (q == me) {
                lse2 = merge_splits<2>(p.part_o + static_cast<int64_t>(r) * p.splits * D,
                                       p.part_lse + static_cast<int64_t>(r) * p.splits, p.splits, D, 2 * k, o);
            } else {
                const lang::LL16* src = region + q * S + rr * kPk;
                lse2 = sp_poll(ctx, src + kPairs, flag, ctx.local_base_rank + q).x;
                const float2 v = sp_poll(ctx, src + k, flag, ctx.local_base_rank + q);
                o[0] = v.x;
                o[1] = v.y;
            }
            m.add(lse2, o);
        }
        m.store(static_cast<T*>(p.o) + static_cast<int64_t>(r) * D + 2 * k,
                k == 0 && p.lse != nullptr ? p.lse + r : nullptr);
    }
}

template <class T, int D>
__global__ void __launch_bounds__(kSpThreads) sp_decode_combine_direct(Ctx ctx, SpParams p, int32_t row0) {
    constexpr int kChunks = D / 4;  // float4 chunks of a row's O
    constexpr uint64_t R = kSpRegionFloats;
    const int W = ctx.local_world, me = ctx.local_rank;
    const int b = static_cast<int>(blockIdx.x);
    const int t = static_cast<int>(threadIdx.x);
    const SpBlock blk = sp_block(p, row0);
    const int r_lo = blk.r_lo, nrows = blk.nrows;
    const uint64_t e = blk.e;
    float* const region = sp_float_regions(p, e, b, W);
    float* const mine = region + me * R;
    float* const mine_lse = mine + p.rows_per_block * D;

    // This rank's merged partials of the block's rows into region `me` of every rank (this one included).
    for (int i = t; i < nrows * kChunks; i += kSpThreads) {
        const int rr = i / kChunks, c = i % kChunks;
        const int r = r_lo + rr;
        float o[4];
        const float lse2 = merge_splits<4>(p.part_o + static_cast<int64_t>(r) * p.splits * D,
                                           p.part_lse + static_cast<int64_t>(r) * p.splits, p.splits, D, 4 * c, o);
        const float4 v = make_float4(o[0], o[1], o[2], o[3]);
        for (int j = 0; j < W; ++j) {
            const int peer = ctx.local_base_rank + (me + j) % W;
            *reinterpret_cast<float4*>(lang::symm_at(ctx, mine + rr * D + 4 * c, peer)) = v;
            if (c == 0) *lang::symm_at(ctx, mine_lse + rr, peer) = lse2;
        }
    }
    // Publish: the block's writes (the barrier), then flag [b][me] = e on every peer, one thread per peer (release).
    __syncthreads();
    if (t >= 1 && t < W) {
        const int peer = ctx.local_base_rank + (me + t) % W;
        lang::signal_release(lang::symm_at(ctx, p.flags + b * W + me, peer), e, lang::SignalOp::Set, lang::Scope::Sys);
        // Every source's flag, one thread per source (acquire); this rank's own region is ordered by the barriers.
        const int q = (me + t) % W;
        lang::spin_wait(ctx, "sp_decode_attention: partials flag", p.flags + b * W + q, lang::Cmp::GE, e,
                        lang::Scope::Sys, ctx.local_base_rank + q);
    }
    __syncthreads();
    // Combine, sources in rank order (online: running max, rescaled sums); L2 reads (__ldcg) of the peers' writes.
    for (int i = t; i < nrows * kChunks; i += kSpThreads) {
        const int rr = i / kChunks, c = i % kChunks;
        const int r = r_lo + rr;
        SpMerge<4> m;
#pragma unroll 4
        for (int q = 0; q < W; ++q) {
            const float* src = region + q * R;
            const float4 v = __ldcg(reinterpret_cast<const float4*>(src + rr * D + 4 * c));
            const float o[4] = {v.x, v.y, v.z, v.w};
            m.add(__ldcg(src + p.rows_per_block * D + rr), o);
        }
        m.store(static_cast<T*>(p.o) + static_cast<int64_t>(r) * D + 4 * c,
                c == 0 && p.lse != nullptr ? p.lse + r : nullptr);
    }
}

template <class T, int D>
__global__ void __launch_bounds__(kSpThreads) sp_decode_combine_two_shot(Ctx ctx, SpParams p, int32_t row0) {
    constexpr int kChunks = D / 4;  // float4 chunks of a row's O
    constexpr int kOut = D / 8;     // 16-byte chunks of a row's O in T
    constexpr uint64_t R = kSpRegionFloats;
    const int W = ctx.local_world, me = ctx.local_rank;
    const int b = static_cast<int>(blockIdx.x);
    const int t = static_cast<int>(threadIdx.x);
    const SpBlock blk = sp_block(p, row0);
    const int r_lo = blk.r_lo, nrows = blk.nrows;
    const uint64_t e = blk.e;
    const int own = p.own_rows;
    const int fin = sp_two_shot_final_offset(own, D);
    float* const region = sp_float_regions(p, e, b, W);

    // Two shots, each ending in flag [b][me] = e on every peer (release) and a wait until every source's flag [b][q]
    // reaches e (acquire), between two barriers. One wait site in a loop: with two inlined copies of the wait (each
    // with its timeout report) ptxas spilled.
    const int own_lo = me * own;
    const int own_n = nrows - own_lo < own ? (nrows - own_lo > 0 ? nrows - own_lo : 0) : own;
#pragma unroll 1
    for (int shot = 0; shot < 2; ++shot) {
        if (shot == 0) {
            // Shot 1: this rank's merged partial of block row rr into region `me` of its owner rr / own (this rank
            // included).
            for (int i = t; i < nrows * kChunks; i += kSpThreads) {
                const int rr = i / kChunks, c = i % kChunks;
                const int r = r_lo + rr, q = rr / own, slot = rr - q * own;
                float o[4];
                const float lse2 =
                    merge_splits<4>(p.part_o + static_cast<int64_t>(r) * p.splits * D,
                                    p.part_lse + static_cast<int64_t>(r) * p.splits, p.splits, D, 4 * c, o);
                const int peer = ctx.local_base_rank + q;
                float* const dst = region + me * R;
                *reinterpret_cast<float4*>(lang::symm_at(ctx, dst + slot * D + 4 * c, peer)) =
                    make_float4(o[0], o[1], o[2], o[3]);
                if (c == 0) *lang::symm_at(ctx, dst + own * D + slot, peer) = lse2;
            }
        } else {
            // Shot 2: combine the rows this rank owns, sources in rank order, and send each combined row (T, and its
            // LSE) to every rank: into this rank's own O, and into region `me` of every peer from offset `fin`.
            for (int i = t; i < own_n * kChunks; i += kSpThreads) {
                const int slot = i / kChunks, c = i % kChunks;
                const int r = r_lo + own_lo + slot;
                SpMerge<4> m;
#pragma unroll 4
                for (int q = 0; q < W; ++q) {
                    const float* src = region + q * R;
                    const float4 v = __ldcg(reinterpret_cast<const float4*>(src + slot * D + 4 * c));
                    const float o[4] = {v.x, v.y, v.z, v.w};
                    m.add(__ldcg(src + own * D + slot), o);
                }
                const uint2 packed = make_uint2(pack2<T>(m.value(0), m.value(1)), pack2<T>(m.value(2), m.value(3)));
                const float lse = m.lse();
                *reinterpret_cast<uint2*>(static_cast<T*>(p.o) + static_cast<int64_t>(r) * D + 4 * c) = packed;
                if (c == 0 && p.lse != nullptr) p.lse[r] = lse;
                T* const fin_o = reinterpret_cast<T*>(region + me * R + fin) + slot * D + 4 * c;
                float* const fin_lse = region + me * R + fin + own * D / 2 + slot;
                for (int j = 1; j < W; ++j) {
                    const int peer = ctx.local_base_rank + (me + j) % W;
                    *reinterpret_cast<uint2*>(lang::symm_at(ctx, fin_o, peer)) = packed;
                    if (c == 0) *lang::symm_at(ctx, fin_lse, peer) = lse;
                }
            }
        }
        __syncthreads();
        if (t >= 1 && t < W) {
            const int q = (me + t) % W;
            uint64_t* const flags = shot == 0 ? p.flags : p.final_flags;
            lang::signal_release(lang::symm_at(ctx, flags + b * W + me, ctx.local_base_rank + q), e,
                                 lang::SignalOp::Set, lang::Scope::Sys);
            lang::spin_wait(ctx, shot == 0 ? "sp_decode_attention: partials flag" : "sp_decode_attention: rows flag",
                            flags + b * W + q, lang::Cmp::GE, e, lang::Scope::Sys, ctx.local_base_rank + q);
        }
        __syncthreads();
    }
    // The other owners' combined rows into O (16-byte chunks) and LSE.
    for (int i = t; i < nrows * kOut; i += kSpThreads) {
        const int rr = i / kOut, c = i % kOut;
        const int q = rr / own;
        if (q == me) continue;
        const int slot = rr - q * own, r = r_lo + rr;
        const float* const src = region + q * R + fin;
        const uint4 v = __ldcg(reinterpret_cast<const uint4*>(reinterpret_cast<const T*>(src) + slot * D) + c);
        *(reinterpret_cast<uint4*>(static_cast<T*>(p.o) + static_cast<int64_t>(r) * D) + c) = v;
        if (c == 0 && p.lse != nullptr) p.lse[r] = __ldcg(src + own * D / 2 + slot);
    }
}

}  // namespace loom::kernels::attention
