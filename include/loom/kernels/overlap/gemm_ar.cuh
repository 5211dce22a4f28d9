// GEMM+AllReduce: C[M, N] on every rank = sum over ranks q of A_q[M, K_loc] * B_q[N, K_loc]^T, accumulated in fp32 in
// rank order 0..W-1. Two algorithms here (a third, ArAlgo::Sequential, is loom::gemm then loom::all_reduce:
// src/ops/overlap/gemm_ar/sequential.cpp).
//
// Reduce kernel (ArAlgo::ReduceKernel), two kernels running concurrently on every rank:
//
//   GEMM     the persistent Hopper GEMM with TileNotifyHooks (kernels/gemm_rs.cuh) writes the partial product
//            into this call's parity half of a symmetric double buffer and publishes each tile as soon as its TMA
//            stores completed (tile[i] = epoch, store-release, sys scope).
//   reduce   gemm_ar_reduce, a few blocks on a side stream, each claiming the next tile in the GEMM's order from a
//            counter; after the GEMM the same kernel again on every usable SM (the GEMM's stream), claiming from the
//            same counter what is left. One-shot: for each tile, thread q waits (acquire, sys) for rank q's signal of
//            it, then the block pulls the W partial tiles and writes C (every rank reduces the whole output).
//            Two-shot: the tile's owner (rank i % W of its index i in the GEMM's order) does that and also writes the
//            sum back into its own partial tile, then raises reduced[i]; every other rank waits for it and copies the
//            sum (see gemm_ar_reduce).
// No reset and no write-after-read signal: a rank writes parity (e + 1) % 2 in call e + 1 while peers may still
// read parity e % 2, and it cannot reach call e + 2 before every peer finished call e (its reduce of call e + 1
// waits, directly or through an owner's reduced signal, for every peer's GEMM of call e + 1, which each peer runs
// after its reduce of call e).
//
// Fused epilogue (ArAlgo::FusedEpilogue, ArEpilogueHooks; Auto's choice with a GPU per rank): no second kernel and no
// SM taken from the GEMM, which for M <= 128 is one wave of tiles bound by the bandwidth of reading B, so every SM
// counts. The kernel stages each consumer warpgroup's 64 x BLOCK_N part of the tile (TOut, 128B-swizzled 8 KiB slabs;
// gemm.cuh kWholeTile); then its issuing thread
//   1. bulk-copies the staged part (cp.async.bulk shared -> peer global; at M < 64 only its rows inside C, in
//      16-row groups) into this rank's slot of every peer's receive buffer, waits for the copies (wait_group 0, proxy
//      fence) and raises tile_in[me][part] := epoch at every peer (st.release.sys);
//   2. waits (acquire, sys) for tile_in[q][part] >= epoch of every peer q;
// and the warpgroup sums the W copies in fp32 in rank order 0..W-1 (its own from the staging buffer, the peers' from
// the receive buffer; the same order, hence the same bits, on every rank), rounds once to TOut in place and stores C
// with TMA. Every rank runs the same tile order, so a part's wait needs only the peers' same part, which each pushes
// before it waits: no cycle (all CTAs resident, grid <= the usable SMs). Write-after-read of the receive buffer:
// calls alternate parity halves, and a rank's call e + 2 starts after its call e + 1 waited for every peer's parts
// of call e + 1, which every peer pushed after finishing call e (stream order), its reads of half e % 2 included.
// The call number e and so the half are the device's (ArFusedSignals::launches, read by every CTA at its start and
// advanced by the last: lang/launch_epoch.cuh), not the host's: a CUDA graph that captured the call replays it as call
// e + 1, e + 2, ... The fused epilogue has its own op state (buffer, signals, counter): the other algorithms' calls
// between two of its calls do not touch them, so the argument above holds across them.
#pragma once

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 1  // wgmma kernel in this TU: no printf anywhere (ptxas C7510)
#endif

#include "loom/kernels/overlap/gemm_rs.cuh"

