// NVSHMEM device-API test kernel (nvcc + nvJitLink path): each PE writes its id into the next PE's slot
// array, then the host checks dst[pe] on every PE after a barrier.
#pragma once

#include <nvshmem.h>
#include <nvshmemx.h>

namespace jit_test {

template <int kRepeat>
__global__ void nvshmem_ring_put(int* dst) {
    int me = nvshmem_my_pe();
    int npes = nvshmem_n_pes();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        for (int r = 0; r < kRepeat; ++r) nvshmem_int_p(dst + me, me + 100 * r, (me + 1) % npes);
        nvshmem_quiet();
    }
}

}  // namespace jit_test
