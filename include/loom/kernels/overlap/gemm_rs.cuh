// GEMM+ReduceScatter (the second layer of a tensor-parallel MLP): C[M/W, N] on rank r = sum over ranks q of
// rows [r * M/W, (r + 1) * M/W) of A_q[M, K_loc] * B_q[N, K_loc]^T, accumulated in fp32 in rank order 0..W-1.
// Scatter-then-reduce, two kernels running concurrently on every rank:
//
//   GEMM      the persistent Hopper GEMM (kernels/gemm.cuh) with TileNotifyHooks writes the partial product
//             [M, N] (local, TMA-store epilogue) in an order rotated so that the rows destined to rank me + 1
//             come first and this rank's own rows last (they need no transfer). after_store publishes each tile
//             (tile[m_block * num_n + n_block] = epoch, store-release at sys scope) once its TMA stores are
//             complete (cp.async.bulk.wait_group 0 + fence.proxy.async.global, then a barrier of the consumers).
//   scatter-  gemm_rs_scatter_reduce, a few blocks on a side stream; each warp w of them walks tiles w,
//   reduce    w + (P x warps), ... in the GEMM's order twice. First walk: wait for each tile's signal, push the
//             tile's rows owned by a peer d into slot `me` of d's scratch (ld/st over NVLink), then
//             tile_in[me][tile] := epoch at d. Second walk: the rows this rank owns, once tile_in[q][tile] >= epoch
//             here for every peer q (copies landed): the W copies (own rows from the partial) summed in fp32 in
//             rank order 0..W-1 into C. Own rows come last in the GEMM's order and every peer made them earlier in
//             its own order, so the reduction runs under the rest of the GEMM and only the last tiles' sums trail.
// Write-after-read: a block pushes into rank d's scratch only after every scatter-reduce block of d finished
// the previous call (freed[d] >= free_target; each block adds 1 to freed[me] on every peer when its walk is
// done). The partial buffer is local: the host orders the next call's GEMM after this kernel (the side stream
// joins the caller's stream at the end of every call).
#pragma once

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 1  // wgmma kernel in this TU: no printf anywhere (ptxas C7510)
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/kernels/gemm/gemm.cuh"
#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/lang/lang.cuh"
#include "loom/lang/profile.cuh"
#include "loom/ptx/async.cuh"
#include "loom/ptx/memory.cuh"

namespace loom::kernels::overlap {

// Diagnostics of the fused gemm_rs kernels, compiled in only where LOOM_DIAG_RS_FUSED_SKIP is defined (bench-overlap's
// and the tests' own builds; the ops never define it). RsAccHooks: bit 0 skips the peer pushes (their signals are still
// raised), bit 1 the own tiles' waits and combine, bit 3 the fence before a pushed tile is published. RsPullHooks:
// bit 0, the reducers do nothing; bit 1, they wait for every tile but sum nothing; bit 2, they hand every part to
// gemm_rs_pull_finish at once. Bits 0 and 1 give wrong results by design: for timing the parts apart.
#if defined(LOOM_DIAG_RS_FUSED_SKIP)
inline constexpr int kRsDiagSkip = LOOM_DIAG_RS_FUSED_SKIP;
#else
inline constexpr int kRsDiagSkip = 0;
#endif

// The GEMM policy of GEMM+RS and GEMM+AR: rotated grouped order, one signal per stored tile. after_store runs
// on thread 0 after every consumer's TMA stores of the tile completed (see kernels/gemm.cuh).
struct TileNotifyHooks {
    TileNotifyHookArgs a;

    template <class Grid>
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const Grid& g, int32_t& m_block,
                                                 int32_t& n_block) const {
        tile::rotated_order(linear, g, a.shift_m, m_block, n_block);
    }
    LOOM_DEVICE LOOM_FORCEINLINE void after_store(const tile::TileCoord& t) const {
        ptx::st_release_sys(a.tile + (static_cast<int64_t>(t.m_block) * a.num_n + t.n_block), a.epoch);
    }
};
static_assert(tile::GemmHooks<TileNotifyHooks> && tile::StoreNotify<TileNotifyHooks>);

