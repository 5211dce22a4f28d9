// Hopper GEMM: D[M, N] = alpha * A[M, K] * B^T + beta * D + bias[N], bf16/fp16 (or fp8 e4m3 with B [N, K]) in, fp32
// accumulate.
//
// Data path: TMA (128B swizzle) -> STAGES-deep mbarrier ring in shared memory -> wgmma (both operands from
// shared memory) -> registers -> 128B-swizzled staging buffers in shared memory -> TMA stores (a BLOCK_N that is not
// a multiple of the store box ends with a slab overlapping the one before it; when beta != 0 or BLOCK_N is narrower
// than one box, vectorised global stores). Persistent: gridDim.x <= #SMs CTAs
// walk the output tiles in the order of the Hooks policy (tile/scheduler.cuh, tile/hooks.cuh).
//
// Warp roles (BLOCK_M / 64 = 1, 2 or 3 consumer warpgroups + 1 producer warpgroup, one CTA per SM; three compile
// under a 128-register cap, hence BLOCK_N <= 176 there, src/ops/gemm/gemm_internal.hpp: kGemmMaxBlockN192):
//   consumers  warpgroup c computes rows [64c, 64c + 64) of the tile with wgmma m64nBLOCK_Nk16, keeps one
//              k-block of MMAs in flight, releases a slot when the MMAs that read it retired, then runs the
//              epilogue while the producer already streams the next tile's k-blocks. The epilogue is per warp, with
//              no warpgroup barrier: each warp writes its 16 rows of a 128-byte-wide slab into one of its (two; one
//              with three consumer warpgroups)
//              staging buffers (stmatrix for 16-bit output without alpha / bias, TBias = void; pair stores
//              otherwise) and its lane 0 issues the slab's TMA store (16-row box), which completes asynchronously
//              while the warp goes on (to the next slab, or the next tile's MMAs).
//   producer   one thread: per tile, hooks.before_load() (LoadWait), then per k-block: wait slot empty, expect_tx,
//              TMA A (BLOCK_M x 64) and B (BLOCK_N x 64, or 64 x BLOCK_N when B is [K, N]). setmaxnreg moves its
//              registers to the consumers (40 / 232 per thread).
// Clusters (CLUSTER_M = 2): two CTAs with adjacent M-blocks and the same N-block; each loads its own A and half
//   of the shared B tile, multicast into both CTAs' shared memory, so L2 -> SM traffic per k-block drops from
//   (BM + BN) to (BM + BN / 2) rows. A slot's empty barrier counts the consumer warpgroups of both CTAs (each
//   warpgroup's warp 0 arrives locally and remotely), so neither producer overwrites a slot its peer still reads.
// Shared memory: STAGES x (BLOCK_M + BLOCK_N) x 128 B + BLOCK_M / 64 x 2 x 8 KiB staging (1 x 8 KiB with three
//   consumers) (+ barriers, + 1 KiB alignment slack): 128 x 256, 4 stages = 225 KiB; 192 x 176, 4 stages = 209 KiB
//   (gemm_params.hpp: gemm_sm90_smem_bytes).
// Hooks: the policy's protocols (tile/hooks.cuh states each one's contract) and what the kernel does for them.
//   TileOrder       the scheduler walks the CTA's tiles in the policy's order.
//   LoadWait        the producer calls hooks.before_load() before a tile's first load (above) and fences the async
//                   proxy; ASource may point the tile's A loads at another tensor map.
//   StoreNotify     after the tile's stores complete and a barrier of the consumers, thread 0 calls after_store. The
//                   kernel then looks the next tile up on the tile boundary, with the divisions (kLookahead,
//                   kFastOrder below).
//   StagedEpilogue  (GEMM+AllReduce's fused epilogue) each consumer warpgroup stages its whole 64 x BLOCK_N part of the
//                   tile (kWholeTile: BLOCK_N x sizeof(TOut) x 64 bytes per warpgroup, so fewer stages fit: 128 x 256
//                   bf16 gets 3) and the hooks store, send or combine it; the accumulators are zeroed before each
//                   mainloop, dead during the hooks' work.
//   AccEpilogue     (GEMM+ReduceScatter's fused epilogue and fused pull) the hooks get the fp32 accumulators after the
//                   mainloop; the plain epilogue stores what they keep, d_row_offset() rows above t.row0 in D. The
//                   staging buffers and stages are the plain kernel's. With AccRingCopies the kernel then adds the
//                   hooks' copies of the tile (e.g. peers' partial sums of it): the producer, after the tile's last
//                   k-block, waits for them (ring_wait) and bulk-copies each warpgroup part into the B slot of a ring
//                   stage, as if they were more k-blocks; each consumer warpgroup adds its parts from shared memory and
//                   releases the stages. So the consumers neither poll signals nor wait on global loads in their
//                   epilogue.
//   SideWarps       (GEMM+ReduceScatter's fused pull) the producer warpgroup's three warps that issue no TMA run
//                   hooks.side_warps() beside the GEMM; no role changes its register budget then (setmaxnreg), so
//                   every thread keeps the launch bound's 168.
// Split-K tail (kSplitTail; CLUSTER_M = 1; the plain GEMM, or hooks with neither an epilogue protocol nor StoreNotify,
//   e.g. ag_gemm's, whose before_load then runs once per work unit): the CTAs walk work units instead of tiles
//   (tile_order.hpp: split_tail_unit): whole tiles for the full waves, then each tail tile as args.tail_splits
//   K-ranges. A split unit's consumers hand their fp32 partial to a workspace slot and count themselves in on the
//   tile's counter; the last of the splits to arrive sums the slots in split order and runs the epilogue
//   (split_tail_fixup below). No CTA ever waits for another, so any residency (MPS, few SMs) is deadlock-free.
// K-clusters (CLUSTER_K = 2, 4 or 8; CLUSTER_M = 1, the plain GEMM without hooks, the direct-store epilogue): a
//   cluster of CLUSTER_K CTAs computes one tile, rank r over k-blocks [r nkb / S, (r + 1) nkb / S) (S = CLUSTER_K),
//   and the ranks sum their partials in distributed shared memory instead of a global workspace: each writes its
//   partial into its own idle ring, a cluster barrier, then rank r sums fragment columns [r F / S, (r + 1) F / S) of
//   the tile (F = BLOCK_N / 8) over the ranks in rank order, reading the peers' rings, and stores them
//   (cluster_k_sum below). The host launches exactly one cluster per tile (gridDim.x = tiles x S): every CTA takes
//   part in the same two cluster barriers, which a cluster is scheduled whole to pass. For decode-sized GEMMs with
//   few tiles: S times the SMs streaming B, with no counter, slot round trip through L2 or serial fix-up.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "loom/config.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/lang/profile.cuh"
#include "loom/ptx/async.cuh"
#include "loom/ptx/cluster.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/sm80.cuh"
#include "loom/ptx/special.cuh"
#include "loom/ptx/tma.cuh"
#include "loom/ptx/wgmma.cuh"
#include "loom/tile/epilogue.cuh"
#include "loom/tile/pipeline.cuh"
#include "loom/tile/scheduler.cuh"
#include "loom/tile/tma.cuh"
#include "loom/tile/wgmma_k_block.cuh"

