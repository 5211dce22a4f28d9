// a2a_o_gemm's sequence (UlyssesAlgo::Sequential): ulysses_o_a2a on the stream, ending once every rank's chunks landed
// in this call's half of the gathered operand, then loom::gemm over it.
#include <algorithm>

#include "loom/jit/jit.hpp"
#include "loom/ops/gemm.hpp"
#include "ops/attention/ulysses/ulysses.hpp"

namespace loom::ulysses {

void o_sequential(const OCall& x) {
    World& world = *x.world;
    OState& st = overlap::op_state<OState>(world, "a2a_o_gemm");
    const int64_t K = x.W * x.width, es = dtype_size(x.dtype);
    const std::size_t half_stride =
        overlap::ensure_parity_halves(world, st.buf, static_cast<std::size_t>(x.R * K * es));
    jit::KernelSpec spec;
    spec.header = kHeader;
    spec.name = "loom::kernels::attention::ulysses_o_a2a";
    const jit::Kernel& a2a = jit::get_kernel(spec);  // before the counters advance

    const uint64_t epoch = ++st.calls;
    auto* const half = static_cast<uint8_t*>(st.buf.p) + (epoch % 2) * half_stride;
    kernels::attention::UlyssesOParams p = o_params(x, st);
    p.gather = half;
    p.epoch = epoch;
    p.wait_all = 1;
    // One block per (chunk, rank) unit, at most the SMs and the comm-kernel cap; the kernel counts its blocks in
    // `started` like the fused one's, so the fused algorithm's targets stay right when calls mix them.
    const int blocks = static_cast<int>(std::clamp<int64_t>(int64_t(x.chunks) * x.W, 1, std::min(x.num_sms, 64)));
    st.started_total += static_cast<uint64_t>(blocks);
    jit::LaunchConfig lc;
    lc.grid = dim3(static_cast<unsigned>(blocks));
    lc.block = dim3(kernels::attention::kUlyssesThreads);
    lc.stream = x.stream;
    a2a(lc, world.ctx(), p);
    gemm(MatrixView{half, x.dtype, x.R, K, 0}, x.w, x.out, GemmOptions{}, x.stream);
}

}  // namespace loom::ulysses
