// bench-ep's baseline helper: all_to_all_v's send counts (elements) from a moe_route layout whose groups are the
// experts (E = W x L, rank d's experts contiguous): counts[d] = (offsets[(d + 1) L] - offsets[d L]) x H.
#pragma once

#include "loom/config.hpp"

namespace loom_bench {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// One block of >= W threads.
__global__ void ep_send_counts(const int* offsets, int local_experts, int world, long long hidden, long long* counts) {
    const int d = static_cast<int>(threadIdx.x);
    if (d < world)
        counts[d] = static_cast<long long>(offsets[(d + 1) * local_experts] - offsets[d * local_experts]) * hidden;
}
#endif

}  // namespace loom_bench