// ---- element helpers (16-byte vectors of T, fp32 math) ------------------------------------------------------
template <class T>
inline constexpr int kVecElems = 16 / static_cast<int>(sizeof(T));

// acc = (first ? 0 : acc) + the vector's elements, in fp32: tile::add_vector with a first source that assigns.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void vec_add(const uint4& v, float (&acc)[kVecElems<T>], bool first) {
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int k = 0; k < kVecElems<T>; ++k) acc[k] = first ? tile::to_float(e[k]) : acc[k] + tile::to_float(e[k]);
}
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE uint4 vec_pack(const float (&acc)[kVecElems<T>]) {
    uint4 v;
    T* e = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int k = 0; k < kVecElems<T>; ++k) {
        if constexpr (sizeof(T) == 4) {
            e[k] = acc[k];
        } else {
            e[k] = T(acc[k]);
        }
    }
    return v;
}

// ---- fused epilogue (RsAccHooks) --------------------------------------------------------------------------------
// The GEMM itself does the ReduceScatter: no second kernel, no SM taken from it. Every M-block belongs to one rank
// (M / W a multiple of BLOCK_M: the host's condition for this algorithm). The order is rotated as for the
// scatter-reduce: rows of rank me + 1 first, own rows last. The hooks take the fp32 accumulators after the mainloop
// (tile::AccEpilogue); the kernel keeps the plain epilogue and its shared memory (4 stages of 128 x 256).
// A slot part (warpgroup wg's 64 x BLOCK_N of a tile, TOut) holds the accumulators in fragment order: 16-byte vector
// v of warpgroup thread i (its accumulators [E v, E v + E), E = 16 / sizeof(TOut)) at byte 16 (128 v + i), so a
// warp's store or load covers 512 contiguous bytes; sender and receiver are the same thread of the same warpgroup in
// the same kernel, so the positions agree without naming them. Per tile of rank d's rows:
//   d != me  every thread stores its vectors into our slot of d's scratch (over NVLink, or on one GPU) or, with the
//            copy-engine transport, of the local outbox; the tile is not stored to C and its signal is pending. At
//            the start of this CTA's next epilogue (or at its end) every thread fences (acq_rel, sys; gpu with the
//            copy engine: its stores, a whole mainloop old by then, are performed), the consumers meet at a named
//            barrier and thread 0 raises tile_in[me][tile] := epoch at d (release, sys), or with the copy engine
//            counts the tile on its chunk (stored[lead] += 1, release, gpu) for the host's copy stream.
//   d == me  after the tile's last k-block the producer thread waits for every peer's tile (or chunk; acquire,
//            sys) and streams the copies through the TMA ring as if they were more k-blocks (the kernel's ring copies,
//            tile::AccRingCopies: each warpgroup part into a stage's B slot); the consumers add their parts from
//            shared memory to their accumulators in rank order (fp32) and the kernel stores the sums to C [M / W, N] at
//            row t.row0 - me * M / W. Nothing on the consumers' path polls a signal or waits on a global load (the
//            tensor cores would idle for it). Precision: the own partial stays fp32, the peers' arrive rounded to TOut
//            once.
// Deadlock freedom: pushes never wait. A tile of rank p's rows is at rotated M-position (m - shift_p) mod num_m,
// which is in the last M / W rows of positions for p and earlier for every other rank q (q's last positions are
// q's own rows), and the grouped order is monotonic in that position for a fixed n-block: every tile a wait
// needs has a smaller linear index in the pushing rank than the waiting tile in the waiting rank. By induction
// over the linear index (each CTA walks increasing indices; all CTAs resident: grid <= the usable SMs), every
// wait ends. A signal is pending only while its CTA is not waiting (published before any wait): the producer waits
// for an own tile's copies only after it issued all of that tile's k-blocks, so the consumers finish the mainloop
// and publish their pending push before they need the copies.
// Write-after-read of the scratch: calls alternate between the two parity halves (the half is half of the
// allocation, not of the call's size); a rank reaches call e + 2 only after its call e + 1 waited for every peer's
// call e + 1 pushes, which each peer made after finishing call e (stream order), reads included.
// The call number and so the half: RsFusedHookArgs (the device's with the SM transport, the host's with the copy
// engine). Thread 0 enters it in init_cta and puts both in shared memory (RsCall), before the CTA's __syncthreads,
// which orders those stores before every other thread's reads, so nobody waits for them. (Entered by consumer thread 0
// at its start instead, as gemm_ar's fused epilogue does to keep the enter's two dependent global round trips off the
// CTA's start, the producer needed a wait for the number: a CTA whose first tile is its own and whose k-blocks fit in
// the ring never blocks on the consumers, and number 0 would pass the peers' tile waits on an earlier call's signals.)
// The readers take them from shared memory at each use (volatile) rather than holding them (ring_wait).
// alpha = 1 and no bias (gemm_rs passes neither).
struct RsCall {
    uint64_t epoch;    // this call's number (the value of tile_in signals)
    uint8_t* scratch;  // this call's half of the scratch
};
LOOM_DEVICE LOOM_FORCEINLINE volatile RsCall& rs_call() {
    __shared__ volatile RsCall call;
    return call;
}
LOOM_DEVICE LOOM_FORCEINLINE int32_t& rs_pending_push() {
    // band * kMaxTileSignals + tile of this CTA's pushed tile whose signal is not raised yet, or -1. Thread 0 writes.
    __shared__ int32_t pending;
    return pending;
}

