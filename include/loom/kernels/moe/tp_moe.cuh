// The TP-MoE ops' fused algorithms on the device (host side: src/ops/moe/tp/fused_ag.cpp, fused_rs.cpp; data:
// tp_moe_params.hpp).
//
// ag_moe, Fused. Every rank routes the gathered ids (any layout: source-major, W x E groups, group r E + e holding
// rank r's tokens routed to e; or expert-major, E groups), then
//   moe_ag_push   copies its own routing entries (its tokens' top-k slots) from x into their rows of every rank's
//                 symmetric gather half, zeros the padding rows of its own half, and sets arrived[me] := e at every
//                 rank (release, sys);
//   grouped GEMM  with MoeAgHooks over the gather half: before a tile is loaded its producer thread waits (bounded,
//                 acquire) for arrived[r] >= e of every other source rank r whose tokens the tile's rows hold (a
//                 group's rows are in token order, so a range of ranks). The push precedes the GEMM on the stream, so
//                 this rank's rows never wait and nothing in the GEMM waits on work that needs this rank's SMs:
//                 co-resident-safe with ranks sharing a GPU.
// moe_rs, Fused. The grouped GEMM (down projection) with MoeRsHooks (peers' groups first, own last; every stored tile
// adds 1 to done[source rank], release) into a local partial product, and moe_rs_reduce_send launched twice: a few
// blocks on a side stream beside the GEMM, a full grid after it on its stream. Blocks of both launches claim the
// sends from one counter, per source rank r in the GEMM's order, chunks of r's tokens: once r's tiles are all stored
// (the side launch waits; the launch after the GEMM need not), the weighted top-k reduce (fp32) rounded to out's type,
// stored into slot me of r's receive half; the chunk that completes r adds 1 to landed[e % 2] at r. Then the stream
// waits (a stream memory operation, bounded by the host watchdog) for landed[e % 2] to count every rank of the call,
// and moe_tp_sum_slots sums the W slots of this rank's tokens (fp32, rank order) into out.
//   The only waits on an SM are the side blocks' for this rank's own GEMM, which waits for nothing; every other
//   kernel ends without waiting, and the waits for the peers hold no SM: a rank whose GEMM is late (ranks sharing a
//   GPU, its CTAs not yet resident) finds the SMs its peers' kernels free, with no peer spinning on them.
// moe_ar, Fused (one-shot): the grouped GEMM (no hooks) into a local partial product, then moe_ar_reduce_push (full
// grid) on the same stream: chunks of every token's top-k reduce pushed into slot me of every rank's receive half
// (the chunk that completes the call adds 1 to landed[e % 2] at every rank); then the same stream waits and
// moe_tp_sum_slots: out = the W slots summed in rank order (the same bits on every rank).
#pragma once

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 1  // wgmma kernel in this TU: no printf anywhere (ptxas C7510)
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/kernels/moe/grouped_gemm.cuh"
#include "loom/kernels/moe/grouped_gemm_sm80.cuh"
#include "loom/kernels/moe/routing.cuh"
#include "loom/kernels/moe/tp_moe_params.hpp"
#include "loom/lang/lang.cuh"
#include "loom/ptx/memory.cuh"

