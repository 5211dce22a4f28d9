// GEMM+AllReduce for small M (decode, small-batch prefill; M <= 128): C[M, N] on every rank = sum over ranks q
// of A_q[M, K_loc] * B_q[N, K_loc]^T, accumulated in fp32 in rank order 0..W-1. Low latency, two kernels running
// concurrently on every rank:
//
//   GEMM     the persistent Hopper GEMM with TileNotifyHooks (kernels/gemm_rs.cuh) writes the partial product
//            into this call's parity half of a symmetric double buffer and publishes each tile as soon as its TMA
//            stores completed (tile[i] = epoch, store-release, sys scope).
//   reduce   gemm_ar_reduce, a few blocks on a side stream: block b takes tiles b, b + P, ... in the GEMM's
//            order; for each, thread q waits (acquire, sys) for rank q's signal of the tile, then the block pulls
//            the W partial tiles over NVLink (one-shot: every rank reduces the whole output) and writes C.
// No reset and no write-after-read signal: a rank writes parity (e + 1) % 2 in call e + 1 while peers may still
// read parity e % 2, and it cannot reach call e + 2 before every peer finished call e (its reduce of call e + 1
// waits for every peer's GEMM of call e + 1, which each peer runs after its reduce of call e).
#pragma once

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 1  // wgmma kernel in this TU: no printf anywhere (ptxas C7510)
#endif

#include "loom/kernels/gemm_rs.cuh"

namespace loom::kernels::overlap {

// T: the partial / output element type. gridDim.x = P blocks, 256 threads.
template <class T>
__global__ void __launch_bounds__(256) gemm_ar_reduce(Ctx ctx, ArParams p) {
    constexpr int E = kVecElems<T>;
    const int W = ctx.local_world;
    const int tid = static_cast<int>(threadIdx.x);
    const T* const partial = static_cast<const T*>(p.partial);
    T* const out = static_cast<T*>(p.out);
    const int32_t num_m = (p.m + p.block_m - 1) / p.block_m;
    const int32_t num_n = (p.n + p.block_n - 1) / p.block_n;
    const int32_t num_tiles = num_m * num_n;
    const T* src_base[kMaxLocalPeers];
#pragma unroll
    for (int q = 0; q < kMaxLocalPeers; ++q)
        src_base[q] = lang::symm_at(ctx, partial, ctx.local_base_rank + (q < W ? q : 0));

    for (int32_t linear = static_cast<int32_t>(blockIdx.x); linear < num_tiles;
         linear += static_cast<int32_t>(gridDim.x)) {
        int32_t mb, nb;
        overlap_tile_order(linear, num_m, num_n, p.group_m, 0, mb, nb);
        const int64_t idx = static_cast<int64_t>(mb) * num_n + nb;
        if (tid < W)
            lang::signal_wait_until(ctx, lang::symm_at(ctx, p.tile + idx, ctx.local_base_rank + tid), lang::Cmp::GE,
                                    p.epoch);
        __syncthreads();
        const int32_t row0 = mb * p.block_m, col0 = nb * p.block_n;
        const int32_t rows = row0 + p.block_m < p.m ? p.block_m : p.m - row0;
        const int32_t cols = col0 + p.block_n < p.n ? p.block_n : p.n - col0;
        const int32_t vecs_per_row = cols / E;
        for (int32_t i = tid; i < rows * vecs_per_row; i += static_cast<int32_t>(blockDim.x)) {
            const int32_t r = row0 + i / vecs_per_row;
            const int32_t c = col0 + (i % vecs_per_row) * E;
            const int64_t off = static_cast<int64_t>(r) * p.n + c;
            float acc[E];
#pragma unroll
            for (int q = 0; q < kMaxLocalPeers; ++q)
                if (q < W) vec_add<T>(ptx::ld_v4(src_base[q] + off), acc, q == 0);
            ptx::st_v4(out + static_cast<int64_t>(r) * p.ldo + c, vec_pack<T>(acc));
        }
        __syncthreads();  // the next tile's waits reuse the threads' registers; keep the block in step
    }
}

}  // namespace loom::kernels::overlap
