// loom::gemm: validate the inputs, choose the config (tune.cpp), launch it on the Hopper or the portable kernel.
#include "loom/ops/gemm.hpp"

#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>

#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "runtime/env_vars.hpp"
#include "runtime/nvtx_range.hpp"

namespace loom {

std::string GemmConfig::str() const {
    if (sm80) return "sm80 128x128x32 st4 (mma.sync)";
    if (gemv) return fmt::format("gemv {}x{} st{} split{}", block_m, block_n, stages, tail_splits);
    return fmt::format(
        "sm90 {}x{}x{} st{} wg{} cluster{} g{} grid{}{}{}{}", block_m, block_n, block_k, stages, consumers(), cluster_m,
        group_m, grid, tail_splits > 1 ? fmt::format(" tail{}", tail_splits) : "",
        cluster_k > 1 ? fmt::format(" ksplit{}", cluster_k) : "", tma_store || cluster_k > 1 ? "" : " direct-store");
}

void gemm(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o, cudaStream_t stream) {
    const loom::detail::NvtxRange nvtx("loom::gemm M={} N={} K={}", c.rows, c.cols, a.cols);
    gemm_validate(a, b, c, o, /*allow_f8=*/true);
    const detail::GemmDevice dev = detail::gemm_device();
    LOOM_CHECK(dev.arch >= 80, "gemm: expected a GPU of compute capability >= 8.0, given {}.{}", dev.arch / 10,
               dev.arch % 10);
    gemm_check_memory("gemm", a, b, c, o, nullptr, dev.device);
    std::string source;
    const GemmConfig cfg = detail::gemm_config_for(a, b, c, o, dev, stream, &source);
    detail::gemm_launch(a, b, c, o, cfg, dev, stream, source.c_str());
}

namespace detail {

GemmDevice gemm_device() {
    static std::mutex mu;
    static std::unordered_map<int, GemmDevice> cache;
    int dev = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(dev);
    if (it != cache.end()) return it->second;
    GemmDevice info;
    int major = 0, minor = 0;
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, dev));
    info.arch = major * 10 + minor;
    info.device = dev;
    cache.emplace(dev, info);
    return info;
}

bool gemm_takes_sm80(const GemmOptions& o, const GemmDevice& dev) { return dev.arch < 90 || o.force_sm80; }

void gemm_log_config(int64_t m, int64_t n, int64_t k, const GemmConfig& cfg, const char* source) {
    if (source == nullptr || !log_enabled(LogLevel::Debug)) return;
    fmt::print(stderr, "loom::gemm M={} N={} K={}: {} ({})\n", m, n, k, cfg.str(), source);
}

void gemm_launch(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o, GemmConfig cfg,
                 const GemmDevice& dev, cudaStream_t stream, const char* source) {
    if (gemm_takes_sm80(o, dev) && !cfg.gemv) cfg.sm80 = true;
    LOOM_CHECK(!cfg.sm80 || a.dtype != DType::F8E4M3,
               "gemm: f8e4m3 inputs need the Hopper kernel (wgmma, sm_90); the sm_80 path (mma.sync) takes bf16 / f16, "
               "given {}",
               dev.arch < 90 ? fmt::format("a GPU of compute capability {}.{}", dev.arch / 10, dev.arch % 10)
                             : std::string("force_sm80 / GemmConfig::sm80"));
    if (o.beta != 0.f) cfg.tma_store = false;  // only the direct-store epilogue reads C
    gemm_validate_config(cfg, o.b_kn, a.dtype);
    // Alpha = 1 without a bias takes the kernel whose epilogue does no arithmetic (where its epilogue applies).
    const std::optional<DType> bias = gemm_kernel_bias(cfg, c.dtype, o);
    if (cfg.gemv) {
        LOOM_CHECK(gemm_gemv_supported(a.rows, o.b_kn, a.dtype, dev.arch),
                   "gemm: the gemv kernel expects M <= {}, B as [N, K] and a GPU of sm_80 (f8e4m3: sm_89) or later, "
                   "given M={}{} on sm_{}",
                   kernels::kGemvMaxM, a.rows, o.b_kn ? ", B as [K, N]" : "", dev.arch);
        gemm_launch_gemv(a, b, c, o, cfg, bias, dev.arch, stream, source);
    } else if (cfg.sm80) {
        gemm_launch_sm80(a, b, c, o, cfg, bias, stream, source);
    } else {
        gemm_launch_sm90(a, b, c, o, cfg, bias, dev.num_sms, stream, source);
    }
}

}  // namespace detail
}  // namespace loom
