// JIT on a GPU: compile → load → launch with result checks; dynamic smem above 48 KiB, clusters,
// cooperative launches, and launch validation. Run: build/tests/loom_gpu_tests --gtest_filter='JitLaunch*'
#include <cuda_runtime_api.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common/test_env.hpp"
#include "loom/jit/jit.hpp"
#include "loom/lang/context.cuh"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "runtime/settings_override.hpp"

namespace {

const std::string kUnitKernels = std::string(LOOM_SOURCE_DIR) + "/tests/unit/kernels";
const std::string kGpuKernels = std::string(LOOM_SOURCE_DIR) + "/tests/gpu/kernels";

template <class T>
struct DeviceBuffer {
    T* p = nullptr;
    std::size_t n = 0;
    explicit DeviceBuffer(std::size_t count) : n(count) {
        LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)));
    }
    ~DeviceBuffer() { cudaFree(p); }
    void upload(const std::vector<T>& h) {
        LOOM_CHECK_CUDA(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<T> download() const {
        std::vector<T> h(n);
        LOOM_CHECK_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
    void poison() { LOOM_CHECK_CUDA(cudaMemset(p, 0xCD, n * sizeof(T))); }
};

loom::jit::KernelSpec gpu_spec(const std::string& name) {
    loom::jit::KernelSpec s;
    s.header = kGpuKernels + "/jit_launch.cuh";
    s.name = name;
    return s;
}

TEST(JitLaunch, CompileLoadLaunchChecksEveryElement) {
    LOOM_REQUIRE_GPU();
    loom::jit::KernelSpec s;
    s.header = kUnitKernels + "/jit_add.cuh";
    s.name = "jit_test::add_n";
    s.template_args = {"7", "float"};
    const loom::jit::Kernel& k = loom::jit::get_kernel(s);
    EXPECT_EQ(&k, &loom::jit::get_kernel(s)) << "second get_kernel must hit the in-process cache";
    EXPECT_GT(k.num_registers(), 0);
    EXPECT_EQ(k.info().lowered_name, "_ZN8jit_test5add_nILi7EfEEvN4loom3CtxEPKT0_PS3_i");

    const int n = 1 << 20;
    std::vector<float> x(n);
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> dist(-4.f, 4.f);
    for (auto& v : x) v = dist(rng);
    DeviceBuffer<float> dx(n), dy(n);
    dx.upload(x);
    dy.poison();
    loom::Ctx ctx{};
    ctx.rank = 5;
    ctx.world = 8;
    loom::jit::LaunchConfig cfg;
    cfg.block = dim3(256);
    cfg.grid = dim3((n + 255) / 256);
    k(cfg, ctx, dx.p, dy.p, n);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    auto y = dy.download();
    int bad = 0;
    // The device may contract x * 3 + 7 into one FMA: allow one rounding of difference.
    for (int i = 0; i < n; ++i) {
        const double want = double(x[i]) * 3.0 + 12.0;
        if (!(std::abs(y[i] - want) <= 1e-5 * (1.0 + std::abs(want))) && bad++ < 5)
            ADD_FAILURE() << "y[" << i << "] = " << y[i] << ", expected " << want;
    }
    EXPECT_EQ(bad, 0);
}

TEST(JitLaunch, DynamicSharedMemoryAbove48KiB) {
    LOOM_REQUIRE_GPU();
    const loom::jit::Kernel& k = loom::jit::get_kernel(gpu_spec("jit_gpu_test::smem_reverse"));
    const int n = 50 * 1024;  // 200 KiB of ints
    std::vector<int> in(n);
    std::iota(in.begin(), in.end(), 17);
    DeviceBuffer<int> din(n), dout(n);
    din.upload(in);
    dout.poison();
    loom::jit::LaunchConfig cfg;
    cfg.block = dim3(1024);
    cfg.smem = n * sizeof(int);
    k(cfg, din.p, dout.p, n);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    auto out = dout.download();
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], in[n - 1 - i]) << i;
    // Beyond the device's opt-in limit: a clear error, not a failed launch.
    cfg.smem = 1 << 20;
    EXPECT_THROW(k(cfg, din.p, dout.p, n), loom::Error);
}

