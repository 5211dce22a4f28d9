// The TP-MoE ops' fused algorithms on the device (host side: src/ops/moe/tp/fused_ag.cpp, fused_rs.cpp; data:
// tp_moe_params.hpp).
//
// ag_moe, Fused. Every rank routes the gathered ids (W x E groups: group r E + e holds rank r's tokens routed to e),
// then
//   moe_ag_push   gathers its own tokens' rows of the layout (rows [offsets[me E], offsets[(me + 1) E])) from x into
//                 the same rows of every rank's symmetric gather half and sets arrived[me] := e there (release, sys);
//   grouped GEMM  with MoeAgHooks over the gather half: own groups first (rotated order); before a tile of rank r's
//                 groups is loaded its producer thread waits (bounded, acquire) for arrived[r] >= e. The push precedes
//                 the GEMM on the stream, so the own groups never wait and nothing in the GEMM waits on work that
//                 needs this rank's SMs: co-resident-safe with ranks sharing a GPU.
// moe_rs, Fused. The grouped GEMM (down projection) with MoeRsHooks (peers' groups first, own last; every stored tile
// adds 1 to done[source rank], release) into a local partial product, and beside it on a side stream
//   moe_rs_reduce_send  per source rank r in the GEMM's order, once r's tiles are all stored: the weighted top-k reduce
//                 of r's tokens, pushed (fp32) into slot me of r's receive half, reduced[me] := e at r; then this
//                 rank's tokens summed over the slots (rank order) after reduced[q] >= e of every peer q.
//   It waits only for this rank's GEMM (which waits for nothing and has the SMs the plan leaves it) and for peers'
//   sends (which wait only for their own GEMMs): no cycle, and no block waits for another block of its kernel.
// moe_ar, Fused (one-shot): the grouped GEMM with MoeRsHooks over the E groups of one source rank (every stored tile
// adds 1 to done[0]) into a local partial product, and beside it on a side stream
//   moe_ar_reduce_push  once every tile is stored: the weighted top-k reduce of every token (fp32), pushed into slot
//                 me of every rank's receive half, reduced[me] := e at every rank; then out = the W slots summed in
//                 rank order after reduced[q] >= e of every peer q. The same waits as moe_rs's reduce-send: its own
//                 GEMM, and peers' pushes that wait only for their own GEMMs.
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

// ---- grouped GEMM hooks ---------------------------------------------------------------------------------------------

struct MoeAgHooks {
    MoeAgHookArgs a;
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const GroupedTileGrid& g, int32_t& rb,
                                                 int32_t& nb) const {
        GroupedRotatedOrder{a.first_group}.tile_order(linear, g, rb, nb);
    }
    LOOM_DEVICE LOOM_FORCEINLINE void before_load(int32_t group, int32_t) const {
        const int32_t r = group / a.num_experts;
        if (r == a.me) return;  // pushed before the GEMM, in stream order
        lang::wait_ge_sys_or_trap(a.arrived + r, a.epoch, a.timeout_ns,
                                  "ag_moe: grouped GEMM waits for a source rank's routed rows");
    }
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

// Rows [lo, hi) of group range [g0, g1) of a routing: offsets clamped to [0, rows] as the grouped GEMM clamps them.
LOOM_DEVICE LOOM_FORCEINLINE int32_t tp_clamped_offset(const int32_t* offsets, int32_t g, int32_t rows, int32_t lo) {
    const int32_t v = offsets[g];
    return v < lo ? lo : (v > rows ? rows : v);
}

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
    const int32_t lo = tp_clamped_offset(p.offsets, me * p.num_experts, p.rows, 0);
    const int32_t hi = tp_clamped_offset(p.offsets, (me + 1) * p.num_experts, p.rows, lo);
    const uint4* x = static_cast<const uint4*>(p.x);
    uint4* const gather = static_cast<uint4*>(p.gather);
    const int64_t words = static_cast<int64_t>(hi - lo) * p.row_words;
    const int64_t token0 = static_cast<int64_t>(me) * p.t_loc;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = lo + i / p.row_words, w = i % p.row_words;
        const int64_t tok = static_cast<int64_t>(p.row_tokens[row]) - token0;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (p.row_tokens[row] >= 0) {
            if (tok < 0 || tok >= p.t_loc) bad_index("ag_moe row_tokens", p.row_tokens + row, tok, p.t_loc);
            v = x[tok * p.row_words + w];
        }
        for (int j = 0; j < W; ++j) {  // own rows first
            const int d = me + j < W ? me + j : me + j - W;
            tp_peer(ctx, gather, d)[row * p.row_words + w] = v;
        }
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

