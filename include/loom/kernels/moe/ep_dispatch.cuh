// Expert-parallel dispatch, throughput mode, on the device (host side: src/ops/moe/ep/dispatch.cpp; data:
// ep_params.hpp). Per call, on every rank, in stream order:
//
//   ep_layout_count   block b: histogram of entries [b kEpChunk, +kEpChunk) over the C = E + W columns (entries per
//                     expert; per destination rank, the tokens whose first slot on that rank is in the chunk) into
//                     chunk_counts[b]; checks every id; token_pair := -1
//   ep_layout_scan    one block: call number e := ++dispatch_calls; per column, exclusive bases of the chunks (in
//                     place) and the total; the totals row to every rank's counts_all[me], counts_ready[me] := e
//                     there; waits for every rank's row (the one small exchange), then from the W x C totals: this
//                     rank's receive segments (expert-contiguous, sources in rank order within an expert), where its
//                     own rows and pair records start at every rank, the capacity check (every rank computes every
//                     rank's totals: all agree on an overflow)
//   ep_layout_index   block b: each entry's row at its expert's rank (segment base + chunk base + rank among the
//                     chunk's earlier entries of the expert: token order) and each (token, rank) pair's record index
//   ep_dispatch_push  a warp per token: for every rank d the token goes to, its row once into d's receive buffer at
//                     the row of its first slot on d, and the pair record (rows and weights of its slots on d) into
//                     d's pair records; the last block sets arrived[me] := e at every rank
//   ep_dispatch_arrive  every block waits for arrived[r] >= e of every rank r, then copies each received pair's row
//                     into the rows of its further slots on this rank (a token sent once, landing in several experts)
//
// The per-expert path (ep_moe_experts, Overlapped: kernels/moe/ep_experts.cuh) runs count -> scan -> index as above
// (the scan also writes send_prefix, the index send_entry: this rank's entries grouped by expert), then
//   ep_dispatch_push_experts  the pair records (a warp per token), then per (local expert l, rank d) in the order
//                     l-major, peers first: this rank's rows of expert d L + l (items of kEpExpertRows rows, a block
//                     each), each into the row of its own entry at d (a token going to several experts of d crosses
//                     once per expert: no receiver copy); the block finishing the expert's last item adds 1 to
//                     expert_ready[l] at d (release, sys; also with no rows, and after an overflow); the last
//                     block sets arrived[me] := e at every rank (the pair records)
//   ep_dispatch_arrived_wait  one warp: waits for arrived[r] >= e of every rank r (before the combine reads the
//                     pair records)
// and the grouped GEMM in between waits per tile for its expert's counter (ep_experts.cuh).
//
// Waits: the scan waits for the peers' scans (which follow only their counts) and the arrive kernel for the peers'
// pushes (which wait for nothing). No block waits for another block of its own kernel, so nothing needs co-resident
// blocks, and ranks sharing a GPU cannot starve each other into a cycle.
//
// A World of several nodes (the kernels built with remote peers: LOOM_REMOTE_PEERS): ranks are global, node peers are
// written by load/store as above, and a rank d on another node through NVSHMEM: the scan's totals row by put_signal
// (counts_ready[me] := e), the push stages the token's row and pair record in this rank's stage rows (at stage_base[d]
// + the pair's index among this rank's pairs with d) and puts them from there (nbi) to the same places at d as the
// stores would; each block completes its puts (quiet) before its last-block ticket, and arrived[me] := e goes to d
// as NVSHMEM's signal after a quiet. The per-expert path stays on one node (the host refuses it on several).
#pragma once

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 1  // diagnostics through the mailbox only: a printf call costs the kernels a stack frame
#endif

#include <cuda_bf16.h>

#include "loom/config.hpp"
#include "loom/kernels/moe/ep_params.hpp"
#include "loom/kernels/moe/routing.cuh"
#include "loom/lang/lang.cuh"
#include "loom/lang/profile.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/tma.cuh"
#include "loom/tile/block_scan.cuh"