namespace loom::kernels {

// A whole tile's work unit: every k-block.
LOOM_DEVICE LOOM_FORCEINLINE void whole_tile_unit(int32_t num_k_blocks, tile::WorkUnit& w) {
    w.split = -1;
    w.kb_begin = 0;
    w.kb_count = num_k_blocks;
}

// A K-cluster rank's share of a tile: k-blocks [r nkb / S, (r + 1) nkb / S) for cluster rank r (S = CLUSTER_K; the
// host launches K-clusters only with nkb >= S, so every rank has at least one).
template <int CLUSTER_K>
LOOM_DEVICE LOOM_FORCEINLINE void cluster_k_unit(int32_t num_k_blocks, tile::WorkUnit& w) {
    const int64_t r = static_cast<int64_t>(ptx::cluster_ctarank());
    const int64_t begin = r * num_k_blocks / CLUSTER_K;
    w.split = -1;
    w.kb_begin = static_cast<int32_t>(begin);
    w.kb_count = static_cast<int32_t>((r + 1) * num_k_blocks / CLUSTER_K - begin);
}

// The next tile (kSplitTail = false: whole tiles, w.kb_* = the full K, or a K-cluster rank's share) or split-tail work
// unit of this CTA; the producer and the consumers call it with the same arguments and so see the same sequence.
template <bool kSplitTail, int CLUSTER_K, class Sched, class Hooks>
LOOM_DEVICE LOOM_FORCEINLINE bool next_work(Sched& sched, const Hooks& hooks, const GemmArgs& args,
                                            int32_t num_k_blocks, tile::TileCoord& t, tile::WorkUnit& w) {
    if constexpr (kSplitTail) {
        return sched.next_unit(hooks, args.work_units, args.dp_tiles, args.tail_splits, num_k_blocks, t, w);
    } else {
        if constexpr (CLUSTER_K > 1) {
            cluster_k_unit<CLUSTER_K>(num_k_blocks, w);
        } else {
            whole_tile_unit(num_k_blocks, w);
        }
        return sched.next_tile(hooks, t);
    }
}

// Split-tail fix-up. Called by every consumer thread (BLOCK_M / 64 warpgroups, convergent) after a split unit's
// mainloop, with the unit's partial sum in `acc` and tail_id = (tail tile << 8) | split. Returns true in the CTA that
// completes the tail tile, with the tile's full sum in `acc` (it then runs the epilogue); false elsewhere (the unit
// is done). No CTA waits for another.
//   1. acc -> workspace slot [tail tile][split] in fragment order: float4 chunk c of warpgroup thread i at float
//      4 (128 c + i) of the warpgroup's 64 x BLOCK_N part, so one warp store covers 512 contiguous bytes (L2 only).
//   2. Named barrier over the consumers, then thread 0 counts the CTA in on the tile's counter with
//      atom.inc.acq_rel.gpu (limit splits - 1): the release is cumulative over every consumer's slot stores
//      (ordered before it by the barrier).
//   3. The thread that reads splits - 1 saw every other split's release (the acquire half): this CTA is last, and
//      the inc wrapped the counter back to 0 for the next launch. "Last" goes to every consumer thread through the
//      barrier's OR reduction, which also orders their slot loads after the acquire.
//   4. The last CTA sums the slots in split order 0..splits-1, its own read back like the others: the rounding
//      does not depend on which CTA came last, so the result is bitwise reproducible.
// Only the warps with rows inside the matrix (tile_rows: M minus the tile's first row) store and read slots: a decode
// GEMM (M <= 16 in a 64-row tile) moves a quarter of the slot. The others' accumulators reach only rows >= M, which the
// epilogue never stores.
// The thread's slot offset comes from an unhoisted %tid.x: nothing of the fix-up stays live across the mainloop.
template <int BLOCK_M, int BLOCK_N>
LOOM_DEVICE LOOM_FORCEINLINE bool split_tail_fixup(float (&acc)[BLOCK_N / 2], const GemmArgs& args, int32_t tail_id,
                                                   int32_t tile_rows) {
    constexpr uint32_t kConsumerThreads = BLOCK_M / 64 * 128;
    constexpr int kChunks = BLOCK_N / 8;  // float4 chunks of acc
    constexpr int64_t kSlot = gemm_split_tail_slot_floats(BLOCK_M, BLOCK_N);
    const int32_t splits = args.tail_splits;
    const int32_t tail_tile = tail_id >> 8, split = tail_id & 255;
    const uint32_t tid = ptx::tid_x_unhoisted();  // consumer threads: [0, kConsumerThreads)
    float* tile_slots =
        args.partials + static_cast<int64_t>(tail_tile) * splits * kSlot + (tid / 128) * 64 * BLOCK_N + 4 * (tid % 128);
    float* mine = tile_slots + split * kSlot;
    // The warp's 16 rows of the tile (warp-uniform): past the matrix, nothing to hand over or sum.
    const bool rows_live = static_cast<int32_t>((tid / 128) * 64 + ((tid % 128) / 32) * 16) < tile_rows;
    if (rows_live) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            __stcg(reinterpret_cast<float4*>(mine + 512 * c),
                   make_float4(acc[4 * c + 0], acc[4 * c + 1], acc[4 * c + 2], acc[4 * c + 3]));
        }
    }
    ptx::named_barrier_sync(1, kConsumerThreads);
    bool last = false;
    if (tid == 0) {
        const uint32_t limit = static_cast<uint32_t>(splits - 1);
        last = ptx::atom_inc_acq_rel_gpu(args.tile_counters + tail_tile, limit) == limit;
    }
    if (!ptx::named_barrier_sync_or(1, kConsumerThreads, last)) return false;
    if (!rows_live) return true;  // still the completing CTA: its barriers and stores are warp-uniform below
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(tile_slots + 512 * c));
        acc[4 * c + 0] = v.x;
        acc[4 * c + 1] = v.y;
        acc[4 * c + 2] = v.z;
        acc[4 * c + 3] = v.w;
    }
    for (int j = 1; j < splits; ++j) {
        const float* slot = tile_slots + j * kSlot;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            const float4 v = __ldcg(reinterpret_cast<const float4*>(slot + 512 * c));
            acc[4 * c + 0] += v.x;
            acc[4 * c + 1] += v.y;
            acc[4 * c + 2] += v.z;
            acc[4 * c + 3] += v.w;
        }
    }
    return true;
}

