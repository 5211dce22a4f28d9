// Ulysses sequence parallelism's all-to-alls (docs/attention.md "Ulysses sequence parallelism"): heads <-> sequence.
//
//   ulysses_qkv_a2a  (qkv_gemm_a2a) a pull: every rank's QKV product [S / W, (Hq + 2 Hkv) D] sits in its symmetric
//                    buffer; each rank copies its head slice of every rank's rows into its own q, k, v ([S, heads, D],
//                    anywhere on the device). Fused: a few blocks on a side stream beside the QKV GEMM, each warp
//                    walking the GEMM's tiles in its raster order and reading a tile once its signal (set by the
//                    owner's GEMM after the tile's TMA stores completed) says it is there. Sequential: after the
//                    GEMM on the caller's stream, launched programmatically so that its launch overlaps the GEMM's
//                    tail (griddep_wait first); it publishes ready[me] and waits for each rank's ready.
//   ulysses_o_a2a    (a2a_o_gemm) a push: each rank writes rows [d S / W, (d + 1) S / W) of its attention output
//                    (its head slice) into columns [me w, (me + 1) w) of rank d's symmetric gathered operand
//                    [S / W, Hq D], chunk by chunk, and sets arrived[me][chunk] there. Fused: beside the output
//                    projection GEMM, whose tiles wait for their chunks (UlyssesOGemmHooks, ulysses_o_gemm.cuh).
//                    Sequential: the kernel itself waits for every chunk, and loom::gemm follows.
//
// Buffer reuse: the symmetric buffers hold two parity halves (call e uses half e % 2), and no extra signal guards them.
// A rank's QKV GEMM of call e follows (stream order) its all-to-all of call e - 1, which read a tile of every peer's
// call e - 1, which that peer produced after its all-to-all of call e - 2 (the last reader of half e % 2) finished. A
// rank's push of call e follows its GEMM of call e - 1, which waited for every peer's chunks of call e - 1, which each
// peer pushed after its GEMM of call e - 2 (the last reader of its half e % 2) finished.
#pragma once

#include "loom/kernels/attention/ulysses_params.hpp"
#include "loom/lang/lang.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/special.cuh"
#include "loom/tile/tile_order.hpp"