namespace loom::kernels::moe {

// Rank d's copy of this rank's symmetric pointer p. Precondition: d is on this node (!ep_remote).
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE T* ep_peer(const Ctx& ctx, T* p, int d) {
    return reinterpret_cast<T*>(ctx.heap_of(d) + ctx.own_offset(p));
}

// Whether rank d is on another node (reached through NVSHMEM): never in a kernel built without remote peers, which
// the host launches on one node only.
LOOM_DEVICE LOOM_FORCEINLINE bool ep_remote(const Ctx& ctx, int d) {
#if LOOM_REMOTE_PEERS
    return !ctx.reachable(d);
#else
    (void)ctx;
    (void)d;
    return false;
#endif
}

// arrived / combined [me] := epoch at rank d: a release store on this node; on another node NVSHMEM's signal after a
// quiet (lang::signal_op), which also completes this rank's earlier puts.
LOOM_DEVICE LOOM_FORCEINLINE void ep_signal(const Ctx& ctx, uint64_t* sig, uint64_t epoch, int d) {
    if (ep_remote(ctx, d)) {
        lang::signal_op(ctx, sig, epoch, lang::SignalOp::Set, d);
    } else {
        ptx::st_release_sys(ep_peer(ctx, sig, d), epoch);
    }
}

// Every thread of the block: in a kernel built with remote peers, the block's NVSHMEM puts are complete (and its
// stores fenced) before what follows; nothing otherwise.
LOOM_DEVICE LOOM_FORCEINLINE void ep_block_quiet(const Ctx& ctx) {
#if LOOM_REMOTE_PEERS
    lang::quiet(lang::block, ctx);
#else
    (void)ctx;
#endif
}

// The lanes of a warp's token (lane s < k holding slot s's expert e, -1 unused): the lanes whose slot is the first of
// the token's slots on e's rank (those send the token to that rank), and this lane's rank (-1 for none).
struct EpDests {
    unsigned first;  // ballot of the first-slot lanes
    int rank;        // e / L, or -1
    unsigned same;   // the lanes whose slot is on this lane's rank (this lane alone for an unused slot)
};
LOOM_DEVICE LOOM_FORCEINLINE EpDests ep_dests(int32_t e, int local_experts) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int d = e >= 0 ? e / local_experts : -1;
    // Lanes with the same rank (unused slots apart: each its own key).
    const unsigned same = __match_any_sync(0xffffffffu, d >= 0 ? d : -2 - lane);
    const bool first = d >= 0 && (__ffs(same) - 1) == lane;
    return EpDests{__ballot_sync(0xffffffffu, first), d, same};
}

LOOM_DEVICE LOOM_FORCEINLINE int ep_cols(const EpParams& p, int W) { return p.num_experts + W; }

// Bounded acquire (sys) wait for *sig >= target; a timeout posts a diagnostic tagged `tag` and traps. Takes the
// bound, not the Ctx: a Ctx passed by reference to the diagnostic would make the kernel copy it to its stack.
LOOM_DEVICE LOOM_FORCEINLINE void ep_wait(uint64_t timeout_ns, const uint64_t* sig, uint64_t target, const char* tag) {
    lang::wait_ge_sys_or_trap(sig, target, timeout_ns, tag);
}

// Every thread of the block calls once its writes are done; true on thread 0 of the launch's last block to arrive
// (a wrapping ticket: atom.inc to gridDim.x - 1, back to 0 for the next launch). The fences order every block's
// writes before its arrival and the last block's later signals after all of them.
LOOM_DEVICE LOOM_FORCEINLINE bool ep_last_block(uint32_t* ticket) {
    __syncthreads();
    if (threadIdx.x != 0) return false;
    ptx::fence_sc_sys();
    const uint32_t last = gridDim.x - 1;
    if (ptx::atom_inc_acq_rel_gpu(ticket, last) != last) return false;
    ptx::fence_sc_sys();
    return true;
}

// Whether slot s is the first of token t's slots on expert e's rank (the slot that sends the token there).
LOOM_DEVICE LOOM_FORCEINLINE bool ep_first_on_rank(const EpParams& p, int64_t t, int s, int32_t e) {
    const int32_t d = e / p.local_experts;
    for (int q = 0; q < s; ++q) {
        const int32_t o = p.topk_idx[t * p.topk + q];
        if (o >= 0 && o / p.local_experts == d) return false;
    }
    return true;
}

