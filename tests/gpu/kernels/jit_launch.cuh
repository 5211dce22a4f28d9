// Kernels for tests/gpu/test_jit_launch.cpp: dynamic shared memory above 48 KiB, clusters, cooperative grids.
#pragma once

#include <cooperative_groups.h>

namespace jit_gpu_test {

// out[i] = in[n - 1 - i] through dynamic shared memory (one block, n ints).
__global__ void smem_reverse(const int* in, int* out, int n) {
    extern __shared__ int buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = in[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = buf[n - 1 - i];
}

// out[block] = (rank of the block in its cluster, blocks per cluster).
__global__ void cluster_info(int2* out) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) {
        int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        out[b] = make_int2(static_cast<int>(cluster.block_rank()), static_cast<int>(cluster.num_blocks()));
    }
}

// Every block adds 1, the grid synchronises, then every block reads the total: all must see gridDim.x.
__global__ void grid_count(unsigned* counter, unsigned* seen) {
    namespace cg = cooperative_groups;
    if (threadIdx.x == 0) atomicAdd(counter, 1u);
    cg::this_grid().sync();
    if (threadIdx.x == 0) seen[blockIdx.x] = atomicAdd(counter, 0u);
}

}  // namespace jit_gpu_test
