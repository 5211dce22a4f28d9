// GEMM+ReduceScatter, fused pull (RsAlgo::FusedPull; docs/overlap.md): one kernel, the persistent Hopper GEMM
// (kernels/gemm.cuh) with RsPullHooks, on every usable SM. Nothing in the GEMM's consumers waits:
//
//   consumers  the plain GEMM and its plain epilogue (per-warp stmatrix + TMA stores) write the whole partial product
//              [M, N] into this call's parity half of the op's symmetric buffer, in the band-interleaved order of
//              rs_pull_tile_order (tile j of rank d's rows is linear d + W j on every rank). At the start of the next
//              tile's epilogue (or at the CTA's end) each warp's lane 0 waits for its bulk stores of the tile (issued a
//              whole mainloop earlier, so complete by then), fences the async proxy and counts its warp in (shared
//              memory, release at CTA scope). No barrier, no system-scope release on their path.
//   publisher  the producer warpgroup's warp 1, lane 0 (tile::SideWarps): walks the CTA's tiles in the scheduler's
//              order and, once every consumer warp counted tile i in (acquire, CTA scope), sets tile_in[me][tile] :=
//              epoch at the rank that owns the tile's rows (release, sys).
//   reducers   the producer warpgroup's warps 2 and 3: this rank's own tiles, each cut into W parts of BLOCK_M / W
//              rows, are dealt round-robin over the CTAs in the order every rank completes them; per part the
//              reducers' thread 0 polls (acquire, sys) tile_in[q][tile] >= epoch of every rank q (this one's
//              included), and the 64 threads sum the W copies of the rows (fp32, rank order 0..W-1, peers' read
//              through their symmetric addresses: same GPU or NVLink) into C [M / W, N].
//   finish     gemm_rs_pull_finish, right after the GEMM on the same stream: the parts the reducers left (below).
//
// Why: an own tile's sum waits for the slowest rank's copy. In the fused epilogue (kernels/gemm_rs.cuh) that wait
// stalls the consumers, i.e. the tensor cores; here only the reducers wait, while the consumers go on with the next
// tiles, and the bands' interleaving spreads every rank's reductions over the whole GEMM.
// Deadlock freedom. No CTA of the GEMM holds its SM waiting for another rank: once the CTA's last tile is published
// (`done`), a reducer waits for a part at most kRsPullGraceNs (200 us) more and then hands that part and every later
// one of its walk to gemm_rs_pull_finish (the leftover list) and ends. (Waiting until every part is ready can hang:
// with 8 ranks sharing one H200 under MPS a rank's last CTAs may find no SM, held by the other ranks' waiting CTAs.)
// So every rank's GEMM completes whatever the others do, as a plain GEMM does, and gemm_rs_pull_finish (a few blocks,
// stream-ordered after it) waits only for tiles that complete. The publisher waits only for its own CTA's consumers,
// which never wait. Write-after-read of the partial halves: a rank writes half e % 2 again in call e + 2, which starts
// after its call e + 1 ended (GEMM and finish); together they waited for every rank's call e + 1 tiles of its rows,
// which each rank stored only after its call e had ended (stream order), its reducers' and finish kernel's reads of our
// half e % 2 included. alpha = 1 and no bias (gemm_rs passes neither).
#pragma once

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 1  // wgmma kernel in this TU: no printf anywhere (ptxas C7510)
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/kernels/gemm/gemm.cuh"
#include "loom/kernels/overlap/gemm_rs.cuh"
#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/lang/lang.cuh"
#include "loom/ptx/async.cuh"
#include "loom/ptx/memory.cuh"