// The entry's expert, -1 for an unused slot; traps on an id outside [-1, E).
LOOM_DEVICE LOOM_FORCEINLINE int32_t ep_expert(const EpParams& p, int64_t j) {
    const int32_t e = p.topk_idx[j];
    if (e < -1 || e >= p.num_experts) bad_index("ep_dispatch topk_idx", p.topk_idx + j, e, p.num_experts);
    return e;
}

// blockDim.x == kEpChunk; dynamic smem: C int32.
__global__ void __launch_bounds__(kEpChunk) ep_layout_count(Ctx ctx, EpParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagEpKernel, lang::kEpLayoutCount);
    extern __shared__ int32_t hist[];
    const int W = ctx.world, C = ep_cols(p, W);
    for (int c = threadIdx.x; c < C; c += blockDim.x) hist[c] = 0;
    const int64_t pairs = static_cast<int64_t>(p.tokens) * W;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        p.token_pair[i] = -1;
    __syncthreads();
    const int64_t entries = static_cast<int64_t>(p.tokens) * p.topk;
    const int64_t j = static_cast<int64_t>(blockIdx.x) * kEpChunk + threadIdx.x;
    if (j < entries) {
        const int32_t e = ep_expert(p, j);
        if (e >= 0) {
            atomicAdd(&hist[e], 1);
            if (ep_first_on_rank(p, j / p.topk, static_cast<int>(j % p.topk), e))
                atomicAdd(&hist[p.num_experts + e / p.local_experts], 1);
        }
    }
    __syncthreads();
    int32_t* out = p.chunk_counts + static_cast<int64_t>(blockIdx.x) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) out[c] = hist[c];
}

// Every thread of a block of kEpScanThreads >= n: out[0] = 0, out[i + 1] = v[0] + ... + v[i] (i < n). buf: n int32 of
// shared memory. Ends with a __syncthreads.
LOOM_DEVICE LOOM_FORCEINLINE void ep_exclusive_prefix(const int32_t* v, int n, int32_t* out, int32_t* buf) {
    const int i = static_cast<int>(threadIdx.x);
    int32_t run = i < n ? v[i] : 0;
    for (int d = 1; d < n; d *= 2) {  // Hillis-Steele: log2(n) steps of the whole block
        if (i < n) buf[i] = run;
        __syncthreads();
        if (i >= d && i < n) run += buf[i - d];
        __syncthreads();
    }
    if (i < n) out[i + 1] = run;
    if (i == 0) out[0] = 0;
    __syncthreads();
}

// The scan's shared state (one block of kEpScanThreads).
struct EpScanShared {
    int32_t tot[kEpMaxCols];     // this rank's column totals, then every expert's total over the sources
    int32_t seg[kEpMaxExperts];  // per expert: the first row of its segment at its rank
    uint64_t epoch;              // the call number
    int32_t need_rows, need_pairs, need_stage;
};

// The scan before the exchange, every thread of the block: call number sh.epoch := ++dispatch_calls; per column, the
// chunks' exclusive bases (in place) and this rank's total into sh.tot; send_prefix (the per-expert path). Ends with
// a __syncthreads.
LOOM_DEVICE LOOM_FORCEINLINE void ep_scan_totals(const EpParams& p, int W, EpScanShared& sh) {
    const int C = ep_cols(p, W);
    if (threadIdx.x == 0) {
        sh.epoch = p.dev->dispatch_calls + 1;
        p.dev->dispatch_calls = sh.epoch;
        sh.need_rows = 0;
        sh.need_pairs = 0;
        sh.need_stage = 0;
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        int32_t run = 0;
        for (int b = 0; b < p.chunks; ++b) {
            int32_t* v = p.chunk_counts + static_cast<int64_t>(b) * C + c;
            const int32_t n = *v;
            *v = run;
            run += n;
        }
        sh.tot[c] = run;
    }
    __syncthreads();
    if (p.send_prefix != nullptr) ep_exclusive_prefix(sh.tot, p.num_experts, p.send_prefix, sh.seg);  // seg: scratch
}

