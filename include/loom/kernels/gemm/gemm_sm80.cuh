// Portable tensor-core GEMM for sm_80 / sm_89 (and a fallback on Hopper): same contract as gemm.cuh,
// D[M, N] = alpha * A[M, K] * B^T + beta * D + bias[N], bf16/fp16 in, fp32 accumulate.
//
// Data path: cp.async 16-byte copies (zero-filled outside the matrix) -> STAGES-deep ring in shared memory
// (XOR-swizzled 16-byte chunks, conflict-free for ldmatrix) -> ldmatrix -> mma.sync m16n8k16 -> registers ->
// vectorised global stores. One CTA per 128 x 128 tile, 8 warps as 2 (M) x 4 (N), each a 64 x 32 warp tile.
// Shared memory: STAGES x (128 x 32 + 32 x 128) x 2 B = STAGES x 16 KiB.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/config.hpp"
#include "loom/kernels/gemm/gemm.cuh"
#include "loom/ptx/sm80.cuh"
#include "loom/tile/epilogue.cuh"

namespace loom::kernels {

namespace detail {
// [rows][32] b16 tile, 4 chunks of 16 B per row: chunk c of row r lives at chunk c ^ ((r >> 1) & 3).
LOOM_DEVICE LOOM_FORCEINLINE int k32_offset(int r, int chunk) { return r * 32 + ((chunk ^ ((r >> 1) & 3)) * 8); }
// [32][128] b16 tile, 16 chunks of 16 B per row: chunk c of row r lives at chunk c ^ (r & 7).
LOOM_DEVICE LOOM_FORCEINLINE int n128_offset(int r, int chunk) { return r * 128 + ((chunk ^ (r & 7)) * 8); }
}  // namespace detail

// The mainloop of one 128 x 128 tile (256 threads, convergent), shared with the grouped GEMM (kernels/moe/): acc :=
// A[row0 .., :] x B^T for tile column r = B's row (kBKMajor) or column b_col(r); rows of A at or past a_row_end and B's
// rows / columns at or past n are read as zeros. b_col is called with r and with multiples of 8 (a [K, N] B is copied
// in 8-column chunks, so it must map each aligned run of 8 to 8 consecutive columns). smem:
// gemm_sm80_smem_bytes(STAGES).
template <class TIn, int STAGES, bool kBKMajor, class BCol>
LOOM_DEVICE LOOM_FORCEINLINE void sm80_tile_mainloop(const TIn* __restrict__ a, int64_t lda, int32_t row0,
                                                     int32_t a_row_end, const TIn* __restrict__ b, int64_t ldb,
                                                     int32_t n, int32_t k, const BCol& b_col, float (&acc)[4][4][4],
                                                     TIn* smem) {
    constexpr bool kBF16 = tile::kSameType<TIn, __nv_bfloat16>;
    constexpr int BM = kSm80BlockM, BN = kSm80BlockN, BK = kSm80BlockK;
    constexpr int kStageElems = (BM + BN) * BK;
    const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
    const int warp_m = warp / 4, warp_n = warp % 4;  // warp tile rows [64 warp_m, +64), cols [32 warp_n, +32)
    const int num_k_blocks = (k + BK - 1) / BK;

    // Copy one k-block into stage s: A 128 x 32 (512 chunks), B 128 x 32 or 32 x 128 (512 chunks), 2 + 2 per
    // thread. K % 8 == 0, so a chunk is entirely inside or outside the matrix.
    auto load_stage = [&](int s, int kb) {
        TIn* sa = smem + s * kStageElems;
        TIn* sb = sa + BM * BK;
        const int k0 = kb * BK;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int c = tid + i * kSm80Threads;
            const int r = c / 4, ch = c % 4;
            const int gr = row0 + r, gk = k0 + ch * 8;
            const bool ok = gr < a_row_end && gk < k;
            ptx::cp_async_16_zfill(sa + detail::k32_offset(r, ch), ok ? a + gr * lda + gk : a, ok);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int c = tid + i * kSm80Threads;
            if constexpr (kBKMajor) {
                const int r = c / 4, ch = c % 4;
                const int gn = b_col(r), gk = k0 + ch * 8;
                const bool ok = gn < n && gk < k;
                ptx::cp_async_16_zfill(sb + detail::k32_offset(r, ch), ok ? b + gn * ldb + gk : b, ok);
            } else {
                const int r = c / 16, ch = c % 16;
                const int gk = k0 + r, gn = b_col(ch * 8);
                const bool ok = gk < k && gn < n;
                ptx::cp_async_16_zfill(sb + detail::n128_offset(r, ch), ok ? b + gk * ldb + gn : b, ok);
            }
        }
    };

#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < num_k_blocks) load_stage(s, s);
        ptx::cp_async_commit();
    }

    for (int kb = 0; kb < num_k_blocks; ++kb) {
        ptx::cp_async_wait<STAGES - 2>();
        __syncthreads();  // stage kb landed for every thread; stage kb - 1 is no longer read
        const int next = kb + STAGES - 1;
        if (next < num_k_blocks) load_stage(next % STAGES, next);
        ptx::cp_async_commit();

        const TIn* sa = smem + (kb % STAGES) * kStageElems;
        const TIn* sb = sa + BM * BK;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            uint32_t af[4][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                // Matrices: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
                const int r = warp_m * 64 + i * 16 + (lane % 16);
                const int ch = kk * 2 + lane / 16;
                ptx::ldmatrix_x4(af[i], sa + detail::k32_offset(r, ch));
            }
#pragma unroll
            for (int jp = 0; jp < 2; ++jp) {
                uint32_t r4[4];
                if constexpr (kBKMajor) {
                    // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
                    const int nn = warp_n * 32 + jp * 16 + (lane / 16) * 8 + (lane % 8);
                    const int ch = kk * 2 + (lane / 8) % 2;
                    ptx::ldmatrix_x4(r4, sb + detail::k32_offset(nn, ch));
                } else {
                    // Transposed from [k][n]: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
                    const int kr = kk * 16 + (lane / 8) % 2 * 8 + (lane % 8);
                    const int ch = (warp_n * 32 + jp * 16) / 8 + lane / 16;
                    ptx::ldmatrix_x4_trans(r4, sb + detail::n128_offset(kr, ch));
                }
                bf[2 * jp][0] = r4[0];
                bf[2 * jp][1] = r4[1];
                bf[2 * jp + 1][0] = r4[2];
                bf[2 * jp + 1][1] = r4[3];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) ptx::mma_m16n8k16<kBF16>(acc[i][j], af[i], bf[j]);
        }
    }
    ptx::cp_async_wait<0>();
}