namespace loom::kernels::moe {

// Rows [lo, hi) of group range [g0, g1) of a routing: offsets clamped to [0, rows] as the grouped GEMM clamps them.
LOOM_DEVICE LOOM_FORCEINLINE int32_t tp_clamped_offset(const int32_t* offsets, int32_t g, int32_t rows, int32_t lo) {
    const int32_t v = offsets[g];
    return v < lo ? lo : (v > rows ? rows : v);
}

// Group g's rows, clamped as above: [start, real_end) hold tokens (its first counts[g]), [real_end, stop) are padding.
LOOM_DEVICE LOOM_FORCEINLINE void tp_group_rows(const int32_t* offsets, const int32_t* counts, int32_t g, int32_t rows,
                                                int32_t& start, int32_t& real_end, int32_t& stop) {
    start = tp_clamped_offset(offsets, g, rows, 0);
    stop = tp_clamped_offset(offsets, g + 1, rows, start);
    const int32_t count = __ldg(counts + g);
    real_end = count < stop - start ? start + (count > 0 ? count : 0) : stop;
}

// ---- grouped GEMM hooks ---------------------------------------------------------------------------------------------

struct MoeAgHooks {
    MoeAgHookArgs a;
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const GroupedTileGrid& g, int32_t& rb,
                                                 int32_t& nb) const {
        GroupedRotatedOrder{a.first_group}.tile_order(linear, g, rb, nb);
    }
    LOOM_DEVICE LOOM_FORCEINLINE void before_load(int32_t group, int32_t row0) const {
        int32_t start, real_end, stop;
        tp_group_rows(a.offsets, a.counts, group, a.rows, start, real_end, stop);
        if (row0 >= real_end) return;  // padding rows only: zeroed by this rank's push
        const int32_t last = (row0 + a.block_m < real_end ? row0 + a.block_m : real_end) - 1;
        int32_t lo = __ldg(a.row_tokens + row0) / a.t_loc, hi = __ldg(a.row_tokens + last) / a.t_loc;
        lo = lo < 0 ? 0 : lo;
        hi = hi >= a.world ? a.world - 1 : hi;
        for (int32_t r = lo; r <= hi; ++r)
            if (r != a.me)
                lang::wait_ge_sys_or_trap(a.arrived + r, a.epoch, a.timeout_ns,
                                          "ag_moe: grouped GEMM waits for a source rank's routed rows");
    }
    LOOM_DEVICE LOOM_FORCEINLINE uint64_t wait_bound_ns() const { return a.timeout_ns; }
};
static_assert(GroupedHooks<MoeAgHooks> && GroupedLoadWait<MoeAgHooks> && !GroupedStoreNotify<MoeAgHooks>);

struct MoeRsHooks {
    MoeRsHookArgs a;
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const GroupedTileGrid& g, int32_t& rb,
                                                 int32_t& nb) const {
        GroupedRotatedOrder{a.first_group}.tile_order(linear, g, rb, nb);
    }
    // Thread 0 after the tile's stores and a barrier of the storing threads: the release is cumulative over them.
    LOOM_DEVICE LOOM_FORCEINLINE void after_store(int32_t group, int32_t, int32_t, int32_t) const {
        ptx::red_add_release_gpu(a.done + group / a.num_experts, uint64_t(1));
    }
};
static_assert(GroupedHooks<MoeRsHooks> && GroupedStoreNotify<MoeRsHooks> && !GroupedLoadWait<MoeRsHooks>);

// ---- communication kernels ------------------------------------------------------------------------------------------

// Local rank d's copy of this rank's symmetric pointer p (d reachable: one node, checked on the host). Plain
// arithmetic on the Ctx's heap table, with no diagnostic call (which would cost the caller stack spills).
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE T* tp_peer(const Ctx& ctx, T* p, int d) {
    return reinterpret_cast<T*>(ctx.heap_of(ctx.local_base_rank + d) + ctx.own_offset(p));
}

// Bounded acquire wait (scope gpu or sys) for *sig >= target; a timeout posts a diagnostic tagged `tag` and traps.
template <bool kSys>
LOOM_DEVICE LOOM_FORCEINLINE void tp_wait_ge(const uint64_t* sig, uint64_t target, uint64_t timeout_ns,
                                             const char* tag) {
    auto load = [sig] { return kSys ? ptx::ld_acquire_sys(sig) : ptx::ld_acquire_gpu(sig); };
    lang::spin_or_trap(
        timeout_ns, tag, sig, lang::Cmp::GE, [&] { return static_cast<int64_t>(load() - target) >= 0; },
        [&] {
            return lang::WaitValues{target, load()};
        });
}

// Every thread of the block calls once its writes of this call are done; true on thread 0 of the call's last block to
// arrive (the cumulative ticket reaches `target`). The fences order every block's writes before its increment and the
// last block's later signals after all of them (the classic last-block pattern), so a release signal that block sends
// publishes every block's writes.
LOOM_DEVICE LOOM_FORCEINLINE bool tp_last_block(uint64_t* ticket, uint64_t target) {
    __syncthreads();
    if (threadIdx.x != 0) return false;
    ptx::fence_sc_sys();
    const uint64_t old = atomicAdd(reinterpret_cast<unsigned long long*>(ticket), 1ull);
    if (old + 1 != target) return false;
    ptx::fence_sc_sys();
    return true;
}