template <class T>
__global__ void __launch_bounds__(kTpMoeThreads) moe_rs_reduce_send(Ctx ctx, MoeRsReduceParams p) {
    __shared__ int64_t s_row[32];
    __shared__ float s_w[32];
    __shared__ int64_t s_blocks;
    const int W = ctx.local_world, me = ctx.local_rank;
    const T* partial = static_cast<const T*>(p.partial);
    const int64_t slot = static_cast<int64_t>(p.t_loc) * p.h;
    const int par = static_cast<int>(p.epoch % 2);
    for (int j = 1; j <= W; ++j) {
        const int r = me + j < W ? me + j : me + j - W;  // the GEMM's order: rank me + 1's groups first, own last
        const uint64_t target = p.expected[(1 - par) * kMaxLocalPeers + r] +
                                static_cast<uint64_t>(tp_row_blocks(p.offsets, p.rows, p.block_m, r * p.num_experts,
                                                                    p.num_experts, &s_blocks)) *
                                    static_cast<uint64_t>(p.num_n);
        if (threadIdx.x == 0) {
            if (blockIdx.x == 0) p.expected[par * kMaxLocalPeers + r] = target;
            tp_wait_ge<false>(p.done + r, target, ctx.wait_timeout_ns,
                              "moe_rs: reduce waits for the grouped GEMM's tiles of a source rank");
        }
        __syncthreads();
        float* const dst = tp_peer(ctx, p.recv, r) + static_cast<int64_t>(me) * slot;
        for (int32_t t = static_cast<int32_t>(blockIdx.x); t < p.t_loc; t += static_cast<int32_t>(gridDim.x)) {
            __syncthreads();  // the previous token's slots are read
            if (threadIdx.x < static_cast<unsigned>(p.topk)) {
                const int64_t e = (static_cast<int64_t>(r) * p.t_loc + t) * p.topk + threadIdx.x;
                const int32_t row = p.dest_rows[e];
                if (row < 0 || row >= p.rows) bad_index("moe_rs dest_rows", p.dest_rows + e, row, p.rows);
                s_row[threadIdx.x] = row;
                s_w[threadIdx.x] = p.weights[e];
            }
            __syncthreads();
            for (int64_t c = threadIdx.x; c < p.h; c += blockDim.x) {
                float acc = 0.f;
                for (int s = 0; s < p.topk; ++s) acc += s_w[s] * moe_to_float<T>(partial[s_row[s] * p.h + c]);
                dst[t * p.h + c] = acc;
            }
        }
        if (r != me && tp_last_block(p.ticket + r, p.ticket_target))
            ptx::st_release_sys(tp_peer(ctx, p.sig->reduced + me, r), p.epoch);
    }
    // This rank's tokens: every peer's slot (the own slot was written by this block, for the same tokens).
    if (threadIdx.x < static_cast<unsigned>(W) && static_cast<int>(threadIdx.x) != me)
        tp_wait_ge<true>(p.sig->reduced + threadIdx.x, p.epoch, ctx.wait_timeout_ns,
                         "moe_rs: waits for a peer's reduced rows of this rank's tokens");
    __syncthreads();
    T* const out = static_cast<T*>(p.out);
    for (int32_t t = static_cast<int32_t>(blockIdx.x); t < p.t_loc; t += static_cast<int32_t>(gridDim.x))
        for (int64_t c = threadIdx.x; c < p.h; c += blockDim.x) {
            float acc = 0.f;
            for (int q = 0; q < W; ++q) acc += p.recv[q * slot + t * p.h + c];
            out[t * p.h + c] = moe_from_float<T>(acc);
        }
}

