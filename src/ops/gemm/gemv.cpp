// The weight-streaming kernel for decode-sized M (kernels/gemm/gemv.cuh): when loom::gemm takes it, its plan, and its
// launch with the K-splits summed in a cluster or through the split-K workspace.
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom {
namespace {

using detail::gemm_ceil_div;

// The ring's shared memory per CTA: two fit on an SM (each ~113 KiB of the 228), so where N has more blocks than SMs
// an SM streams two blocks at once. The K-splits only fill the SMs once: on an H200 a second split per SM cost more in
// fix-ups than its stream gained (1 x 8192 x 4096 bf16: 20.3 us whole on 128 CTAs, 21.8 split in two on 256, 24.5 in
// four; bench-gemm --decode-sweep).
constexpr int kGemvSmemPerCta = 112 * 1024;
// Each K-split streams at least this many 256-byte slices of its rows (fewer and the fix-up outweighs the stream).
constexpr int64_t kGemvMinSlicesPerSplit = 2;
constexpr int kGemvMaxSplits = 32;

int gemv_m_tiles(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : 4; }

}  // namespace

bool detail::gemm_gemv_supported(int64_t m, bool b_kn, DType in, int arch) {
    return m <= kernels::kGemvMaxM && !b_kn && (in == DType::F8E4M3 ? arch >= 89 : arch >= 80);
}

bool detail::gemm_gemv_preferred(int64_t m, int64_t k, bool b_kn, DType in, int arch) {
    if (!gemm_gemv_supported(m, b_kn, in, arch) || dtype_size(in) != 2 || m > kGemvPreferMaxM) return false;
    const int64_t row_bytes = k * static_cast<int64_t>(dtype_size(in));
    return row_bytes >= (m <= 8 ? kGemvPreferMinKBytesOneTile : kGemvPreferMinKBytes);
}

GemmConfig detail::gemm_gemv_plan(int64_t m, int64_t n, int64_t k, DType in, int num_sms) {
    GemmConfig c;
    c.gemv = true;
    c.cluster_m = 1;
    c.block_m = 8 * gemv_m_tiles(m);
    c.block_n = kernels::kGemvRows;
    c.block_k = kernels::kGemvSliceBytes / static_cast<int>(dtype_size(in));
    c.stages = std::clamp(kGemvSmemPerCta / kernels::gemv_stage_bytes(gemv_m_tiles(m)), 2, kernels::kGemvMaxStages);
    const int64_t blocks = gemm_ceil_div(n, kernels::kGemvRows);
    const int64_t slices = kernels::gemv_slices(k * static_cast<int64_t>(dtype_size(in)));
    int64_t splits = blocks >= num_sms ? 1 : num_sms / blocks;
    splits = std::min<int64_t>({splits, std::max<int64_t>(slices / kGemvMinSlicesPerSplit, 1), kGemvMaxSplits});
    c.tail_splits = static_cast<int>(std::max<int64_t>(splits, 1));
    c.grid = static_cast<int>(blocks * c.tail_splits);
    return c;
}

jit::KernelSpec detail::gemm_gemv_kernel_spec(DType in, DType out, std::optional<DType> bias, int64_t m, int stages,
                                              bool cluster) {
    jit::KernelSpec spec;
    spec.header = "loom/kernels/gemm/gemv.cuh";
    spec.name = "loom::kernels::gemm_gemv_mma";
    spec.template_args = {dtype_cuda_name(in),
                          dtype_cuda_name(out),
                          dtype_cuda_name(bias.value_or(DType::F32)),
                          std::to_string(gemv_m_tiles(m)),
                          std::to_string(stages),
                          cluster ? "true" : "false"};
    return spec;
}

void detail::gemm_launch_gemv(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                              const GemmConfig& cfg, std::optional<DType> bias, int arch, cudaStream_t stream,
                              const char* source) {
    const int64_t m = a.rows, k = a.cols, n = c.cols;  // gemm_launch checked gemm_gemv_supported
    const int mt = gemv_m_tiles(m);
    const int64_t blocks = gemm_ceil_div(n, kernels::kGemvRows);  // N <= INT32_MAX (gemm_validate): a valid grid.x
    const int64_t slices = kernels::gemv_slices(k * static_cast<int64_t>(dtype_size(a.dtype)));
    int splits = static_cast<int>(std::min<int64_t>(cfg.tail_splits, slices));
    jit::LaunchConfig lc;
    lc.grid = dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
    lc.block = dim3(kernels::kGemvThreads);
    lc.smem = static_cast<size_t>(kernels::gemv_smem_bytes(mt, cfg.stages));
    lc.stream = stream;
    kernels::GemmArgs args = gemm_whole_tile_args(c, m, n, k, o);
    // One n8 tile of A's rows with 2-kGemvMaxClusterSplits splits on sm_90 sums them in a cluster where one fits this
    // context's SMs (its MPS share); otherwise the workspace does. With more tiles ptxas gives the cluster variant 96
    // registers against the workspace one's 122, and its mainloop measured 4-20 % slower (M = 16, N 1024-8192, K
    // 4096-16384).
    bool cluster = mt == 1 && arch >= 90 && splits >= 2 && splits <= kernels::kGemvMaxClusterSplits;
    const jit::Kernel* kernel = nullptr;
    if (cluster) {
        kernel = &jit::get_kernel(gemm_gemv_kernel_spec(a.dtype, c.dtype, bias, m, cfg.stages, true));
        lc.cluster = dim3(1, static_cast<unsigned>(splits), 1);
        cluster = kernel->max_active_clusters(lc) >= 1;
        if (!cluster) lc.cluster = dim3(1, 1, 1);
    }
    if (!cluster) kernel = &jit::get_kernel(gemm_gemv_kernel_spec(a.dtype, c.dtype, bias, m, cfg.stages, false));
    std::unique_lock<std::mutex> ws_lock;
    if (splits >= 2 && !cluster) {
        const GemmSplitWorkspace ws =
            gemm_split_workspace(stream, static_cast<size_t>(blocks * splits * kernels::gemv_slot_floats(mt)),
                                 static_cast<size_t>(blocks), ws_lock);
        if (ws.partials == nullptr) {
            splits = 1;  // capturing a graph: this launch runs without the split
            lc.grid.y = 1;
        } else {
            args.partials = ws.partials;
            args.tile_counters = ws.counters;
        }
    }
    args.tail_splits = splits;
    GemmConfig ran = cfg;
    ran.tail_splits = splits;
    gemm_log_config(m, n, k, ran, source);
    const void* a_ptr = a.data;
    const void* b_ptr = b.data;
    const int64_t lda = a.stride(), ldb = b.stride();
    (*kernel)(lc, a_ptr, lda, b_ptr, ldb, args);
}

}  // namespace loom