__global__ void __launch_bounds__(kTpMoeThreads) moe_ag_push(Ctx ctx, MoeAgPushParams p) {
    const int W = ctx.local_world, me = ctx.local_rank;
    const uint4* x = static_cast<const uint4*>(p.x);
    uint4* const gather = static_cast<uint4*>(p.gather);
    const int64_t entries = static_cast<int64_t>(p.t_loc) * p.topk;
    const int32_t* const dest = p.dest_rows + static_cast<int64_t>(me) * entries;
    const int64_t words = entries * p.row_words;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t entry = i / p.row_words, w = i % p.row_words;
        const int32_t row = dest[entry];
        if (row < 0 || row >= p.rows) bad_index("ag_moe dest_rows", dest + entry, row, p.rows);
        const uint4 v = x[(entry / p.topk) * p.row_words + w];
        for (int j = 0; j < W; ++j) {  // own rows first
            const int d = me + j < W ? me + j : me + j - W;
            tp_peer(ctx, gather, d)[row * p.row_words + w] = v;
        }
    }
    // Padding rows, a group per block at a time: zeros in this rank's half.
    for (int32_t g = static_cast<int32_t>(blockIdx.x); g < p.num_groups; g += static_cast<int32_t>(gridDim.x)) {
        int32_t start, first, stop;
        tp_group_rows(p.offsets, p.counts, g, p.rows, start, first, stop);
        const int64_t n = static_cast<int64_t>(stop - first) * p.row_words;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            gather[static_cast<int64_t>(first) * p.row_words + i] = make_uint4(0, 0, 0, 0);
    }
    if (tp_last_block(p.ticket, p.ticket_target))
        for (int j = 0; j < W; ++j) {
            const int d = me + j < W ? me + j : me + j - W;
            ptx::st_release_sys(tp_peer(ctx, p.sig->arrived + me, d), p.epoch);
        }
}

// The row blocks (BLOCK_M rows, offsets clamped to [0, rows]) of groups [first, first + count), summed by every
// thread of the block; returns the block's total after a barrier. scratch: one shared int64.
LOOM_DEVICE LOOM_FORCEINLINE int64_t tp_row_blocks(const int32_t* offsets, int32_t rows, int32_t block_m, int32_t first,
                                                   int32_t count, int64_t* scratch) {
    if (threadIdx.x == 0) *scratch = 0;
    __syncthreads();
    int64_t mine = 0;
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < count; i += static_cast<int32_t>(blockDim.x)) {
        const int32_t s = tp_clamped_offset(offsets, first + i, rows, 0);
        const int32_t end = tp_clamped_offset(offsets, first + i + 1, rows, s);
        mine += (end - s + block_m - 1) / block_m;
    }
    if (mine != 0) atomicAdd(reinterpret_cast<unsigned long long*>(scratch), static_cast<unsigned long long>(mine));
    __syncthreads();
    const int64_t total = *scratch;
    __syncthreads();
    return total;
}

// 16-byte words of T as floats: acc += w x word, and floats rounded to T as one word.
template <class T>
inline constexpr int kTpWordElems = static_cast<int>(16 / sizeof(T));

template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void tp_word_fma(const uint4& word, float w, float (&acc)[kTpWordElems<T>]) {
    const T* e = reinterpret_cast<const T*>(&word);
#pragma unroll
    for (int i = 0; i < kTpWordElems<T>; ++i) acc[i] += w * to_float<T>(e[i]);
}

template <class T>
LOOM_DEVICE LOOM_FORCEINLINE uint4 tp_word_pack(const float (&acc)[kTpWordElems<T>]) {
    uint4 word;
    T* e = reinterpret_cast<T*>(&word);
#pragma unroll
    for (int i = 0; i < kTpWordElems<T>; ++i) e[i] = from_float<T>(acc[i]);
    return word;
}

// Words each thread has in flight per pass of the reduce loops (4 x 16 B x 512 threads = 32 KiB per block).
inline constexpr int kTpUnroll = 4;

