// Portable tensor-core GEMM for sm_80 / sm_89 (and a fallback on Hopper): same contract as gemm.cuh,
// D[M, N] = alpha * A[M, K] * B^T + beta * D + bias[N], bf16/fp16 in, fp32 accumulate.
//
// Data path: cp.async 16-byte copies (zero-filled outside the matrix) -> STAGES-deep ring in shared memory
// (XOR-swizzled 16-byte chunks, conflict-free for ldmatrix) -> ldmatrix -> mma.sync m16n8k16 -> registers ->
// vectorised global stores. One CTA per 128 x 128 tile, 8 warps as 2 (M) x 4 (N), each a 64 x 32 warp tile.
// Shared memory: STAGES x (128 x 32 + 32 x 128) x 2 B = STAGES x 16 KiB.
//
// sm80_tile_mainloop_e4m3 is the same tile for fp8 e4m3 A and B [N, K] (the grouped GEMM's; sm_80 has no fp8 MMA):
// cp.async of the fp8 bytes into a STAGES-deep ring, each thread converting the bytes it copied to bf16 (exact) into
// one of two bf16 k-tiles in the layout above, then the bf16 ldmatrix + mma.sync path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/config.hpp"
#include "loom/kernels/gemm/gemm.cuh"
#include "loom/ptx/async.cuh"
#include "loom/ptx/sm80.cuh"
#include "loom/tile/epilogue.cuh"

