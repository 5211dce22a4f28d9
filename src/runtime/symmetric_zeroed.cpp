#include "runtime/symmetric_zeroed.hpp"

#include <cuda_runtime_api.h>

#include "loom/runtime/error.hpp"

namespace loom::detail {

void* alloc_zeroed(World& world, std::size_t bytes) {
    void* p = world.alloc_bytes(bytes);
    LOOM_CHECK_CUDA(cudaMemset(p, 0, bytes));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    world.barrier("loom/alloc-zeroed");  // every rank's copy is zero before any peer writes it
    return p;
}

}  // namespace loom::detail
