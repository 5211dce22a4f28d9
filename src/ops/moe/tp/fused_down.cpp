// plan_fused_down: the shared planning of moe_rs's and moe_ar's fused algorithms (fused_down.hpp).
#include "ops/moe/tp/fused_down.hpp"

#include <algorithm>

#include "loom/kernels/gemm/gemm_params.hpp"

namespace loom::moe {

FusedDown plan_fused_down(const MoeDownCall& c, const char* op, overlap::LocalBuffer& partial, int64_t tokens,
                          const char* reduce_kernel) {
    const auto& dev = overlap::op_state<overlap::DeviceFacts>(*c.world, op, c.captured);
    const MoeRoutingShape& s = c.routing.shape;
    const int64_t H = c.out.cols;
    FusedDown f;
    f.partial = overlap::ensure_local(partial, static_cast<std::size_t>(s.max_rows()) * H * dtype_size(c.out.dtype));

    GroupedGemmOptions gopts = c.opts.gemm;
    gopts.max_rows = static_cast<int>(s.max_rows());
    const int usable = gopts.num_sms > 0 && gopts.num_sms < dev.device_sms ? gopts.num_sms : dev.device_sms;
    f.blocks = rs_reduce_blocks(tokens, usable);
    f.gemm_sms = std::max(1, usable - f.blocks);
    MatrixView a = c.rows;
    a.rows = s.max_rows();
    f.gemm = GroupedGemmProblem{a,
                                c.w_down,
                                MatrixView{f.partial, c.out.dtype, s.max_rows(), H},
                                s.num_experts,
                                c.routing.offsets,
                                s.num_groups(),
                                gopts};
    grouped_gemm_validate(f.gemm, dev.device);
    f.cfg = grouped_gemm_config(f.gemm, dev.arch, f.gemm_sms);
    f.block_m = f.cfg.sm80 ? kernels::kSm80BlockM : f.cfg.block_m;
    const int block_n = f.cfg.sm80 ? kernels::kSm80BlockN : f.cfg.block_n;
    f.num_n = static_cast<int>((H + block_n - 1) / block_n);

    jit::KernelSpec rspec;
    rspec.header = kTpHeader;
    rspec.name = reduce_kernel;
    rspec.template_args = {dtype_cuda_name(c.out.dtype)};
    f.reduce = &jit::get_kernel(rspec);
    (void)jit::get_kernel(grouped_gemm_kernel_spec(f.cfg, c.rows.dtype, c.out.dtype, f.gemm.b_kn(), gopts.activation,
                                                   "loom::kernels::moe::MoeRsHooks", kTpHeader, f.gemm.block_scaled()));
    return f;
}

}  // namespace loom::moe
