// Warpgroup MMA (wgmma, sm_90a): shared-memory matrix descriptors, the async MMA itself, its fence /
// commit / wait, and the per-warpgroup register reallocation (setmaxnreg) used by warp-specialised kernels.
//
// Contracts (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
// - All four warps of a warpgroup execute every function here convergently (".sync.aligned").
// - wgmma_fence() before the first wgmma that touches accumulator registers written by ordinary code
//   (and after smem operands were written by generic-proxy stores, with a proxy fence).
// - The accumulators of an in-flight wgmma must not be read or written until wgmma_wait<N>() retires
//   its group.
// Only legal in an sm_90a compile; elsewhere these trap (kernels that use them are never launched there).
#pragma once

#include "loom/config.hpp"

namespace loom::ptx {

// ---- fence / commit / wait ----------------------------------------------------------------------------------

LOOM_DEVICE LOOM_FORCEINLINE void wgmma_fence() {
#if LOOM_SM90A
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}

LOOM_DEVICE LOOM_FORCEINLINE void wgmma_commit_group() {
#if LOOM_SM90A
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}

// Waits until at most N committed wgmma groups of this warpgroup are still pending.
template <int N>
LOOM_DEVICE LOOM_FORCEINLINE void wgmma_wait_group() {
    static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
#if LOOM_SM90A
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
    __trap();
#endif
}

// Keeps the compiler from moving accumulator reads/writes across an async MMA boundary.
template <int N>
LOOM_DEVICE LOOM_FORCEINLINE void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// ---- register reallocation (warp specialisation) -------------------------------------------------------------
// Every thread of the warpgroup executes it; the count is per thread, a multiple of 8 in [24, 256]. The kernel
// must be launched with __launch_bounds__(threads, 1) so the initial per-thread budget is known.

template <int kRegs>
LOOM_DEVICE LOOM_FORCEINLINE void setmaxnreg_inc() {
    static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
#if LOOM_SM90A
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

template <int kRegs>
LOOM_DEVICE LOOM_FORCEINLINE void setmaxnreg_dec() {
    static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
#if LOOM_SM90A
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// ---- named barrier over a set of warps (e.g. the consumer warpgroups of a warp-specialised kernel) -------
// bar.sync with an id other than 0 (which __syncthreads uses) and `threads` = a multiple of 32: only the warps
// that take part wait; it orders their shared and global memory accesses at CTA scope like __syncthreads.
LOOM_DEVICE LOOM_FORCEINLINE void named_barrier_sync(uint32_t id, uint32_t threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The same barrier that also ORs `pred` over the `threads` taking part and returns the result to each of them
// (bar.red.or.pred): a broadcast of one thread's decision without shared memory.
LOOM_DEVICE LOOM_FORCEINLINE bool named_barrier_sync_or(uint32_t id, uint32_t threads, bool pred) {
    uint32_t out;
    asm volatile(
        "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
        : "=r"(out)
        : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads)
        : "memory");
    return out != 0;
}

// ---- shared-memory matrix descriptor -------------------------------------------------------------------------
// 64-bit descriptor (PTX ISA "Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29 leading-dimension
// byte offset >> 4, 32-45 stride-dimension byte offset >> 4, 49-51 base offset, 62-63 swizzle mode.

enum class SmemSwizzle : uint32_t { None = 0, B128 = 1, B64 = 2, B32 = 3 };

LOOM_DEVICE LOOM_FORCEINLINE uint64_t wgmma_smem_desc(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                                      SmemSwizzle swizzle) {
    const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    uint64_t desc = 0;
    desc |= static_cast<uint64_t>((addr >> 4) & 0x3fff);
    desc |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3fff) << 16;
    desc |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3fff) << 32;
    desc |= static_cast<uint64_t>(static_cast<uint32_t>(swizzle)) << 62;
    return desc;
}

// ---- wgmma.mma_async m64nNk16 (16-bit inputs) and m64nNk32 (e4m3), fp32 accumulate, A and B from shared memory --
// D[64, N] (+)= A[64, 16] * B[16, N]. kTransA / kTransB: 0 = K-major operand in smem, 1 = MN-major (transposed).
// scale_d = 0 overwrites D (first k-step of a tile), 1 accumulates. Accumulator fragment of thread t of the
// warpgroup (warp w = t / 32, lane l): d[4j + {0,1}] at (row 16w + l/4, cols 8j + 2(l%4) + {0,1}),
// d[4j + {2,3}] at row + 8.

template <int N>
struct WgmmaM64K16;

#define LOOM_WGMMA_D8(i)                                                                                        \
    "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), \
        "+f"(d[(i) + 6]), "+f"(d[(i) + 7])

#if LOOM_SM90A
#define LOOM_WGMMA_ASM(N, IA, IB, IS, ITA, ITB, REGS, TYPE, ...)                                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE \
                 "." TYPE " {" REGS "}, %" #IA ", %" #IB ", p, 1, 1, %" #ITA ", %" #ITB ";\n}\n"                       \
                 : __VA_ARGS__                                                                                         \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB))
