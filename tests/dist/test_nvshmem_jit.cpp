// NVSHMEM through Loom: bootstrap over the World's store, a JIT kernel compiled with nvcc and linked with
// libnvshmem_device (nvJitLink), device state set up by get_kernel, and the host-side on-stream collectives.
// Run: loomrun -n 2 build/tests/loom_dist_tests --gtest_filter='NvshmemJit.*'
#include <cuda_runtime_api.h>

#include <vector>

#include "common/test_env.hpp"
#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/nvshmem.hpp"
#include "loom/runtime/settings.hpp"

namespace {

TEST(NvshmemJit, KernelPutsToTheNextPeAndHostCollectivesRun) {
    LOOM_REQUIRE_GPU();
    loom::World& w = loom::test::world();
    LOOM_CHECK_CUDA(cudaSetDevice(w.device()));
    loom::nvshmem::init(w);
    ASSERT_TRUE(loom::nvshmem::initialized());
    const int pe = loom::nvshmem::my_pe(), npes = loom::nvshmem::n_pes();
    EXPECT_EQ(pe, w.rank());
    EXPECT_EQ(npes, w.world_size());

    int* dst = static_cast<int*>(loom::nvshmem::malloc(npes * sizeof(int)));
    LOOM_CHECK_CUDA(cudaMemset(dst, 0xff, npes * sizeof(int)));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    loom::nvshmem::barrier_all();

    loom::jit::KernelSpec s;
    s.header = std::string(LOOM_SOURCE_DIR) + "/tests/unit/kernels/jit_nvshmem.cuh";
    s.name = "jit_test::nvshmem_ring_put";
    s.template_args = {"3"};
    s.needs_nvshmem = true;
    const loom::jit::Kernel& k = loom::jit::get_kernel(s);
    EXPECT_EQ(k.info().compiler, "nvcc+nvjitlink");
    loom::jit::LaunchConfig cfg;
    cfg.block = dim3(32);
    k(cfg, dst);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    loom::nvshmem::barrier_all();
    std::vector<int> h(npes);
    LOOM_CHECK_CUDA(cudaMemcpy(h.data(), dst, npes * sizeof(int), cudaMemcpyDeviceToHost));
    const int prev = (pe - 1 + npes) % npes;
    for (int i = 0; i < npes; ++i) {
        // Only the previous PE wrote here (its last of 3 puts: prev + 200); every other slot keeps the poison.
        EXPECT_EQ(h[i], i == prev ? prev + 200 : -1) << "slot " << i << " on PE " << pe;
    }

    // Host-side baseline collective: fcollect (all-gather) of one int per PE. NVSHMEM refuses host collectives
    // when several processes share a GPU without MPS ("limited MPG"); loomrun starts MPS for shared GPUs.
    int devices = 0;
    LOOM_CHECK_CUDA(cudaGetDeviceCount(&devices));
    const bool shared_without_mps = w.local_world_size() > devices && loom::settings().mps_thread_percentage == 0;
    if (shared_without_mps) {
        loom::nvshmem::free(dst);
        loom::nvshmem::finalize();
        GTEST_SKIP() << "ranks share a GPU without MPS: NVSHMEM host collectives unsupported (kernel part passed)";
    }
    int* src = static_cast<int*>(loom::nvshmem::malloc(sizeof(int)));
    int* all = static_cast<int*>(loom::nvshmem::malloc(npes * sizeof(int)));
    const int mine = 1000 + 7 * pe;
    LOOM_CHECK_CUDA(cudaMemcpy(src, &mine, sizeof(int), cudaMemcpyHostToDevice));
    loom::nvshmem::barrier_all();
    cudaStream_t stream;
    LOOM_CHECK_CUDA(cudaStreamCreate(&stream));
    loom::nvshmem::fcollect_on_stream(all, src, sizeof(int), stream);
    loom::nvshmem::barrier_all_on_stream(stream);
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    LOOM_CHECK_CUDA(cudaMemcpy(h.data(), all, npes * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < npes; ++i) EXPECT_EQ(h[i], 1000 + 7 * i) << "fcollect slot " << i;
    LOOM_CHECK_CUDA(cudaStreamDestroy(stream));

    loom::nvshmem::free(all);
    loom::nvshmem::free(src);
    loom::nvshmem::free(dst);
    loom::nvshmem::finalize();
    EXPECT_FALSE(loom::nvshmem::initialized());
}

}  // namespace
