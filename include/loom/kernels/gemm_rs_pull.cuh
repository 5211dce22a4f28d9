// GEMM+ReduceScatter, fused pull (RsAlgo::FusedPull; docs/overlap.md): one kernel, the persistent Hopper GEMM
// (kernels/gemm.cuh) with RsPullHooks, on every usable SM. Nothing in the GEMM's consumers waits:
//
//   consumers  the plain GEMM and its plain epilogue (per-warp stmatrix + TMA stores) write the whole partial product
//              [M, N] into this call's parity half of the op's symmetric buffer, in the band-interleaved order of
//              rs_pull_tile_order (tile j of rank d's rows is linear d + W j on every rank). At the start of the next
//              tile's epilogue (or at the CTA's end) the previous tile is published to the rank that owns its rows:
//              each warp's lane 0 waits for its bulk stores (wait_group 0, issued a whole mainloop earlier, so
//              complete by then) and fences the async proxy, the consumers meet at a named barrier, and thread 0 sets
//              tile_in[me][tile] := epoch at the owner (release, sys).
//   reducers   the producer warpgroup's three warps that issue no TMA (kSideWarps): this rank's own tiles, each cut
//              into W parts of BLOCK_M / W rows, are dealt round-robin over the CTAs in the order every rank completes
//              them; per part a warp's lane 0 waits (acquire, sys) for tile_in[q][tile] >= epoch of every rank q (this
//              one's included), and the 96 threads sum the W copies of the rows (fp32, rank order 0..W-1, peers'
//              read through their symmetric addresses: same GPU or NVLink) into C [M / W, N].
//
// Why: an own tile's sum waits for the slowest rank's copy. In the fused epilogue (kernels/gemm_rs.cuh) that wait
// stalls the consumers, i.e. the tensor cores; here only the reducers wait, while the consumers go on with the next
// tiles, and the bands' interleaving spreads every rank's reductions over the whole GEMM (the tail is the last wave's
// parts, 1 / W of a tile per CTA).
// Deadlock freedom: the consumers never wait, so every tile is stored and published; a reducer waits only for
// published tiles, and every CTA is resident (grid <= the usable SMs), so each wait ends.
// Write-after-read of the partial halves: a rank writes half e % 2 again in call e + 2, which starts after its call
// e + 1 ended; that call's reducers waited for every rank's call e + 1 tiles of its rows, which each rank stored only
// after its call e had ended (stream order), its reducers' reads of our half e % 2 included.
// alpha = 1 and no bias (gemm_rs passes neither).
#pragma once

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 1  // wgmma kernel in this TU: no printf anywhere (ptxas C7510)
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/kernels/gemm.cuh"
#include "loom/kernels/gemm_rs.cuh"
#include "loom/kernels/overlap_params.hpp"
#include "loom/lang/lang.cuh"
#include "loom/ptx/async.cuh"
#include "loom/ptx/memory.cuh"

namespace loom::kernels::overlap {

// m_block * num_n + n_block of this CTA's stored tile not yet published, or -1. Consumer thread 0 reads and writes it.
LOOM_DEVICE LOOM_FORCEINLINE int32_t& rs_pull_pending() {
    __shared__ int32_t pending;
    return pending;
}

struct RsPullHooks {
    static constexpr bool kWaitsBeforeLoad = false;
    static constexpr bool kRedirectsA = false;
    static constexpr bool kNotifiesAfterStore = false;
    static constexpr bool kEpilogueHooks = false;
    // The accumulator hooks only to publish a tile one epilogue late (its stores complete by then without a stall);
    // the accumulators are left as they are and stored by the plain epilogue.
    static constexpr bool kAccEpilogue = true;
    static constexpr bool kSideWarps = true;
    RsPullHookArgs a;

    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const tile::TileGrid& g, int32_t& m_block,
                                                 int32_t& n_block) const {
        rs_pull_tile_order(linear, a.world, a.blocks_per_rank, g.num_n, a.group, m_block, n_block);
    }
    LOOM_DEVICE LOOM_FORCEINLINE void before_load(const tile::TileCoord&) const {}
    LOOM_DEVICE LOOM_FORCEINLINE void after_store(const tile::TileCoord&) const {}
    LOOM_DEVICE LOOM_FORCEINLINE void init_cta() const { rs_pull_pending() = -1; }
    template <class TOut, int BLOCK_M, int BLOCK_N>
    LOOM_DEVICE LOOM_FORCEINLINE void prefetch_epilogue(const tile::TileCoord&) const {}
    LOOM_DEVICE LOOM_FORCEINLINE int32_t d_row_offset() const { return 0; }

    // Every consumer thread: the pending tile's TMA stores complete (each warp's lane 0 issued its own: bulk groups
    // are per thread), then thread 0 publishes it to its owner.
    template <int kConsumers>
    LOOM_DEVICE LOOM_FORCEINLINE void publish() const {
        const uint32_t tid = ptx::tid_x_unhoisted();
        if ((tid & 31u) == 0) {
            ptx::tma_store_wait<0>();
            ptx::fence_proxy_async_global();
        }
        ptx::named_barrier_sync(1, kConsumers * 128);
        if (tid == 0) {
            const int32_t p = rs_pull_pending();
            if (p >= 0) {
                const int32_t owner = p / a.num_n / a.blocks_per_rank;
                uint8_t* flag =
                    reinterpret_cast<uint8_t*>(a.tile_in + static_cast<int64_t>(a.me) * kMaxTileSignals + p);
                ptx::st_release_sys(
                    reinterpret_cast<uint64_t*>(flag + static_cast<int64_t>(owner - a.me) * a.heap_bytes), a.epoch);
            }
        }
    }