namespace loom::kernels::overlap {

// ---- the staged part (ArEpilogueHooks) -------------------------------------------------------------------------
// A chunk: 16 bytes per thread of the warpgroup, i.e. 16 rows x 128 bytes of a slab; a thread's chunk c is bytes
// (c x 128 + thread) x 16 of the part. Per slab (64 rows): 4.
inline constexpr int kChunksPerSlab = static_cast<int>(kGemmStoreBufBytes / 16) / 128;
// Chunks (kInFlight per round) covering the first `slabs` staged slabs of the part, rounded up to whole rounds: a
// round may run past the staged slabs (N tail) into the part's next slab, whose sums are never stored, but never past
// the part.
template <int kSlabs, int kInFlight>
LOOM_DEVICE LOOM_FORCEINLINE int staged_chunks(int slabs) {
    static_assert((kSlabs * kChunksPerSlab) % kInFlight == 0, "rounds stay inside the warpgroup's part");
    return (slabs * kChunksPerSlab + kInFlight - 1) / kInFlight * kInFlight;
}
// The warpgroup's issuing thread: TMA-stores the first `slabs` staged slabs (128-byte columns from col0) at `row`.
template <class TOut>
LOOM_DEVICE LOOM_FORCEINLINE void store_staged_slabs(const ptx::TmaDescriptor* tmap_c, uint8_t* bufs, int slabs,
                                                     int32_t col0, int32_t row) {
    constexpr int kStoreCols = gemm_store_box_cols(sizeof(TOut));
    for (int sl = 0; sl < slabs; ++sl)
        ptx::tma_store_2d(tmap_c, bufs + sl * kGemmStoreBufBytes, col0 + sl * kStoreCols, row);
    ptx::tma_store_commit();
}

// This call's number in the CTA (ArEpilogueHooks): 0 until consumer thread 0 has entered the launch epoch
// (consumer_start), then the number (>= 1), read by every consumer thread in store_tile.
LOOM_DEVICE LOOM_FORCEINLINE volatile uint64_t& ar_call_epoch() {
    __shared__ volatile uint64_t epoch;
    return epoch;
}

// Protocol (tile/hooks.cuh): StagedEpilogue.
struct ArEpilogueHooks {
    ArFusedHookArgs a;

    template <class Grid>
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const Grid& g, int32_t& m_block,
                                                 int32_t& n_block) const {
        tile::rotated_order(linear, g, 0, m_block, n_block);
    }
    // The CTA's thread 0, before the kernel's first __syncthreads: no number yet.
    LOOM_DEVICE LOOM_FORCEINLINE void init_cta() const { ar_call_epoch() = 0; }
    // Every consumer thread at its start: thread 0 (a consumer) enters the launch epoch (lang/launch_epoch.cuh) here
    // rather than in init_cta, so that its two dependent global round trips overlap the first mainloop instead of
    // holding the whole CTA (the producer's first loads) at the __syncthreads.
    LOOM_DEVICE LOOM_FORCEINLINE void consumer_start() const {
        if (threadIdx.x == 0) ar_call_epoch() = lang::launch_epoch_enter(a.launches);
    }

    // Every consumer thread, before its warpgroup stages the tile: the previous tile's C stores have read the
    // staging buffers out (each warpgroup's issuing thread waits for its bulk groups; the warpgroup's barrier).
    template <class TOut, int BLOCK_M, int BLOCK_N>
    LOOM_DEVICE LOOM_FORCEINLINE void before_epilogue(const tile::TileCoord&) const {
        const uint32_t tid = ptx::tid_x_unhoisted();
        if (tid % 128 == 0) ptx::tma_store_wait_read<0>();
        ptx::named_barrier_sync(2 + tid / 128, 128);
    }