// K-cluster sum. Called by every consumer thread (BLOCK_M / 64 warpgroups, convergent) after the tile's mainloop, with
// this rank's partial (its k-blocks) in `acc`. `buf` is the CTA's ring and staging buffers (at least BLOCK_M x
// BLOCK_N floats), idle now: the CTA runs one tile. Returns with the owned fragments of `acc` (columns 8 j .. 8 j + 7
// of the warp's rows for j in [r F / S, (r + 1) F / S), r = cluster rank, F = BLOCK_N / 8, S = CLUSTER_K) summed over
// the cluster's ranks in rank order 0 .. S - 1 (the rounding is the same whichever rank finishes first); the epilogue
// stores only those. The others are left as they are.
//   1. Named barrier over the consumers: every warpgroup's wgmma reads of the ring have retired (wgmma.wait_group);
//      a proxy fence (the ring was last written by TMA and read by wgmma, the async proxy); then each thread's partial
//      into buf in fragment order: float4 chunk j of warpgroup thread i at float 4 (128 j + i) of its warpgroup's
//      64 x BLOCK_N part (warps with rows inside the matrix only: the others' rows are never stored).
//   2. cluster_sync (the producer warpgroup takes part too): every rank's partial is written (release / acquire).
//   3. The owned chunks summed over the ranks: this rank's from its registers, a peer's from the same offset of the
//      peer's buffer (distributed shared memory). The peers read buf until the kernel's final cluster_sync; nothing
//      writes it after step 1.
template <int BLOCK_M, int BLOCK_N, int CLUSTER_K>
LOOM_DEVICE LOOM_FORCEINLINE void cluster_k_sum(float (&acc)[BLOCK_N / 2], float* buf, int32_t tile_rows) {
    constexpr uint32_t kConsumerThreads = BLOCK_M / 64 * 128;
    constexpr int kFrags = BLOCK_N / 8;           // float4 chunks of acc
    constexpr int kOwned = kFrags / CLUSTER_K;    // chunks each rank sums and stores
    const uint32_t tid = ptx::tid_x_unhoisted();  // consumer threads: [0, kConsumerThreads)
    float* const mine = buf + (tid / 128) * 64 * BLOCK_N + 4 * (tid % 128);
    const bool rows_live = static_cast<int32_t>((tid / 128) * 64 + ((tid % 128) / 32) * 16) < tile_rows;
    ptx::named_barrier_sync(1, kConsumerThreads);
    ptx::fence_proxy_async_smem();
    if (rows_live) {
#pragma unroll
        for (int j = 0; j < kFrags; ++j) {
            *reinterpret_cast<float4*>(mine + 512 * j) =
                make_float4(acc[4 * j + 0], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
        }
    }
    ptx::cluster_sync();
    if (!rows_live) return;
    const int r = static_cast<int>(ptx::cluster_ctarank());
#pragma unroll
    for (int j = 0; j < kFrags; ++j) {
        if (j / kOwned != r) continue;
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int q = 0; q < CLUSTER_K; ++q) {
            const float4 v = q == r ? make_float4(acc[4 * j + 0], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3])
                                    : ptx::ld_shared_cluster_f32x4(mine + 512 * j, static_cast<uint32_t>(q));
            if (q == 0) {
                sum = v;
            } else {
                sum.x += v.x;
                sum.y += v.y;
                sum.z += v.z;
                sum.w += v.w;
            }
        }
        acc[4 * j + 0] = sum.x;
        acc[4 * j + 1] = sum.y;
        acc[4 * j + 2] = sum.z;
        acc[4 * j + 3] = sum.w;
    }
}

// Consumer warpgroup: hand a ring slot back once its wgmma reads of it retired (wgmma.wait_group). Warp 0 signals
// for the warpgroup, as CUTLASS's one signalling thread per consumer warpgroup does (a wgmma group is the
// warpgroup's, and so is its completion): one lane, or with a cluster one lane per CTA of the cluster, whose slot
// its multicast also fills. The empty barriers count BLOCK_M / 64 x CLUSTER_M arrivals (4x fewer than one per warp:
// with clusters, 4x fewer remote arrivals per k-block).
// The thread index is read unhoisted here: held across the mainloop it cost the tightest kernels (split tail, hooks) a
// register and they spilled.
template <int CLUSTER_M, int STAGES>
LOOM_DEVICE LOOM_FORCEINLINE void release_slot(tile::TmaPipeline<STAGES>* pipe, uint32_t stage) {
    const uint32_t wg_thread = ptx::tid_x_unhoisted() % 128;
    if (wg_thread >= 32) return;  // warp 0 of the warpgroup
    if constexpr (CLUSTER_M == 1) {
        if (wg_thread == 0) pipe->consumer_release(stage);
    } else {
        pipe->template consumer_release_cluster<CLUSTER_M>(stage, wg_thread);
    }
}

// TIn: __nv_bfloat16, __half, or __nv_fp8_e4m3 (kBKMajor only; a k-block is then 128 elements, the same 128-byte
// swizzle rows, and each k32 wgmma step the same 32 bytes as a 16-bit k16 step). TOut: __nv_bfloat16, __half or float.
// TBias: any of those (unused when args.bias is null). kBKMajor: B is [N, K] row-major (K contiguous); otherwise B is
// [K, N] row-major. CLUSTER_M: 1, or 2 (launched with cluster dims (2, 1, 1), gridDim.x even; the host map of a K-major
// B then has boxes of BLOCK_N / 2 rows). tmap_d: D with boxes of 64 rows x gemm_store_box_cols(sizeof(TOut)) columns,
// 128B swizzle (read only by the TMA-store epilogue). kTmaStoreEpilogue: stage the output in shared memory and store it
// with TMA (when BLOCK_N is a multiple of the store box; requires args.beta == 0, which the host checks); false: direct
// global stores that also read D for beta != 0. (Two instantiations rather than a runtime branch: both epilogues in one
// kernel exceed the 168 registers a 384-thread CTA compiles for, and spill.) kSplitTail: walk the split-K tail's work
// units (args.dp_tiles, args.tail_splits, args.partials, args.tile_counters; see the top of this file); only with
// CLUSTER_M = 1 and hooks with neither an epilogue protocol nor StoreNotify. A separate instantiation, chosen by the
// host when the tail is split, so the plain kernel is the same as without it. Hooks: a GEMM hooks policy
// (tile/hooks.cuh: tile::GemmHooks), a __grid_constant__ parameter. CLUSTER_K: 1, or 2, 4, 8 (K-clusters, see the top
// of this file; launched with cluster dims (CLUSTER_K, 1, 1) and gridDim.x = tiles x CLUSTER_K, k-blocks >=
// CLUSTER_K; CLUSTER_M 1, no hooks, no split tail, the direct-store epilogue).
template <class TIn, class TOut, class TBias, int BLOCK_M, int BLOCK_N, int STAGES, bool kBKMajor, int CLUSTER_M = 1,
          bool kTmaStoreEpilogue = true, class Hooks = tile::GemmNoHooks, bool kSplitTail = false, int CLUSTER_K = 1>