// The scan after the exchange, every thread of the block, once every rank's totals row is in p.counts_all [W, C]
// (all ranks compute the same from it): the rows and pairs every rank receives, the capacity check, where this rank's
// rows and pair records start at every rank, its receive segments, and (several nodes, ranks of a node contiguous,
// local_world of them) its stage rows.
LOOM_DEVICE LOOM_FORCEINLINE void ep_scan_layout(const EpParams& p, int W, int me, int local_world, EpScanShared& sh) {
    const int C = ep_cols(p, W), E = p.num_experts, L = p.local_experts;
    const int32_t* all = p.counts_all;
    int32_t* const tot = sh.tot;
    int32_t* const seg = sh.seg;
    // Every expert's total over the sources.
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t s = 0;
        for (int r = 0; r < W; ++r) s += all[r * C + e];
        tot[e] = s;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < W; d += blockDim.x) {
        int32_t rows = 0, prs = 0, staged = 0;
        for (int l = 0; l < L; ++l) {
            seg[d * L + l] = rows;
            rows += tot[d * L + l];
        }
        for (int r = 0; r < W; ++r) {
            prs += all[r * C + E + d];
            if (r / local_world != d / local_world) staged += all[d * C + E + r];  // d's pairs with other nodes
        }
        atomicMax(&sh.need_rows, rows);
        atomicMax(&sh.need_pairs, prs);
        atomicMax(&sh.need_stage, staged);
        if (d == me) p.dev->recv_pairs = prs;
        int32_t base = 0;  // this rank's pairs start after those of the lower ranks
        for (int r = 0; r < me; ++r) base += all[r * C + E + d];
        p.pair_base[d] = base;
    }
    __syncthreads();
    const bool overflow = sh.need_rows > p.capacity || sh.need_pairs > p.pair_capacity || sh.need_stage > p.capacity;
    if (threadIdx.x == 0) {
        p.dev->need_rows = sh.need_rows;
        p.dev->need_pairs = sh.need_pairs;
        p.dev->need_stage = sh.need_stage;
        p.dev->overflow = overflow ? 1 : 0;
    }
    // This rank's segment of expert e at e's rank starts after the lower ranks' rows of e.
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t base = seg[e];
        for (int r = 0; r < me; ++r) base += all[r * C + e];
        p.send_base[e] = base;
    }
    // The receive segments (nothing to compute on after an overflow: the call moves no data).
    for (int l = threadIdx.x; l <= L; l += blockDim.x) {
        p.recv_offsets[l] = overflow ? 0 : (l < L ? seg[me * L + l] : seg[me * L + L - 1] + tot[me * L + L - 1]);
        if (l < L) p.recv_counts[l] = overflow ? 0 : tot[me * L + l];
    }
    // Several nodes: the stage rows of this rank's pairs with each rank of another node (in rank order), where each
    // source of another node keeps its pairs with this rank, and where each source's pair records start here.
    if (p.stage_base != nullptr) {
        const int my_node = me / local_world;
        for (int d = threadIdx.x; d < W; d += blockDim.x) {
            int32_t stage = 0, ret = 0, src = 0;
            for (int r = 0; r < d; ++r)
                if (r / local_world != my_node) stage += all[me * C + E + r];
            for (int r = 0; r < me; ++r)
                if (r / local_world != d / local_world) ret += all[d * C + E + r];
            for (int r = 0; r < d; ++r) src += all[r * C + E + me];
            p.stage_base[d] = stage;
            p.ret_base[d] = ret;
            p.src_pair_base[d] = src;
            if (d == W - 1) p.src_pair_base[W] = src + all[d * C + E + me];
        }
    }
}

