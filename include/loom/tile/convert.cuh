// Element conversions between the storage types the kernels read and write (fp32, fp16, bf16) and the fp32 they
// compute in: widening is exact, narrowing rounds to nearest even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/config.hpp"

namespace loom::tile {

template <class A, class B>
inline constexpr bool kSameType = false;
template <class A>
inline constexpr bool kSameType<A, A> = true;

template <class T>
LOOM_DEVICE LOOM_FORCEINLINE float to_float(T v) {
    if constexpr (sizeof(T) == 4) {
        return v;
    } else {
        return static_cast<float>(v);
    }
}

template <class T>
LOOM_DEVICE LOOM_FORCEINLINE T from_float(float v) {
    if constexpr (kSameType<T, float>) {
        return v;
    } else if constexpr (kSameType<T, __nv_bfloat16>) {
        return __float2bfloat16_rn(v);
    } else {
        static_assert(kSameType<T, __half>, "from_float: T is float, __half or __nv_bfloat16");
        return __float2half_rn(v);
    }
}

}  // namespace loom::tile
