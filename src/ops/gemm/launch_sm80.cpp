// The portable kernel's launch (kernels/gemm/gemm_sm80.cuh: cp.async + mma.sync, one fixed 128 x 128 x 32 tile): below
// sm_90, or where GemmOptions::force_sm80 / GemmConfig::sm80 asks for it.
#include <cstdint>

#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom {

void detail::gemm_launch_sm80(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                              const GemmConfig& cfg, std::optional<DType> bias, cudaStream_t stream,
                              const char* source) {
    const int64_t m = a.rows, k = a.cols, n = c.cols;
    gemm_log_config(m, n, k, cfg, source);
    const jit::Kernel* kernel = &jit::get_kernel(gemm_kernel_spec(cfg, a.dtype, c.dtype, bias, o.b_kn));
    const kernels::GemmArgs args = gemm_whole_tile_args(c, m, n, k, o);
    jit::LaunchConfig lc;
    lc.grid = dim3(static_cast<unsigned>(gemm_ceil_div(n, kernels::kSm80BlockN)),
                   static_cast<unsigned>(gemm_ceil_div(m, kernels::kSm80BlockM)));
    lc.block = dim3(kernels::kSm80Threads);
    lc.smem = kernels::gemm_sm80_smem_bytes(4);
    lc.stream = stream;
    LOOM_CHECK(lc.grid.y <= 65535, "gemm (sm80 path): expected M <= {}, given {}", 65535 * 128, m);
    const void* a_ptr = a.data;
    const void* b_ptr = b.data;
    const int64_t lda = a.stride(), ldb = b.stride();
    (*kernel)(lc, a_ptr, lda, b_ptr, ldb, args);
}

}  // namespace loom
