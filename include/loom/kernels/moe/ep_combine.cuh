// Expert-parallel combine, throughput mode, on the device (host side: src/ops/moe/ep/combine.cpp; data: ep_params.hpp).
// Per call, on every rank, in stream order after the dispatch it belongs to:
//
//   ep_combine_send    call number c (the launch's, kept on the device: lang/launch_epoch.cuh); a warp per received
//                      pair q: its partial sum p_q = sum over the pair's slots s on this rank, in slot order, of
//                      w_s x expert_out[row_s] (fp32, fmaf from 0), stored as bf16 into this rank's combine rows[q];
//                      the last block sets combined[me] := c at every rank
//   ep_combine_reduce  every block waits for combined[d] >= c of every rank d; a warp per token t: y[t] = bf16 of the
//                      fp32 sum, over the ranks d it went to in ascending order, of the partial p read (pulled) from
//                      d's combine rows at the token's pair record index; zero for a token with no slot
//
// The reduce pulls, so each partial is produced once at the expert's rank and crosses NVLink once, as bf16 (half the
// bytes of fp32; y's sum itself is fp32). Reuse of the combine rows: rank d overwrites them in its next combine, after
// its next dispatch's scan, which waits for every rank's next scan, which follows that rank's reduce (stream order).
//
// A pair with one slot (most pairs: with top-8 of 256 experts on 8 ranks, about 60 %) is not summed at the expert's
// rank when its expert_out is in the symmetric heap: the send kernel posts expert_out's offset and stride to every
// rank (EpSignals::out_offset, out_ld_words, before its combined signal) and skips the pair, and the token's rank
// reads the expert row in place and rounds w x row to bf16 itself — the partial the expert's rank would have stored,
// bit for bit — which saves a row read and a row write per such pair. expert_out is reused under the same argument as
// the combine rows (its rank writes it next after its next dispatch).
//
// A World of several nodes: a pair whose token came from a rank s on another node is pushed instead — the send kernel
// puts its partial from this rank's combine rows into s's stage row of that pair (ret_base[s] + its index among s's
// pairs here), each block completes its puts before its ticket, and combined[me] := c reaches s as NVSHMEM's signal
// after a quiet; s's reduce reads such partials from its own stage rows. Reuse of s's stage rows: s writes them next
// in its next dispatch's push, after its reduce (stream order), which waited for every rank's combined signal, each
// sent after that rank's puts completed.
#pragma once

#include <cuda_bf16.h>

#include "loom/kernels/moe/ep_dispatch.cuh"

namespace loom::kernels::moe {

// 8 bf16 in a 16-byte word <-> 8 floats.
LOOM_DEVICE LOOM_FORCEINLINE void ep_unpack(const uint4& v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
LOOM_DEVICE LOOM_FORCEINLINE uint4 ep_pack(const float (&f)[8]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&b);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Words per lane summed at a time by the combine kernels (their loads for one source issued together).
inline constexpr int kEpSumBatch = 4;

// acc[u] := fmaf(w, word base + 32u + lane of `row`, acc[u]) for u < kEpSumBatch, words below `words`: the batch's
// loads are issued together. (w = 1 is an exact sum: fmaf(1, v, a) rounds v + a once, as v + a does.)
// kRoundProduct: acc[u] += bf16(w x word) instead, the product rounded to bf16 as ep_store_batch rounds a one-slot
// partial (fmaf(w, v, 0) is w x v rounded once), then added as the w = 1 sum adds that partial.
template <bool kRoundProduct = false>
LOOM_DEVICE LOOM_FORCEINLINE void ep_sum_batch(float (&acc)[kEpSumBatch][8], const uint4* row, float w, int64_t base,
                                               int64_t words) {
    uint4 v[kEpSumBatch];
    ep_load_words(v, row, base, words);
#pragma unroll
    for (int u = 0; u < kEpSumBatch; ++u) {
        float f[8];
        ep_unpack(v[u], f);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            if constexpr (kRoundProduct) {
                acc[u][c] = __fadd_rn(acc[u][c], __bfloat162float(__float2bfloat16_rn(__fmul_rn(w, f[c]))));
            } else {
                acc[u][c] = __fmaf_rn(w, f[c], acc[u][c]);
            }
        }
    }
}

// Word base + 32u + lane of `row` := acc[u] as bf16, for u < kEpSumBatch, words below `words`.
LOOM_DEVICE LOOM_FORCEINLINE void ep_store_batch(uint4* row, const float (&acc)[kEpSumBatch][8], int64_t base,
                                                 int64_t words) {
    const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
    for (int u = 0; u < kEpSumBatch; ++u) {
        const int64_t i = base + u * 32 + lane;
        if (i < words) row[i] = ep_pack(acc[u]);
    }
}

// Per-warp shared memory of the combine send: its pair's row and weight of every slot.
struct EpPairSlots {
    int32_t row[kEpThreads / 32][32];
    float w[kEpThreads / 32][32];
};

// The whole warp: received pair q's partial sum (see the top) into this rank's combine_rows[q]; with skip_single, a
// pair of one slot is left to the token's rank (nothing stored). Returns whether it stored the partial.
LOOM_DEVICE LOOM_FORCEINLINE bool ep_pair_partial(const EpParams& p, int64_t q, EpPairSlots& sl, bool skip_single) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int32_t row = -1;
    float w = 0.f;
    if (lane < p.topk) {
        row = p.pair_rows[q * p.topk + lane];
        w = p.pair_weights[q * p.topk + lane];
        if (row >= p.capacity) bad_index("ep_combine pair_rows", p.pair_rows + q * p.topk + lane, row, p.capacity);
    }
    const unsigned slots = __ballot_sync(0xffffffffu, row >= 0);
    if (skip_single && __popc(slots) == 1) return false;
    __syncwarp();  // the previous pair's slots are read
    sl.row[warp][lane] = row;
    sl.w[warp][lane] = w;
    __syncwarp();
    const uint4* const out = static_cast<const uint4*>(p.expert_out);
    uint4* const partial = static_cast<uint4*>(p.combine_rows) + q * p.row_words;
    // kEpSumBatch words per lane at a time, the slots in order.
    for (int64_t base = 0; base < p.row_words; base += 32 * kEpSumBatch) {
        float acc[kEpSumBatch][8] = {};
        for (unsigned m = slots; m != 0; m &= m - 1) {
            const int s = __ffs(m) - 1;
            ep_sum_batch(acc, out + static_cast<int64_t>(sl.row[warp][s]) * p.out_ld_words, sl.w[warp][s], base,
                         p.row_words);
        }
        ep_store_batch(partial, acc, base, p.row_words);
    }
    return true;
}

