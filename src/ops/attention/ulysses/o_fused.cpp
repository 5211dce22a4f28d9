// a2a_o_gemm's fused algorithm (ulysses.hpp): ulysses_o_a2a on comm_blocks SMs of a side stream pushes o's row chunks
// into their owners' gathered operands while the output projection GEMM (UlyssesOGemmHooks) waits per tile for the
// chunks of its rows. The GEMM is launched once every push block is resident (a bounded stream wait), so its spinning
// CTAs can never keep the pushes off the SMs.
#include "loom/jit/jit.hpp"
#include "ops/attention/ulysses/ulysses.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"
#include "runtime/stream_watchdog.hpp"

namespace loom::ulysses {

void o_fused(const OCall& x) {
    World& world = *x.world;
    OState& st = overlap::op_state<OState>(world, "a2a_o_gemm");
    const GemmConfig& cfg = x.plan.gemm;
    const int64_t K = x.W * x.width, es = dtype_size(x.dtype);
    const std::size_t half_stride =
        overlap::ensure_parity_halves(world, st.buf, static_cast<std::size_t>(x.R * K * es));
    jit::KernelSpec spec;
    spec.header = kHeader;
    spec.name = "loom::kernels::attention::ulysses_o_a2a";
    // Both kernels compiled before the counters advance (a JIT error leaves them as they were).
    const jit::Kernel& a2a = jit::get_kernel(spec);
    overlap::prepare_gemm(kOGemmHooks, kOGemmHeader, MatrixView{st.buf.p, x.dtype, x.R, K, 0}, x.out, cfg,
                          overlap::OpScale{}, overlap::ScaleAt::Epilogue);

    const uint64_t epoch = ++st.calls;
    auto* const half = static_cast<uint8_t*>(st.buf.p) + (epoch % 2) * half_stride;
    kernels::attention::UlyssesOParams p = o_params(x, st);
    p.gather = half;
    p.epoch = epoch;
    p.wait_all = 0;
    const int P = x.plan.comm_blocks;
    st.started_total += static_cast<uint64_t>(P);

    overlap::fork(st.side, x.stream);
    overlap::launch_on_side(a2a, st.side, static_cast<unsigned>(P), kernels::attention::kUlyssesThreads, world.ctx(),
                            p);
    detail::WatchedWaits watch(world, "a2a_o_gemm", epoch, x.stream);  // bounded on the host
    watch.wait_value(x.stream, &st.sig->started, st.started_total, x.me);
    kernels::attention::UlyssesOHookArgs h{};
    h.arrived = &st.sig->arrived[0][0];
    h.epoch = epoch;
    h.timeout_ns = world.ctx().wait_timeout_ns;
    h.chunk_rows = static_cast<int32_t>(kChunkRows);
    h.world = x.W;
    overlap::launch_gemm(kOGemmHooks, kOGemmHeader, MatrixView{half, x.dtype, x.R, K, 0}, x.w, x.out, cfg, x.num_sms,
                         x.stream, h, overlap::OpScale{}, overlap::ScaleAt::Epilogue);
    overlap::join(st.side, x.stream);
    watch.enqueued();
}

}  // namespace loom::ulysses
