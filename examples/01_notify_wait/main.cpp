// Example 01: signal ping-pong between rank pairs; prints the round-trip latency.
//   loomrun -n 2 build/examples/01_notify_wait [rounds]
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
    const int me = world.rank();
    const int partner = (me ^ 1) < world.world_size() ? (me ^ 1) : me;

    auto* sig = world.alloc<uint64_t>(1);
    uint64_t* elapsed = nullptr;
    LOOM_CHECK_CUDA(cudaMemset(sig, 0, sizeof(uint64_t)));
    LOOM_CHECK_CUDA(cudaMalloc(&elapsed, sizeof(uint64_t)));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());

    loom::jit::KernelSpec spec;
    spec.header = LOOM_EXAMPLE_DIR "/notify_wait.cuh";
    spec.name = "example::ping_pong";
    const auto& kernel = loom::jit::get_kernel(spec);  // compile before the barrier: the timed part is the kernel
    world.barrier("ping-pong");
    kernel(loom::jit::LaunchConfig{dim3(1), dim3(1)}, world.ctx(), sig, rounds, partner, elapsed);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());

    uint64_t ns = 0, final_value = 0;
    LOOM_CHECK_CUDA(cudaMemcpy(&ns, elapsed, sizeof ns, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(&final_value, sig, sizeof final_value, cudaMemcpyDeviceToHost));
    std::printf("rank %d <-> %d: %u rounds, round trip %.3f us (signal reached %llu)\n", me, partner, rounds,
                double(ns) / rounds / 1e3, static_cast<unsigned long long>(final_value));
    const bool ok = final_value == rounds;
    world.barrier("done");
    LOOM_CHECK_CUDA(cudaFree(elapsed));
    world.free(sig);
    return ok ? 0 : 1;
}