// Block 0 of the send kernel, before its ticket: this rank's expert_out into out_offset / out_ld_words [me] at rank d.
LOOM_DEVICE LOOM_FORCEINLINE void ep_post_expert_out(EpSignals* sig_at_d, int me, int64_t offset, int64_t ld_words) {
    sig_at_d->out_offset[me] = offset;
    sig_at_d->out_ld_words[me] = ld_words;
}

// A warp per received pair (grid-strided).
__global__ void __launch_bounds__(kEpThreads) ep_combine_send(Ctx ctx, EpParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagEpKernel, lang::kEpCombineSend);
    __shared__ uint64_t s_epoch;
    __shared__ EpPairSlots sl;
    const int W = ctx.world, me = ctx.rank;
    if (threadIdx.x == 0) s_epoch = lang::launch_epoch_enter(&p.dev->combine);
    const int32_t pairs = p.dev->overflow == 0 ? p.dev->recv_pairs : 0;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    uint4* const partial = static_cast<uint4*>(p.combine_rows);
    // expert_out in the heap: one-slot pairs are read in place by the token's rank (node peers; see the top).
    const bool in_heap = ctx.is_symmetric(p.expert_out);
    if (blockIdx.x == 0)
        for (int d = threadIdx.x; d < W; d += blockDim.x)
            if (!ep_remote(ctx, d))
                ep_post_expert_out(ep_peer(ctx, p.sig, d), me,
                                   in_heap ? static_cast<int64_t>(ctx.own_offset(p.expert_out)) : -1, p.out_ld_words);
    for (int64_t q = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; q < pairs; q += warps) {
        // Several nodes: the pair's source rank s (the last with src_pair_base[s] <= q); another node's gets the
        // partial put into its stage row.
        int s = -1;
        if (p.src_pair_base != nullptr) {
            int lo = 0, hi = W - 1;
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (p.src_pair_base[mid] <= q) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            s = lo;
        }
        const bool put = s >= 0 && ep_remote(ctx, s);
        if (!ep_pair_partial(p, q, sl, in_heap && !put) || !put) continue;
        const int64_t si = p.ret_base[s] + q - p.src_pair_base[s];
        if (si < 0 || si >= p.capacity) bad_index("ep_combine stage row", p.ret_base + s, si, p.capacity);
        __threadfence_system();  // the partial's bytes before NVSHMEM reads them
        __syncwarp();
        lang::put_nbi(lang::warp, ctx, static_cast<uint4*>(p.stage_x) + si * p.row_words, partial + q * p.row_words,
                      static_cast<uint64_t>(p.row_words) * 16, s);
    }
    ep_block_quiet(ctx);  // several nodes: this block's puts complete before its ticket
    if (ep_last_block(&p.dev->send_ticket))
        for (int d = 0; d < W; ++d) ep_signal(ctx, p.sig->combined + me, s_epoch, d);
}