// One block of kEpScanThreads.
__global__ void __launch_bounds__(kEpScanThreads) ep_layout_scan(Ctx ctx, EpParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagEpKernel, lang::kEpLayoutScan);
    __shared__ EpScanShared sh;
    const int W = ctx.world, me = ctx.rank, C = ep_cols(p, W);
    ep_scan_totals(p, W, sh);
    const uint64_t epoch = sh.epoch;
    // The exchange: this rank's totals into row me of every rank's counts_all, then counts_ready[me] := epoch there.
    // Node peers (and this rank) by stores; ranks on other nodes by one put_signal of the row from this rank's own.
    for (int i = threadIdx.x; i < W * C; i += blockDim.x) {
        const int d = i / C, c = i % C;
        if (!ep_remote(ctx, d)) ep_peer(ctx, p.counts_all, d)[me * C + c] = sh.tot[c];
    }
    __syncthreads();
    int32_t* const own_row = p.counts_all + static_cast<int64_t>(me) * C;
    for (int d = threadIdx.x; d < W; d += blockDim.x) {
        ptx::fence_sc_sys();  // the block's stores of the rows (ordered by the __syncthreads) before the signal
        if (ep_remote(ctx, d)) {
            lang::put_signal(lang::thread, ctx, own_row, own_row, sizeof(int32_t) * static_cast<uint64_t>(C),
                             p.sig->counts_ready + me, epoch, lang::SignalOp::Set, d);
        } else {
            ptx::st_release_sys(ep_peer(ctx, p.sig->counts_ready + me, d), epoch);
        }
    }
    for (int d = threadIdx.x; d < W; d += blockDim.x)
        ep_wait(ctx.wait_timeout_ns, p.sig->counts_ready + d, epoch, "ep_dispatch: waits for a rank's layout counts");
    __syncthreads();
    ep_scan_layout(p, W, me, ctx.local_world, sh);
}

// blockDim.x == kEpChunk.
__global__ void __launch_bounds__(kEpChunk) ep_layout_index(Ctx ctx, EpParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagEpKernel, lang::kEpLayoutIndex);
    __shared__ int32_t col[kEpChunk];   // the entry's expert, -1 unused
    __shared__ int32_t pcol[kEpChunk];  // the entry's rank where it is the token's first slot there, else -1
    const int W = ctx.world, C = ep_cols(p, W);
    const int64_t entries = static_cast<int64_t>(p.tokens) * p.topk;
    const int64_t j = static_cast<int64_t>(blockIdx.x) * kEpChunk + threadIdx.x;
    int32_t e = -1, d = -1;
    if (j < entries) {
        e = ep_expert(p, j);
        if (e >= 0 && ep_first_on_rank(p, j / p.topk, static_cast<int>(j % p.topk), e)) d = e / p.local_experts;
    }
    col[threadIdx.x] = e;
    pcol[threadIdx.x] = d;
    __syncthreads();
    if (j >= entries) return;
    if (e < 0) {
        p.entry_row[j] = -1;
        return;
    }
    int32_t before = 0, pbefore = 0;  // this chunk's earlier entries of expert e / first slots on rank d
    for (int i = 0; i < static_cast<int>(threadIdx.x); ++i) {
        before += col[i] == e;
        pbefore += d >= 0 && pcol[i] == d;
    }
    const int32_t* base = p.chunk_counts + static_cast<int64_t>(blockIdx.x) * C;
    p.entry_row[j] = p.send_base[e] + base[e] + before;
    if (p.send_entry != nullptr) p.send_entry[p.send_prefix[e] + base[e] + before] = static_cast<int32_t>(j);
    if (d >= 0) p.token_pair[(j / p.topk) * W + d] = p.pair_base[d] + base[p.num_experts + d] + pbefore;
}

// v[u] := word base + 32u + lane of `src` for u < N, words below `words` (the others left as they are): the N loads
// are issued together.
template <int N>
LOOM_DEVICE LOOM_FORCEINLINE void ep_load_words(uint4 (&v)[N], const uint4* src, int64_t base, int64_t words) {
    const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
    for (int u = 0; u < N; ++u) {
        const int64_t i = base + u * 32 + lane;
        if (i < words) v[u] = src[i];
    }
}

// The warp copies a row of `words` 16-byte words, kEpCopyBatch loads in flight per lane: a batch's loads are issued
// before its stores (src and dst never overlap), which one load then one store per word would serialise.
inline constexpr int kEpCopyBatch = 4;
LOOM_DEVICE LOOM_FORCEINLINE void ep_copy_row(uint4* dst, const uint4* src, int64_t words) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    for (int64_t base = 0; base < words; base += 32 * kEpCopyBatch) {
        uint4 v[kEpCopyBatch];
        ep_load_words(v, src, base, words);
#pragma unroll
        for (int u = 0; u < kEpCopyBatch; ++u) {
            const int64_t i = base + u * 32 + lane;
            if (i < words) dst[i] = v[u];
        }
    }
}

