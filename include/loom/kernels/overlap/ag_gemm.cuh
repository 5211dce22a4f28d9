// AllGather+GEMM (the first layer of a tensor-parallel MLP): C[M, N_loc] = gather(A)[M, K] * B[N_loc, K]^T, with
// A sharded by rows ([M / W, K] per rank). Two parts run concurrently on every rank:
//
//   producer  moves this rank's shard into rows [me * M/W, (me + 1) * M/W) of every rank's gather buffer
//             (symmetric [M, K]) and raises the chunk signal there. Either the copy engine (host side:
//             src/ops/overlap/ag_gemm/copy_engine.cpp, cudaMemcpyAsync + cuStreamWriteValue64 on a side stream), or the
//             SM kernel ag_gemm_push below (a few blocks on a side stream, ld/st or TMA data path). Or, ranks sharing a
//             GPU, nobody (the direct producer): each rank copies its shard into its own symmetric staging and raises
//             chunk[me] at every rank; the GEMMs read every peer's rows in place from there (a_peer maps).
//   consumer  the persistent Hopper GEMM (kernels/gemm.cuh) with AgGemmHooks: tiles in rank-rotated order (this
//             rank's own rows first, then the next rank's, ...); before a tile's operands are loaded its
//             producer thread waits (acquire, sys scope) until the chunks holding the tile's rows have landed
//             for this call; the GEMM then issues fence.proxy.async.global so its TMA loads see the data. With
//             own_local (the copy-engine producer, M / W a multiple of BLOCK_M) the own rows' tiles load from the
//             A shard itself through a second tensor map and wait for nothing: no copy of them precedes the GEMM.
//
// Signals (kernels/overlap/overlap_params.hpp AgGatherSignals, AgDirectSignals): chunk[r] counts the pieces of rank r's
// chunk that landed (cumulative over calls; the host passes this call's target), ready[r] says rank r's gather buffer
// may be overwritten for this call (its previous GEMM is done: the producer runs after it in stream order and publishes
// it first).
#pragma once

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 1  // wgmma kernel in this TU: no printf anywhere (ptxas C7510)
#endif

#include "loom/kernels/gemm/gemm.cuh"
#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/lang/lang.cuh"
#include "loom/lang/profile.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/special.cuh"
#include "loom/ptx/tma.cuh"

namespace loom::kernels::overlap {

// The GEMM policy (protocols: tile/hooks.cuh). before_load runs on the GEMM's producer thread only, for tiles with
// rows inside M; the kernel adds fence.proxy.async.global after it.
struct AgGemmHooks {
    static constexpr bool kScalesAccumulators = true;  // tile::ScalesAccumulators
    AgGemmHookArgs a;

    // Is the tile one of this rank's own M-blocks, read in place from its shard? (With own_local the tile lies
    // wholly inside the own rows: rows_per_rank is a multiple of BLOCK_M.)
    LOOM_DEVICE LOOM_FORCEINLINE bool own_in_place(const tile::TileCoord& t) const {
        return a.own_local != 0 && static_cast<uint32_t>(t.row0 - a.own_row0) < static_cast<uint32_t>(a.rows_per_rank);
    }
    LOOM_DEVICE LOOM_FORCEINLINE const ptx::TmaDescriptor* local_map() const {
        return reinterpret_cast<const ptx::TmaDescriptor*>(&a.a_local);
    }
    LOOM_DEVICE LOOM_FORCEINLINE void prefetch_a() const {
        if (a.own_local) ptx::tma_prefetch_descriptor(local_map());
        if (a.direct)
            for (int r = 0; r < a.world; ++r)
                if (r * a.rows_per_rank != a.own_row0)
                    ptx::tma_prefetch_descriptor(reinterpret_cast<const ptx::TmaDescriptor*>(&a.a_peer[r]));
    }
    LOOM_DEVICE LOOM_FORCEINLINE void a_source(const tile::TileCoord& t, const ptx::TmaDescriptor*& map,
                                               int32_t& row) const {
        if (own_in_place(t)) {
            map = local_map();
            row = t.row0 - a.own_row0;
        } else if (a.direct) {  // the owner's staging copy, in place (the tile lies inside one rank's rows)
            const int32_t r = t.row0 / a.rows_per_rank;
            map = reinterpret_cast<const ptx::TmaDescriptor*>(&a.a_peer[r]);
            row = t.row0 - r * a.rows_per_rank;
        }
    }

    template <class Grid>
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const Grid& g, int32_t& m_block,
                                                 int32_t& n_block) const {
        tile::rotated_order(linear, g, a.shift_m, m_block, n_block);
    }
    LOOM_DEVICE LOOM_FORCEINLINE void before_load(const tile::TileCoord& t) const {
        if (own_in_place(t)) return;  // in this rank's shard since before the call
        // A tile of BLOCK_M rows spans at most two ranks' chunks unless M / W < BLOCK_M; loop over them all.
        const int32_t first = t.row0 / a.rows_per_rank;
        const int32_t last = (t.row0 + t.rows - 1) / a.rows_per_rank;
        for (int32_t r = first; r <= last; ++r) {
            LOOM_PROF_BEGIN(lang::kTagAgChunkWait, r);
            lang::wait_ge_sys_or_trap(a.chunk + r, a.target, a.timeout_ns, "ag_gemm: GEMM waits for a chunk");
            LOOM_PROF_END(lang::kTagAgChunkWait, r);
        }
    }
    LOOM_DEVICE LOOM_FORCEINLINE uint64_t wait_bound_ns() const { return a.timeout_ns; }
};
static_assert(tile::GemmHooks<AgGemmHooks> && tile::LoadWait<AgGemmHooks> && tile::ASource<AgGemmHooks> &&
              tile::ScalesAccumulators<AgGemmHooks>);