template <class TOut>
LOOM_DEVICE LOOM_FORCEINLINE uint4 acc_vector(const float* acc) {  // acc[0, E) -> one vector of TOut
    float v[kVecElems<TOut>];
#pragma unroll
    for (int k = 0; k < kVecElems<TOut>; ++k) v[k] = acc[k];
    return vec_pack<TOut>(v);
}

// Protocols (tile/hooks.cuh): AccEpilogue, and AccRingCopies for the peers' copies of an own tile.
struct RsAccHooks {
    RsFusedHookArgs a;

    template <class Grid>
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const Grid& g, int32_t& m_block,
                                                 int32_t& n_block) const {
        // The plain divisions (the grid without its divisors): with the multiplies and shifts the fp32-output 128 x 256
        // kernels spilled 24 bytes, and the 16-bit-output kernel looks the next tile up while its MMAs drain
        // (kLookahead, kernels/gemm.cuh), where the divisions cost nothing.
        tile::rotated_order(linear, static_cast<const tile::TileGrid&>(g), a.shift_m, m_block, n_block);
    }
    // Thread 0, before the CTA's __syncthreads: the call (RsCall above).
    LOOM_DEVICE LOOM_FORCEINLINE void init_cta() const {
        rs_pending_push() = -1;
        const uint64_t e = a.launches != nullptr ? lang::launch_epoch_enter(a.launches) : a.epoch;
        rs_call().scratch = a.launches != nullptr ? a.scratch + static_cast<int64_t>(e % 2) * a.half_stride : a.scratch;
        rs_call().epoch = e;
    }

    // Byte offset of warpgroup wg's part of tile t in a scratch slot of rank `band`'s rows.
    template <int BLOCK_M, int BLOCK_N, class TOut>
    LOOM_DEVICE LOOM_FORCEINLINE int64_t tile_offset(const tile::TileCoord& t, int32_t band, int wg) const {
        constexpr int64_t kTileBytes = int64_t(BLOCK_M) * BLOCK_N * sizeof(TOut);
        return rs_slot_tile(t.m_block - band * a.blocks_per_rank, t.n_block, a.blocks_per_rank, a.num_n, a.group) *
                   kTileBytes +
               wg * (kTileBytes / (BLOCK_M / 64));
    }

    // Every consumer thread: raise the signal of the pushed tile still pending (its stores performed first).
    template <int kConsumers>
    LOOM_DEVICE LOOM_FORCEINLINE void publish() const {
        ptx::named_barrier_sync(1, kConsumers * 128);  // the pending tile's stores issued, `pending` written
        const int32_t p = rs_pending_push();
        if (p < 0) return;             // uniform: every thread read the same value
        if ((kRsDiagSkip & 8) == 0) {  // diagnostics (racy without it): the fence's own cost
            // With the copy-engine transport the stores' readers are this GPU's own copy engine and stream memory
            // operations, which read through its L2: GPU scope makes the stores visible to them (a system-scope fence
            // here costs 2.5-10 us per GEMM at small K). Stores over NVLink: system scope.
            if (a.outbox != nullptr) {
                ptx::fence_acq_rel_gpu();
            } else {
                ptx::fence_acq_rel_sys();
            }
            ptx::named_barrier_sync(1, kConsumers * 128);
        }
        if (threadIdx.x == 0) {
            const int32_t d = p / kMaxTileSignals, tile = p % kMaxTileSignals;
            if (a.outbox != nullptr) {
                const int32_t band0 = d * a.blocks_per_rank;
                ptx::red_add_release_gpu(a.stored + static_cast<int64_t>(band0) * a.num_n +
                                             rs_chunk_lead(tile / a.num_n - band0, tile % a.num_n, a.blocks_per_rank,
                                                           a.num_n, a.group, a.chunk_n),
                                         uint64_t{1});
            } else {
                uint8_t* flag =
                    reinterpret_cast<uint8_t*>(a.tile_in + static_cast<int64_t>(a.me) * kMaxTileSignals + tile);
                ptx::st_release_sys(reinterpret_cast<uint64_t*>(flag + static_cast<int64_t>(d - a.me) * a.heap_bytes),
                                    rs_call().epoch);
            }
            rs_pending_push() = -1;
        }
    }

    // Signal of an own tile's copies: per tile when peers push over NVLink, per chunk with the copy engine.
    LOOM_DEVICE LOOM_FORCEINLINE int64_t own_tile_signal(const tile::TileCoord& t) const {
        const int32_t band0 = a.me * a.blocks_per_rank;
        return a.outbox != nullptr
                   ? static_cast<int64_t>(band0) * a.num_n +
                         rs_chunk_lead(t.m_block - band0, t.n_block, a.blocks_per_rank, a.num_n, a.group, a.chunk_n)
                   : int64_t(t.m_block) * a.num_n + t.n_block;
    }
    // Ring copies (tile::AccRingCopies): an own tile gets every peer's copy, in rank order.
    template <class TOut, int BLOCK_M, int BLOCK_N>
    LOOM_DEVICE LOOM_FORCEINLINE int ring_copies(const tile::TileCoord& t) const {
        const bool own = t.m_block / a.blocks_per_rank == a.me;
        return own && (kRsDiagSkip & 2) == 0 ? a.world - 1 : 0;
    }
    template <class TOut, int BLOCK_M, int BLOCK_N>
    LOOM_DEVICE LOOM_FORCEINLINE void ring_wait(const tile::TileCoord& t) const {
        const int64_t tile_id = own_tile_signal(t);
        LOOM_PROF_BEGIN(lang::kTagRsRingWait, (t.m_block << 16) | t.n_block);
        for (int q = 0; q < a.world; ++q) {
            if (q == a.me) continue;
            // The call number re-read from shared memory in every poll: held in registers over the spin it made the
            // producer (56 registers) spill 24 bytes in most tile shapes (a kernel parameter is re-read free).
            const uint64_t* sig = a.tile_in + static_cast<int64_t>(q) * kMaxTileSignals + tile_id;
            lang::spin_or_trap(
                a.timeout_ns, "gemm_rs: GEMM waits for a peer's tile", sig, lang::Cmp::GE,
                [&] { return static_cast<int64_t>(ptx::ld_acquire_sys(sig) - rs_call().epoch) >= 0; },
                [&] {
                    return lang::WaitValues{rs_call().epoch, ptx::ld_acquire_sys(sig)};
                });
        }
        LOOM_PROF_END(lang::kTagRsRingWait, (t.m_block << 16) | t.n_block);
    }
    // Copy c (the c-th peer in rank order) at ring_copy(t) + c * ring_copy_stride(): the peers' slots are in rank
    // order (rs_slot_of).
    template <class TOut, int BLOCK_M, int BLOCK_N>
    LOOM_DEVICE LOOM_FORCEINLINE const uint8_t* ring_copy(const tile::TileCoord& t) const {
        return rs_call().scratch + tile_offset<BLOCK_M, BLOCK_N, TOut>(t, a.me, 0);
    }
    LOOM_DEVICE LOOM_FORCEINLINE int64_t ring_copy_stride() const { return a.slot_bytes; }

    template <class TOut, int BLOCK_M, int BLOCK_N>
    LOOM_DEVICE LOOM_FORCEINLINE bool epilogue_acc(float (&acc)[BLOCK_N / 2], const tile::TileCoord& t) const {
        constexpr int E = kVecElems<TOut>;
        constexpr int kVecs = BLOCK_N / 2 / E;  // the thread's accumulators as 16-byte vectors of TOut
        constexpr int kVecStride = 128 * 16;    // bytes from vector v to v + 1 of one thread (fragment order)
        publish<BLOCK_M / 64>();
        const uint32_t tid = ptx::tid_x_unhoisted();
        const int warpgroup = static_cast<int>(tid / 128), wg_thread = static_cast<int>(tid % 128);
        const int32_t band = t.m_block / a.blocks_per_rank;
        if (band != a.me) {
            // Pending until this CTA's next publish (its named barrier orders this write and the stores below).
            if (tid == 0) rs_pending_push() = band * kMaxTileSignals + t.m_block * a.num_n + t.n_block;
            LOOM_PROF_ONLY(if (wg_thread == 0) LOOM_PROF_BEGIN(lang::kTagRsPushTile, (t.m_block << 16) | t.n_block));
            if ((kRsDiagSkip & 1) == 0) {
                // Over NVLink into our slot of the owner's scratch, or (copy-engine transport) into the local outbox.
                uint8_t* dst = (a.outbox != nullptr ? a.outbox + band * a.slot_bytes
                                                    : rs_call().scratch +  // RsCall
                                                          static_cast<int64_t>(band - a.me) * a.heap_bytes +
                                                          rs_slot_of(a.me, band) * a.slot_bytes) +
                               tile_offset<BLOCK_M, BLOCK_N, TOut>(t, band, warpgroup) + wg_thread * 16;
#pragma unroll
                for (int v = 0; v < kVecs; ++v)
                    *reinterpret_cast<uint4*>(dst + v * kVecStride) = acc_vector<TOut>(acc + E * v);
            }
            LOOM_PROF_ONLY(if (wg_thread == 0) LOOM_PROF_END(lang::kTagRsPushTile, (t.m_block << 16) | t.n_block));
            return false;
        }
        // An own tile: the kernel adds every peer's copy (ring_copies below).
        return true;
    }
    // An own tile's rows in C [M / W, N].
    LOOM_DEVICE LOOM_FORCEINLINE int32_t d_row_offset() const { return a.me * a.rows_per_rank; }

    template <int BLOCK_M>
    LOOM_DEVICE LOOM_FORCEINLINE void finish() const {
        publish<BLOCK_M / 64>();
    }
};
static_assert(tile::GemmHooks<RsAccHooks> && tile::AccRingCopies<RsAccHooks>);

