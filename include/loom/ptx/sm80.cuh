// Ampere-style tensor-core path (sm_80+): cp.async global->shared copies, ldmatrix and mma.sync m16n8k16; and
// stmatrix (sm_90+), which the Hopper GEMM's epilogue uses to stage 16-bit output.
//
// Used by the portable GEMM (kernels/gemm_sm80.cuh) on sm_80 / sm_89 and as a fallback on Hopper.
#pragma once

#include "loom/config.hpp"

namespace loom::ptx {

// 16-byte async copy global -> shared, bypassing L1. `valid` false zero-fills the 16 destination bytes and
// reads nothing (the source address must still be a valid pointer value; it is not dereferenced).
LOOM_DEVICE LOOM_FORCEINLINE void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes)
                 : "memory");
}

// 4-byte async copy global -> shared, through L1 (the only cache mode cp.async has for fewer than 16 bytes): small
// index reads (a block table) that later copies depend on, so that no register waits for them.
LOOM_DEVICE LOOM_FORCEINLINE void cp_async_4(void* smem_dst, const void* gmem_src) {
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}

LOOM_DEVICE LOOM_FORCEINLINE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// At most N committed cp.async groups of this thread are pending (their data is not yet in shared memory).
template <int N>
LOOM_DEVICE LOOM_FORCEINLINE void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lane i supplies the row address of matrix i / 8, row i % 8.
LOOM_DEVICE LOOM_FORCEINLINE void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// As ldmatrix_x4, each matrix transposed.
LOOM_DEVICE LOOM_FORCEINLINE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// Stores four 8x8 b16 matrices (sm_90+): matrix i from r[i], in the mma/wgmma accumulator layout (lane l holds
// row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1, packed low first); lane l supplies the 16-byte row address of
// matrix l / 8, row l % 8. One instruction for what takes four 4-byte st.shared per lane.
LOOM_DEVICE LOOM_FORCEINLINE void stmatrix_x4(void* smem_row, const uint32_t (&r)[4]) {
#if LOOM_ARCH >= 900
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r[0]), "r"(r[1]),
                 "r"(r[2]), "r"(r[3])
                 : "memory");
#else
    __trap();
#endif
}

// D[16x8] += A[16x16] * B[16x8], fp32 accumulate; kBF16 selects bf16 (else fp16) inputs. Fragment layouts as in
// the PTX ISA (mma.m16n8k16, .row.col).
template <bool kBF16>
LOOM_DEVICE LOOM_FORCEINLINE void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    if constexpr (kBF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

// D[16x8] += A[16x32] * B[32x8], e4m3 inputs, fp32 accumulate (sm_89+; traps below). The fragments hold the same
// bytes at the same places as m16n8k16's 16-bit ones.
LOOM_DEVICE LOOM_FORCEINLINE void mma_m16n8k32_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if LOOM_ARCH >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();
#endif
}

// 2^x, approximate (2 ulp), denormals flushed; 2^-inf = 0.
LOOM_DEVICE LOOM_FORCEINLINE float ex2_approx_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

}  // namespace loom::ptx
