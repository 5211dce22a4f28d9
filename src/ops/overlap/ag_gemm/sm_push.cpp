// ag_gemm's SM producer: ag_gemm_push (kernels/overlap/ag_gemm.cuh), comm_blocks blocks on the state's side stream
// that push this rank's shard into every rank's gather buffer beside the hooked GEMM on the other SMs (ag_gemm.hpp).
#include "loom/jit/jit.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/overlap/ag_gemm/ag_gemm.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"
#include "runtime/stream_watchdog.hpp"

namespace loom::overlap {

void ag_gemm_sm_push(const AgCall& x, kernels::overlap::AgGemmHookArgs h, bool tma) {
    AgGatherState& st = *x.st;
    jit::KernelSpec spec;
    spec.header = kAgHeader;
    spec.name = "loom::kernels::overlap::ag_gemm_push";
    spec.template_args = {tma ? "1" : "0"};
    // Compiled before the counters advance (a JIT error leaves them as they were).
    const jit::Kernel& push_kernel = jit::get_kernel(spec);
    const uint64_t epoch = ++st.calls;
    auto* const sig = st.sig.p;
    fork(st.side, x.stream);
    const int P = x.plan.comm_blocks;
    st.chunk_total += static_cast<uint64_t>(P);
    st.started_total += static_cast<uint64_t>(P);
    kernels::overlap::AgPushParams pp{};
    pp.a_local = x.a.data;
    pp.gather = x.gather;
    pp.sig = sig;
    pp.chunk_bytes = x.chunk_bytes;
    pp.epoch = epoch;
    pp.stages = 4;
    pp.stage_bytes = 16 * 1024;
    jit::LaunchConfig lc;
    lc.grid = dim3(static_cast<unsigned>(P));
    lc.block = dim3(512);
    lc.smem = tma ? 128 + std::size_t(pp.stages) * pp.stage_bytes : 0;  // lang::tma_staging_bytes
    lc.stream = st.side.stream;
    const Ctx ctx = x.world->ctx();
    push_kernel(lc, ctx, pp);
    // The GEMM takes the remaining SMs only once every producer block is resident: it can never starve them.
    detail::WatchedWaits watch(*x.world, "ag_gemm", epoch, x.stream);   // bounded on the host
    watch.wait_value(x.stream, &sig->started, st.started_total, x.me);  // this rank's own producer blocks
    h.chunk = sig->chunk;
    h.target = st.chunk_total;
    launch_gemm(kAgHooks, kAgHeader, x.gview, x.b, x.c, x.plan.gemm, x.num_sms, x.stream, h, x.sc,
                ScaleAt::Accumulators);
    join(st.side, x.stream);
    watch.enqueued();
}

}  // namespace loom::overlap