// Lane `lane` of token t's warp: slot lane's expert (-1 for an unused slot or a lane >= k), its row at the expert's
// rank (entry_row) and its weight (1 without weights).
struct EpSlot {
    int32_t e, row;
    float w;
};
LOOM_DEVICE LOOM_FORCEINLINE EpSlot ep_slot(const EpParams& p, int64_t t, int lane) {
    EpSlot s{-1, -1, 1.f};
    if (lane < p.topk) {
        s.e = p.topk_idx[t * p.topk + lane];
        s.row = p.entry_row[t * p.topk + lane];
        if (p.topk_weights != nullptr) s.w = p.topk_weights[t * p.topk + lane];
    }
    return s;
}

// A warp per token (grid-strided). Rows move 16 bytes per lane and store; to a rank on another node they are staged
// and put (see the top).
__global__ void __launch_bounds__(kEpThreads) ep_dispatch_push(Ctx ctx, EpParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagEpKernel, lang::kEpDispatchPush);
    const int W = ctx.world, me = ctx.rank;
    const int lane = threadIdx.x % 32;
    const bool move = p.dev->overflow == 0;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    const uint4* x = static_cast<const uint4*>(p.x);
    const int64_t row_bytes = p.row_words * 16;
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; move && t < p.tokens;
         t += warps) {
        const EpSlot sl = ep_slot(p, t, lane);
        const int32_t row = sl.row;
        const float w = sl.w;
        const EpDests dests = ep_dests(sl.e, p.local_experts);
        for (unsigned m = dests.first; m != 0; m &= m - 1) {  // the token's ranks, in slot order
            const int f = __ffs(m) - 1;
            const int d = __shfl_sync(0xffffffffu, dests.rank, f);
            const int32_t first = __shfl_sync(0xffffffffu, row, f);  // the first slot on d carries the row
            const int32_t q = p.token_pair[t * W + d];
            if (first < 0 || first >= p.capacity) bad_index("ep_dispatch entry_row", p.entry_row, first, p.capacity);
            if (q < 0 || q >= p.pair_capacity) bad_index("ep_dispatch token_pair", p.token_pair, q, p.pair_capacity);
            const bool on_d = dests.rank == d;
            const int64_t rec = static_cast<int64_t>(q) * p.topk;
            const uint4* src = x + t * p.x_ld_words;
            if (!ep_remote(ctx, d)) {
                if (lane < p.topk) {
                    ep_peer(ctx, p.pair_rows, d)[rec + lane] = on_d ? row : -1;
                    ep_peer(ctx, p.pair_weights, d)[rec + lane] = w;
                }
                ep_copy_row(static_cast<uint4*>(ep_peer(ctx, p.recv_x, d)) + static_cast<int64_t>(first) * p.row_words,
                            src, p.row_words);
                continue;
            }
            // Another node: stage the record and the row, then put both from the stage rows.
            const int64_t si = p.stage_base[d] + q - p.pair_base[d];
            if (si < 0 || si >= p.capacity) bad_index("ep_dispatch stage row", p.stage_base + d, si, p.capacity);
            if (lane < p.topk) {
                p.stage_rows[si * p.topk + lane] = on_d ? row : -1;
                p.stage_weights[si * p.topk + lane] = w;
            }
            uint4* stage = static_cast<uint4*>(p.stage_x) + si * p.row_words;
            ep_copy_row(stage, src, p.row_words);
            __threadfence_system();  // the staged bytes before NVSHMEM reads them (every transport)
            __syncwarp();
            lang::put_nbi(lang::warp, ctx, static_cast<uint4*>(p.recv_x) + static_cast<int64_t>(first) * p.row_words,
                          stage, static_cast<uint64_t>(row_bytes), d);
            lang::put_nbi(lang::warp, ctx, p.pair_rows + rec, p.stage_rows + si * p.topk,
                          sizeof(int32_t) * static_cast<uint64_t>(p.topk), d);
            lang::put_nbi(lang::warp, ctx, p.pair_weights + rec, p.stage_weights + si * p.topk,
                          sizeof(float) * static_cast<uint64_t>(p.topk), d);
        }
    }
    ep_block_quiet(ctx);  // several nodes: this block's puts complete before its ticket
    if (ep_last_block(&p.dev->push_ticket)) {
        const uint64_t epoch = p.dev->dispatch_calls;
        for (int j = 1; j <= W; ++j) {  // peers first, own last
            const int d = me + j < W ? me + j : me + j - W;
            ep_signal(ctx, p.sig->arrived + me, epoch, d);
        }
    }
}

