// qkv_gemm_a2a's sequence (UlyssesAlgo::Sequential): loom::gemm into this call's half of the symmetric product, then
// ulysses_qkv_a2a on the stream in its whole-product mode (ready signals; pieces of kSequentialPieceRows whole rows).
#include <algorithm>

#include "loom/jit/jit.hpp"
#include "loom/ops/gemm.hpp"
#include "ops/attention/ulysses/ulysses.hpp"

namespace loom::ulysses {

void qkv_sequential(const QkvCall& x) {
    World& world = *x.world;
    QkvState& st = overlap::op_state<QkvState>(world, "qkv_gemm_a2a");
    const int64_t N = x.layout.cols(), es = dtype_size(x.dtype);
    const std::size_t half_stride =
        overlap::ensure_parity_halves(world, st.buf, static_cast<std::size_t>(x.R * N * es));
    jit::KernelSpec spec;
    spec.header = kHeader;
    spec.name = "loom::kernels::attention::ulysses_qkv_a2a";
    const jit::Kernel& a2a = jit::get_kernel(spec);  // before the counter advances

    const uint64_t epoch = ++st.calls;
    auto* const half = static_cast<uint8_t*>(st.buf.p) + (epoch % 2) * half_stride;
    gemm(x.x, x.w, MatrixView{half, x.dtype, x.R, N, 0}, GemmOptions{}, x.stream);

    kernels::attention::UlyssesQkvParams p = qkv_params(x, st);
    p.qkv = half;
    p.epoch = epoch;
    p.block_m = kSequentialPieceRows;
    p.block_n_bytes = static_cast<int32_t>(N * es);
    p.num_m = static_cast<int32_t>((x.R + kSequentialPieceRows - 1) / kSequentialPieceRows);
    p.num_n = 1;
    p.group_m = 1;
    p.whole = 1;
    const int64_t warps = kernels::attention::kUlyssesThreads / 32;
    const int64_t units = int64_t(p.num_m) * x.W;
    jit::LaunchConfig lc;
    lc.grid = dim3(static_cast<unsigned>(std::clamp<int64_t>((units + warps - 1) / warps, 1, x.num_sms)));
    lc.block = dim3(kernels::attention::kUlyssesThreads);
    lc.stream = x.stream;
    // Its launch overlaps the GEMM's tail: every thread waits in griddep_wait() for the GEMM to complete first.
    lc.programmatic = true;
    a2a(lc, world.ctx(), p);
}

}  // namespace loom::ulysses