// Thread 0 claims the block's next item (the counter's value less `base`) and every thread of the block returns it.
LOOM_DEVICE LOOM_FORCEINLINE int64_t tp_claim(uint64_t* work, uint64_t base, int64_t* s_item) {
    __syncthreads();  // the previous item's shared state is read
    if (threadIdx.x == 0)
        *s_item = static_cast<int64_t>(atomicAdd(reinterpret_cast<unsigned long long*>(work), 1ull) - base);
    __syncthreads();
    return *s_item;
}

// Stages the (row, weight) pairs of `entries` consecutive routing entries from e0 into shared memory, then a barrier.
LOOM_DEVICE LOOM_FORCEINLINE void tp_stage_entries(const int32_t* dest_rows, const float* weights, int64_t e0,
                                                   int32_t entries, int32_t rows, const char* tag, int32_t* s_row,
                                                   float* s_w) {
    int32_t bad = -1;  // an out-of-range entry, reported after the loop (fewer values live across the call)
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < entries; i += static_cast<int32_t>(blockDim.x)) {
        const int32_t row = dest_rows[e0 + i];
        if (row < 0 || row >= rows) bad = i;
        s_row[i] = row;
        s_w[i] = weights[e0 + i];
    }
    if (bad >= 0) bad_index(tag, dest_rows + e0 + bad, dest_rows[e0 + bad], rows);
    __syncthreads();
}

// The weighted top-k sums (fp32, slot order) of nt tokens whose (row, weight) pairs are staged in s_row / s_w (token
// t's slot s at t x topk + s), word by word across the rows: store(t, word, value) with value rounded to T. Every
// thread of the block calls; nt x row_words < 2^31 (checked on the host).
template <class T, class Store>
LOOM_DEVICE LOOM_FORCEINLINE void tp_topk_reduce_words(const uint4* partial, uint32_t row_words, int32_t nt, int topk,
                                                       const int32_t* s_row, const float* s_w, Store store) {
    const uint32_t n = static_cast<uint32_t>(nt) * row_words;
    for (uint32_t base = threadIdx.x; base < n; base += kTpUnroll * blockDim.x) {
        float acc[kTpUnroll][kTpWordElems<T>];
        int32_t tok[kTpUnroll];
        uint32_t word[kTpUnroll];
#pragma unroll
        for (int u = 0; u < kTpUnroll; ++u) {
            const uint32_t i = base + u * blockDim.x;
            tok[u] = i < n ? static_cast<int32_t>(i / row_words) : -1;
            word[u] = i < n ? i - static_cast<uint32_t>(tok[u]) * row_words : 0;
#pragma unroll
            for (int v = 0; v < kTpWordElems<T>; ++v) acc[u][v] = 0.f;
        }
        for (int s = 0; s < topk; ++s) {
            uint4 x[kTpUnroll];
#pragma unroll
            for (int u = 0; u < kTpUnroll; ++u)  // every load of the pass issued before the first use
                if (tok[u] >= 0) x[u] = partial[static_cast<int64_t>(s_row[tok[u] * topk + s]) * row_words + word[u]];
#pragma unroll
            for (int u = 0; u < kTpUnroll; ++u)
                if (tok[u] >= 0) tp_word_fma<T>(x[u], s_w[tok[u] * topk + s], acc[u]);
        }
#pragma unroll
        for (int u = 0; u < kTpUnroll; ++u)
            if (tok[u] >= 0) store(tok[u], word[u], tp_word_pack<T>(acc[u]));
    }
}

