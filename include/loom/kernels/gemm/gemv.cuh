// Weight-streaming GEMM for decode-sized M (M <= kGemvMaxM, B [N, K]): same contract as gemm.cuh,
// D[M, N] = alpha * A[M, K] * B^T + beta * D + bias[N], bf16 / fp16 (mma.sync m16n8k16) or fp8 e4m3 (m16n8k32, sm_89+)
// in, fp32 accumulate.
//
// At such M the GEMM reads B from memory once and does little else, so its time is how many bytes of B every SM keeps
// in flight. The operands are swapped (D^T = B A^T): 16 rows of B fill an MMA's M side and the M tokens its N side
// (one to four n8 tiles), so A's rows are padded to 8, 16 or 32, not to the Hopper kernel's 64-row MMA side.
// Data path: cp.async 16-byte copies (zero-filled outside the matrices) of 256-byte K-slices of kGemvRows rows of B and
// of the M rows of A -> STAGES-deep ring in shared memory (16-byte chunk c of row r at chunk c ^ (r & 7): conflict-free
// ldmatrix) -> ldmatrix -> mma.sync -> registers. 4 warps, each 16 rows of B over the whole slice; no CTA-wide
// reduction. Small rings (the host sizes STAGES for two CTAs per SM) keep two independent streams per SM where N has
// more blocks than SMs.
// Split K: grid (N-blocks, splits), split s streaming slices [s S / splits, (s + 1) S / splits), summed in split order
// (bitwise reproducible) by one of them, which runs the epilogue. Two ways, chosen by the launch:
// - a cluster (1, splits) (CLUSTER; sm_90, splits <= kGemvMaxClusterSplits): each split leaves its fp32
//   partial in its own shared memory, and after a cluster barrier split 0 reads the others' (distributed shared
//   memory); a second barrier keeps them alive until it has. No global round trip, no workspace, graph-capturable.
// - a workspace: each split stores its partial to a slot and counts itself in on the block's counter (atom.inc,
//   acq_rel: the counter wraps to 0 for the next launch); the last to arrive sums every slot (its own read back too,
//   so the result does not depend on which came last). No CTA waits for another.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "loom/config.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/ptx/cluster.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/sm80.cuh"
#include "loom/tile/epilogue.cuh"

namespace loom::kernels {

namespace detail {

// Byte offset of 16-byte chunk `chunk` (0..15) of ring row r in a stage.
LOOM_DEVICE LOOM_FORCEINLINE int gemv_offset(int r, int chunk) {
    return r * kGemvSliceBytes + ((chunk ^ (r & 7)) << 4);
}

// The MMA of an input type: e4m3's m16n8k32 holds the same bytes at the same fragment places as m16n8k16's 16-bit
// ones, so one ldmatrix path feeds both.
template <class TIn>
LOOM_DEVICE LOOM_FORCEINLINE void gemv_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    if constexpr (sizeof(TIn) == 1) {
        ptx::mma_m16n8k32_e4m3(d, a, b);
    } else {
        ptx::mma_m16n8k16<tile::kSameType<TIn, __nv_bfloat16>>(d, a, b);
    }
}

}  // namespace detail