namespace loom::kernels::overlap {

// The CTA's publication state in shared memory: `stored` counts consumer warps' arrivals (one per warp and tile, once
// the tile's TMA stores are complete), `started[w]` marks consumer warp w past its first epilogue (its lane 0 only).
struct RsPullCta {
    uint32_t stored;
    volatile uint32_t done;  // the publisher published the CTA's last tile
    volatile uint32_t
        verdict[2];  // the reducers' thread 0 to the others, per part (alternating): 1 ready, 0 handed over
    uint8_t started[16];
};
LOOM_DEVICE LOOM_FORCEINLINE RsPullCta& rs_pull_cta() {
    __shared__ RsPullCta cta;
    return cta;
}

// How long a reducer still waits for a part once its CTA's GEMM work is done, before handing the rest to the finish
// kernel: longer than the usual skew between ranks (their kernels start up to ~20-30 us apart with 8 ranks under MPS;
// 20 us here handed tails to the finish kernel often enough to cost ~2 %), short enough that a rank starved of SMs
// gets them back soon.
inline constexpr uint64_t kRsPullGraceNs = 200000;
// Named barrier of the 64 reducer threads (the GEMM's consumers use 1 and 2 + warpgroup).
inline constexpr uint32_t kRsPullReducerBarrier = 7;

// This rank's own tile of unit u (part u % W of own tile u / W, in the order every rank completes them).
LOOM_DEVICE LOOM_FORCEINLINE int64_t rs_pull_unit_tile(const RsPullHookArgs& a, int64_t u, int32_t& mb, int32_t& nb) {
    tile::grouped_order(static_cast<int32_t>(u / a.world), tile::TileGrid{a.blocks_per_rank, a.num_n, a.group}, mb, nb);
    mb += a.me * a.blocks_per_rank;
    return int64_t(mb) * a.num_n + nb;
}
// Whether every rank stored its copy of tile `tile_id` in this call (acquire, sys).
LOOM_DEVICE LOOM_FORCEINLINE bool rs_pull_ready(const RsPullHookArgs& a, int64_t tile_id) {
    for (int q = 0; q < a.world; ++q)
        if (static_cast<int64_t>(ptx::ld_acquire_sys(a.tile_in + static_cast<int64_t>(q) * kMaxTileSignals + tile_id) -
                                 a.epoch) < 0)
            return false;
    return true;
}

// Ranks q .. q + G - 1 of U vectors (byte offsets off[] from `mine`, this rank's copy; rank q's is (q - me) heaps
// away) added to acc in rank order: every load issued before the first add.
template <class TOut, int U, int G>
LOOM_DEVICE LOOM_FORCEINLINE void rs_pull_add_ranks(const RsPullHookArgs& a, const uint8_t* mine,
                                                    const int64_t (&off)[U], float (&acc)[U][kVecElems<TOut>], int q) {
    uint4 x[G][U];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const uint8_t* src = mine + static_cast<int64_t>(q + g - a.me) * a.heap_bytes;
#pragma unroll
        for (int v = 0; v < U; ++v) x[g][v] = ptx::ld_v4_na(src + off[v]);
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int v = 0; v < U; ++v) vec_add<TOut>(x[g][v], acc[v], q + g == 0);
}

// Unit u (its tile ready on every rank): the part's rows of the W copies summed into C by kThreads threads. U vectors
// per thread and round, of up to four ranks at once: 16 loads of 16 bytes in flight per thread (one rank at a time
// left the reducers latency-bound: W load latencies per round).
template <class TOut, int BLOCK_M, int BLOCK_N, int kThreads>
LOOM_DEVICE LOOM_FORCEINLINE void rs_pull_reduce_unit(const RsPullHookArgs& a, int64_t u, int thread) {
    constexpr int E = kVecElems<TOut>, U = 4;
    constexpr int64_t es = sizeof(TOut);
    const int W = a.world;
    int32_t mb, nb;
    rs_pull_unit_tile(a, u, mb, nb);
    const int32_t part = static_cast<int32_t>(u % W);
    const int32_t r0 = part * BLOCK_M / W, r1 = (part + 1) * BLOCK_M / W;
    const int32_t col0 = nb * BLOCK_N;
    const int32_t cols = a.n - col0 < BLOCK_N ? a.n - col0 : BLOCK_N;
    const int32_t vpr = cols / E, total = (r1 - r0) * vpr;
    // This rank's copy of the tile's first element.
    const uint8_t* const mine = a.partial + (int64_t(mb) * BLOCK_M * a.n + col0) * es;
    uint8_t* const dst = a.out + (int64_t(mb - a.me * a.blocks_per_rank) * BLOCK_M * a.ldc + col0) * es;
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
        for (; q + 4 <= W; q += 4) rs_pull_add_ranks<TOut, U, 4>(a, mine, off, acc, q);
        if (q + 2 <= W) {
            rs_pull_add_ranks<TOut, U, 2>(a, mine, off, acc, q);
            q += 2;
        }
        if (q < W) rs_pull_add_ranks<TOut, U, 1>(a, mine, off, acc, q);
#pragma unroll
        for (int v = 0; v < U; ++v)
            if (base + v * kThreads < total) ptx::st_v4(dst + out_off[v], vec_pack<TOut>(acc[v]));
    }
}