// Where ep_reduce_tokens reads one of a token's partials: a row, and whether it is an expert row to scale by the slot's
// weight and round (a one-slot pair read in place) or a partial to add as it is.
struct EpPartialSource {
    const uint4* row;
    bool scaled;
};

// Every thread of the block, once every rank's partial rows of the current combine are ready: a warp per token
// (grid-strided) sums the partials of the ranks it went to (see the top). source_of(d, q, row, single): where the
// token's partial from rank d is — q its pair record index at d; row its first slot's row at d, single whether that is
// its only slot there. s_src / s_w: per warp, its token's sources in ascending rank order and their slots' weights.
template <class SourceOf>
LOOM_DEVICE LOOM_FORCEINLINE void ep_reduce_tokens(const EpParams& p, int W, const SourceOf& source_of,
                                                   const uint4* (&s_src)[kEpThreads / 32][32],
                                                   float (&s_w)[kEpThreads / 32][32]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    uint4* const y = static_cast<uint4*>(p.y);
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; t < p.tokens;
         t += warps) {
        const int32_t e = lane < p.topk ? p.topk_idx[t * p.topk + lane] : -1;
        const EpDests dests = ep_dests(e, p.local_experts);
        const bool first = (dests.first >> lane) & 1u;
        // This lane's place among the token's ranks: how many of them are lower than its own.
        int pos = 0;
        for (int j = 0; j < p.topk; ++j) {
            const int dj = __shfl_sync(0xffffffffu, dests.rank, j);
            pos += ((dests.first >> j) & 1u) && dj < dests.rank;
        }
        __syncwarp();  // the previous token's rows are read
        bool scaled = false;
        if (first) {
            const int d = dests.rank;
            const int32_t q = p.token_pair[t * W + d];
            if (q < 0 || q >= p.pair_capacity) bad_index("ep_combine token_pair", p.token_pair, q, p.pair_capacity);
            const int32_t row = p.entry_row[t * p.topk + lane];
            if (row < 0 || row >= p.capacity) bad_index("ep_combine entry_row", p.entry_row, row, p.capacity);
            const EpPartialSource src = source_of(d, q, row, __popc(dests.same) == 1);
            s_src[warp][pos] = src.row;
            s_w[warp][pos] = p.topk_weights != nullptr ? p.topk_weights[t * p.topk + lane] : 1.f;
            scaled = src.scaled;
        }
        const unsigned scaled_at = __reduce_or_sync(0xffffffffu, scaled ? 1u << pos : 0u);  // by place
        __syncwarp();
        const int n = __popc(dests.first);
        for (int64_t base = 0; base < p.row_words; base += 32 * kEpSumBatch) {
            float acc[kEpSumBatch][8] = {};
            for (int r = 0; r < n; ++r) {
                if ((scaled_at >> r) & 1u) {
                    ep_sum_batch<true>(acc, s_src[warp][r], s_w[warp][r], base, p.row_words);
                } else {
                    ep_sum_batch(acc, s_src[warp][r], 1.f, base, p.row_words);
                }
            }
            ep_store_batch(y + t * p.y_ld_words, acc, base, p.row_words);
        }
    }
}

// Every block waits for every rank's partials (combined[d] >= c), then ep_reduce_tokens: a node peer's one-slot pair
// read in its expert_out when that is in its heap, its partial otherwise; another node's from this rank's stage row.
__global__ void __launch_bounds__(kEpThreads) ep_combine_reduce(Ctx ctx, EpParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagEpKernel, lang::kEpCombineReduce);
    __shared__ const uint4* s_src[kEpThreads / 32][32];
    __shared__ float s_w[kEpThreads / 32][32];
    const int W = ctx.world;
    const uint64_t epoch = p.dev->combine.calls;  // the send kernel before this one on the stream advanced it
    for (int d = threadIdx.x; d < W; d += blockDim.x)
        ep_wait(ctx.wait_timeout_ns, p.sig->combined + d, epoch, "ep_combine: waits for a rank's partial sums");
    __syncthreads();
    if (p.dev->overflow != 0) return;  // the dispatch moved nothing: y is left as it was
    const auto source_of = [&](int d, int32_t q, int32_t row, bool single) -> EpPartialSource {
        if (ep_remote(ctx, d))
            return {static_cast<const uint4*>(p.stage_x) +
                        static_cast<int64_t>(p.stage_base[d] + q - p.pair_base[d]) * p.row_words,
                    false};
        const int64_t off = p.sig->out_offset[d];
        if (single && off >= 0)
            return {reinterpret_cast<const uint4*>(ctx.heap_of(d) + off) +
                        static_cast<int64_t>(row) * p.sig->out_ld_words[d],
                    true};
        return {static_cast<const uint4*>(ep_peer(ctx, p.combine_rows, d)) + static_cast<int64_t>(q) * p.row_words,
                false};
    };
    ep_reduce_tokens(p, W, source_of, s_src, s_w);
}

}  // namespace loom::kernels::moe
