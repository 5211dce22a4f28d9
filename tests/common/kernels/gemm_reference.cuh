// The GEMM tests' device reference, compiled by Loom's JIT: ref[i, j] (+)= alpha x sum_k a[i, k] b[j, k] and
// abs_ref[i, j] (+)= |alpha| x sum_k |a[i, k] b[j, k]| in fp64, one thread per output element (B as [N, K], or [K, N]
// with kBKn). Naive on purpose: no tiles, no shared memory, no tensor cores, nothing in common with the kernels under
// test. accumulate != 0 adds to what ref / abs_ref hold (a sum over ranks' products).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace loom_test {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
template <class TIn, bool kBKn>
__global__ void gemm_reference(const TIn* a, const TIn* b, double* ref, double* abs_ref, int m, int n, int k,
                               double alpha, int accumulate) {
    const int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    const int i = static_cast<int>(blockIdx.y * blockDim.y + threadIdx.y);
    if (i >= m || j >= n) return;
    const long long row = static_cast<long long>(i) * k;
    double s = 0, sa = 0;
    for (int x = 0; x < k; ++x) {
        const TIn bv = kBKn ? b[static_cast<long long>(x) * n + j] : b[static_cast<long long>(j) * k + x];
        const double p =
            static_cast<double>(static_cast<float>(a[row + x])) * static_cast<double>(static_cast<float>(bv));
        s += p;
        sa += fabs(p);
    }
    const long long o = static_cast<long long>(i) * n + j;
    ref[o] = (accumulate ? ref[o] : 0.0) + alpha * s;
    abs_ref[o] = (accumulate ? abs_ref[o] : 0.0) + fabs(alpha) * sa;
}
#endif

}  // namespace loom_test