// a: [m, k] row-major (lda elements), b: [n, k] row-major (ldb elements), both 16-byte aligned with 16-byte rows.
// MT: n8 tiles of A's rows (m <= 8 MT). Grid (ceil(n / kGemvRows), splits); block kGemvThreads; dynamic smem
// gemv_smem_bytes(MT, STAGES). args: d, ldd, m, n, k, alpha, beta, bias, scales; with splits >= 2, CLUSTER: a cluster
// (1, splits) (sm_90); else partials ([N-block][split] slots of gemv_slot_floats(MT)) and tile_counters (one per
// N-block, zero before the launch and left zero after it). CLUSTER is a template argument, not a runtime test: its
// code in the kernel changes ptxas's register allocation of the mainloop (at MT = 2, 96 registers against 122).
template <class TIn, class TOut, class TBias, int MT, int STAGES, bool CLUSTER>
__global__ void __launch_bounds__(kGemvThreads)
    gemm_gemv_mma(const TIn* __restrict__ a, int64_t lda, const TIn* __restrict__ b, int64_t ldb, const GemmArgs args) {
    static_assert(MT == 1 || MT == 2 || MT == 4, "MT: 1, 2 or 4 n8 tiles");
    static_assert(STAGES >= 2 && STAGES <= kGemvMaxStages, "STAGES in [2, kGemvMaxStages]");
#if LOOM_ARCH >= 800
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
    const int n0 = static_cast<int>(blockIdx.x) * kGemvRows;
    const int split = static_cast<int>(blockIdx.y), splits = static_cast<int>(gridDim.y);
    const int64_t k_bytes = static_cast<int64_t>(args.k) * static_cast<int64_t>(sizeof(TIn));
    const int slices = static_cast<int>(gemv_slices(k_bytes));
    const int s_begin = static_cast<int>(static_cast<int64_t>(split) * slices / splits);
    const int count = static_cast<int>(static_cast<int64_t>(split + 1) * slices / splits) - s_begin;
    const uint8_t* const a_bytes = reinterpret_cast<const uint8_t*>(a);
    const uint8_t* const b_bytes = reinterpret_cast<const uint8_t*>(b);
    const int64_t lda_bytes = lda * static_cast<int64_t>(sizeof(TIn)),
                  ldb_bytes = ldb * static_cast<int64_t>(sizeof(TIn));

    // Slice i of this split into ring stage `stage`: 16 chunks per row, B's kGemvRows rows then A's 8 MT rows.
    auto load = [&](int stage, int i) {
        uint8_t* const st = smem + stage * gemv_stage_bytes(MT);
        const int64_t k0 = static_cast<int64_t>(s_begin + i) * kGemvSliceBytes;
#pragma unroll
        for (int j = 0; j < kGemvRows * 16 / kGemvThreads; ++j) {
            const int idx = tid + j * kGemvThreads, r = idx / 16, c = idx % 16;
            const int64_t kb = k0 + c * 16;
            const bool valid = n0 + r < args.n && kb < k_bytes;
            const uint8_t* src = valid ? b_bytes + static_cast<int64_t>(n0 + r) * ldb_bytes + kb : b_bytes;
            ptx::cp_async_16_zfill(st + detail::gemv_offset(r, c), src, valid);
        }
#pragma unroll
        for (int j = 0; j < 8 * MT * 16 / kGemvThreads; ++j) {
            const int idx = tid + j * kGemvThreads, r = idx / 16, c = idx % 16;
            const int64_t kb = k0 + c * 16;
            const bool valid = r < args.m && kb < k_bytes;
            const uint8_t* src = valid ? a_bytes + static_cast<int64_t>(r) * lda_bytes + kb : a_bytes;
            ptx::cp_async_16_zfill(st + detail::gemv_offset(kGemvRows + r, c), src, valid);
        }
    };

    // Two accumulator sets, even and odd 32-byte steps: consecutive MMAs on one accumulator wait for each other, and
    // with two warps per scheduler that wait, not the memory, would bound an fp8 or M > 8 stream. Their sum
    // after the mainloop is in a fixed order.
    float acc[MT][4], acc2[2][MT][4];
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc2[0][j][e] = acc2[1][j][e] = 0.f;

#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < count) load(i, i);
        ptx::cp_async_commit();  // empty groups too: the wait below counts groups
    }
    for (int it = 0; it < count; ++it) {
        ptx::cp_async_wait<STAGES - 2>();  // slice `it` landed (this thread's copies)
        __syncthreads();                   // ... everybody's; and everybody is done with slice it - 1's stage
        if (it + STAGES - 1 < count) load((it + STAGES - 1) % STAGES, it + STAGES - 1);
        ptx::cp_async_commit();
        const uint8_t* const st = smem + (it % STAGES) * gemv_stage_bytes(MT);
        // Fragments of step kk: B rows 16 warp + (0-7, 8-15) x bytes (0-15, 16-31) of the 32-byte step as m16n8k16's
        // A fragment, and A's n8 tiles as its B fragments. Two steps' fragments are loaded before their MMAs.
        auto fragments = [&](int kk, uint32_t(&bf)[4], uint32_t(&af)[MT][2]) {
            ptx::ldmatrix_x4(bf, st + detail::gemv_offset(16 * warp + lane % 16, 2 * kk + lane / 16));
            if constexpr (MT == 1) {
                // Lanes 16-31 address the same matrices (ldmatrix .x4 reads all 32 addresses).
                uint32_t t[4];
                ptx::ldmatrix_x4(t, st + detail::gemv_offset(kGemvRows + lane % 8, 2 * kk + (lane / 8) % 2));
                af[0][0] = t[0];
                af[0][1] = t[1];
            } else {
#pragma unroll
                for (int p = 0; p < MT / 2; ++p) {
                    // Matrices: tiles 2p, 2p + 1 x bytes (0-15, 16-31) of the step.
                    uint32_t t[4];
                    const int q = lane / 8;
                    ptx::ldmatrix_x4(
                        t, st + detail::gemv_offset(kGemvRows + 8 * (2 * p + q / 2) + lane % 8, 2 * kk + q % 2));
                    af[2 * p][0] = t[0];
                    af[2 * p][1] = t[1];
                    af[2 * p + 1][0] = t[2];
                    af[2 * p + 1][1] = t[3];
                }
            }
        };
#pragma unroll
        for (int kk = 0; kk < kGemvSliceBytes / 32; kk += 2) {
            uint32_t bf0[4], bf1[4], af0[MT][2], af1[MT][2];
            fragments(kk, bf0, af0);
            fragments(kk + 1, bf1, af1);
#pragma unroll
            for (int j = 0; j < MT; ++j) {
                detail::gemv_mma<TIn>(acc2[0][j], bf0, af0[j]);
                detail::gemv_mma<TIn>(acc2[1][j], bf1, af1[j]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = acc2[0][j][e] + acc2[1][j][e];
    ptx::cp_async_wait<0>();

    if (CLUSTER && splits > 1) {
#if LOOM_ARCH >= 900
        // The cluster's sum: this split's partial into its ring's first bytes (every warp is done with the ring).
        float* const mine = reinterpret_cast<float*>(smem);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < MT; ++j)
            reinterpret_cast<float4*>(mine)[j * kGemvThreads + tid] =
                make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        ptx::cluster_sync();  // every split's partial written
        if (split == 0) {
            for (int s = 1; s < splits; ++s) {
#pragma unroll
                for (int j = 0; j < MT; ++j) {
                    const float4 v = ptx::ld_shared_cluster_f32x4(mine + 4 * (j * kGemvThreads + tid), s);
                    acc[j][0] += v.x;
                    acc[j][1] += v.y;
                    acc[j][2] += v.z;
                    acc[j][3] += v.w;
                }
            }
        }
        ptx::cluster_sync();  // split 0 has read them: the others may exit
        if (split != 0) return;
#else
        __trap();
#endif
    } else if (splits > 1) {
        float* const slots = args.partials + static_cast<int64_t>(blockIdx.x) * splits * gemv_slot_floats(MT);
#pragma unroll
        for (int j = 0; j < MT; ++j)
            __stcg(reinterpret_cast<float4*>(slots + split * gemv_slot_floats(MT) + 4 * (j * kGemvThreads + tid)),
                   make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
        __threadfence();
        __syncthreads();
        __shared__ int last;
        if (tid == 0) {
            const uint32_t limit = static_cast<uint32_t>(splits - 1);
            last = ptx::atom_inc_acq_rel_gpu(args.tile_counters + blockIdx.x, limit) == limit;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
#pragma unroll
        for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
        for (int s = 0; s < splits; ++s) {
#pragma unroll
            for (int j = 0; j < MT; ++j) {
                const float4 v = __ldcg(
                    reinterpret_cast<const float4*>(slots + s * gemv_slot_floats(MT) + 4 * (j * kGemvThreads + tid)));
                acc[j][0] += v.x;
                acc[j][1] += v.y;
                acc[j][2] += v.z;
                acc[j][3] += v.w;
            }
        }
    }

    // acc[j] is D^T's 16 x 8 fragment: (B row g, token 2t, 2t + 1) and (B row g + 8, ...), g = lane / 4, t = lane % 4.
    // D's pairs are adjacent columns (B rows) of one token: lanes g and g ^ 1 swap halves, the even-g lane keeps
    // token 2t of rows (g, g + 1), the odd-g lane token 2t + 1 of rows (g - 1, g).
    const auto epi = gemm_epilogue_params<TOut, TBias>(args, args.alpha * gemm_device_scales(args));
    const int g = lane / 4, t = lane % 4;
    const bool even = (g & 1) == 0;
    const int row = n0 + 16 * warp + (even ? g : g - 1);
#pragma unroll
    for (int j = 0; j < MT; ++j) {
        const float x = __shfl_xor_sync(0xffffffffu, even ? acc[j][1] : acc[j][0], 4);
        const float y = __shfl_xor_sync(0xffffffffu, even ? acc[j][3] : acc[j][2], 4);
        const int token = 8 * j + 2 * t + (even ? 0 : 1);
        if (even) {
            epi.store(token, row, acc[j][0], x);
            epi.store(token, row + 8, acc[j][2], y);
        } else {
            epi.store(token, row, x, acc[j][1]);
            epi.store(token, row + 8, y, acc[j][3]);
        }
    }
#else
    __trap();
#endif
}
}  // namespace loom::kernels