    template <class TOut, int BLOCK_M, int BLOCK_N>
    LOOM_DEVICE LOOM_FORCEINLINE bool epilogue_acc(float (&)[BLOCK_N / 2], const tile::TileCoord& t) const {
        publish<BLOCK_M / 64>();
        if (ptx::tid_x_unhoisted() == 0) rs_pull_pending() = t.m_block * a.num_n + t.n_block;
        return true;
    }

    template <int BLOCK_M>
    LOOM_DEVICE LOOM_FORCEINLINE void finish() const {
        publish<BLOCK_M / 64>();
    }

    // The producer warpgroup's threads 32-127 (thread 0-95): this rank's own tiles' reductions, part by part.
    template <class TOut, int BLOCK_M, int BLOCK_N>
    LOOM_DEVICE LOOM_FORCEINLINE void side_warps(int thread) const {
        constexpr int E = kVecElems<TOut>;
        constexpr int kThreads = 96;
        constexpr int U = 4;  // vectors per thread per round, two ranks' loads in flight: 8 x 16 bytes
        constexpr int64_t es = sizeof(TOut);
        const int W = a.world, me = a.me, lane = thread % 32;
        const int32_t bpr = a.blocks_per_rank, num_n = a.num_n;
        const int64_t units = int64_t(bpr) * num_n * W;  // (own tile j, part p): rows [p BLOCK_M / W, ...)
        for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
            const int32_t j = static_cast<int32_t>(u / W), part = static_cast<int32_t>(u % W);
            int32_t mb, nb;
            tile::grouped_order(j, tile::TileGrid{bpr, num_n, a.group}, mb, nb);
            mb += me * bpr;
            const int64_t tile_id = int64_t(mb) * num_n + nb;
            if (lane == 0) {
                for (int q = 0; q < W; ++q)
                    lang::wait_ge_sys_or_trap(a.tile_in + static_cast<int64_t>(q) * kMaxTileSignals + tile_id, a.epoch,
                                              a.timeout_ns, "gemm_rs (fused pull): a reducer waits for a rank's tile");
            }
            __syncwarp();
            const int32_t r0 = part * BLOCK_M / W, r1 = (part + 1) * BLOCK_M / W;
            const int32_t col0 = nb * BLOCK_N;
            const int32_t cols = a.n - col0 < BLOCK_N ? a.n - col0 : BLOCK_N;
            const int32_t vpr = cols / E, total = (r1 - r0) * vpr;
            // This rank's copy of the tile's first element; rank q's is (q - me) heaps away.
            const uint8_t* const mine = a.partial + (int64_t(mb) * BLOCK_M * a.n + col0) * es;
            uint8_t* const dst = a.out + (int64_t(mb - me * bpr) * BLOCK_M * a.ldc + col0) * es;
            for (int32_t base = thread; base < total; base += U * kThreads) {
                int64_t off[U], out_off[U];
#pragma unroll
                for (int v = 0; v < U; ++v) {
                    const int32_t i = base + v * kThreads < total ? base + v * kThreads : base;  // past the end: redo
                    const int32_t r = r0 + i / vpr, c = (i % vpr) * E;
                    off[v] = (int64_t(r) * a.n + c) * es;
                    out_off[v] = (int64_t(r) * a.ldc + c) * es;
                }
                float acc[U][E];
                int q = 0;
                for (; q + 1 < W; q += 2) {
                    const uint8_t* s0 = mine + static_cast<int64_t>(q - me) * a.heap_bytes;
                    const uint8_t* s1 = s0 + a.heap_bytes;
                    uint4 x0[U], x1[U];
#pragma unroll
                    for (int v = 0; v < U; ++v) x0[v] = ptx::ld_v4_na(s0 + off[v]);
#pragma unroll
                    for (int v = 0; v < U; ++v) x1[v] = ptx::ld_v4_na(s1 + off[v]);
#pragma unroll
                    for (int v = 0; v < U; ++v) {
                        vec_add<TOut>(x0[v], acc[v], q == 0);
                        vec_add<TOut>(x1[v], acc[v], false);
                    }
                }
                if (q < W) {
                    const uint8_t* s0 = mine + static_cast<int64_t>(q - me) * a.heap_bytes;
                    uint4 x0[U];
#pragma unroll
                    for (int v = 0; v < U; ++v) x0[v] = ptx::ld_v4_na(s0 + off[v]);
#pragma unroll
                    for (int v = 0; v < U; ++v) vec_add<TOut>(x0[v], acc[v], q == 0);
                }
#pragma unroll
                for (int v = 0; v < U; ++v)
                    if (base + v * kThreads < total) ptx::st_v4(dst + out_off[v], vec_pack<TOut>(acc[v]));
            }
        }
    }
};

}  // namespace loom::kernels::overlap