// Rows [r0, r1) x columns [c0, c0 + cols) of this rank's segment: out = sum over q < W of the rows' copy from
// rank q (q == me: the local partial; else slot q of the scratch), fp32, rank order. cols is a multiple of the
// vector width; threads t = 0..nthreads-1 of the calling group (a warp) call it.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void reduce_rows(const RsParams& p, int W, int me, int32_t r0, int32_t r1, int32_t c0,
                                              int32_t cols, int32_t t, int32_t nthreads) {
    constexpr int E = kVecElems<T>;
    // U vectors per thread in flight per source: one 16-byte load at a time per thread leaves a 512-thread
    // block latency-bound at ~8 GB/s, too slow for a few blocks to keep up with the GEMM's output.
    constexpr int U = 4;
    const T* const partial = static_cast<const T*>(p.partial);
    const T* const scratch = static_cast<const T*>(p.scratch);
    T* const out = static_cast<T*>(p.out);
    const int64_t seg_elems = static_cast<int64_t>(p.rows_seg) * p.n;
    const int32_t vecs_per_row = cols / E, total = (r1 - r0) * vecs_per_row;
    const int32_t step = nthreads;
    for (int32_t base = t; base < total; base += U * step) {
        int64_t off[U];  // element offset of the vector within the segment's [rows_seg, n] layout
        int32_t orow[U], ocol[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int32_t i = base + u * step < total ? base + u * step : base;  // past the end: redo `base`
            orow[u] = r0 + i / vecs_per_row - me * p.rows_seg;
            ocol[u] = c0 + (i % vecs_per_row) * E;
            off[u] = static_cast<int64_t>(orow[u]) * p.n + ocol[u];
        }
        float acc[U][E];
#pragma unroll 1
        for (int q = 0; q < W; ++q) {
            const T* src = q == me ? partial + static_cast<int64_t>(me) * seg_elems : scratch + q * seg_elems;
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; ++u) v[u] = ptx::ld_v4_na(src + off[u]);
#pragma unroll
            for (int u = 0; u < U; ++u) vec_add<T>(v[u], acc[u], q == 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (base + u * step < total)
                ptx::st_v4(out + static_cast<int64_t>(orow[u]) * p.ldo + ocol[u], vec_pack<T>(acc[u]));
    }
}

// Rows [r0, r1) x columns [c0, c0 + vecs_per_row * E) of the partial -> rows [r0 - row_shift, ...) of `dst`
// (leading dimension n), U 16-byte vectors in flight per thread; threads t = 0..nthreads-1 of the group call it.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void copy_rows(const T* partial, T* dst, int32_t n, int32_t r0, int32_t r1, int32_t c0,
                                            int32_t vecs_per_row, int32_t row_shift, int32_t t, int32_t nthreads) {
    constexpr int E = kVecElems<T>, U = 6;  // 8 spills under the 168-register cap
    const int32_t total = (r1 - r0) * vecs_per_row, step = nthreads;
    for (int32_t base = t; base < total; base += U * step) {
        uint4 v[U];
        int64_t off[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int32_t i = base + u * step < total ? base + u * step : base;
            off[u] = static_cast<int64_t>(r0 + i / vecs_per_row) * n + c0 + (i % vecs_per_row) * E;
            v[u] = ptx::ld_v4_na(partial + off[u]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (base + u * step < total) ptx::st_v4(dst + off[u] - static_cast<int64_t>(row_shift) * n, v[u]);
    }
}

// T: the partial / output element type (bf16, fp16 or fp32). gridDim.x = P blocks (the same on every rank),
// kScatterReduceThreads threads (384: up to 170 registers, room for the vectors in flight). See the top of the file for
// the protocol.
template <class T>
__global__ void __launch_bounds__(kScatterReduceThreads) gemm_rs_scatter_reduce(Ctx ctx, RsParams p) {
    constexpr int E = kVecElems<T>;
    const int W = ctx.local_world, me = ctx.local_rank;
    const int tid = static_cast<int>(threadIdx.x);
    const T* const partial = static_cast<const T*>(p.partial);
    T* const scratch = static_cast<T*>(p.scratch);
    const int64_t seg_elems = static_cast<int64_t>(p.rows_seg) * p.n;

    // Every peer finished reading the previous call's scratch (its slot `me` is ours to fill again).
    if (tid < W && tid != me) lang::signal_wait_until(ctx, &p.sig->freed[tid], lang::Cmp::GE, p.free_target);
    __syncthreads();

    // Each warp is a worker with its own walk over tiles worker, worker + workers, ...: a warp's waits and its
    // release fence (which holds until its NVLink stores are acknowledged) stall only that warp, not the block.
    // Two walks: every push first, then the own rows' sums. A push waits only for this rank's GEMM, so pushes
    // always progress; a sum waits for peers' pushes. Were they interleaved in one walk, a worker could wait for
    // a peer's push that sits behind a sum in the peer worker's walk while that sum waits for a push behind
    // ours (the grouped order mixes owners inside a group): a cycle. Own rows come last in the GEMM's order, so
    // the second walk still runs under the GEMM.
    const int lane = tid % 32, warps = static_cast<int>(blockDim.x) / 32;
    const int32_t worker = static_cast<int32_t>(blockIdx.x) * warps + tid / 32;
    const int32_t workers = static_cast<int32_t>(gridDim.x) * warps;
    const int32_t num_m = (p.m + p.block_m - 1) / p.block_m;
    const int32_t num_n = (p.n + p.block_n - 1) / p.block_n;
    const int32_t num_tiles = num_m * num_n;
    for (int walk = 0; walk < 2; ++walk) {
        const bool pushing = walk == 0;
        for (int32_t linear = worker; linear < num_tiles; linear += workers) {
            int32_t mb, nb;
            overlap_tile_order(linear, num_m, num_n, p.group_m, p.shift_m, mb, nb);
            const int64_t t = static_cast<int64_t>(mb) * num_n + nb;
            const int32_t row0 = mb * p.block_m, col0 = nb * p.block_n;
            const int32_t row1 = row0 + p.block_m < p.m ? row0 + p.block_m : p.m;
            const int32_t cols = col0 + p.block_n < p.n ? p.block_n : p.n - col0;
            const int32_t vecs_per_row = cols / E;
            const int own0 = me * p.rows_seg, own1 = own0 + p.rows_seg;
            const bool has_own = row0 < own1 && row1 > own0;
            const bool has_peer_rows = row0 < own0 || row1 > own1;
            if (pushing ? !has_peer_rows : !has_own) continue;
            LOOM_PROF_ONLY(if (lane == 0) LOOM_PROF_BEGIN(lang::kTagRsScatterWait, t));
            lang::wait(lang::warp, ctx, &p.sig->tile[t], lang::Cmp::GE, p.epoch);
            LOOM_PROF_ONLY(if (lane == 0) LOOM_PROF_END(lang::kTagRsScatterWait, t));
            LOOM_PROF_ONLY(const uint16_t phase_tag = pushing ? lang::kTagRsScatterPush : lang::kTagRsScatterReduce;
                           if (lane == 0) LOOM_PROF_BEGIN(phase_tag, t));
            for (int32_t r0 = row0; r0 < row1;) {
                const int d = r0 / p.rows_seg;  // owner of rows [r0, r1)
                const int32_t r1 = (d + 1) * p.rows_seg < row1 ? (d + 1) * p.rows_seg : row1;
                if (pushing && d != me) {
                    T* const remote = lang::symm_at(ctx, scratch, ctx.local_base_rank + d) + me * seg_elems;
                    copy_rows<T>(partial, remote, p.n, r0, r1, col0, vecs_per_row, d * p.rows_seg, lane, 32);
                    // The warp's stores, then tile_in[me][t] := epoch at d (__syncwarp, release at sys scope).
                    lang::notify(lang::warp, ctx, &p.sig->tile_in[me][t], ctx.local_base_rank + d, p.epoch,
                                 lang::SignalOp::Set);
                } else if (!pushing && d == me) {
                    // Lane q waits for rank q's copy (acquire), then __syncwarp orders the warp's reads after it.
                    if (lane < W && lane != me)
                        lang::signal_wait_until(ctx, &p.sig->tile_in[lane][t], lang::Cmp::GE, p.epoch);
                    __syncwarp();
                    reduce_rows<T>(p, W, me, r0, r1, col0, cols, lane, 32);
                }
                r0 = r1;
            }
            LOOM_PROF_ONLY(if (lane == 0) LOOM_PROF_END(phase_tag, t));
        }
    }
    // Done reading our scratch: every rank may push the next call's tiles into it (notify's block barrier waits
    // for every warp of this block first).
    for (int d = 0; d < W; ++d)
        if (d != me) lang::notify(lang::block, ctx, &p.sig->freed[me], ctx.local_base_rank + d, 1, lang::SignalOp::Add);
}

}  // namespace loom::kernels::overlap
