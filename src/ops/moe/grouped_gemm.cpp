// loom::grouped_gemm: validate the inputs, choose the config, launch the Hopper or the portable kernel.
#include <cstdio>

#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"
#include "runtime/nvtx_range.hpp"

namespace loom {

void grouped_gemm(const MatrixView& a, const MatrixView& b, int num_experts, const MatrixView& c,
                  const int32_t* group_offsets, int num_groups, cudaStream_t stream, const GroupedGemmOptions& opts) {
    const loom::detail::NvtxRange nvtx("loom::grouped_gemm rows={} N={} K={} E={} G={}", a.rows, c.cols, a.cols,
                                       num_experts, num_groups);
    const moe::GroupedGemmProblem p{a, b, c, num_experts, group_offsets, num_groups, opts};
    const detail::GemmDevice dev = detail::gemm_device();
    LOOM_CHECK(dev.arch >= 80, "grouped_gemm: expected a GPU of compute capability >= 8.0, given {}.{}", dev.arch / 10,
               dev.arch % 10);
    moe::grouped_gemm_validate(p, dev.device);
    if (a.rows == 0) return;  // no group has rows
    const int num_sms = opts.num_sms > 0 && opts.num_sms < dev.num_sms ? opts.num_sms : dev.num_sms;
    const GemmConfig cfg = moe::grouped_gemm_config(p, dev.arch, num_sms);
    if (log_enabled(LogLevel::Debug))
        fmt::print(stderr, "loom::grouped_gemm rows={} N={} K={} E={} G={}: {}\n", a.rows, p.n(), a.cols, num_experts,
                   num_groups, cfg.str());
    struct NoHooks {
    } hooks;  // loom::kernels::moe::GroupedNoHooks: an empty object
    moe::grouped_gemm_launch_hooked("loom::kernels::moe::GroupedNoHooks", "", p, cfg, num_sms, stream, hooks);
}

}  // namespace loom
