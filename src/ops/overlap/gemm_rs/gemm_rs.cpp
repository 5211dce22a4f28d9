// loom::gemm_rs: GEMM+ReduceScatter (kernels/overlap/gemm_rs.cuh, gemm_rs_pull.cuh; docs/overlap.md). The entry
// validates the call, chooses the algorithm (plan.cpp) and dispatches to it: fused_epilogue.cpp, fused_pull.cpp,
// scatter_reduce.cpp, sequential.cpp, across nodes across_nodes.cpp. A call that leaves every choice to Loom runs the
// options the autotuner decided for its shape (common/tune.hpp).
#include "ops/overlap/gemm_rs/gemm_rs.hpp"

#include <cstdint>

#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "runtime/call_agreement.hpp"
#include "runtime/nvtx_range.hpp"

namespace loom {
namespace {

using overlap::RsCall;

detail::CallSignature signature(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                                const GemmRsOptions& o) {
    detail::CallSignature s = overlap::signature(world, "gemm_rs", a, b, c);
    s.add("GemmRsOptions::algo", to_string(o.algo))
        .add("GemmRsOptions::transport", to_string(o.transport))
        .add("GemmRsOptions::comm_sms", o.comm_sms)
        .add("GemmRsOptions::ce_chunk_bytes", o.ce_chunk_bytes)
        .add("GemmRsOptions::config", overlap::config_field(o.config))
        .add("GemmRsOptions::num_sms", o.num_sms);
    return s;
}

// The call's inputs checked, its facts gathered (the World's DeviceFacts: created on the first call).
RsCall validate(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
                const GemmRsOptions& o, bool captured) {
    constexpr const char* op = "gemm_rs";
    RsCall x;
    overlap::begin_call(x, op, world, a, b, c, stream, o, captured);
    x.M = a.rows;
    x.K = a.cols;
    x.N = b.rows;
    LOOM_CHECK(x.M % x.W == 0, "{}: expected M a multiple of the world size {}, given M = {}", op, x.W, x.M);
    x.rows_seg = x.M / x.W;
    LOOM_CHECK(c.rows == x.rows_seg && c.cols == x.N, "{}: expected C of [M / W, N] = [{}, {}], given {} x {}", op,
               x.rows_seg, x.N, c.rows, c.cols);
    LOOM_CHECK(x.M <= INT32_MAX && x.N <= INT32_MAX && x.M * x.N <= (int64_t(1) << 40),
               "{}: shapes too large: M={} N={}", op, x.M, x.N);
    LOOM_CHECK(o.comm_sms >= 0, "{}: expected comm_sms >= 0, given {}", op, o.comm_sms);
    x.out_bytes = static_cast<int>(dtype_size(c.dtype));
    return x;
}

// The op with the options as given (diag: gemm_rs_diagnostic's bits).
void as_given(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
              const GemmRsOptions& o, int diag = 0) {
    // The fused pull and the scatter-reduce cannot be replayed; the fused epilogue with the SM transport can. Auto's
    // choice is checked once made (prepare_overlapped).
    const bool captured = overlap::check_capture(
        stream, "gemm_rs",
        o.algo == RsAlgo::Sequential ||
            ((o.algo == RsAlgo::Auto || o.algo == RsAlgo::FusedEpilogue) && o.transport != RsTransport::CopyEngine));
    RsCall x = validate(world, a, b, c, stream, o, captured);
    x.diag = diag;
    overlap::choose_algo(x, o);
    if (x.algo == RsAlgo::Sequential) return overlap::gemm_rs_sequential(x);
    if (x.nodes > 1) return overlap::gemm_rs_across_nodes(x);  // ScatterReduce across nodes: the two-level form
    overlap::prepare_overlapped(x, o);
    switch (x.plan.rs_algo) {
        case RsAlgo::FusedPull:
            return overlap::gemm_rs_pull(x);
        case RsAlgo::FusedEpilogue:
            return overlap::gemm_rs_fused(x, o.ce_chunk_bytes);
        default:
            return overlap::gemm_rs_scatter(x);
    }
}

}  // namespace

void gemm_rs(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const GemmRsOptions& o) {
    const loom::detail::NvtxRange nvtx("loom::gemm_rs M={} N={} K={}", a.rows, c.cols, a.cols);
    const detail::AgreedCall agreed(
        world, [&] { return signature(world, a, b, c, o); },
        [&] { overlap::check_args(world, "gemm_rs", a, b, c, o); });
    const bool choices_left = o.algo == RsAlgo::Auto && o.transport == RsTransport::Auto && o.comm_sms == 0 &&
                              o.config == nullptr && o.ce_chunk_bytes == 0;
    if (!choices_left) return as_given(world, a, b, c, stream, o);
    overlap::run_tuned<GemmRsOptions>(
        world, "gemm_rs", a, b, c, stream, o.num_sms,
        [&](const overlap::DeviceFacts& dev, int sms) { return overlap::gemm_rs_candidates(world, a, b, c, dev, sms); },
        [&](const GemmRsOptions& x, const MatrixView& out) {
            as_given(world, a, b, out, stream, overlap::with_callers_terms(x, o));
        });
}

void overlap::gemm_rs_diagnostic(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                                 cudaStream_t stream, const GemmRsOptions& o, int skip) {
    as_given(world, a, b, c, stream, o, skip);
}

}  // namespace loom