__global__ void __launch_bounds__(128 * (BLOCK_M / 64 + 1), 1)
    gemm_sm90_tma_wgmma(const __grid_constant__ ptx::TmaDescriptor tmap_a,
                        const __grid_constant__ ptx::TmaDescriptor tmap_b,
                        const __grid_constant__ ptx::TmaDescriptor tmap_d, const GemmArgs args,
                        const __grid_constant__ Hooks hooks) {
    static_assert(BLOCK_M == 64 || BLOCK_M == 128 || BLOCK_M == 192,
                  "BLOCK_M is 64, 128 or 192 (one, two or three consumer warpgroups)");
    static_assert(BLOCK_N % 16 == 0 && BLOCK_N >= 16 && BLOCK_N <= 256, "BLOCK_N: multiple of 16 in [16, 256]");
    static_assert(kBKMajor || BLOCK_N % 64 == 0, "B as [K, N] needs BLOCK_N a multiple of 64");
    static_assert(STAGES >= 2 && STAGES <= kGemmSm90MaxStages, "STAGES in [2, kGemmSm90MaxStages]");
    static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "CLUSTER_M is 1 or 2");
    constexpr bool kFp8 = tile::kSameType<TIn, __nv_fp8_e4m3>;
    static_assert(sizeof(TIn) == 2 || (kFp8 && kBKMajor), "inputs are bf16 or fp16, or fp8 e4m3 with B as [N, K]");
    static_assert(tile::GemmHooks<Hooks>,
                  "Hooks: a tile order, trivially copyable, at most one epilogue protocol, the accumulators' without "
                  "StoreNotify (tile/hooks.cuh)");
    static_assert(!kSplitTail || (CLUSTER_M == 1 && !tile::StagedEpilogue<Hooks> && !tile::AccEpilogue<Hooks> &&
                                  !tile::StoreNotify<Hooks>),
                  "the split tail walks single-CTA tiles and publishes nothing per tile: no epilogue protocol, no "
                  "StoreNotify (TileOrder, LoadWait and ASource take part)");
    static_assert(!tile::AccEpilogue<Hooks> || CLUSTER_M == 1, "AccEpilogue: single-CTA tiles");
    static_assert(CLUSTER_K == 1 || CLUSTER_K == 2 || CLUSTER_K == 4 || CLUSTER_K == 8, "CLUSTER_K is 1, 2, 4 or 8");
    static_assert(CLUSTER_K == 1 || (CLUSTER_M == 1 && !kSplitTail && !kTmaStoreEpilogue &&
                                     tile::kSameType<Hooks, tile::GemmNoHooks>),
                  "K-clusters: the plain GEMM (no hooks, no split tail, CLUSTER_M 1) with the direct-store epilogue");
    static_assert(CLUSTER_K == 1 || (BLOCK_N / 8) % CLUSTER_K == 0,
                  "K-clusters: the tile's 8-column fragments divide among the ranks");
