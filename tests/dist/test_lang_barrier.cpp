// barrier_all across ranks, at block and grid scope: no rank passes before every rank arrived, and writes made
// before the barrier are visible after it.
#include <cuda_runtime.h>

#include "common/test_env.hpp"
#include "common/test_kernels.hpp"
#include "loom/runtime/error.hpp"

namespace {

using loom::jit::LaunchConfig;
using loom::test::lang_kernel;

TEST(LangBarrier, NoRankPassesEarly) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    // loom::lang::BarrierState: 2 + 6 + 8 words.
    auto* state = w.alloc<uint64_t>(16);
    auto* slots = w.alloc<uint64_t>(8);
    uint32_t* errors = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&errors, 4));
    LOOM_CHECK_CUDA(cudaMemset(state, 0, 16 * 8));  // once: the counters are monotonic from here on
    const uint32_t rounds = 20000;
    for (int grid_mode : {0, 1}) {
        LOOM_CHECK_CUDA(cudaMemset(slots, 0, 64));
        LOOM_CHECK_CUDA(cudaMemset(errors, 0, 4));
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        w.barrier("barrier");
        LaunchConfig cfg{dim3(grid_mode ? 8 : 1), dim3(128)};
        cfg.cooperative = grid_mode != 0;
        lang_kernel("loom_test::barrier_rounds")(cfg, w.ctx(), state, slots, rounds, grid_mode, errors);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        uint32_t bad = 1;
        LOOM_CHECK_CUDA(cudaMemcpy(&bad, errors, 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(bad, 0u) << (grid_mode ? "grid" : "block") << " barrier: a rank passed before all arrived";
        w.barrier("barrier-done");
    }
    LOOM_CHECK_CUDA(cudaFree(errors));
    w.free(slots);
    w.free(state);
}

}  // namespace
