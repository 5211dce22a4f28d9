// 04_jit_user_kernel: compile a user's kernel (scale_by_rank.cuh, beside this file) with Loom's JIT, launch it
// and check the result. Shows the compile record (compiler, registers, cache) and the cache hit on reuse.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "loom/jit/jit.hpp"
#include "loom/lang/context.cuh"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"

int main() try {
    loom::jit::KernelSpec spec;
    spec.header = std::string(LOOM_EXAMPLE_DIR) + "/scale_by_rank.cuh";
    spec.name = "user::scale_by_rank";
    spec.template_args = {"4"};

    if (!loom::driver::available()) {
        auto r = loom::jit::compile(spec, 90);  // NVRTC needs no GPU: show that the kernel builds
        std::printf("compiled %s for sm_90a with %s (%d registers, %s); no GPU to run it: %s\n", spec.display().c_str(),
                    r.compiler.c_str(), r.registers, r.from_cache ? "cache hit" : "fresh compile",
                    loom::driver::unavailable_reason().c_str());
        return 1;
    }
    const loom::jit::Kernel& k = loom::jit::get_kernel(spec);
    const auto& info = k.info();
    std::printf("%s: %s, %d registers, %d B spills, %.3f s (%s)\n", k.name().c_str(), info.compiler.c_str(),
                info.registers, info.spill_bytes, info.seconds, info.from_cache ? "cache hit" : "compiled");

    const int n = 1 << 20;
    std::vector<float> x(n), y(n);
    for (int i = 0; i < n; ++i) x[i] = std::sin(0.001f * i) * 10.f;
    float *dx = nullptr, *dy = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dx), n * sizeof(float)));
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dy), n * sizeof(float)));
    LOOM_CHECK_CUDA(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    LOOM_CHECK_CUDA(cudaMemset(dy, 0xff, n * sizeof(float)));

    loom::Ctx ctx{};
    ctx.rank = 2;
    ctx.world = 4;
    loom::jit::LaunchConfig cfg;
    cfg.block = dim3(256);
    cfg.grid = dim3((n + 256 * 4 - 1) / (256 * 4));
    k(cfg, ctx, 0.5f, static_cast<const float*>(dx), dy, n);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    LOOM_CHECK_CUDA(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; ++i) bad += y[i] != 0.5f * x[i] + 3.f;
    cudaFree(dx);
    cudaFree(dy);
    std::printf("%s: %d of %d elements wrong\n", bad ? "FAILED" : "OK", bad, n);
    return bad ? 1 : 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "04_jit_user_kernel: %s\n", e.what());
    return 1;
}