    // Every consumer thread, once its warpgroup staged its part and passed the warpgroup's barrier (see the top of
    // the file).
    template <class TOut, int BLOCK_M, int BLOCK_N>
    LOOM_DEVICE LOOM_FORCEINLINE void store_tile(const ptx::TmaDescriptor* tmap_c, uint8_t* bufs,
                                                 const tile::TileCoord& t, int32_t n) const {
        constexpr int kStoreCols = gemm_store_box_cols(sizeof(TOut));
        constexpr int kSlabs = BLOCK_N / kStoreCols;
        constexpr int E = kVecElems<TOut>;
        constexpr int kInFlight = kSlabs % 2 == 0 ? 8 : 4;  // chunks per thread per round (staged_chunks)
        constexpr int64_t kTileBytes = int64_t(BLOCK_M) * BLOCK_N * sizeof(TOut);
        const uint32_t tid = ptx::tid_x_unhoisted();
        const int warpgroup = static_cast<int>(tid / 128), wg_thread = static_cast<int>(tid % 128);
        const int32_t cols = n - t.col0;
        const int slabs = cols >= BLOCK_N ? kSlabs : (cols + kStoreCols - 1) / kStoreCols;  // staged
        // Set long before, by thread 0 ahead of its first mainloop: the wait normally passes at once.
        uint64_t epoch = 0;
        const auto numbered = [&] { return (epoch = ar_call_epoch()) != 0; };
        const auto seen = [&] { return lang::WaitValues{0, epoch}; };
        lang::spin_or_trap(a.timeout_ns, "gemm_ar: consumer waits for the call number",
                           const_cast<const uint64_t*>(&ar_call_epoch()), lang::Cmp::NE, numbered, seen);
        uint8_t* const recv = a.recv + static_cast<int64_t>(epoch % 2) * a.half_stride;  // this call's half
        const int64_t tile = static_cast<int64_t>(t.m_block) * a.num_n + t.n_block;
        const int64_t part = 2 * tile + warpgroup;
        const int64_t offset = tile * kTileBytes + warpgroup * (kTileBytes / (BLOCK_M / 64));
        // The part's rows inside C, in 16-row groups (one chunk of each slab): at M < 64 only those travel and are
        // summed (at M = 16 the whole 64-row part is 4x the bytes the all_reduce of the same C moves).
        const int live_groups = (min(max(t.rows - warpgroup * 64, 0), 64) + 15) / 16;
        if (wg_thread == 0) {
            LOOM_PROF_BEGIN(lang::kTagArPushTile, part);
            for (int d = 0; d < a.world; ++d) {
                if (d == a.me) continue;
                uint8_t* dst =
                    recv + static_cast<int64_t>(d - a.me) * a.heap_bytes + rs_slot_of(a.me, d) * a.slot_bytes + offset;
                if (live_groups == kChunksPerSlab) {
                    ptx::cp_async_bulk_s2g(dst, bufs, static_cast<uint32_t>(slabs) * kGemmStoreBufBytes);
                } else if (live_groups > 0) {
                    for (int sl = 0; sl < slabs; ++sl)
                        ptx::cp_async_bulk_s2g(dst + sl * kGemmStoreBufBytes, bufs + sl * kGemmStoreBufBytes,
                                               static_cast<uint32_t>(live_groups) * (kGemmStoreBufBytes / 4));
                }
            }
            ptx::tma_store_commit();
            ptx::tma_store_wait<0>();
            ptx::fence_proxy_async_global();
            for (int d = 0; d < a.world; ++d) {
                if (d == a.me) continue;
                uint8_t* flag =
                    reinterpret_cast<uint8_t*>(a.tile_in + static_cast<int64_t>(a.me) * kMaxTileSignals + part);
                ptx::st_release_sys(reinterpret_cast<uint64_t*>(flag + static_cast<int64_t>(d - a.me) * a.heap_bytes),
                                    epoch);
            }
            LOOM_PROF_END(lang::kTagArPushTile, part);
            LOOM_PROF_BEGIN(lang::kTagArPeerWait, part);
            for (int q = 0; q < a.world; ++q)
                if (q != a.me)
                    lang::wait_ge_sys_or_trap(a.tile_in + static_cast<int64_t>(q) * kMaxTileSignals + part, epoch,
                                              a.timeout_ns, "gemm_ar: GEMM waits for a peer's tile");
            LOOM_PROF_END(lang::kTagArPeerWait, part);
        }
        ptx::named_barrier_sync(2 + warpgroup, 128);
        {
            const uint8_t* src = recv + offset;
            const int chunks = staged_chunks<kSlabs, kInFlight>(slabs);
            // Round c0's chunks of rank q's copy: this rank's from the staging buffer, a peer's from its slot.
            // Chunks of rows past C (c % kChunksPerSlab >= live_groups) were not sent: their sums are never stored.
            auto load = [&](int q, int c0, uint4(&v)[kInFlight]) {
                if (q == a.me) {
#pragma unroll
                    for (int i = 0; i < kInFlight; ++i)
                        v[i] = *reinterpret_cast<const uint4*>(bufs + ((c0 + i) * 128 + wg_thread) * 16);
                } else {
#pragma unroll
                    for (int i = 0; i < kInFlight; ++i)
                        v[i] = (c0 + i) % kChunksPerSlab < live_groups
                                   ? __ldcg(reinterpret_cast<const uint4*>(src + rs_slot_of(q, a.me) * a.slot_bytes +
                                                                           ((c0 + i) * 128 + wg_thread) * 16))
                                   : make_uint4(0, 0, 0, 0);
                }
            };
            for (int c0 = 0; c0 < chunks; c0 += kInFlight) {
                float sum[kInFlight][E];
                uint4 v[kInFlight];
                load(0, c0, v);  // rank order from rank 0: the same sums, hence bits, on every rank
#pragma unroll
                for (int i = 0; i < kInFlight; ++i) vec_add<TOut>(v[i], sum[i], true);
                for (int q = 1; q < a.world; ++q) {
                    load(q, c0, v);
#pragma unroll
                    for (int i = 0; i < kInFlight; ++i) vec_add<TOut>(v[i], sum[i], false);
                }
#pragma unroll
                for (int i = 0; i < kInFlight; ++i)
                    *reinterpret_cast<uint4*>(bufs + ((c0 + i) * 128 + wg_thread) * 16) = vec_pack<TOut>(sum[i]);
            }
            // Generic-proxy smem writes -> visible to the TMA stores.
            ptx::fence_proxy_async_smem();
            ptx::named_barrier_sync(2 + warpgroup, 128);
        }
        if (wg_thread == 0) store_staged_slabs<TOut>(tmap_c, bufs, slabs, t.col0, t.row0 + warpgroup * 64);
    }