template <class T>
__global__ void __launch_bounds__(kTpMoeThreads) moe_ar_reduce_push(Ctx ctx, MoeArReduceParams p) {
    __shared__ int64_t s_row[32];
    __shared__ float s_w[32];
    __shared__ int64_t s_blocks;
    const int W = ctx.local_world, me = ctx.local_rank;
    const T* partial = static_cast<const T*>(p.partial);
    const int64_t slot = static_cast<int64_t>(p.tokens) * p.h;
    const int par = static_cast<int>(p.epoch % 2);
    const uint64_t target = p.expected[1 - par] + static_cast<uint64_t>(tp_row_blocks(p.offsets, p.rows, p.block_m, 0,
                                                                                      p.num_experts, &s_blocks)) *
                                                      static_cast<uint64_t>(p.num_n);
    if (threadIdx.x == 0) {
        if (blockIdx.x == 0) p.expected[par] = target;
        tp_wait_ge<false>(p.done, target, ctx.wait_timeout_ns, "moe_ar: reduce waits for the grouped GEMM's tiles");
    }
    __syncthreads();
    for (int32_t t = static_cast<int32_t>(blockIdx.x); t < p.tokens; t += static_cast<int32_t>(gridDim.x)) {
        __syncthreads();  // the previous token's slots are read
        if (threadIdx.x < static_cast<unsigned>(p.topk)) {
            const int64_t e = static_cast<int64_t>(t) * p.topk + threadIdx.x;
            const int32_t row = p.dest_rows[e];
            if (row < 0 || row >= p.rows) bad_index("moe_ar dest_rows", p.dest_rows + e, row, p.rows);
            s_row[threadIdx.x] = row;
            s_w[threadIdx.x] = p.weights[e];
        }
        __syncthreads();
        for (int64_t c = threadIdx.x; c < p.h; c += blockDim.x) {
            float acc = 0.f;
            for (int s = 0; s < p.topk; ++s) acc += s_w[s] * moe_to_float<T>(partial[s_row[s] * p.h + c]);
            for (int j = 0; j < W; ++j) {  // own slot first
                const int d = me + j < W ? me + j : me + j - W;
                tp_peer(ctx, p.recv, d)[me * slot + t * p.h + c] = acc;
            }
        }
    }
    if (tp_last_block(p.ticket, p.ticket_target))
        for (int j = 1; j < W; ++j) {
            const int d = me + j < W ? me + j : me + j - W;
            ptx::st_release_sys(tp_peer(ctx, p.sig->reduced + me, d), p.epoch);
        }
    // Every token's W slots: the own slot of token t was written by this block (the same token assignment).
    if (threadIdx.x < static_cast<unsigned>(W) && static_cast<int>(threadIdx.x) != me)
        tp_wait_ge<true>(p.sig->reduced + threadIdx.x, p.epoch, ctx.wait_timeout_ns,
                         "moe_ar: waits for a peer's reduced rows");
    __syncthreads();
    T* const out = static_cast<T*>(p.out);
    for (int32_t t = static_cast<int32_t>(blockIdx.x); t < p.tokens; t += static_cast<int32_t>(gridDim.x))
        for (int64_t c = threadIdx.x; c < p.h; c += blockDim.x) {
            float acc = 0.f;
            for (int q = 0; q < W; ++q) acc += p.recv[q * slot + t * p.h + c];
            out[t * p.h + c] = moe_from_float<T>(acc);
        }
}

}  // namespace loom::kernels::moe