TEST(JitLaunch, ClusterDimensions) {
    LOOM_REQUIRE_GPU();
    if (loom::jit::current_arch() < 90) GTEST_SKIP() << "clusters need sm_90";
    const loom::jit::Kernel& k = loom::jit::get_kernel(gpu_spec("jit_gpu_test::cluster_info"));
    loom::jit::LaunchConfig cfg;
    cfg.grid = dim3(16);
    cfg.block = dim3(64);
    cfg.cluster = dim3(4);
    DeviceBuffer<int2> out(16);
    out.poison();
    k(cfg, out.p);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    auto h = out.download();
    for (int b = 0; b < 16; ++b) {
        EXPECT_EQ(h[b].x, b % 4) << b;
        EXPECT_EQ(h[b].y, 4) << b;
    }
    cfg.grid = dim3(10);  // not a multiple of the cluster
    EXPECT_THROW(k(cfg, out.p), loom::Error);
}

TEST(JitLaunch, CooperativeGridSync) {
    LOOM_REQUIRE_GPU();
    const loom::jit::Kernel& k = loom::jit::get_kernel(gpu_spec("jit_gpu_test::grid_count"));
    int sms = 0, dev = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int blocks = sms;  // one per SM is always co-resident for a 128-thread block
    DeviceBuffer<unsigned> counter(1), seen(blocks);
    LOOM_CHECK_CUDA(cudaMemset(counter.p, 0, sizeof(unsigned)));
    seen.poison();
    loom::jit::LaunchConfig cfg;
    cfg.grid = dim3(blocks);
    cfg.block = dim3(128);
    cfg.cooperative = true;
    k(cfg, counter.p, seen.p);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    for (unsigned v : seen.download()) EXPECT_EQ(v, static_cast<unsigned>(blocks));
    // More blocks than can be resident: refused before launch.
    cfg.grid = dim3(blocks * (k.max_blocks_per_sm(128, 0) + 1));
    EXPECT_THROW(k(cfg, counter.p, seen.p), loom::Error);
}

TEST(JitLaunch, ValidatesBlockShape) {
    LOOM_REQUIRE_GPU();
    const loom::jit::Kernel& k = loom::jit::get_kernel(gpu_spec("jit_gpu_test::smem_reverse"));
    loom::jit::LaunchConfig cfg;
    cfg.block = dim3(2048);
    int* null = nullptr;
    EXPECT_THROW(k(cfg, null, null, 0), loom::Error);
    cfg.block = dim3(32, 32, 2);
    EXPECT_THROW(k(cfg, null, null, 0), loom::Error);
    cfg.block = dim3(32);
    cfg.grid = dim3(0);
    EXPECT_THROW(k(cfg, null, null, 0), loom::Error);
}

TEST(JitLaunch, NvrtcPtxasAndNvccBuildsLaunchToo) {
    LOOM_REQUIRE_GPU();
    for (bool nvcc : {false, true}) {
        loom::jit::KernelSpec s;
        s.header = kUnitKernels + "/jit_add.cuh";
        s.name = "jit_test::add_n";
        s.template_args = {"2", "int"};
        s.force_nvcc = nvcc;
        const loom::jit::Kernel& k = [&]() -> const loom::jit::Kernel& {
            if (nvcc) return loom::jit::get_kernel(s);
            const loom::detail::ScopedSettings ptxas(
                [](loom::Settings& x) { x.jit_compiler = loom::JitCompiler::NvrtcPtxas; });
            return loom::jit::get_kernel(s);
        }();
        EXPECT_EQ(k.info().compiler, nvcc ? "nvcc" : "nvrtc-ptxas");
        const int n = 1000;
        std::vector<int> x(n);
        std::iota(x.begin(), x.end(), -300);
        DeviceBuffer<int> dx(n), dy(n);
        dx.upload(x);
        dy.poison();
        loom::Ctx ctx{};
        ctx.rank = 1;
        loom::jit::LaunchConfig cfg;
        cfg.block = dim3(128);
        cfg.grid = dim3((n + 127) / 128);
        k(cfg, ctx, dx.p, dy.p, n);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        auto y = dy.download();
        for (int i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] * 3 + 2 + 1) << i << (nvcc ? " nvcc" : " nvrtc-ptxas");
    }
}

}  // namespace