    template <int BLOCK_M>
    LOOM_DEVICE LOOM_FORCEINLINE void finish() const {}
};
static_assert(tile::GemmHooks<ArEpilogueHooks> && tile::StagedEpilogue<ArEpilogueHooks>);

// ---- the reduce kernel (ArAlgo::ReduceKernel) --------------------------------------------------------------------
// (kArReduceThreads: overlap_params.hpp.)

// Whether tile `linear` (in the GEMM's order) is reduced by this rank: every tile in one-shot; in two-shot the tile's
// owner, rank linear % W. Every rank completes its tiles in the same order, so the owners' shares complete together.
LOOM_HOST_DEVICE inline int32_t ar_tile_owner(int32_t linear, int32_t world) { return linear % world; }

// Rows [row0, row0 + rows) x cols [col0, col0 + cols) of C: the W ranks' partial copies (src[q]: rank q's partial,
// leading dimension n) summed in fp32 in rank order 0..W-1 and stored to out (leading dimension ldo) and, when
// `back`, to back (this rank's partial: the two-shot's reduced tile, which the peers copy). U vectors per thread and
// round, every rank's load of a group of up to four ranks issued before the first add.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void ar_reduce_rows(const T* const (&src)[kMaxLocalPeers], int W, T* out, int64_t ldo,
                                                 T* back, int32_t n, int32_t row0, int32_t rows, int32_t col0,
                                                 int32_t cols) {
    constexpr int E = kVecElems<T>, U = 4, G = 4;
    constexpr int kThreads = kArReduceThreads;
    const int32_t vpr = cols / E, total = rows * vpr;
    for (int32_t base = static_cast<int32_t>(threadIdx.x); base < total; base += U * kThreads) {
        int64_t off[U], out_off[U];
#pragma unroll
        for (int v = 0; v < U; ++v) {
            const int32_t i = base + v * kThreads < total ? base + v * kThreads : base;  // past the end: redo
            const int32_t r = row0 + i / vpr, c = col0 + (i % vpr) * E;
            off[v] = int64_t(r) * n + c;
            out_off[v] = int64_t(r) * ldo + c;
        }
        float acc[U][E];
#pragma unroll
        for (int q0 = 0; q0 < kMaxLocalPeers; q0 += G) {
            if (q0 >= W) break;
            uint4 x[G][U];
#pragma unroll
            for (int g = 0; g < G; ++g)
#pragma unroll
                for (int v = 0; v < U; ++v)
                    x[g][v] = q0 + g < W ? ptx::ld_v4(src[q0 + g] + off[v]) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int g = 0; g < G; ++g)
                if (q0 + g < W)
#pragma unroll
                    for (int v = 0; v < U; ++v) vec_add<T>(x[g][v], acc[v], q0 + g == 0);
        }
#pragma unroll
        for (int v = 0; v < U; ++v) {
            if (base + v * kThreads >= total) continue;
            const uint4 sum = vec_pack<T>(acc[v]);
            ptx::st_v4(out + out_off[v], sum);
            if (back) ptx::st_v4(back + off[v], sum);
        }
    }
}