// Every thread of the block, once every rank's push of the current dispatch arrived: a warp per received pair
// (grid-strided) copies the pair's row into the rows of its further slots on this rank (a token sent once, landing in
// several experts). s_row: per warp, its pair's row of every slot (-1: not on this rank).
LOOM_DEVICE LOOM_FORCEINLINE void ep_arrive_copies(const EpParams& p, int32_t (&s_row)[kEpThreads / 32][32]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int32_t pairs = p.dev->overflow == 0 ? p.dev->recv_pairs : 0;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    uint4* const rows = static_cast<uint4*>(p.recv_x);
    for (int64_t q = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp; q < pairs; q += warps) {
        // Rows below the capacity: the senders computed them from the totals the scan checked.
        const int32_t row = lane < p.topk ? p.pair_rows[q * p.topk + lane] : -1;
        const unsigned slots = __ballot_sync(0xffffffffu, row >= 0);
        __syncwarp();  // the previous pair's rows are read
        s_row[warp][lane] = row;
        __syncwarp();
        if (slots == 0) continue;
        const uint4* src = rows + static_cast<int64_t>(s_row[warp][__ffs(slots) - 1]) * p.row_words;
        for (unsigned m = slots & (slots - 1); m != 0; m &= m - 1)  // the further slots on this rank
            ep_copy_row(rows + static_cast<int64_t>(s_row[warp][__ffs(m) - 1]) * p.row_words, src, p.row_words);
    }
    // The grouped GEMM that follows reads the rows through TMA (the async proxy).
    __syncthreads();
    ptx::fence_proxy_async_global();
}

// Every block waits for every rank's push of the current dispatch (arrived[r] >= e), then ep_arrive_copies.
__global__ void __launch_bounds__(kEpThreads) ep_dispatch_arrive(Ctx ctx, EpParams p) {
    LOOM_PROF_BLOCK_SPAN(lang::kTagEpKernel, lang::kEpDispatchArrive);
    __shared__ int32_t s_row[kEpThreads / 32][32];
    if (threadIdx.x < static_cast<unsigned>(ctx.world))  // W <= kEpMaxRanks == kEpThreads
        ep_wait(ctx.wait_timeout_ns, p.sig->arrived + threadIdx.x, p.dev->dispatch_calls,
                "ep_dispatch: waits for a rank's routed rows");
    __syncthreads();
    ep_arrive_copies(p, s_row);
}

