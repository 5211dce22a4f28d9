// The grouped kernels' JIT specs and launches: tensor maps (Hopper), arguments, launch dimensions.
#include <algorithm>
#include <cstdint>
#include <string>

#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/tma.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"

namespace loom::moe {

jit::KernelSpec grouped_gemm_kernel_spec(const GemmConfig& cfg, DType in, DType out, bool b_kn, MoeActivation act,
                                         const std::string& hooks, const std::string& header, bool block_scale) {
    const std::string activation =
        std::to_string(static_cast<int>(act == MoeActivation::SwiGLU ? kernels::moe::GroupedAct::SwiGLU
                                        : act == MoeActivation::GeLU ? kernels::moe::GroupedAct::GeLU
                                                                     : kernels::moe::GroupedAct::None));
    jit::KernelSpec spec;
    if (cfg.sm80) {
        spec.header = header.empty() ? "loom/kernels/moe/grouped_gemm_sm80.cuh" : header;
        spec.name = "loom::kernels::moe::grouped_gemm_sm80";
        spec.template_args = {dtype_cuda_name(in),     dtype_cuda_name(out), "4",
                              b_kn ? "false" : "true", activation,           hooks};
        if (block_scale) spec.template_args.push_back("true");  // kBlockScale
        return spec;
    }
    spec.header = header.empty() ? "loom/kernels/moe/grouped_gemm.cuh" : header;
    spec.name = "loom::kernels::moe::grouped_gemm_sm90";
    spec.template_args = {dtype_cuda_name(in),
                          dtype_cuda_name(out),
                          std::to_string(cfg.block_m),
                          std::to_string(cfg.block_n),
                          std::to_string(cfg.stages),
                          b_kn ? "false" : "true",
                          activation,
                          hooks};
    // Trailing defaulted arguments: kBlockScale, then kStagedStore (cfg.tma_store: the staged epilogue).
    if (block_scale || cfg.tma_store) spec.template_args.push_back(block_scale ? "true" : "false");
    if (cfg.tma_store) spec.template_args.push_back("true");
    return spec;
}

GroupedGemmLaunch grouped_gemm_launch_for(const GroupedGemmProblem& p, const GemmConfig& cfg, int num_sms,
                                          cudaStream_t stream) {
    LOOM_CHECK(p.a.rows > 0, "grouped_gemm: a launch needs A with rows, given {}", p.a.rows);
    GroupedGemmLaunch l;
    l.sm80 = cfg.sm80;
    const int64_t n = p.n(), k = p.k();
    auto& args = l.args;
    args.c = p.c.data;
    args.ldc = p.c.stride();
    args.offsets = p.offsets;
    args.a = p.a.data;
    args.b = p.b.data;
    args.lda = p.a.stride();
    args.ldb = p.b.stride();
    args.num_groups = p.num_groups;
    args.num_experts = p.num_experts;
    args.rows = static_cast<int32_t>(p.a.rows);
    args.n = static_cast<int32_t>(n);
    args.n_out = static_cast<int32_t>(p.n_out());
    args.k = static_cast<int32_t>(k);
    args.group_m = cfg.group_m;
    args.alpha = p.opts.alpha;
    args.scale_a = p.opts.scale_a;
    args.scale_b = p.opts.scale_b;
    args.scale_a_blocks = p.opts.scale_a_blocks;
    args.scale_b_blocks = p.opts.scale_b_blocks;
    const int64_t max_tiles = grouped_gemm_max_tiles(p.planned_rows(), p.n_out(), p.num_groups, cfg, p.swiglu());
    l.launch.stream = stream;
    if (cfg.sm80) {
        // One CTA per tile of the upper bound (the kernel walks more when max_rows understates the rows).
        const int64_t grid = cfg.grid > 0 ? cfg.grid : max_tiles;
        l.launch.grid = dim3(static_cast<unsigned>(std::clamp<int64_t>(grid, 1, INT32_MAX)));
        l.launch.block = dim3(kernels::kSm80Threads);
        l.launch.smem =
            (p.a.dtype == DType::F8E4M3 ? kernels::gemm_sm80_e4m3_smem_bytes(4) : kernels::gemm_sm80_smem_bytes(4)) +
            kernels::moe::grouped_prefix_bytes(p.num_groups);
        return l;
    }
    l.tmap_a = make_tma_2d(p.a, cfg.block_m, cfg.block_k);
    if (p.b_kn()) {
        l.tmap_b = make_tma_3d(MatrixView{p.b.data, p.b.dtype, k, n, p.b.ld}, p.num_experts, cfg.block_k, 64);
    } else {
        l.tmap_b = make_tma_3d(MatrixView{p.b.data, p.b.dtype, n, k, p.b.ld}, p.num_experts,
                               p.swiglu() ? cfg.block_n / 2 : cfg.block_n, cfg.block_k);
    }
    const int64_t grid = cfg.grid > 0 ? cfg.grid : std::min<int64_t>(num_sms, max_tiles);
    l.launch.grid = dim3(static_cast<unsigned>(std::max<int64_t>(grid, 1)));
    l.launch.block = dim3(static_cast<unsigned>(128 * (cfg.block_m / 64 + 1)));
    l.launch.smem =
        kernels::moe::grouped_gemm_sm90_smem_bytes(cfg.block_m, cfg.block_n, cfg.stages, p.num_groups, cfg.tma_store);
    return l;
}

}  // namespace loom::moe
