// GEMM epilogue from accumulator fragments: D = alpha * acc + beta * D + bias[col], converted to D's type and
// written with vectorised (2-element) global stores, clipped to the matrix.
//
// Fragment contract (wgmma m64nN and mma.sync m16n8 share it): each thread owns pairs of adjacent columns
// (col, col + 1) with col even, so with N a multiple of 8 a pair is entirely inside or entirely outside.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/config.hpp"
#include "loom/tile/convert.cuh"

namespace loom::tile {

// Pair load/store of two adjacent elements at p (aligned to the pair).
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE float2 load_pair(const T* p) {
    if constexpr (sizeof(T) == 4) {
        return *reinterpret_cast<const float2*>(p);
    } else if constexpr (kSameType<T, __nv_bfloat16>) {
        return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    } else {
        return __half22float2(*reinterpret_cast<const __half2*>(p));
    }
}

template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void store_pair(T* p, float x, float y) {
    if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float2*>(p) = make_float2(x, y);
    } else if constexpr (kSameType<T, __nv_bfloat16>) {
        *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
    } else {
        *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
    }
}

// acc[0, 16 / sizeof(T)) += the elements of one 16-byte vector of T, in fp32.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void add_vector(float* acc, const uint4& x) {
    const T* e = reinterpret_cast<const T*>(&x);
#pragma unroll
    for (int k = 0; k < 16 / static_cast<int>(sizeof(T)); ++k) acc[k] += to_float(e[k]);
}

// Two values rounded to a 16-bit T and packed (x in the low half), as stmatrix / a 4-byte store takes them.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE uint32_t pack_pair(float x, float y) {
    static_assert(sizeof(T) == 2, "16-bit element types only");
    if constexpr (kSameType<T, __nv_bfloat16>) {
        union {
            __nv_bfloat162 v;
            uint32_t u;
        } c{__floats2bfloat162_rn(x, y)};
        return c.u;
    } else {
        union {
            __half2 v;
            uint32_t u;
        } c{__floats2half2_rn(x, y)};
        return c.u;
    }
}

// Runtime epilogue parameters. beta == 0 never reads D (so D may hold garbage or NaN); bias may be null.
template <class TOut, class TBias>
struct EpilogueParams {
    TOut* d;
    int64_t ldd;
    const TBias* bias;
    int32_t m, n;
    float alpha, beta;

    // Stores the pair (x, y) = acc at (row, col), (row, col + 1) if inside the matrix.
    LOOM_DEVICE LOOM_FORCEINLINE void store(int32_t row, int32_t col, float x, float y) const {
        if (row >= m || col >= n) return;
        x *= alpha;
        y *= alpha;
        TOut* p = d + static_cast<int64_t>(row) * ldd + col;
        if (beta != 0.f) {
            const float2 c = load_pair(p);
            x += beta * c.x;
            y += beta * c.y;
        }
        if (bias != nullptr) {
            x += to_float(bias[col]);
            y += to_float(bias[col + 1]);
        }
        store_pair(p, x, y);
    }
};

}  // namespace loom::tile
