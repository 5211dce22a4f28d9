// loom::gemm_ar: GEMM+AllReduce (kernels/overlap/gemm_ar.cuh; docs/overlap.md). The entry validates the
// call, chooses the algorithm (plan.cpp) and dispatches to it: fused_epilogue.cpp, reduce_kernel.cpp, sequential.cpp.
// A call that leaves every choice to Loom runs the options the autotuner decided for its shape (common/tune.hpp).
#include "ops/overlap/gemm_ar/gemm_ar.hpp"

#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "runtime/call_agreement.hpp"
#include "runtime/nvtx_range.hpp"

namespace loom {
namespace {

using overlap::ArCall;

detail::CallSignature signature(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                                const GemmArOptions& o) {
    detail::CallSignature s = overlap::signature(world, "gemm_ar", a, b, c);
    s.add("GemmArOptions::algo", to_string(o.algo))
        .add("GemmArOptions::comm_sms", o.comm_sms)
        .add("GemmArOptions::config", overlap::config_field(o.config))
        .add("GemmArOptions::num_sms", o.num_sms)
        .add("GemmArOptions::shots", to_string(o.shots));
    return s;
}

// The call's inputs checked, its facts gathered (the World's DeviceFacts: created on the first call).
ArCall validate(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
                const GemmArOptions& o, bool captured) {
    constexpr const char* op = "gemm_ar";
    ArCall x;
    overlap::begin_call(x, op, world, a, b, c, stream, o, captured);
    x.M = a.rows;
    x.K = a.cols;
    x.N = b.rows;
    LOOM_CHECK(c.rows == x.M && c.cols == x.N, "{}: expected C of [M, N] = [{}, {}], given {} x {}", op, x.M, x.N,
               c.rows, c.cols);
    LOOM_CHECK(o.comm_sms >= 0, "{}: expected comm_sms >= 0, given {}", op, o.comm_sms);
    x.out_bytes = static_cast<int>(dtype_size(c.dtype));
    return x;
}

// The op with the options as given.
void as_given(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
              const GemmArOptions& o) {
    // ReduceKernel cannot be replayed; Auto's choice is checked once planned (choose_algo).
    const bool captured =
        overlap::check_capture(stream, "gemm_ar", o.algo != ArAlgo::ReduceKernel && o.shots == ArShots::Auto);
    ArCall x = validate(world, a, b, c, stream, o, captured);
    overlap::choose_algo(x, o);
    if (x.algo == ArAlgo::Sequential) {
        gemm_validate(a, b, c, GemmOptions{}, /*allow_f8=*/true);
        return overlap::gemm_ar_sequential(x);
    }
    if (x.plan.ar_algo == ArAlgo::FusedEpilogue) {
        gemm_validate(a, b, c, GemmOptions{}, /*allow_f8=*/true);
        return overlap::gemm_ar_fused(x);
    }
    overlap::gemm_ar_reduce_kernel(x);
}

}  // namespace

void gemm_ar(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const GemmArOptions& o) {
    const loom::detail::NvtxRange nvtx("loom::gemm_ar M={} N={} K={}", a.rows, c.cols, a.cols);
    const detail::AgreedCall agreed(
        world, [&] { return signature(world, a, b, c, o); },
        [&] { overlap::check_args(world, "gemm_ar", a, b, c, o); });
    const bool choices_left =
        o.algo == ArAlgo::Auto && o.shots == ArShots::Auto && o.comm_sms == 0 && o.config == nullptr;
    if (!choices_left) return as_given(world, a, b, c, stream, o);
    overlap::run_tuned<GemmArOptions>(
        world, "gemm_ar", a, b, c, stream, o.num_sms,
        [&](const overlap::DeviceFacts& dev, int sms) { return overlap::gemm_ar_candidates(world, a, b, c, dev, sms); },
        [&](const GemmArOptions& x, const MatrixView& out) {
            as_given(world, a, b, out, stream, overlap::with_callers_terms(x, o));
        });
}

}  // namespace loom
