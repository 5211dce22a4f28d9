// Example 03: cross-rank barrier_all rounds with a check that no rank passes early; prints the time per barrier.
//   loomrun -n 4 build/examples/03_barrier [rounds]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "loom/jit/jit.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"

int main(int argc, char** argv) {
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        return 1;
    }
    const uint32_t rounds = argc > 1 ? static_cast<uint32_t>(std::atoi(argv[1])) : 10000;
    auto world = loom::World::from_env();

    // loom::lang::BarrierState is 16 64-bit words; zeroed once, monotonic afterwards.
    auto* state = world.alloc<uint64_t>(16);
    auto* slots = world.alloc<uint64_t>(8);
    uint32_t* early = nullptr;
    uint64_t* elapsed = nullptr;
    LOOM_CHECK_CUDA(cudaMemset(state, 0, 16 * sizeof(uint64_t)));
    LOOM_CHECK_CUDA(cudaMemset(slots, 0, 8 * sizeof(uint64_t)));
    LOOM_CHECK_CUDA(cudaMalloc(&early, sizeof(uint32_t)));
    LOOM_CHECK_CUDA(cudaMalloc(&elapsed, sizeof(uint64_t)));
    LOOM_CHECK_CUDA(cudaMemset(early, 0, sizeof(uint32_t)));

    loom::jit::KernelSpec spec;
    spec.header = LOOM_EXAMPLE_DIR "/barrier.cuh";
    spec.name = "example::barrier_rounds";
    const auto& kernel = loom::jit::get_kernel(spec);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    world.barrier("barrier-example");
    kernel(loom::jit::LaunchConfig{dim3(1), dim3(32)}, world.ctx(), state, slots, rounds, early, elapsed);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());

    uint32_t behind = 0;
    uint64_t ns = 0;
    LOOM_CHECK_CUDA(cudaMemcpy(&behind, early, sizeof behind, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(&ns, elapsed, sizeof ns, cudaMemcpyDeviceToHost));
    std::printf("rank %d: %u barriers over %d ranks, %.3f us each, early passes: %u\n", world.rank(), rounds,
                world.world_size(), double(ns) / rounds / 1e3, behind);
    world.barrier("done");
    LOOM_CHECK_CUDA(cudaFree(elapsed));
    LOOM_CHECK_CUDA(cudaFree(early));
    world.free(slots);
    world.free(state);
    return behind == 0 ? 0 : 1;
}
