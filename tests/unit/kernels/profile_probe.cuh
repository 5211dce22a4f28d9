// ProfileCompile's kernel (tests/unit/test_profile.cpp): the same body with profiler calls (as Loom's kernels carry
// them) and, with PROBE_BARE defined, without any. Compiled without LOOM_PROFILE both must give the same cubin.
#pragma once

#include "loom/lang/profile.cuh"

namespace profile_test {

__global__ void probe(float* out, const float* in, int n) {
#if !defined(PROBE_BARE)
    LOOM_PROF_BLOCK_SPAN(loom::lang::kProfileUserTag0, 7);
#endif
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
#if !defined(PROBE_BARE)
        LOOM_PROF_ONLY(if (threadIdx.x == 0) LOOM_PROF_BEGIN(loom::lang::kProfileUserTag0 + 1, i));
#endif
        out[i] = 2.f * in[i] + 1.f;
#if !defined(PROBE_BARE)
        LOOM_PROF_ONLY(if (threadIdx.x == 0) LOOM_PROF_END(loom::lang::kProfileUserTag0 + 1, i));
        LOOM_PROF_INSTANT(loom::lang::kProfileUserTag0 + 2, n);
#endif
    }
}

}  // namespace profile_test
