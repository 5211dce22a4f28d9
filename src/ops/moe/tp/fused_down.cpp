// plan_fused_down: the shared planning of moe_rs's and moe_ar's fused algorithms (fused_down.hpp).
#include "ops/moe/tp/fused_down.hpp"

#include <algorithm>

#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/common/plan.hpp"

namespace loom::moe {

FusedDown plan_fused_down(const MoeDownCall& c, const char* op, overlap::LocalBuffer& partial, int64_t tokens,
                          int sources, const char* reduce_kernel, bool side) {
    const auto& dev = overlap::op_state<overlap::DeviceFacts>(*c.world, op, c.captured);
    const MoeRoutingShape& s = c.routing.shape;
    const int64_t H = c.out.cols, K = c.rows.cols;
    const int64_t out_bytes = dtype_size(c.out.dtype), in_bytes = dtype_size(c.rows.dtype);
    FusedDown f;
    f.partial = overlap::ensure_local(partial, static_cast<std::size_t>(s.max_rows()) * H * out_bytes);

    // Work items: chunks of tokens (16-byte words of out's type across H: H x out_bytes is a multiple of 16, as the
    // GEMM's N is a multiple of 8).
    const int64_t row_words = H * out_bytes / 16;
    LOOM_CHECK(row_words * 16 == H * out_bytes, "{}: internal: out's rows of {} B are not whole 16-byte words", op,
               H * out_bytes);
    f.chunk = down_chunk_tokens(tokens, H, static_cast<int>(out_bytes), s.topk);
    LOOM_CHECK(f.chunk * row_words < (int64_t{1} << 31) && (sources + 1) * tokens < (int64_t{1} << 31),
               "{}: out: expected under 2^31 16-byte words per row and tokens per rank, given {} and {}", op, row_words,
               tokens);
    f.row_words = static_cast<int>(row_words);
    f.chunks = (tokens + f.chunk - 1) / f.chunk;
    const int64_t items = sources * f.chunks;

    GroupedGemmOptions gopts = c.opts.gemm;
    gopts.max_rows = static_cast<int>(s.max_rows());
    const int usable = gopts.num_sms > 0 && gopts.num_sms < dev.device_sms ? gopts.num_sms : dev.device_sms;
    if (side && c.opts.comm_sms > 0) {
        f.side_blocks = overlap::comm_blocks(c.opts.comm_sms, c.opts.comm_sms, usable);
    } else if (side && c.opts.comm_sms == 0 && !dev.shared_gpu) {
        // (Ranks sharing a GPU: none. The side blocks of every rank there take SMs from every rank's persistent GEMM,
        // whose last CTAs then wait for a free SM: Mixtral-8x7B at 8192 tokens, 4 ranks, took 7.0 ms with them and
        // 3.6 ms without.)
        // The peers' sends (read k rows, write one, per token) become ready while the GEMM runs; the own rank's last.
        const double entries = static_cast<double>(s.entries());
        const double side_bytes = static_cast<double>(sources - 1) * static_cast<double>(tokens) *
                                  static_cast<double>((s.topk + 1) * H * out_bytes);
        const double flops = 2.0 * entries * static_cast<double>(K) * static_cast<double>(H);
        const double gemm_bytes = entries * static_cast<double>(K * in_bytes) +
                                  static_cast<double>(s.num_experts) * static_cast<double>(H * K * in_bytes) +
                                  entries * static_cast<double>(H * out_bytes);
        f.side_blocks = rs_side_blocks(side_bytes, flops, gemm_bytes, usable);
    }
    if (usable < 2) f.side_blocks = 0;  // the GEMM must keep an SM
    // With side blocks the GEMM leaves them their SMs of the planned share. Without, it waits for nothing and nothing
    // waits inside it, so it takes the grid Sequential's grouped_gemm takes (the SMs the device reports, under MPS the
    // rank's share, or opts.gemm.num_sms): the planned share (DeviceFacts) is for kernels that wait on each other.
    const int device_sms = detail::gemm_device().num_sms;
    f.gemm_sms = f.side_blocks > 0 ? std::max(1, usable - f.side_blocks)
                                   : (gopts.num_sms > 0 && gopts.num_sms < device_sms ? gopts.num_sms : device_sms);
    f.tail_blocks = down_tail_blocks(items, usable);
    f.sum_blocks = down_tail_blocks(f.chunks, usable);
    f.claims = items + f.side_blocks + f.tail_blocks;
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
    rspec.name = "loom::kernels::moe::moe_tp_sum_slots";
    f.sum = &jit::get_kernel(rspec);
    (void)jit::get_kernel(
        grouped_gemm_kernel_spec(f.cfg, c.rows.dtype, c.out.dtype, f.gemm.b_kn(), gopts.activation,
                                 f.hooked() ? "loom::kernels::moe::MoeRsHooks" : "loom::kernels::moe::GroupedNoHooks",
                                 f.hooked() ? kTpHeader : "", f.gemm.block_scaled()));
    return f;
}

}  // namespace loom::moe