// The per-expert push (see the top). Grid-strided: a warp per token for the pair records, then a block per work item:
// work order o in [0, E) names local expert l = o / W at rank d = (me + 1 + o % W) % W, expert e = d L + l; its
// rows are split into items of kEpExpertRows (one item when it has none, or after an overflow). The block that
// finishes e's last item (a wrapping ticket per expert) signals e's rank.
// (minimum 1 block per SM: ptxas otherwise caps sm_80 at 32 registers and spills)
__global__ void __launch_bounds__(kEpThreads, 1) ep_dispatch_push_experts(Ctx ctx, EpParams p) {
    __shared__ int32_t s_item[kEpMaxExperts + 1];  // first item of each work order position
    __shared__ int32_t s_scratch[32];
    const int W = ctx.world, me = ctx.rank, L = p.local_experts, E = p.num_experts;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, block_warps = blockDim.x / 32;
    const bool move = p.dev->overflow == 0;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * block_warps;
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * block_warps + warp; move && t < p.tokens; t += warps) {
        if (lane >= p.topk) continue;  // no warp collectives below
        const int32_t e = p.topk_idx[t * p.topk + lane];
        const int32_t row = p.entry_row[t * p.topk + lane];
        if (e >= 0 && (row < 0 || row >= p.capacity))
            bad_index("ep_moe_experts entry_row", p.entry_row + t * p.topk + lane, row, p.capacity);
        const float w = p.topk_weights != nullptr ? p.topk_weights[t * p.topk + lane] : 1.f;
        for (int d = 0; d < W; ++d) {
            const int32_t q = p.token_pair[t * W + d];
            if (q < 0) continue;
            const int64_t rec = static_cast<int64_t>(q) * p.topk + lane;
            ep_peer(ctx, p.pair_rows, d)[rec] = e >= 0 && e / L == d ? row : -1;
            ep_peer(ctx, p.pair_weights, d)[rec] = w;
        }
    }
    auto expert_of = [&](int o) { return ((me + 1 + o % W) % W) * L + o / W; };
    auto items = [&](int o) {
        const int e = expert_of(o);
        const int32_t n = move ? p.send_prefix[e + 1] - p.send_prefix[e] : 0;
        return n > 0 ? (n + kEpExpertRows - 1) / kEpExpertRows : 1;
    };
    tile::block_exclusive_prefix(E, items, s_item, s_scratch, static_cast<int>(blockDim.x));
    const uint4* x = static_cast<const uint4*>(p.x);
    for (int32_t it = blockIdx.x; it < s_item[E]; it += gridDim.x) {
        int o = 0, hi_o = E - 1;  // the last o with s_item[o] <= it
        while (o < hi_o) {
            const int mid = (o + hi_o + 1) / 2;
            if (s_item[mid] <= it) {
                o = mid;
            } else {
                hi_o = mid - 1;
            }
        }
        const int d = (me + 1 + o % W) % W, l = o / W, e = d * L + l;
        const int32_t chunk = it - s_item[o], chunks = s_item[o + 1] - s_item[o];
        if (move) {
            uint4* const rows = static_cast<uint4*>(ep_peer(ctx, p.recv_x, d));
            const int32_t lo = p.send_prefix[e] + chunk * kEpExpertRows;
            const int32_t end = lo + kEpExpertRows < p.send_prefix[e + 1] ? lo + kEpExpertRows : p.send_prefix[e + 1];
            for (int32_t i = lo + warp; i < end; i += block_warps) {
                const int32_t j = p.send_entry[i];
                const int32_t row = p.entry_row[j];
                if (row < 0 || row >= p.capacity) continue;  // never: the pair pass above traps on it
                const uint4* src = x + static_cast<int64_t>(j / p.topk) * p.x_ld_words;
                uint4* dst = rows + static_cast<int64_t>(row) * p.row_words;
                for (int64_t c = lane; c < p.row_words; c += 32) dst[c] = src[c];
            }
        }
        __syncthreads();  // every warp's rows of the item stored
        if (threadIdx.x == 0) {
            ptx::fence_sc_sys();  // this block's rows before its ticket; the last block's signal after every ticket
            const uint32_t last = static_cast<uint32_t>(chunks - 1);
            if (ptx::atom_inc_acq_rel_gpu(p.dev->expert_ticket + e, last) == last) {
                ptx::fence_sc_sys();
                ptx::red_add_release_sys(ep_peer(ctx, p.sig->expert_ready + l, d), uint64_t{1});
            }
        }
    }
    if (ep_last_block(&p.dev->push_ticket)) {
        const uint64_t epoch = p.dev->dispatch_calls;
        for (int d = 0; d < W; ++d) ptx::st_release_sys(ep_peer(ctx, p.sig->arrived + me, d), epoch);
    }
}

// One warp: every rank's pair records of the current dispatch have landed (the combine that follows reads them).
__global__ void __launch_bounds__(32) ep_dispatch_arrived_wait(Ctx ctx, EpParams p) {
    for (int r = threadIdx.x; r < ctx.world; r += blockDim.x)
        ep_wait(ctx.wait_timeout_ns, p.sig->arrived + r, p.dev->dispatch_calls,
                "ep_moe_experts: waits for a rank's pair records");
}

}  // namespace loom::kernels::moe