#if LOOM_SM90A
    constexpr int kConsumers = BLOCK_M / 64;
    constexpr bool kBF16 = tile::kSameType<TIn, __nv_bfloat16>;
    constexpr int kBlockK = gemm_block_k(sizeof(TIn));               // elements of one 128-byte row
    constexpr uint32_t kABytes = tile::swizzled_box_bytes(BLOCK_M);  // (BLOCK_M, kBlockK): 128 B per row
    constexpr uint32_t kBBytes = tile::swizzled_box_bytes(BLOCK_N);  // (BLOCK_N, kBlockK)
    // Copies of the tile through the ring (tile::AccRingCopies; below) give the producer thread more to hold.
    constexpr bool kAccRing = tile::AccRingCopies<Hooks>;
    constexpr int kProducerRegs = kAccRing ? 56 : 40;
    // setmaxnreg moves registers between the roles inside the CTA's launch allocation (the launch bound's registers
    // per thread, a multiple of 8: 168 for 384 threads, 128 for 512): a consumer's setmaxnreg.inc waits until the
    // producer's dec freed enough, so asking for more than the allocation hangs the consumers (it did, with 64 + 2 x
    // 224). ptxas fits each role's code in its budget: the ring-copy kernels need 56 for the producer's waits and
    // copies (40 spilled) and 224 for the fp32-output consumers' adds (216 spilled).
    constexpr auto at_most = [](int v, int cap) { return v < cap ? v : cap; };
    constexpr int kLaunchRegs = at_most(65536 / (128 * (kConsumers + 1)) / 8 * 8, 248);
    constexpr int kConsumerRegs = at_most(((kConsumers + 1) * kLaunchRegs - kProducerRegs) / kConsumers / 8 * 8, 240);
    static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (kConsumers + 1) * kLaunchRegs,
                  "setmaxnreg within the CTA's launch allocation");
    // TMA-store epilogue: slabs 128 bytes wide (kStoreCols elements of TOut); 16 rows per warp, 64 per warpgroup with
    // StagedEpilogue hooks.
    constexpr int kStoreCols = gemm_store_box_cols(sizeof(TOut));
    // A BLOCK_N that is not a multiple of the slab width ends with a slab overlapping the one before it (see
    // slab_frag0 below); narrower tiles than one slab take the direct stores.
    constexpr bool kTmaStore = kTmaStoreEpilogue && BLOCK_N >= kStoreCols;
    // TBias = void: the host promises alpha = 1, no bias and no device scales, and the epilogue converts the
    // accumulators as they are.
    constexpr bool kAffine = !tile::kSameType<TBias, void>;
    // tile::ScalesAccumulators: the accumulators are scaled by alpha times the device scales right after the
    // mainloop (the host leaves TBias to the output type); every other kernel scales in its affine epilogue (the host
    // takes TBias = float when alpha != 1 or a device scale is given).
    constexpr bool kScalesAcc = tile::ScalesAccumulators<Hooks>;
    static_assert(kAffine || (kTmaStore && !tile::StagedEpilogue<Hooks> && sizeof(TOut) == 2),
                  "TBias = void (alpha 1, no bias) is for the plain TMA-store epilogue of 16-bit outputs");
    constexpr int kSlabs = (BLOCK_N + kStoreCols - 1) / kStoreCols;
    static_assert(!tile::StagedEpilogue<Hooks> || (kTmaStore && BLOCK_N % kStoreCols == 0 && CLUSTER_M == 1),
                  "StagedEpilogue takes part in the TMA-store epilogue (BLOCK_N a multiple of the store box), "
                  "single-CTA tiles");
    constexpr int kFragsPerSlab = kStoreCols / 8;  // 8-column accumulator fragments per slab
    // The first fragment of slab s: s x kFragsPerSlab, except that the last slab of a BLOCK_N that is not a multiple
    // of the slab width ends at the tile's edge and so overlaps the slab before it. Its TMA store rewrites the
    // overlapped columns with the values they already got (same registers, same rounding) and reaches no column of
    // the next tile. (BLOCK_N % 16 == 0 keeps the first fragment even, as stmatrix's fragment pairs need.)
    const auto slab_frag0 = [](int slab) {
        return slab * kFragsPerSlab < BLOCK_N / 8 - kFragsPerSlab ? slab * kFragsPerSlab : BLOCK_N / 8 - kFragsPerSlab;
    };
    constexpr int kWarpBufs = gemm_warp_store_bufs(BLOCK_M);  // the plain epilogue's staging buffers per warp
    // Copies of the tile through the ring (tile::AccRingCopies): a warpgroup's 64 x BLOCK_N part of TOut is
    // kRingPieces B slots (one for 16-bit TOut, two for fp32), each kRingPieceVecs 16-byte vectors per thread.
    constexpr int kRingPieces = static_cast<int>(sizeof(TOut)) / 2;
    constexpr int kRingVecElems = 16 / static_cast<int>(sizeof(TOut));
    constexpr int kRingPieceVecs = BLOCK_N / 2 / kRingVecElems / kRingPieces;
    constexpr int kRingInFlight = kRingPieceVecs % 4 == 0 ? 4 : kRingPieceVecs % 2 == 0 ? 2 : 1;
    static_assert(!kAccRing || kRingPieceVecs * 128 * 16 == kBBytes,
                  "ring copies: a part of the tile fills whole B slots");

    extern __shared__ uint8_t smem_raw[];
    // 128B-swizzled TMA boxes and wgmma descriptors need 1024-byte aligned tiles.
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uint64_t>(smem_raw) + 1023) & ~uint64_t(1023));
    uint8_t* smem_a = smem;
    uint8_t* smem_b = smem + STAGES * kABytes;
    // StagedEpilogue: the warpgroup stages its whole part of the tile (kSlabs buffers) and the hooks act on it at once.
    constexpr bool kWholeTile = tile::StagedEpilogue<Hooks>;
    // The consumers look the next tile up before the epilogue (below) where that spills nothing
    // (tests/unit/test_gemm_compile.cpp, test_overlap_compile.cpp): whole single-CTA tiles. The split-tail, clustered,
    // StoreNotify (TileNotifyHooks), SideWarps (the fused pull) and fp32-output AccEpilogue kernels spilled 4-20
    // bytes with it, even holding only the next tile's two blocks.
    constexpr bool kLookahead = !kSplitTail && CLUSTER_M == 1 && CLUSTER_K == 1 && !tile::StoreNotify<Hooks> &&
                                !tile::SideWarps<Hooks> && !(tile::AccEpilogue<Hooks> && sizeof(TOut) == 4);
    constexpr uint32_t kStagingBytes = gemm_staging_bytes_per_wg(BLOCK_M, BLOCK_N, kWholeTile ? int(sizeof(TOut)) : 0);
    static_assert(CLUSTER_K == 1 || (!kWholeTile && STAGES >= gemm_sm90_cluster_k_min_stages(BLOCK_M, BLOCK_N)),
                  "K-clusters: the ring and staging buffers hold the tile's fp32 partial");
    uint8_t* smem_store = smem_b + STAGES * kBBytes;  // kConsumers x kStagingBytes
    auto* pipe = reinterpret_cast<tile::TmaPipeline<STAGES>*>(smem_store + kConsumers * kStagingBytes);

    const int warpgroup = static_cast<int>(threadIdx.x) / 128;
    const int wg_thread = static_cast<int>(threadIdx.x) % 128;
    const uint32_t cta_rank = CLUSTER_M > 1 ? ptx::cluster_ctarank() : 0u;
    // kScalesAcc: alpha times the device scales, read once per CTA at its start.
    __shared__ float acc_scale;
    if (threadIdx.x == 0) {
        if constexpr (kScalesAcc) acc_scale = args.alpha * gemm_device_scales(args);
        pipe->init(kConsumers * CLUSTER_M);  // one arrival per consumer warpgroup of the cluster releases a slot
        ptx::tma_prefetch_descriptor(&tmap_a);
        ptx::tma_prefetch_descriptor(&tmap_b);
        ptx::tma_prefetch_descriptor(&tmap_d);
        if constexpr (tile::ASource<Hooks>) hooks.prefetch_a();
        if constexpr (tile::CtaLifetime<Hooks>) hooks.init_cta();
    }
    // The peer multicasts into our slots and arrives on our barriers: their init must be visible cluster-wide.
    if constexpr (CLUSTER_M > 1) {
        ptx::cluster_sync();
    } else {
        __syncthreads();
    }

    // The tile grid with its divisors (and for the split tail the k-blocks) come from the host: read from the constant
    // bank where used rather than computed once and held in registers. kFastOrder: the tile order multiplies by the
    // host's divisors instead of dividing (tile_order.hpp, FastTileGrid), where the next tile is looked up on the tile
    // boundary (no kLookahead: the clustered kernels, fp8's on a whole GPU, the fused pull, fp32-output accumulator
    // hooks). The lookahead kernels keep the divisions, off the boundary anyway (with the multiplies bf16's 8192 x 1376
    // x 4096 read 1 % slower); the split-tail and notifying kernels too (they spilled 4-16 bytes with them).
    constexpr bool kFastOrder = !kLookahead && !kSplitTail && !tile::StoreNotify<Hooks>;
    using Scheduler = tile::PersistentScheduler<BLOCK_M, BLOCK_N, Hooks, CLUSTER_M, kFastOrder, CLUSTER_K>;
    Scheduler sched(args.m, args.n, args.grid, tile::BoolConstant<!kSplitTail>{});
    const int num_k_blocks = kSplitTail ? args.num_k_blocks : (args.k + kBlockK - 1) / kBlockK;
    tile::TileCoord t;
    tile::WorkUnit w;  // k-blocks [w.kb_begin, w.kb_begin + w.kb_count) of tile t; w.split >= 0: a split-tail unit

    if (warpgroup == kConsumers) {
        // ---- producer warpgroup: one thread issues every TMA ------------------------------------------------
        if constexpr (!tile::SideWarps<Hooks>) ptx::setmaxnreg_dec<kProducerRegs>();
        if (wg_thread == 0) {
            tile::PipelineState<STAGES> st;
            while (next_work<kSplitTail, CLUSTER_K>(sched, hooks, args, num_k_blocks, t, w)) {
                if constexpr (tile::LoadWait<Hooks>) {
                    if (t.rows > 0) hooks.before_load(t);
                    ptx::fence_proxy_async_global();
                }
                // The tile's A rows: tmap_a at t.row0, or wherever the hooks redirect them.
                const ptx::TmaDescriptor* map_a = &tmap_a;
                int32_t row_a = t.row0;
                if constexpr (tile::ASource<Hooks>) hooks.a_source(t, map_a, row_a);
                // A's box: BLOCK_M rows, or fewer for a skinny A through tmap_a (GemmArgs::a_box_rows).
                const uint32_t a_bytes =
                    map_a == &tmap_a && args.a_box_rows > 0 ? static_cast<uint32_t>(args.a_box_rows) * 128u : kABytes;
                for (int kb = 0; kb < w.kb_count; ++kb) {
                    // Expect the whole B tile: our half and the peer's multicast half both land here.
                    uint64_t* full = pipe->producer_acquire(st, a_bytes + kBBytes);
                    const int k0 = (w.kb_begin + kb) * kBlockK;
                    uint8_t* b_slot = smem_b + st.stage * kBBytes;
                    tile::tma_load_tile(smem_a + st.stage * kABytes, map_a, full, k0, row_a);
                    if constexpr (CLUSTER_M == 1) {
                        if constexpr (kBKMajor) {
                            tile::tma_load_tile(b_slot, &tmap_b, full, k0, t.col0);
                        } else {
                            tile::tma_load_tile_mn<BLOCK_N, 64, kBlockK>(b_slot, &tmap_b, full, t.col0, k0);
                        }
                    } else {
                        constexpr uint16_t kMask = (1u << CLUSTER_M) - 1u;
                        if constexpr (kBKMajor) {
                            constexpr int kRows = BLOCK_N / CLUSTER_M;  // the host map's box rows
                            ptx::tma_load_2d_multicast(b_slot + cta_rank * tile::swizzled_box_bytes(kRows), &tmap_b,
                                                       full, k0, t.col0 + static_cast<int>(cta_rank) * kRows, kMask);
                        } else {
                            // 64-column boxes dealt round-robin over the cluster's CTAs.
#pragma unroll
                            for (int j = 0; j < BLOCK_N / 64; ++j) {
                                if (j % CLUSTER_M == static_cast<int>(cta_rank))
                                    ptx::tma_load_2d_multicast(b_slot + j * tile::swizzled_box_bytes(kBlockK), &tmap_b,
                                                               full, t.col0 + 64 * j, k0, kMask);
                            }
                        }
                    }
                    st.advance();
                }
                if constexpr (kAccRing) {
                    // The tile's copies for its epilogue, in the order the consumers add them: copy by copy, each
                    // warpgroup's part (contiguous in the copy) as kRingPieces B slots.
                    const int copies = hooks.template ring_copies<TOut, BLOCK_M, BLOCK_N>(t);
                    if (copies > 0) {
                        hooks.template ring_wait<TOut, BLOCK_M, BLOCK_N>(t);
                        ptx::fence_proxy_async_global();  // what the acquire made visible, to the bulk copies
                        const uint8_t* src = hooks.template ring_copy<TOut, BLOCK_M, BLOCK_N>(t);
                        for (int c = 0; c < copies; ++c, src += hooks.ring_copy_stride()) {
                            for (int piece = 0; piece < kConsumers * kRingPieces; ++piece) {
                                uint64_t* full = pipe->producer_acquire(st, kBBytes);
                                ptx::cp_async_bulk_g2s(smem_b + st.stage * kBBytes, src + piece * kBBytes, kBBytes,
                                                       full);
                                st.advance();
                            }
                        }
                    }
                }
            }
        }
        if constexpr (tile::SideWarps<Hooks>) {
            if (wg_thread >= 32) hooks.template side_warps<TOut, BLOCK_M, BLOCK_N>(wg_thread - 32);
        }
        // K-clusters: the producer warpgroup's part in the consumers' cluster barrier of cluster_k_sum (the tile's
        // one; the kernel's final one follows).
        if constexpr (CLUSTER_K > 1) {
            __syncwarp();
            ptx::cluster_sync();
        }
    } else {
        // ---- consumer warpgroups: wgmma over the ring, then the epilogue -----------------------------------
        if constexpr (!tile::SideWarps<Hooks>) ptx::setmaxnreg_inc<kConsumerRegs>();
        if constexpr (tile::StagedEpilogue<Hooks>) hooks.consumer_start();
        const int warp = wg_thread / 32, lane = wg_thread % 32;
        uint8_t* store_bufs = smem_store + warpgroup * kStagingBytes;
        uint32_t store_count = 0;  // slabs this warpgroup has stored; selects the staging buffer
        float acc[BLOCK_N / 2];
        tile::PipelineState<STAGES> st;
        // kLookahead: the next tile is looked up while this one's last MMAs drain (below), not after its epilogue,
        // so the tile order's integer divisions (~0.1 us of dependent latency) stay off the boundary between two
        // mainloops, where the tensor cores idle. Only its blocks are held across the epilogue (two registers;
        // m_block -1: none left), the rest of its coordinates is filled in after it.
        int32_t mb_next = -1, nb_next = 0;
        if constexpr (kLookahead) sched.next_blocks(hooks, mb_next, nb_next);
        const auto next_unit = [&]() {
            if constexpr (kLookahead) {
                if (mb_next < 0) return false;
                sched.set_blocks(mb_next, nb_next, t);
                whole_tile_unit(num_k_blocks, w);
                return true;
            } else {
                return next_work<kSplitTail, CLUSTER_K>(sched, hooks, args, num_k_blocks, t, w);
            }
        };
        while (next_unit()) {
            // The split unit's (tail tile << 8) | split, -1 for a whole tile: one register across the mainloop.
            const int32_t tail_id = w.split < 0 ? -1 : ((w.linear - args.dp_tiles) << 8) | w.split;
            // Profiled kernels (lang/profile.cuh): the unit's mainloop, one span per consumer warpgroup.
            LOOM_PROF_ONLY(if (ptx::tid_x_unhoisted() % 128 == 0)
                               LOOM_PROF_BEGIN(lang::kTagGemmTile, (t.m_block << 16) | t.n_block));
            if constexpr (kSplitTail || kWholeTile) {
                // Written here (64 register moves per unit), the accumulators are dead from their last read in the
                // previous unit's epilogue or fix-up on, rather than live into this unit's first wgmma (which
                // ignores them): the registers of the slabs already stored are free for the rest of the epilogue.
#pragma unroll
                for (int i = 0; i < BLOCK_N / 2; ++i) acc[i] = 0.f;
            }
            uint32_t prev_stage = 0;
            // kb counts the unit's k-blocks: its first one (kb = 0, kk = 0) overwrites the accumulators.
            for (int kb = 0; kb < w.kb_count; ++kb) {
                pipe->consumer_wait(st, tile::consumer_wait_cycles<tile::LoadWait<Hooks>>(hooks));
                const uint8_t* a_tile = smem_a + st.stage * kABytes + warpgroup * 64 * 128;
                const uint8_t* b_tile = smem_b + st.stage * kBBytes;
                ptx::wgmma_fence_operands(acc);
                ptx::wgmma_fence();
                tile::wgmma_k_block<BLOCK_N, TIn, kBKMajor>(acc, a_tile, b_tile, kb > 0);
                ptx::wgmma_commit_group();
                ptx::wgmma_fence_operands(acc);
                // Keep this k-block's MMAs in flight; the previous k-block's have retired, so its slot is free.
                ptx::wgmma_wait_group<1>();
                if (kb > 0) release_slot<CLUSTER_M>(pipe, prev_stage);
                prev_stage = st.stage;
                st.advance();
            }
            if constexpr (kLookahead) sched.next_blocks(hooks, mb_next, nb_next);
            ptx::wgmma_wait_group<0>();
            ptx::wgmma_fence_operands(acc);
            if (w.kb_count > 0) release_slot<CLUSTER_M>(pipe, prev_stage);
            // The mainloop's end: its time now, its record when the unit is done (at the scope's exit, after the
            // epilogue), so that the record's registers are not needed beside the live accumulators.
            LOOM_PROF_ONLY(const uint64_t prof_end_ns = ptx::globaltimer();
                           const uint32_t prof_tile = (t.m_block << 16) | t.n_block;
                           const bool prof_writer = ptx::tid_x_unhoisted() % 128 == 0;)
            LOOM_PROF_AT_SCOPE_EXIT(if (prof_writer) lang::profile::record_at(prof_end_ns, lang::kTagGemmTile,
                                                                              lang::kProfileEnd, prof_tile));
            // No unit is empty: K >= 1 (gemm_sm90_launch checks it) and splits <= k-blocks (gemm_tail_plan), and the
            // split-tail and whole-tile kernels zero the accumulators before the mainloop anyway. (A guard zeroing
            // them after an empty unit cost 128 selects per thread and tile, with the tensor cores idle.)
            if constexpr (kScalesAcc) {
                const float s = acc_scale;  // uniform
                if (s != 1.f) {
#pragma unroll
                    for (int i = 0; i < BLOCK_N / 2; ++i) acc[i] *= s;
                }
            }
            if constexpr (CLUSTER_K > 1) {
                // The cluster's ranks sum their partials; this one stores its share of the tile's columns.
                cluster_k_sum<BLOCK_M, BLOCK_N, CLUSTER_K>(acc, reinterpret_cast<float*>(smem), args.m - t.row0);
            }
            if constexpr (kSplitTail) {
                // A split unit: hand the partial over; only the CTA that completes the tile stores it.
                if (tail_id >= 0 && !split_tail_fixup<BLOCK_M, BLOCK_N>(acc, args, tail_id, args.m - t.row0)) continue;
            }
            // AccEpilogue hooks may send the tile away (this CTA then stores nothing of it); the rest is stored
            // d_row_offset() rows above t.row0 in D (read where used, from the parameter space: held in a register
            // across the epilogue it made the tightest configs spill).
            if constexpr (tile::AccEpilogue<Hooks>) {
                if (!hooks.template epilogue_acc<TOut, BLOCK_M, BLOCK_N>(acc, t)) continue;
            }
            if constexpr (kAccRing) {
                // The copies the producer streams after the mainloop (above): warpgroup g adds the slots of its part,
                // then its warp 0 releases them once all four warps have read (every warpgroup waits for and
                // releases every slot, so the ring's phases stay in step).
                const int copies = hooks.template ring_copies<TOut, BLOCK_M, BLOCK_N>(t);
                const uint32_t r_tid = ptx::tid_x_unhoisted();
                const int r_wg = static_cast<int>(r_tid / 128);
                for (int c = 0; c < copies; ++c) {
                    // (The warpgroup loop not unrolled: its body does not depend on g, one copy of it is enough.)
#pragma unroll 1
                    for (int g = 0; g < kConsumers; ++g) {
#pragma unroll
                        for (int piece = 0; piece < kRingPieces; ++piece) {
                            pipe->consumer_wait_lean(st);
                            if (g == r_wg) {
                                const uint8_t* slot = smem_b + st.stage * kBBytes + (r_tid % 128) * 16;
                                // kRingInFlight vectors at a time (a divisor of the piece's: BLOCK_N 160 has 10):
                                // all of them at once (64 registers beside the 128 accumulators) made ptxas spill.
#pragma unroll
                                for (int v0 = 0; v0 < kRingPieceVecs; v0 += kRingInFlight) {
                                    uint4 x[kRingInFlight];
#pragma unroll
                                    for (int v = 0; v < kRingInFlight; ++v)
                                        x[v] = ptx::ld_shared_v4(slot + (v0 + v) * 128 * 16);
#pragma unroll
                                    for (int v = 0; v < kRingInFlight; ++v)
                                        tile::add_vector<TOut>(acc + kRingVecElems * (piece * kRingPieceVecs + v0 + v),
                                                               x[v]);
                                }
                                ptx::named_barrier_sync(2 + r_wg, 128);
                            }
                            release_slot<CLUSTER_M>(pipe, st.stage);
                            st.advance();
                        }
                    }
                }
            }
            const auto d_row0 = [&]() -> int32_t {
                if constexpr (tile::AccEpilogue<Hooks>) {
                    return t.row0 - hooks.d_row_offset();
                } else {
                    return t.row0;
                }
            };

            // Epilogue: thread owns (row 16w + lane/4 (+8), cols 8j + 2(lane%4) + {0,1}) of its 64-row slab.
            // (args stays in the constant bank: no registers held across the mainloop, whose 128 accumulators
            // per thread leave little room under 168. One epilogue path per instantiation for the same reason.)
            if constexpr (kTmaStore) {
                {
                    // The thread's coordinates. The split-tail kernel and the epilogue protocols recompute them here
                    // from an unhoisted %tid.x: held across the mainloop (as the plain kernel's compiler does) they
                    // leave the fix-up / the hooks too few registers under 168 and they spill.
                    constexpr bool kUnhoisted = kSplitTail || kWholeTile || tile::AccEpilogue<Hooks> || kConsumers == 3;
                    const uint32_t e_tid = kUnhoisted ? ptx::tid_x_unhoisted() : 0u;
                    const int e_warpgroup = kUnhoisted ? static_cast<int>(e_tid / 128) : warpgroup;
                    const int e_wg_thread = kUnhoisted ? static_cast<int>(e_tid % 128) : wg_thread;
                    const int e_warp = kUnhoisted ? static_cast<int>((e_tid % 128) / 32) : warp;
                    const int e_lane = kUnhoisted ? static_cast<int>(e_tid % 32) : lane;
                    uint8_t* const e_bufs = kUnhoisted ? smem_store + e_warpgroup * kStagingBytes : store_bufs;
                    // One fragment's pair of outputs, (row lane / 4 + 8 h, columns 8 j + 2 (lane % 4) + {0, 1}) of the
                    // warp's rows: alpha x + bias, or (TBias = void: alpha = 1, no bias) the accumulators as they are.
                    const float e_alpha = kAffine && !kScalesAcc ? args.alpha * gemm_device_scales(args) : 1.f;
                    auto value = [&](int j, int h) -> float2 {
                        const float x = acc[4 * j + 2 * h + 0], y = acc[4 * j + 2 * h + 1];
                        if constexpr (!kAffine) {
                            return make_float2(x, y);
                        } else {
                            const int col = t.col0 + 8 * j + 2 * (e_lane % 4);
                            float b0 = 0.f, b1 = 0.f;
                            if (args.bias != nullptr && col < args.n) {
                                const TBias* bias = static_cast<const TBias*>(args.bias);
                                b0 = tile::to_float(bias[col]);
                                b1 = tile::to_float(bias[col + 1]);
                            }
                            return make_float2(e_alpha * x + b0, e_alpha * y + b1);
                        }
                    };
                    // One slab's fragments as pairs into a 128B-swizzled buffer whose row r_lo + 8 h holds the thread's
                    // rows (16-byte chunk c of row r sits at chunk c ^ (r % 8)).
                    auto stage_pairs = [&](uint8_t* buf, int frag0, int r_lo) {
#pragma unroll
                        for (int f = 0; f < kFragsPerSlab; ++f) {
                            const int j = frag0 + f;
                            const uint32_t byte = static_cast<uint32_t>(8 * f + 2 * (e_lane % 4)) * sizeof(TOut);
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const int r = r_lo + 8 * h;
                                const uint32_t off =
                                    static_cast<uint32_t>(r) * 128u +
                                    ((((byte >> 4) ^ static_cast<uint32_t>(r & 7)) << 4) | (byte & 15u));
                                const float2 v = value(j, h);
                                tile::store_pair(reinterpret_cast<TOut*>(buf + off), v.x, v.y);
                            }
                        }
                    };
                    if constexpr (kWholeTile) {
                        // StagedEpilogue: the warpgroup stages its whole 64 x BLOCK_N part (slab s in buffer s), every
                        // buffer read out by the previous tile's stores first (the hooks' wait and barrier).
                        hooks.template before_epilogue<TOut, BLOCK_M, BLOCK_N>(t);
                        const int r_lo = e_warp * 16 + e_lane / 4;  // row inside the warpgroup's 64-row slab
#pragma unroll
                        for (int slab = 0; slab < kSlabs; ++slab) {
                            if (t.col0 + slab * kStoreCols >= args.n) break;  // uniform: the rest is past N
                            uint8_t* buf = e_bufs + slab * kGemmStoreBufBytes;
                            stage_pairs(buf, slab * kFragsPerSlab, r_lo);
                        }
                        // The staged part goes to the hooks, which store, send or combine it. The accumulators are
                        // dead from here (zeroed before the next mainloop), which leaves the hooks registers.
                        ptx::fence_proxy_async_smem();
                        ptx::named_barrier_sync(2 + e_warpgroup, 128);
                        hooks.template store_tile<TOut, BLOCK_M, BLOCK_N>(&tmap_d, e_bufs, t, args.n);
                    } else {
                        // Per warp, no warpgroup barrier: warp w stages its 16 rows of each slab in one of its
                        // kWarpBufs buffers (the one whose store was issued kWarpBufs slabs ago, maybe in the previous
                        // tile, once that store has read it out) and lane 0 stores them with a 16-row TMA box.
                        uint8_t* const wbufs = e_bufs + e_warp * kWarpBufs * kGemmWarpStoreBytes;
#pragma unroll
                        for (int slab = 0; slab < kSlabs; ++slab) {
                            const int frag0 = slab_frag0(slab);
                            const int slab_col0 = t.col0 + 8 * frag0;
                            if (slab_col0 >= args.n) break;  // uniform: the rest of the tile is past N
                            uint8_t* buf = wbufs + (store_count % kWarpBufs) * kGemmWarpStoreBytes;
                            if (e_lane == 0) ptx::tma_store_wait_read<kWarpBufs - 1>();
                            __syncwarp();
                            if constexpr (sizeof(TOut) == 2 && !kAffine) {
                                // 16 columns per stmatrix.x4: matrix i = (rows 8 (i % 2) .. +7, 16-byte chunk
                                // 2 p + i / 2); lane l addresses row 8 ((l / 8) % 2) + l % 8 of matrix l / 8. (Only
                                // without alpha / bias: with them, four fragments' bias values in flight made the
                                // split-tail kernel spill; the affine kernels take the pair stores below.)
                                const int mr = ((e_lane >> 3) & 1) * 8 + (e_lane & 7);
                                const int mc = e_lane >> 4;
#pragma unroll
                                for (int p = 0; p < kFragsPerSlab / 2; ++p) {
                                    const int j = frag0 + 2 * p;
                                    const uint32_t regs[4] = {tile::pack_pair<TOut>(acc[4 * j + 0], acc[4 * j + 1]),
                                                              tile::pack_pair<TOut>(acc[4 * j + 2], acc[4 * j + 3]),
                                                              tile::pack_pair<TOut>(acc[4 * j + 4], acc[4 * j + 5]),
                                                              tile::pack_pair<TOut>(acc[4 * j + 6], acc[4 * j + 7])};
                                    const uint32_t chunk = static_cast<uint32_t>(2 * p + mc);
                                    ptx::stmatrix_x4(buf + mr * 128 + ((chunk ^ static_cast<uint32_t>(mr & 7)) << 4),
                                                     regs);
                                }
                            } else {
                                stage_pairs(buf, frag0, e_lane / 4);  // rows inside the warp's 16
                            }
                            // Generic-proxy smem writes -> visible to the TMA (async proxy) store issued next.
                            ptx::fence_proxy_async_smem();
                            __syncwarp();
                            if (e_lane == 0) {
                                ptx::tma_store_2d(&tmap_d, buf, slab_col0, d_row0() + e_warpgroup * 64 + e_warp * 16);
                                ptx::tma_store_commit();
                            }
                            ++store_count;
                        }
                    }
                    if constexpr (tile::StoreNotify<Hooks>) {
                        // The hook publishes the tile: its stores complete, not just issued, by every thread that
                        // issued some (bulk groups are per thread): each warp's lane 0, or with StagedEpilogue the
                        // warpgroup's thread 0.
                        if ((kWholeTile ? e_wg_thread : e_lane) == 0) {
                            ptx::tma_store_wait<0>();
                            ptx::fence_proxy_async_global();
                        }
                    }
                }
            } else {
                const auto epi =
                    gemm_epilogue_params<TOut, TBias>(args, kScalesAcc ? 1.f : args.alpha * gemm_device_scales(args));
                const int row = d_row0() + warpgroup * 64 + warp * 16 + lane / 4;
                const int col = t.col0 + 2 * (lane % 4);
                // K-clusters: this rank's share of the fragments (cluster_k_sum summed them).
                const int owner = CLUSTER_K > 1 ? static_cast<int>(ptx::cluster_ctarank()) : 0;
#pragma unroll
                for (int j = 0; j < BLOCK_N / 8; ++j) {
                    if (CLUSTER_K > 1 && j / (BLOCK_N / 8 / CLUSTER_K) != owner) continue;
                    epi.store(row, col + 8 * j, acc[4 * j + 0], acc[4 * j + 1]);
                    epi.store(row + 8, col + 8 * j, acc[4 * j + 2], acc[4 * j + 3]);
                }
            }
            if constexpr (tile::StoreNotify<Hooks>) {
                ptx::named_barrier_sync(1, kConsumers * 128);
                if (threadIdx.x == 0 && t.rows > 0) hooks.after_store(t);
            }
        }
        // The hooks may still have a tile to publish (its stores issued, its signal not yet raised).
        if constexpr (tile::CtaLifetime<Hooks>) hooks.template finish<BLOCK_M>();
        // The staging buffers must stay alive (and the stores land) before the CTA exits (bulk groups are per thread:
        // each warp's lane 0 issued its own).
        if (lane == 0) ptx::tma_store_wait<0>();
    }
    // A peer may still arrive on our empty barriers (and we on its), or read our partial (K-clusters): nobody leaves
    // before the whole cluster is done.
    if constexpr (CLUSTER_M > 1 || CLUSTER_K > 1) ptx::cluster_sync();
#else
    __trap();  // compiled only to keep one TU for every arch; launched only on sm_90a
#endif
}

}  // namespace loom::kernels