namespace loom::kernels::attention {

// rows x row_bytes (a multiple of 16) from src (row stride src_ld) to dst (row stride dst_ld), by threads
// t = 0 .. nthreads - 1, eight 16-byte vectors in flight per thread (peer reads are latency-bound one at a time; with
// 8 ranks sharing an H100, eight took both Sequential all-to-alls 1-1.4 % faster than four).
LOOM_DEVICE LOOM_FORCEINLINE void ulysses_copy_rect(const uint8_t* src, int64_t src_ld, uint8_t* dst, int64_t dst_ld,
                                                    int32_t rows, int32_t row_bytes, int32_t t, int32_t nthreads) {
    constexpr int U = 8;
    const int32_t vpr = row_bytes / 16, total = rows * vpr;
    for (int32_t base = t; base < total; base += U * nthreads) {
        uint4 v[U];
        int64_t so[U], dof[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int32_t i = base + u * nthreads < total ? base + u * nthreads : base;  // past the end: redo `base`
            const int32_t r = i / vpr, c = (i % vpr) * 16;
            so[u] = static_cast<int64_t>(r) * src_ld + c;
            dof[u] = static_cast<int64_t>(r) * dst_ld + c;
            v[u] = ptx::ld_v4_na(src + so[u]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (base + u * nthreads < total) ptx::st_v4(dst + dof[u], v[u]);
    }
}

// gridDim.x blocks of kUlyssesThreads; every warp is a worker with its own walk over units u = (tile, source rank):
// tile u / W of the tiling in its raster order, source (me + u) % W, so that the ranks' first tiles are read first
// and a warp's wait stalls only that warp. Units whose tile holds none of this rank's columns are skipped unread.
__global__ void __launch_bounds__(kUlyssesThreads) ulysses_qkv_a2a(Ctx ctx, UlyssesQkvParams p) {
    // Sequential launches it programmatically after the GEMM (qkv_sequential): wait for that grid to complete and its
    // stores to be visible before signalling or reading. A no-op in the fused launch (a side stream, not programmatic).
    ptx::griddep_wait();
    const int W = ctx.local_world, me = ctx.local_rank;
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32;
    if (p.whole && tid < W) {
        // This rank's product is complete (its GEMM precedes this kernel in stream order); the fence makes it
        // cumulative for the release (every block sets the same value: no block needs another to run).
        ptx::fence_acq_rel_sys();
        lang::signal_op(ctx, &p.sig->ready[me], p.epoch, lang::SignalOp::Set, ctx.local_base_rank + tid);
    }
    const int warps = static_cast<int>(blockDim.x) / 32;
    const int64_t worker = static_cast<int64_t>(blockIdx.x) * warps + tid / 32;
    const int64_t workers = static_cast<int64_t>(gridDim.x) * warps;
    const int64_t units = static_cast<int64_t>(p.num_m) * p.num_n * W;
    const tile::TileGrid grid{p.num_m, p.num_n, p.group_m};
    for (int64_t u = worker; u < units; u += workers) {
        const int32_t linear = static_cast<int32_t>(u / W);
        const int src = static_cast<int>((me + u % W) % W);
        int32_t mb, nb;
        tile::grouped_order(linear, grid, mb, nb);
        const int32_t row0 = mb * p.block_m;
        const int32_t rows = p.rows_per_rank - row0 < p.block_m ? p.rows_per_rank - row0 : p.block_m;
        const int64_t c0 = static_cast<int64_t>(nb) * p.block_n_bytes;
        const int64_t c1 = c0 + p.block_n_bytes < p.row_bytes ? c0 + p.block_n_bytes : p.row_bytes;
        bool mine = false;
#pragma unroll
        for (int s = 0; s < 3; ++s) mine |= c0 < p.col_bytes[s] + p.width_bytes[s] && p.col_bytes[s] < c1;
        if (!mine) continue;
        const int peer = ctx.local_base_rank + src;
        if (lane == 0) {
            const uint64_t* sig =
                p.whole ? &p.sig->ready[src]
                        : lang::symm_at(ctx, p.sig->tile + (static_cast<int64_t>(mb) * p.num_n + nb), peer);
            lang::spin_wait(ctx, p.whole ? "ulysses_qkv_a2a: rank's product" : "ulysses_qkv_a2a: QKV tile", sig,
                            lang::Cmp::GE, p.epoch, lang::Scope::Sys, peer);
        }
        __syncwarp();  // the warp's reads after lane 0's acquire
        const uint8_t* const tile = lang::symm_at(ctx, p.qkv, peer) + static_cast<int64_t>(row0) * p.row_bytes;
#pragma unroll 1
        for (int s = 0; s < 3; ++s) {
            const int64_t a = c0 > p.col_bytes[s] ? c0 : p.col_bytes[s];
            const int64_t e = c1 < p.col_bytes[s] + p.width_bytes[s] ? c1 : p.col_bytes[s] + p.width_bytes[s];
            if (a >= e) continue;
            uint8_t* const dst = p.out[s] + (static_cast<int64_t>(src) * p.rows_per_rank + row0) * p.out_ld_bytes[s] +
                                 (a - p.col_bytes[s]);
            ulysses_copy_rect(tile + a, p.row_bytes, dst, p.out_ld_bytes[s], rows, static_cast<int32_t>(e - a), lane,
                              32);
        }
    }
}

// gridDim.x blocks of kUlyssesThreads (the same count on every rank); block b pushes units u = b, b + gridDim.x, ...:
// chunk u / W to rank (me + u) % W, so every rank's first chunks go out first (the GEMM's first tiles need them).
__global__ void __launch_bounds__(kUlyssesThreads) ulysses_o_a2a(Ctx ctx, UlyssesOParams p) {
    const int W = ctx.local_world, me = ctx.local_rank;
    const int tid = static_cast<int>(threadIdx.x);
    if (tid == 0) ptx::red_add_relaxed_sys(&p.sig->started, uint64_t(1));  // resident (Fused: the GEMM waits for it)
    const int64_t gather_ld = static_cast<int64_t>(W) * p.width_bytes;
    const int32_t units = p.num_chunks * W;
    for (int32_t u = static_cast<int32_t>(blockIdx.x); u < units; u += static_cast<int32_t>(gridDim.x)) {
        const int32_t c = u / W;
        const int d = (me + u % W) % W;
        const int peer = ctx.local_base_rank + d;
        const int32_t row0 = c * p.chunk_rows;
        const int32_t rows = p.rows_per_rank - row0 < p.chunk_rows ? p.rows_per_rank - row0 : p.chunk_rows;
        const uint8_t* const src = p.o + (static_cast<int64_t>(d) * p.rows_per_rank + row0) * p.o_ld_bytes;
        uint8_t* const dst = lang::symm_at(ctx, p.gather, peer) + static_cast<int64_t>(row0) * gather_ld +
                             static_cast<int64_t>(me) * p.width_bytes;
        ulysses_copy_rect(src, p.o_ld_bytes, dst, gather_ld, rows, static_cast<int32_t>(p.width_bytes), tid,
                          static_cast<int32_t>(blockDim.x));
        // The block's stores, then arrived[me][c] := epoch at d (__syncthreads, release at sys scope).
        lang::notify(lang::block, ctx, &p.sig->arrived[me][c], peer, p.epoch, lang::SignalOp::Set);
    }
    if (!p.wait_all) return;
    // Sequential: the GEMM that follows on the stream reads every chunk: end only once all of them landed here.
    const int64_t waits = static_cast<int64_t>(W) * p.num_chunks;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + tid; j < waits;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int q = static_cast<int>(j / p.num_chunks);
        lang::signal_wait_until(ctx, &p.sig->arrived[q][j % p.num_chunks], lang::Cmp::GE, p.epoch, lang::Scope::Sys,
                                "ulysses_o_a2a: chunk", ctx.local_base_rank + q);
    }
}

}  // namespace loom::kernels::attention