// Protocols (tile/hooks.cuh): SideWarps, and AccEpilogue only to learn of a tile's epilogue (the previous tile's
// stores are then complete, without a stall); the accumulators are left as they are and stored by the plain epilogue.
struct RsPullHooks {
    RsPullHookArgs a;

    template <class Grid>
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const Grid& g, int32_t& m_block,
                                                 int32_t& n_block) const {
        rs_pull_tile_order(linear, a.world, a.blocks_per_rank, g.num_n, a.group, m_block, n_block);
    }
    LOOM_DEVICE LOOM_FORCEINLINE void init_cta() const {
        RsPullCta& c = rs_pull_cta();
        c.stored = 0;
        c.done = 0;
        for (int w = 0; w < 16; ++w) c.started[w] = 0;
    }
    LOOM_DEVICE LOOM_FORCEINLINE int32_t d_row_offset() const { return 0; }

    // Every consumer thread, at a tile's epilogue and after the CTA's last: each warp's lane 0 waits for its bulk
    // stores of the previous tile (issued a whole mainloop earlier: complete by now; bulk groups are per thread),
    // fences them against later generic accesses and counts its warp in (release, CTA scope). No barrier: the
    // publisher warp raises the tile's signal once every consumer warp is in.
    LOOM_DEVICE LOOM_FORCEINLINE void arrive() const {
        const uint32_t tid = ptx::tid_x_unhoisted();
        if ((tid & 31u) != 0) return;
        RsPullCta& c = rs_pull_cta();
        if (c.started[tid / 32] != 0) {
            ptx::tma_store_wait<0>();
            ptx::fence_proxy_async_global();
            ptx::red_add_release_cta_shared(&c.stored, 1u);
        }
        c.started[tid / 32] = 1;
    }
    template <class TOut, int BLOCK_M, int BLOCK_N>
    LOOM_DEVICE LOOM_FORCEINLINE bool epilogue_acc(float (&)[BLOCK_N / 2], const tile::TileCoord&) const {
        arrive();
        return true;
    }
    template <int BLOCK_M>
    LOOM_DEVICE LOOM_FORCEINLINE void finish() const {
        arrive();
    }

    // The publisher (producer warpgroup's warp 1, lane 0): walks this CTA's tiles as the scheduler deals them and,
    // once every consumer warp counted tile i in, sets tile_in[me][tile] := epoch at the tile's owner (release, sys:
    // cumulative over the consumers' stores it acquired). Off the consumers' path: a release at system scope on
    // their thread 0 cost 1.5-3.4 % of the GEMM (8 ranks on one H200, small K).
    template <int BLOCK_M>
    LOOM_DEVICE LOOM_FORCEINLINE void publisher() const {
        constexpr uint32_t kWarps = BLOCK_M / 16;  // consumer warps
        const int32_t num_tiles = a.world * a.blocks_per_rank * a.num_n;
        const RsPullCta& c = rs_pull_cta();
        uint32_t count = 0;
        for (int32_t linear = static_cast<int32_t>(blockIdx.x), i = 1; linear < num_tiles;
             linear += static_cast<int32_t>(gridDim.x), ++i) {
            while (count < kWarps * static_cast<uint32_t>(i)) {
                count = ptx::ld_acquire_cta_shared(&c.stored);
                if (count < kWarps * static_cast<uint32_t>(i)) ptx::nanosleep(64);
            }
            int32_t mb, nb;
            rs_pull_tile_order(linear, a.world, a.blocks_per_rank, a.num_n, a.group, mb, nb);
            const int64_t tile_id = int64_t(mb) * a.num_n + nb;
            const int32_t owner = mb / a.blocks_per_rank;
            uint8_t* flag =
                reinterpret_cast<uint8_t*>(a.tile_in + static_cast<int64_t>(a.me) * kMaxTileSignals + tile_id);
            ptx::st_release_sys(reinterpret_cast<uint64_t*>(flag + static_cast<int64_t>(owner - a.me) * a.heap_bytes),
                                a.epoch);
        }
        rs_pull_cta().done = 1u;
    }

    // The producer warpgroup's threads 32-127 (thread 0-95): warp 1 publishes, warps 2-3 reduce this rank's own
    // tiles' parts (units), dealt round-robin over the CTAs: CTA b walks units b, b + G, ... in the order every rank
    // completes their tiles (rs_pull_tile_order: tile j of band me is linear me + W j everywhere).
    template <class TOut, int BLOCK_M, int BLOCK_N>
    LOOM_DEVICE LOOM_FORCEINLINE void side_warps(int thread) const {
        constexpr int kThreads = 64;
        if (thread < 32) {
            if (thread == 0) publisher<BLOCK_M>();
            return;
        }
        thread -= 32;
        if ((kRsDiagSkip & 1) != 0) return;
        RsPullCta& c = rs_pull_cta();
        const int64_t units = int64_t(a.blocks_per_rank) * a.num_n * a.world;
        const int64_t step = gridDim.x;
        uint32_t k = 0;  // parts walked: selects the verdict slot
        for (int64_t u = blockIdx.x; u < units; u += step, ++k) {
            if (thread == 0) {
                int32_t mb, nb;
                const int64_t tile_id = rs_pull_unit_tile(a, u, mb, nb);
                uint64_t give_up_at = 0;  // set once the CTA's GEMM work is done
                bool ready = (kRsDiagSkip & 4) == 0 && rs_pull_ready(a, tile_id);
                while (!ready && (kRsDiagSkip & 4) == 0) {
                    if (give_up_at == 0 && c.done != 0u) give_up_at = ptx::globaltimer() + kRsPullGraceNs;
                    if (give_up_at != 0 && ptx::globaltimer() > give_up_at) break;
                    ptx::nanosleep(100);
                    ready = rs_pull_ready(a, tile_id);
                }
                if (!ready) {
                    // This part and every later one of the walk to gemm_rs_pull_finish.
                    const uint32_t n = static_cast<uint32_t>((units - 1 - u) / step + 1);
                    const uint32_t parity = static_cast<uint32_t>(a.epoch & 1u);
                    const uint32_t at = atomicAdd(a.leftover + parity, n);
                    uint32_t* list = a.leftover + 4 + int64_t(parity) * kMaxTileSignals;
                    for (uint32_t i = 0; i < n; ++i) list[at + i] = static_cast<uint32_t>(u + int64_t(i) * step);
                }
                c.verdict[k & 1u] = ready ? 1u : 0u;
            }
            ptx::named_barrier_sync(kRsPullReducerBarrier, kThreads);
            if (c.verdict[k & 1u] == 0u) return;
            if ((kRsDiagSkip & 2) != 0) continue;
            rs_pull_reduce_unit<TOut, BLOCK_M, BLOCK_N, kThreads>(a, u, thread);
        }
    }
};
static_assert(tile::GemmHooks<RsPullHooks> && tile::AccEpilogue<RsPullHooks> && tile::SideWarps<RsPullHooks>);