// out's words [w0, w0 + n) = the sum (fp32, rank order) of the W slots' same words (slot q at q x slot_words), rounded
// to T; out need not be 16-byte aligned. Every thread of the block calls.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void tp_sum_slots(const uint4* recv, int64_t slot_words, int W, int64_t w0, int64_t n,
                                               void* out) {
    const bool aligned = (reinterpret_cast<unsigned long long>(out) & 15) == 0;
    for (int64_t base = threadIdx.x; base < n; base += kTpUnroll * static_cast<int64_t>(blockDim.x)) {
        float acc[kTpUnroll][kTpWordElems<T>];
#pragma unroll
        for (int u = 0; u < kTpUnroll; ++u)
#pragma unroll
            for (int v = 0; v < kTpWordElems<T>; ++v) acc[u][v] = 0.f;
        for (int q = 0; q < W; ++q) {
            uint4 x[kTpUnroll];
#pragma unroll
            for (int u = 0; u < kTpUnroll; ++u) {
                const int64_t i = base + u * static_cast<int64_t>(blockDim.x);
                if (i < n) x[u] = recv[q * slot_words + w0 + i];
            }
#pragma unroll
            for (int u = 0; u < kTpUnroll; ++u)
                if (base + u * static_cast<int64_t>(blockDim.x) < n) tp_word_fma<T>(x[u], 1.f, acc[u]);
        }
#pragma unroll
        for (int u = 0; u < kTpUnroll; ++u) {
            const int64_t i = base + u * static_cast<int64_t>(blockDim.x);
            if (i >= n) continue;
            const uint4 word = tp_word_pack<T>(acc[u]);
            if (aligned) {
                static_cast<uint4*>(out)[w0 + i] = word;
            } else {
                const T* e = reinterpret_cast<const T*>(&word);
                T* o = static_cast<T*>(out) + (w0 + i) * kTpWordElems<T>;
#pragma unroll
                for (int v = 0; v < kTpWordElems<T>; ++v) o[v] = e[v];
            }
        }
    }
}

// moe_rs's sends, one kernel launched twice per call: beside the GEMM on a side stream (after_gemm = 0, few blocks:
// they take the items that become ready while the GEMM runs) and after it on the GEMM's stream (after_gemm = 1, a
// full grid: the rest at the whole share's bandwidth). Items and their order: MoeRsReduceParams; waits and why they
// end: the file's head.
template <class T>
__global__ void __launch_bounds__(kTpMoeThreads) moe_rs_reduce_send(Ctx ctx, MoeRsReduceParams p) {
    __shared__ int32_t s_row[kTpMoeMaxChunkEntries];
    __shared__ float s_w[kTpMoeMaxChunkEntries];
    __shared__ uint64_t s_target[kMaxLocalPeers];
    __shared__ int64_t s_scratch;
    __shared__ int64_t s_item;
    const int W = ctx.local_world, me = ctx.local_rank;
    const int par = static_cast<int>(p.epoch % 2);
    // Every source rank's tile target of this call: the side launch's blocks wait for them (thread 0 writes and reads
    // them); block 0 of one launch per call keeps them for the next call of the other parity.
    if (!p.after_gemm || (p.write_expected && blockIdx.x == 0))
        for (int r = 0; r < W; ++r) {
            const uint64_t tiles =
                p.counted ? static_cast<uint64_t>(tp_row_blocks(p.offsets, p.rows, p.block_m, r * p.num_experts,
                                                                p.num_experts, &s_scratch)) *
                                static_cast<uint64_t>(p.num_n)
                          : 0;
            const uint64_t target = p.expected[(1 - par) * kMaxLocalPeers + r] + tiles;
            if (threadIdx.x == 0) {
                s_target[r] = target;
                if (blockIdx.x == 0 && p.write_expected) p.expected[par * kMaxLocalPeers + r] = target;
            }
        }
    // Sizes from the parameters (host-computed: fewer registers live across the waits).
    const uint32_t row_words = static_cast<uint32_t>(p.row_words);
    const int64_t slot_words = static_cast<int64_t>(p.t_loc) * p.row_words;
    const int32_t chunks = p.chunks;
    const int64_t sends = static_cast<int64_t>(W) * chunks;
    const uint4* partial = static_cast<const uint4*>(p.partial);
    int64_t item = tp_claim(p.work, p.work_base, &s_item);
    for (; item < sends; item = tp_claim(p.work, p.work_base, &s_item)) {
        const int32_t c = static_cast<int32_t>(item % chunks);
        const int32_t t0 = c * p.chunk, nt = min(p.chunk, p.t_loc - t0);
        const int pos = static_cast<int>(item / chunks);
        const int r = me + 1 + pos < W ? me + 1 + pos : me + 1 + pos - W;  // the GEMM's order, own last
        if (threadIdx.x == 0 && !p.after_gemm)
            tp_wait_ge<false>(p.done + r, s_target[r], ctx.wait_timeout_ns,
                              "moe_rs: reduce waits for the grouped GEMM's tiles of a source rank");
        tp_stage_entries(p.dest_rows, p.weights, (static_cast<int64_t>(r) * p.t_loc + t0) * p.topk, nt * p.topk, p.rows,
                         "moe_rs dest_rows", s_row, s_w);
        uint4* const dst = tp_peer(ctx, static_cast<uint4*>(p.recv), r) + static_cast<int64_t>(me) * slot_words +
                           static_cast<int64_t>(t0) * row_words;
        tp_topk_reduce_words<T>(partial, row_words, nt, p.topk, s_row, s_w,
                                [dst, row_words](int32_t t, uint32_t w, const uint4& v) {
                                    dst[static_cast<int64_t>(t) * row_words + w] = v;
                                });
        if (tp_last_block(p.ticket + r, p.ticket_target))
            ptx::red_add_release_sys(tp_peer(ctx, p.sig->landed + p.epoch % 2, r), uint64_t(1));
    }
}

