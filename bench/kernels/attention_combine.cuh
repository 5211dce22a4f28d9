// bench-attention's sp baseline kernel: the combine of every rank's (O, LSE) after an all-gather. The gathered
// buffer holds, per rank q, `rank_bytes` bytes: O_q [rows][D] bf16, then LSE_q [rows] fp32 (natural log, -inf for a
// rank that holds no token of the row). One block of D threads per row writes O = sum_q w_q O_q / sum_q w_q,
// w_q = exp(LSE_q - max_q LSE_q), and LSE = max + ln(sum_q w_q) (O = 0, LSE = -inf when every rank's LSE is -inf).
#pragma once

#include <cuda_bf16.h>

#include "loom/config.hpp"

namespace attn_bench {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
template <int D>
__global__ void __launch_bounds__(D)
    combine_gathered(const unsigned char* __restrict__ gathered, loom::uint64_t rank_bytes, int world, int rows,
                     __nv_bfloat16* __restrict__ o, float* __restrict__ lse) {
    const float neg_inf = __int_as_float(0xff800000);  // no INFINITY macro under NVRTC
    const int row = static_cast<int>(blockIdx.x), d = static_cast<int>(threadIdx.x);
    const loom::uint64_t lse_offset = static_cast<loom::uint64_t>(rows) * D * sizeof(__nv_bfloat16);
    float m = neg_inf;
    for (int q = 0; q < world; ++q)
        m = fmaxf(m, reinterpret_cast<const float*>(gathered + q * rank_bytes + lse_offset)[row]);
    float acc = 0.f, sum = 0.f;
    if (m != neg_inf) {
        for (int q = 0; q < world; ++q) {
            const unsigned char* part = gathered + q * rank_bytes;
            const float w = __expf(reinterpret_cast<const float*>(part + lse_offset)[row] - m);
            sum += w;
            acc += w * __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(part)[row * D + d]);
        }
    }
    o[static_cast<loom::uint64_t>(row) * D + d] = __float2bfloat16(sum > 0.f ? acc / sum : 0.f);
    if (d == 0) lse[row] = sum > 0.f ? m + __logf(sum) : neg_inf;
}
#endif

}  // namespace attn_bench