// The parts the GEMM's reducers handed over (RsPullHookArgs::leftover of this call's parity), on the GEMM's stream
// right after it: block b takes entries b, b + gridDim.x, ...; its thread 0 waits (acquire, sys; bounded by
// timeout_ns) until every rank stored the part's tile, then the block sums it. Block 0 first zeroes the next call's
// count (the GEMM of call e + 1 appends to it only after this kernel).
template <class TOut, int BLOCK_M, int BLOCK_N>
__global__ void __launch_bounds__(kRsPullFinishThreads) gemm_rs_pull_finish(RsPullHookArgs a) {
    const uint32_t parity = static_cast<uint32_t>(a.epoch & 1u);
    if (blockIdx.x == 0 && threadIdx.x == 0) a.leftover[parity ^ 1u] = 0;
    const uint32_t n = a.leftover[parity];
    const uint32_t* list = a.leftover + 4 + int64_t(parity) * kMaxTileSignals;
    for (uint32_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t u = list[i];
        if (threadIdx.x == 0) {
            int32_t mb, nb;
            const int64_t tile_id = rs_pull_unit_tile(a, u, mb, nb);
            for (int q = 0; q < a.world; ++q)
                lang::wait_ge_sys_or_trap(a.tile_in + static_cast<int64_t>(q) * kMaxTileSignals + tile_id, a.epoch,
                                          a.timeout_ns,
                                          "gemm_rs (fused pull): the finish kernel waits for a rank's tile");
        }
        __syncthreads();
        rs_pull_reduce_unit<TOut, BLOCK_M, BLOCK_N, kRsPullFinishThreads>(a, u, static_cast<int>(threadIdx.x));
        __syncthreads();
    }
}

}  // namespace loom::kernels::overlap