// 8-bit inputs: k32, and no transpose immediates (wgmma reads e4m3 / e5m2 operands K-major only).
#define LOOM_WGMMA_ASM_E4M3(N, IA, IB, IS, REGS, ...)                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N \
                 "k32.f32.e4m3.e4m3 {" REGS "}, %" #IA ", %" #IB ", p, 1, 1;\n}\n"                     \
                 : __VA_ARGS__                                                                         \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#else
#define LOOM_WGMMA_ASM(...) __trap()
#define LOOM_WGMMA_ASM_E4M3(...) __trap()
#endif

#define LOOM_WGMMA_M64K16(N, IA, IB, IS, ITA, ITB, REGS, ...)                                                  \
    template <>                                                                                                \
    struct WgmmaM64K16<N> {                                                                                    \
        template <bool kBF16, int kTransA, int kTransB>                                                        \
        static LOOM_DEVICE LOOM_FORCEINLINE void mma(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,      \
                                                     int scale_d) {                                            \
            if constexpr (kBF16) {                                                                             \
                LOOM_WGMMA_ASM(N, IA, IB, IS, ITA, ITB, REGS, "bf16", __VA_ARGS__);                            \
            } else {                                                                                           \
                LOOM_WGMMA_ASM(N, IA, IB, IS, ITA, ITB, REGS, "f16", __VA_ARGS__);                             \
            }                                                                                                  \
        }                                                                                                      \
        static LOOM_DEVICE LOOM_FORCEINLINE void mma_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, \
                                                          int scale_d) {                                       \
            LOOM_WGMMA_ASM_E4M3(N, IA, IB, IS, REGS, __VA_ARGS__);                                             \
        }                                                                                                      \
    };

// clang-format off
LOOM_WGMMA_M64K16(16, 8, 9, 10, 11, 12,
                  "%0, %1, %2, %3, %4, %5, %6, %7",
                  LOOM_WGMMA_D8(0))
LOOM_WGMMA_M64K16(32, 16, 17, 18, 19, 20,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8))
LOOM_WGMMA_M64K16(48, 24, 25, 26, 27, 28,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16))
LOOM_WGMMA_M64K16(64, 32, 33, 34, 35, 36,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24))
LOOM_WGMMA_M64K16(80, 40, 41, 42, 43, 44,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32))
LOOM_WGMMA_M64K16(96, 48, 49, 50, 51, 52,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32), LOOM_WGMMA_D8(40))
LOOM_WGMMA_M64K16(112, 56, 57, 58, 59, 60,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32), LOOM_WGMMA_D8(40), LOOM_WGMMA_D8(48))
LOOM_WGMMA_M64K16(128, 64, 65, 66, 67, 68,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32), LOOM_WGMMA_D8(40), LOOM_WGMMA_D8(48), LOOM_WGMMA_D8(56))
LOOM_WGMMA_M64K16(144, 72, 73, 74, 75, 76,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
                  "%64, %65, %66, %67, %68, %69, %70, %71",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32), LOOM_WGMMA_D8(40), LOOM_WGMMA_D8(48), LOOM_WGMMA_D8(56), LOOM_WGMMA_D8(64))
LOOM_WGMMA_M64K16(160, 80, 81, 82, 83, 84,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
                  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32), LOOM_WGMMA_D8(40), LOOM_WGMMA_D8(48), LOOM_WGMMA_D8(56), LOOM_WGMMA_D8(64), LOOM_WGMMA_D8(72))
LOOM_WGMMA_M64K16(176, 88, 89, 90, 91, 92,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
                  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                  "%80, %81, %82, %83, %84, %85, %86, %87",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32), LOOM_WGMMA_D8(40), LOOM_WGMMA_D8(48), LOOM_WGMMA_D8(56), LOOM_WGMMA_D8(64), LOOM_WGMMA_D8(72), LOOM_WGMMA_D8(80))