// The same rectangle copied from `src` (the owner's reduced tile in its partial, leading dimension n) to out.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void ar_copy_rows(const T* src, T* out, int64_t ldo, int32_t n, int32_t row0, int32_t rows,
                                               int32_t col0, int32_t cols) {
    constexpr int E = kVecElems<T>, U = 8;
    constexpr int kThreads = kArReduceThreads;
    const int32_t vpr = cols / E, total = rows * vpr;
    for (int32_t base = static_cast<int32_t>(threadIdx.x); base < total; base += U * kThreads) {
        uint4 x[U];
        int64_t out_off[U];
#pragma unroll
        for (int v = 0; v < U; ++v) {
            const int32_t i = base + v * kThreads < total ? base + v * kThreads : base;
            const int32_t r = row0 + i / vpr, c = col0 + (i % vpr) * E;
            x[v] = ptx::ld_v4(src + int64_t(r) * n + c);
            out_off[v] = int64_t(r) * ldo + c;
        }
#pragma unroll
        for (int v = 0; v < U; ++v)
            if (base + v * kThreads < total) ptx::st_v4(out + out_off[v], x[v]);
    }
}

// T: the partial / output element type. kArReduceThreads threads a block; launched twice a call on this rank, both
// launches claiming the tiles from one counter (p.claims, the call's claim k being tile k - p.claim_base): P blocks on
// the side stream beside the GEMM, then a grid over every usable SM on the GEMM's stream after it, which sums what
// the P blocks did not reach at the whole GPU's rate. A block's thread 0 claims the next tile in the GEMM's order
// (overlap_tile_order), the same order on every rank, and the block exits at its first claim past the last tile; per
// tile:
//   reduced here (one-shot: every tile; two-shot: the tiles this rank owns, ar_tile_owner)
//            thread q < W waits (acquire, sys) for rank q's tile[i] >= epoch; the block sums the W partial tiles
//            (rank order, fp32) into C; two-shot: also back into this rank's partial tile, then reduced[i] := epoch
//            here (the block's barrier, release at sys scope);
//   copied (two-shot, a peer's tile)
//            thread 0 waits (acquire, sys) for the owner's reduced[i] >= epoch; the block copies the owner's reduced
//            tile into C.
// Two-shot moves 3 tiles' bytes per tile and rank (one-shot W + 1) at the cost of the owner's hop.
// Progress: a tile's reduction waits only for the GEMMs, which wait for nothing. A copy of tile k waits for tile k's
// reduction at its owner, whose claims reach k once its tiles before k are done there: each of those is a reduction
// or a copy of a tile before k, so by induction on k every tile completes, once the GEMMs end and free their SMs,
// as long as every rank has a resident block that claims (the P side blocks are, from before the GEMM). The owner's
// in-place sum races with no reader: only the owner reads its own partial tile before the sum, and the peers only after
// reduced[i]. The claim counter: the side launch of call e ends before call e + 1's launches start (the join into the
// GEMM's stream), so a call's claims are contiguous from claim_base, and the host's base is exact: every block makes
// one claim per tile it takes plus one past the last.
// Write-after-read of the partial halves: see the top of the file; in two-shot a rank's call e + 1 waits (directly or
// through an owner's reduced[i]) for every rank's call e + 1 tiles, stored after that rank's call e ended.
template <class T>
__global__ void __launch_bounds__(kArReduceThreads) gemm_ar_reduce(Ctx ctx, ArParams p) {
    const int W = ctx.local_world;
    const int me = ctx.local_rank;
    const int tid = static_cast<int>(threadIdx.x);
    T* const out = static_cast<T*>(p.out);
    const int32_t num_m = (p.m + p.block_m - 1) / p.block_m;
    const int32_t num_n = (p.n + p.block_n - 1) / p.block_n;
    const int32_t num_tiles = num_m * num_n;
    const T* src_base[kMaxLocalPeers];
#pragma unroll
    for (int q = 0; q < kMaxLocalPeers; ++q)
        src_base[q] = lang::symm_at(ctx, static_cast<const T*>(p.partial), ctx.local_base_rank + (q < W ? q : 0));
    T* const mine = static_cast<T*>(p.partial);
    __shared__ int32_t claimed;

    for (;;) {
        if (tid == 0) {
            const uint64_t k = atomicAdd(reinterpret_cast<unsigned long long*>(p.claims), 1ull) - p.claim_base;
            claimed = k < static_cast<uint64_t>(num_tiles) ? static_cast<int32_t>(k) : -1;
        }
        __syncthreads();
        const int32_t linear = claimed;
        if (linear < 0) break;  // every thread read it: the block leaves together
        int32_t mb, nb;
        overlap_tile_order(linear, num_m, num_n, p.group_m, 0, mb, nb);
        const int64_t idx = static_cast<int64_t>(mb) * num_n + nb;
        const int32_t row0 = mb * p.block_m, col0 = nb * p.block_n;
        const int32_t rows = row0 + p.block_m < p.m ? p.block_m : p.m - row0;
        const int32_t cols = col0 + p.block_n < p.n ? p.block_n : p.n - col0;
        const int32_t owner = p.two_shot ? ar_tile_owner(linear, W) : me;
        LOOM_PROF_ONLY(if (tid == 0) LOOM_PROF_BEGIN(lang::kTagArReduceTile, idx));
        if (owner == me) {
            if (tid < W)
                lang::signal_wait_until(ctx, lang::symm_at(ctx, p.tile + idx, ctx.local_base_rank + tid), lang::Cmp::GE,
                                        p.epoch, lang::Scope::Sys, "gemm_ar: reduce kernel waits for a rank's tile",
                                        ctx.local_base_rank + tid);
            __syncthreads();
            ar_reduce_rows<T>(src_base, W, out, p.ldo, p.two_shot ? mine : nullptr, p.n, row0, rows, col0, cols);
            // Two-shot: the sum published to the peers (the block's barrier orders every thread's stores before it).
            if (p.two_shot) lang::notify(lang::block, ctx, p.reduced + idx, ctx.local_base_rank + me, p.epoch);
        } else {
            if (tid == 0)
                lang::signal_wait_until(ctx, lang::symm_at(ctx, p.reduced + idx, ctx.local_base_rank + owner),
                                        lang::Cmp::GE, p.epoch, lang::Scope::Sys,
                                        "gemm_ar: reduce kernel waits for the owner's reduced tile",
                                        ctx.local_base_rank + owner);
            __syncthreads();
            ar_copy_rows<T>(lang::symm_at(ctx, static_cast<const T*>(p.partial), ctx.local_base_rank + owner), out,
                            p.ldo, p.n, row0, rows, col0, cols);
        }
        LOOM_PROF_ONLY(if (tid == 0) LOOM_PROF_END(lang::kTagArReduceTile, idx));
        // The next claim overwrites `claimed` and the next tile's waits reuse the threads' registers: keep the block
        // in step.
        __syncthreads();
    }
}

}  // namespace loom::kernels::overlap