namespace loom::kernels {

namespace detail {
// [rows][32] b16 tile, 4 chunks of 16 B per row: chunk c of row r lives at chunk c ^ ((r >> 1) & 3).
LOOM_DEVICE LOOM_FORCEINLINE int k32_offset(int r, int chunk) { return r * 32 + ((chunk ^ ((r >> 1) & 3)) * 8); }
// [32][128] b16 tile, 16 chunks of 16 B per row: chunk c of row r lives at chunk c ^ (r & 7).
LOOM_DEVICE LOOM_FORCEINLINE int n128_offset(int r, int chunk) { return r * 128 + ((chunk ^ (r & 7)) * 8); }
}  // namespace detail

// acc := 0 (the 128 x 128 tile's fragments of one thread).
LOOM_DEVICE LOOM_FORCEINLINE void sm80_zero(float (&acc)[4][4][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// acc += the k-tile in shared memory (A [128][32] and B [128][32] (kBKMajor) or [32][128], layouts above) of one
// 128 x 128 tile: each warp its 64 x 32 warp tile (256 threads).
template <class TIn, bool kBKMajor>
LOOM_DEVICE LOOM_FORCEINLINE void sm80_k_tile_mma(const TIn* sa, const TIn* sb, float (&acc)[4][4][4]) {
    constexpr bool kBF16 = tile::kSameType<TIn, __nv_bfloat16>;
    const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
    const int warp_m = warp / 4, warp_n = warp % 4;  // warp tile rows [64 warp_m, +64), cols [32 warp_n, +32)
#pragma unroll
    for (int kk = 0; kk < kSm80BlockK / 16; ++kk) {
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
    constexpr int BM = kSm80BlockM, BN = kSm80BlockN, BK = kSm80BlockK;
    constexpr int kStageElems = (BM + BN) * BK;
    const int tid = static_cast<int>(threadIdx.x);
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

    sm80_zero(acc);

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
        sm80_k_tile_mma<TIn, kBKMajor>(sa, sa + BM * BK, acc);
    }
    ptx::cp_async_wait<0>();
}

namespace detail {
// Two e4m3 -> a bf16x2, exactly: the e4m3 in bits 15..8 (low half) and 31..24 (high half) of w; bits 7..0 and 23..16
// are ignored. s.eeee.mmm becomes the bf16 bits s.0000eeee.mmm0000, which is the e4m3 value x 2^-120 (e4m3's
// subnormals land on bf16's), then one bf16x2 multiply by 2^120 makes it the value (exact: bf16 keeps subnormals and
// the product is a bf16). The NaN s.1111.111 gets the exponent 0xff first and stays a NaN.
LOOM_DEVICE LOOM_FORCEINLINE uint32_t e4m3_pair_to_bf16x2(uint32_t w) {
    const uint32_t mag = w & 0x7f007f00u;
    const uint32_t nan = (mag + 0x01000100u) & 0x80008000u;  // 0x8000 in a half whose magnitude is 0x7f
    const uint32_t bits = (w & 0x80008000u) | (mag >> 4) | (nan - (nan >> 4));
    const __nv_bfloat16 two_120 = __ushort_as_bfloat16(0x7b80);  // 2^120
    const __nv_bfloat162 v =
        __hmul2_rn(*reinterpret_cast<const __nv_bfloat162*>(&bits), __halves2bfloat162(two_120, two_120));
    return *reinterpret_cast<const uint32_t*>(&v);
}

// 16 e4m3 (one 16-byte chunk) -> 16 bf16 (two 16-byte chunks), the bytes of each 4-byte word in the order 0, 2, 1, 3.
LOOM_DEVICE LOOM_FORCEINLINE void e4m3x16_to_bf16(const uint4& q, uint4& lo, uint4& hi) {
    lo = make_uint4(e4m3_pair_to_bf16x2(q.x << 8), e4m3_pair_to_bf16x2(q.x), e4m3_pair_to_bf16x2(q.y << 8),
                    e4m3_pair_to_bf16x2(q.y));
    hi = make_uint4(e4m3_pair_to_bf16x2(q.z << 8), e4m3_pair_to_bf16x2(q.z), e4m3_pair_to_bf16x2(q.w << 8),
                    e4m3_pair_to_bf16x2(q.w));
}
}  // namespace detail

// sm80_tile_mainloop for fp8 e4m3 A [rows, k] and B [n, k] (lda, ldb in bytes; k a multiple of 16), same contract:
// acc := A[row0 .., :] x B^T for tile column r = B's row b_col(r), rows of A at or past a_row_end and B's rows at or
// past n read as zeros; and k_tile_done(kt) after the MMAs of each 32-element k-tile kt (acc then holds what
// k_tile_done left in it plus k-tile kt's products: a block-scaled caller promotes there). smem:
// gemm_sm80_e4m3_smem_bytes(STAGES).
// Per k-tile, thread t copies 16 fp8 of row t / 2 of A and of B (k-tile bytes 16 (t % 2) ..) with cp.async into the
// STAGES-deep fp8 ring and, STAGES - 1 k-tiles later, converts exactly those bytes (its own copies: no barrier
// between copy and conversion) into two 16-byte chunks of bf16 k-tile kt % 2 (the sm_80 layout, conflict-free: the
// 8 stores of a quarter warp, rows 4q .. 4q + 3, land in 8 distinct chunks of the swizzle). Within a k-tile the
// elements are permuted (e4m3x16_to_bf16), alike in A and B, so the products' sum is the same. One barrier per
// k-tile, between the conversion and the MMAs: it publishes k-tile kt, and it is where every warp has finished the
// MMAs of kt - 1, so the conversion of kt + 1 may overwrite the buffer of kt - 1 and the copies of kt + STAGES the
// fp8 slot of kt.
template <int STAGES, class BCol, class KTileDone>
LOOM_DEVICE LOOM_FORCEINLINE void sm80_tile_mainloop_e4m3(const uint8_t* __restrict__ a, int64_t lda, int32_t row0,
                                                          int32_t a_row_end, const uint8_t* __restrict__ b, int64_t ldb,
                                                          int32_t n, int32_t k, const BCol& b_col,
                                                          float (&acc)[4][4][4], uint8_t* smem,
                                                          const KTileDone& k_tile_done) {
    constexpr int BM = kSm80BlockM, BN = kSm80BlockN, BK = kSm80BlockK;
    constexpr int kStageBytes = (BM + BN) * BK;  // one fp8 k-tile of A and B: 8 KiB
    constexpr int kTileElems = (BM + BN) * BK;   // one bf16 k-tile of A and B: 16 KiB
    __nv_bfloat16* const tiles = reinterpret_cast<__nv_bfloat16*>(smem + STAGES * kStageBytes);
    const int tid = static_cast<int>(threadIdx.x);
    const int r = tid / 2, half = tid % 2;  // this thread's row of the A and B tiles, and its 16 bytes of a k-tile
    const int num_k_tiles = (k + BK - 1) / BK;
    const int32_t ga = row0 + r, gn = b_col(r);
    const bool a_ok = ga < a_row_end, b_ok = gn < n;
    const uint8_t* const a_row = a + (a_ok ? ga * lda : 0) + 16 * half;
    const uint8_t* const b_row = b + (b_ok ? gn * ldb : 0) + 16 * half;

    auto load_stage = [&](int kt) {
        uint8_t* const slot = smem + (kt % STAGES) * kStageBytes + tid * 16;
        const int k0 = kt * BK;
        const bool k_ok = k0 + 16 * half < k;
        ptx::cp_async_16_zfill(slot, a_ok && k_ok ? a_row + k0 : a, a_ok && k_ok);
        ptx::cp_async_16_zfill(slot + BM * BK, b_ok && k_ok ? b_row + k0 : b, b_ok && k_ok);
    };
    auto convert = [&](int kt) {
        const uint8_t* const slot = smem + (kt % STAGES) * kStageBytes + tid * 16;
        __nv_bfloat16* const ta = tiles + (kt % 2) * kTileElems;
        __nv_bfloat16* const tb = ta + BM * BK;
        uint4 lo, hi;
        detail::e4m3x16_to_bf16(ptx::ld_shared_v4(slot), lo, hi);
        ptx::st_shared_v4(ta + detail::k32_offset(r, 2 * half), lo);
        ptx::st_shared_v4(ta + detail::k32_offset(r, 2 * half + 1), hi);
        detail::e4m3x16_to_bf16(ptx::ld_shared_v4(slot + BM * BK), lo, hi);
        ptx::st_shared_v4(tb + detail::k32_offset(r, 2 * half), lo);
        ptx::st_shared_v4(tb + detail::k32_offset(r, 2 * half + 1), hi);
    };

    sm80_zero(acc);

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < num_k_tiles) load_stage(s);
        ptx::cp_async_commit();
    }
    for (int kt = 0; kt < num_k_tiles; ++kt) {
        if (kt + STAGES - 1 < num_k_tiles) load_stage(kt + STAGES - 1);
        ptx::cp_async_commit();
        ptx::cp_async_wait<STAGES - 1>();  // this thread's copies of k-tile kt landed
        convert(kt);
        __syncthreads();  // bf16 k-tile kt complete; every warp is past the MMAs of kt - 1
        const __nv_bfloat16* const ta = tiles + (kt % 2) * kTileElems;
        sm80_k_tile_mma<__nv_bfloat16, true>(ta, ta + BM * BK, acc);
        k_tile_done(kt);
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

    const auto epi = gemm_epilogue_params<TOut, TBias>(args, args.alpha * gemm_device_scales(args));
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