// a: [m, k] row-major (lda elements). b: [n, k] (kBKMajor) or [k, n] row-major (ldb elements).
// Grid: (ceil(n / 128), ceil(m / 128)); block: 256 threads; dynamic smem: gemm_sm80_smem_bytes(STAGES).
template <class TIn, class TOut, class TBias, int STAGES, bool kBKMajor>
__global__ void __launch_bounds__(kSm80Threads)
    gemm_sm80_mma_sync(const TIn* __restrict__ a, int64_t lda, const TIn* __restrict__ b, int64_t ldb,
                       const GemmArgs args) {
    static_assert(STAGES >= 2 && STAGES <= 6, "STAGES in [2, 6]");
    static_assert(sizeof(TIn) == 2, "inputs are bf16 or fp16");
#if LOOM_ARCH >= 800
    extern __shared__ uint8_t smem_raw[];
    TIn* smem = reinterpret_cast<TIn*>(smem_raw);
    const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
    const int warp_m = warp / 4, warp_n = warp % 4;  // warp tile rows [64 warp_m, +64), cols [32 warp_n, +32)
    const int row0 = static_cast<int>(blockIdx.y) * kSm80BlockM, col0 = static_cast<int>(blockIdx.x) * kSm80BlockN;
    float acc[4][4][4];  // [m16 frag][n8 frag][4]
    sm80_tile_mainloop<TIn, STAGES, kBKMajor>(
        a, lda, row0, args.m, b, ldb, args.n, args.k, [col0](int r) { return col0 + r; }, acc, smem);

    const tile::EpilogueParams<TOut, TBias> epi{static_cast<TOut*>(args.d),
                                                args.ldd,
                                                static_cast<const TBias*>(args.bias),
                                                args.m,
                                                args.n,
                                                args.alpha * gemm_device_scales(args),
                                                args.beta};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = row0 + warp_m * 64 + i * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = col0 + warp_n * 32 + j * 8 + 2 * (lane % 4);
            epi.store(r, c, acc[i][j][0], acc[i][j][1]);
            epi.store(r + 8, c, acc[i][j][2], acc[i][j][3]);
        }
    }
#else
    __trap();
#endif
}

}  // namespace loom::kernels