LOOM_WGMMA_M64K16(192, 96, 97, 98, 99, 100,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
                  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32), LOOM_WGMMA_D8(40), LOOM_WGMMA_D8(48), LOOM_WGMMA_D8(56), LOOM_WGMMA_D8(64), LOOM_WGMMA_D8(72), LOOM_WGMMA_D8(80), LOOM_WGMMA_D8(88))
LOOM_WGMMA_M64K16(208, 104, 105, 106, 107, 108,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
                  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
                  "%96, %97, %98, %99, %100, %101, %102, %103",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32), LOOM_WGMMA_D8(40), LOOM_WGMMA_D8(48), LOOM_WGMMA_D8(56), LOOM_WGMMA_D8(64), LOOM_WGMMA_D8(72), LOOM_WGMMA_D8(80), LOOM_WGMMA_D8(88), LOOM_WGMMA_D8(96))
LOOM_WGMMA_M64K16(224, 112, 113, 114, 115, 116,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
                  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
                  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32), LOOM_WGMMA_D8(40), LOOM_WGMMA_D8(48), LOOM_WGMMA_D8(56), LOOM_WGMMA_D8(64), LOOM_WGMMA_D8(72), LOOM_WGMMA_D8(80), LOOM_WGMMA_D8(88), LOOM_WGMMA_D8(96), LOOM_WGMMA_D8(104))
LOOM_WGMMA_M64K16(240, 120, 121, 122, 123, 124,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
                  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
                  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
                  "%112, %113, %114, %115, %116, %117, %118, %119",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32), LOOM_WGMMA_D8(40), LOOM_WGMMA_D8(48), LOOM_WGMMA_D8(56), LOOM_WGMMA_D8(64), LOOM_WGMMA_D8(72), LOOM_WGMMA_D8(80), LOOM_WGMMA_D8(88), LOOM_WGMMA_D8(96), LOOM_WGMMA_D8(104), LOOM_WGMMA_D8(112))
LOOM_WGMMA_M64K16(256, 128, 129, 130, 131, 132,
                  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
                  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
                  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
                  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127",
                  LOOM_WGMMA_D8(0), LOOM_WGMMA_D8(8), LOOM_WGMMA_D8(16), LOOM_WGMMA_D8(24), LOOM_WGMMA_D8(32), LOOM_WGMMA_D8(40), LOOM_WGMMA_D8(48), LOOM_WGMMA_D8(56), LOOM_WGMMA_D8(64), LOOM_WGMMA_D8(72), LOOM_WGMMA_D8(80), LOOM_WGMMA_D8(88), LOOM_WGMMA_D8(96), LOOM_WGMMA_D8(104), LOOM_WGMMA_D8(112), LOOM_WGMMA_D8(120))
// clang-format on

#undef LOOM_WGMMA_M64K16
#undef LOOM_WGMMA_ASM
#undef LOOM_WGMMA_ASM_E4M3
#undef LOOM_WGMMA_D8

// D[64, N] (+)= A * B for N a multiple of 16 in [16, 256]; kBF16 selects bf16 (else fp16) inputs.
template <int N, bool kBF16, int kTransA = 0, int kTransB = 0>
LOOM_DEVICE LOOM_FORCEINLINE void wgmma_m64k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    static_assert(N % 16 == 0 && N >= 16 && N <= 256, "wgmma_m64k16: N must be a multiple of 16 in [16, 256]");
    WgmmaM64K16<N>::template mma<kBF16, kTransA, kTransB>(d, desc_a, desc_b, scale_d);
}

// D[64, N] (+)= A[64, 32] * B[32, N] with fp8 e4m3 inputs, both K-major in shared memory (the only layout wgmma
// takes for 8-bit types): a k32 step spans the same 32 bytes of a 128-byte swizzle row as a 16-bit k16 step.
// Accumulator fragment as for wgmma_m64k16. The tensor cores add the products into the fp32 accumulators with
// fewer than fp32's mantissa bits (DeepGEMM measured about 14 on H800); callers that need more promote partial sums.
template <int N>
LOOM_DEVICE LOOM_FORCEINLINE void wgmma_m64k32_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    static_assert(N % 16 == 0 && N >= 16 && N <= 256, "wgmma_m64k32_e4m3: N must be a multiple of 16 in [16, 256]");
    WgmmaM64K16<N>::mma_e4m3(d, desc_a, desc_b, scale_d);
}

}  // namespace loom::ptx