// SM producer: gridDim.x blocks (every rank the same), each moves its share of this rank's chunk to every rank
// (this rank first, so the rank-rotated GEMM starts at once; then me + 1, me + 2, ...) and adds 1 to
// chunk[me] there with release semantics. kPath: coll-style data path (0 ld/st, 1 TMA staging in dynamic smem).
// Before writing into rank d's gather buffer it waits for d's ready signal of this call; it publishes its own
// first (the host launches it after this rank's previous GEMM in stream order).
template <int kPath>
__global__ void __launch_bounds__(512) ag_gemm_push(Ctx ctx, AgPushParams p) {
    extern __shared__ __align__(128) char ag_push_smem[];
    const int W = ctx.local_world, me = ctx.local_rank;
    const int tid = static_cast<int>(threadIdx.x);
    // Running: the GEMM's stream waits until every producer block is resident (no deadlock behind the GEMM).
    if (tid == 0) ptx::red_add_relaxed_sys(&p.sig->started, uint64_t(1));
    if (blockIdx.x == 0 && tid < W)
        lang::signal_op(ctx, &p.sig->ready[me], p.epoch, lang::SignalOp::Set, ctx.local_base_rank + tid);

    const lang::Range share = lang::block_share(p.chunk_bytes, 16);  // 16-byte aligned pieces
    const uint64_t lo = share.lo, hi = share.hi;
    char* const dst = static_cast<char*>(p.gather) + static_cast<uint64_t>(me) * p.chunk_bytes + lo;
    const char* const src = static_cast<const char*>(p.a_local) + lo;

    auto push_all = [&](const auto& path) {
        for (int i = 0; i < W; ++i) {
            const int d = (me + i) % W;
            const int peer = ctx.local_base_rank + d;
            LOOM_PROF_ONLY(if (tid == 0) LOOM_PROF_BEGIN(lang::kTagAgPush, d));
            if (d != me) lang::wait(lang::block, ctx, &p.sig->ready[d], lang::Cmp::GE, p.epoch);
            if (hi > lo) {
                lang::put_signal(lang::block, ctx, dst, src, hi - lo, &p.sig->chunk[me], 1, lang::SignalOp::Add, peer,
                                 path);
            } else {
                lang::notify(lang::block, ctx, &p.sig->chunk[me], peer, 1, lang::SignalOp::Add);
            }
            LOOM_PROF_ONLY(if (tid == 0) LOOM_PROF_END(lang::kTagAgPush, d));
        }
    };
    if constexpr (kPath == 1) {
        push_all(lang::make_tma_staging(lang::block, ag_push_smem, p.stages, p.stage_bytes));
    } else {
        push_all(lang::LdSt{});
    }
}

// Direct producer (ranks sharing a GPU; host side src/ops/overlap/ag_gemm/direct.cpp): call e's one
// kernel before its GEMM, in stream order. It replaces 2W - 1 stream memory operations (cuStreamWaitValue64 /
// cuStreamWriteValue64, each a trip through the GPU's front end) and the runtime's copy:
//   block 0    read_done[me] := e - 1 at every peer: this rank's GEMM of call e - 1 (which read the peers' staging
//              halves) finished, since it precedes this kernel in stream order;
//   every block  waits read_done[q] >= e - 2 of every peer q (q's GEMM of call e - 2, the last reader of this rank's
//              staging half e % 2, finished), copies its share of the shard into the half, and adds 1 to
//              chunk[me] at every rank (release, sys: the share is visible to whoever sees the count). The GEMM
//              waits until chunk[r] reaches the host's cumulative count (gridDim.x per call, the same on every rank).
// No deadlock: rank p in call e waits for q's read_done >= e - 2, raised by q's stage kernel of call e - 1; that
// kernel ran, since p's GEMM of call e - 1 (before p's call e in stream order) waited for q's chunk count of call
// e - 1, which that kernel raised after the read_done store. The read_done of a rank's last call is never raised:
// only a later call would wait for it.
__global__ void __launch_bounds__(512) ag_gemm_direct_stage(Ctx ctx, AgDirectParams p) {
    const int W = ctx.local_world, me = ctx.local_rank;
    const int tid = static_cast<int>(threadIdx.x);
    LOOM_PROF_ONLY(if (tid == 0) LOOM_PROF_BEGIN(lang::kTagAgStage, me));
    if (blockIdx.x == 0 && tid < W && tid != me && p.epoch > 1)
        lang::signal_op(ctx, &p.sig->read_done[me], p.epoch - 1, lang::SignalOp::Set, ctx.local_base_rank + tid);
    if (tid < W && tid != me && p.epoch > 2)
        lang::signal_wait_until(ctx, &p.sig->read_done[tid], lang::Cmp::GE, p.epoch - 2);
    __syncthreads();
    if (const lang::Range r = lang::block_share(p.bytes, 16); r.size())
        lang::put(lang::block, ctx, static_cast<char*>(p.staging) + r.lo, static_cast<const char*>(p.shard) + r.lo,
                  r.size(), ctx.local_base_rank + me);
    for (int d = 0; d < W; ++d)
        lang::notify(lang::block, ctx, &p.sig->chunk[me], ctx.local_base_rank + d, 1, lang::SignalOp::Add);
    LOOM_PROF_ONLY(if (tid == 0) LOOM_PROF_END(lang::kTagAgStage, me));
}

}  // namespace loom::kernels::overlap