// moe_ar's reduce, launched after the grouped GEMM on its stream with a full grid: the pushes (MoeArReduceParams).
// Nothing in it waits.
template <class T>
__global__ void __launch_bounds__(kTpMoeThreads) moe_ar_reduce_push(Ctx ctx, MoeArReduceParams p) {
    __shared__ int32_t s_row[kTpMoeMaxChunkEntries];
    __shared__ float s_w[kTpMoeMaxChunkEntries];
    __shared__ int64_t s_item;
    const int W = ctx.local_world, me = ctx.local_rank;
    const uint32_t row_words = static_cast<uint32_t>(p.row_words);
    const int64_t slot_words = static_cast<int64_t>(p.tokens) * p.row_words;
    const int32_t chunks = p.chunks;
    const uint4* partial = static_cast<const uint4*>(p.partial);
    uint4* const recv = static_cast<uint4*>(p.recv);
    int64_t item = tp_claim(p.work, p.work_base, &s_item);
    for (; item < chunks; item = tp_claim(p.work, p.work_base, &s_item)) {
        const int32_t t0 = static_cast<int32_t>(item) * p.chunk, nt = min(p.chunk, p.tokens - t0);
        tp_stage_entries(p.dest_rows, p.weights, static_cast<int64_t>(t0) * p.topk, nt * p.topk, p.rows,
                         "moe_ar dest_rows", s_row, s_w);
        const int64_t at = static_cast<int64_t>(me) * slot_words + static_cast<int64_t>(t0) * row_words;
        tp_topk_reduce_words<T>(partial, row_words, nt, p.topk, s_row, s_w,
                                [&ctx, recv, at, row_words, W, me](int32_t t, uint32_t w, const uint4& v) {
                                    const int64_t i = at + static_cast<int64_t>(t) * row_words + w;
                                    for (int j = 0; j < W; ++j) {  // own slot first
                                        const int d = me + j < W ? me + j : me + j - W;
                                        tp_peer(ctx, recv, d)[i] = v;
                                    }
                                });
        if (tp_last_block(p.ticket, p.ticket_target))
            for (int j = 0; j < W; ++j) {
                const int d = me + j < W ? me + j : me + j - W;
                ptx::red_add_release_sys(tp_peer(ctx, p.sig->landed + p.epoch % 2, d), uint64_t(1));
            }
    }
}

// moe_rs / moe_ar final sums, launched on the stream after it waited (a stream memory operation, on no SM) for every
// rank's sums of the call (landed): out's tokens = the W slots summed (fp32, rank order), block b taking chunks b, b +
// grid,
// ... Nothing in it waits.
template <class T>
__global__ void __launch_bounds__(kTpMoeThreads) moe_tp_sum_slots(Ctx ctx, MoeTpSumParams p) {
    const int64_t slot_words = static_cast<int64_t>(p.tokens) * p.row_words;
    for (int32_t c = static_cast<int32_t>(blockIdx.x); c < p.chunks; c += static_cast<int32_t>(gridDim.x)) {
        const int32_t t0 = c * p.chunk, nt = min(p.chunk, p.tokens - t0);
        tp_sum_slots<T>(static_cast<const uint4*>(p.recv), slot_words, ctx.local_world,
                        static_cast<int64_t>(t0) * p.row_words, static_cast<int64_t>(nt) * p.row_words, p.out);
    }
}

}  // namespace loom::kernels::moe
