// Test kernel for the JIT unit and GPU tests: y[i] = x[i] * JIT_TEST_SCALE + N + ctx.rank.
#pragma once

#include "jit_scale.cuh"
#include "loom/lang/context.cuh"

namespace jit_test {

template <int N, class T>
__global__ void add_n(loom::Ctx ctx, const T* x, T* y, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) y[i] = x[i] * T(JIT_TEST_SCALE) + T(N) + T(ctx.rank);
}

__global__ void plain_kernel(int* out) { out[threadIdx.x] = threadIdx.x; }

}  // namespace jit_test
