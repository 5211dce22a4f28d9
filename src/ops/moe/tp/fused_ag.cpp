// ag_moe's Fused algorithm (kernels/moe/tp_moe.cuh), either routing layout. Per call e on every rank, on the stream:
//   all_gather of topk_idx (and weights) ── moe_route over the gathered ids ── moe_ag_push (this rank's routing
//   entries from x into their rows of gather half e % 2 of every rank, its own padding rows zeroed, arrived[me] := e
//   there) ── grouped GEMM over the half with MoeAgHooks (a tile waits for arrived[r] >= e of the source ranks r of
//   its rows; source-major: own groups first).
// Reuse of half e % 2: this rank pushes into rank d's half again in call e + 2, after its GEMM of call e + 1, which
// waited for d's push of call e + 1 (every rank owns T_loc x k > 0 rows, and a tile waits for the source rank of each
// of its rows, so every GEMM waits for every rank), which d enqueued after its GEMM of call e — the last reader of the
// half.
#include <cstring>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/tp_moe_params.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"
#include "ops/moe/tp/tp_moe.hpp"
#include "ops/overlap/common/state.hpp"

namespace loom::moe {

namespace {

constexpr const char* kTpHeader = "loom/kernels/moe/tp_moe.cuh";

// Symmetric: MoeAgSignals and buf, the gather buffer's two parity halves [max_rows, H]. Local: the ids' and
// weights' gather buffers and the push ticket.
struct FusedAgState final : overlap::SignalState<kernels::moe::MoeAgSignals> {
    static constexpr const char* kKey = "moe/tp/fused_ag";
    explicit FusedAgState(World& world) : SignalState(world) {
        LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&ticket), sizeof(uint64_t)));
        LOOM_CHECK_CUDA(cudaMemset(ticket, 0, sizeof(uint64_t)));
    }
    ~FusedAgState() override { cudaFree(ticket); }
    overlap::LocalBuffer ids, weights;
    uint64_t* ticket = nullptr;
    uint64_t calls = 0;         // this algorithm's calls on the World: the epoch of the current call
    uint64_t ticket_total = 0;  // push blocks over all calls
};

}  // namespace

void ag_moe_fused(const AgMoeCall& c) {
    World& world = *c.world;
    const char* op = "ag_moe";
    FusedAgState& st = overlap::op_state<FusedAgState>(world, op, c.captured);
    const auto& dev = overlap::op_state<overlap::DeviceFacts>(world, op, c.captured);
    const MoeRoutingShape& s = c.routing.shape;
    const int W = world.world_size(), me = world.local_rank();
    const std::size_t ids = static_cast<std::size_t>(c.x.rows) * s.topk;

    // Routing metadata: every rank routes every rank's ids (small), so the layout is Sequential's, bit for bit.
    auto* idx = static_cast<int32_t*>(overlap::ensure_local(st.ids, std::max<std::size_t>(ids * W * 4, 4)));
    float* weights = nullptr;
    if (c.topk_weights != nullptr)
        weights = static_cast<float*>(overlap::ensure_local(st.weights, std::max<std::size_t>(ids * W * 4, 4)));
    if (ids > 0) {
        all_gather(world, BufferView{const_cast<int32_t*>(c.topk_idx), DType::I32, ids},
                   BufferView{idx, DType::I32, ids * W}, c.stream);
        if (weights != nullptr)
            all_gather(world, BufferView{const_cast<float*>(c.topk_weights), DType::F32, ids},
                       BufferView{weights, DType::F32, ids * W}, c.stream);
    }
    moe_route(idx, weights, c.routing, c.stream);
    if (s.max_rows() == 0) return;  // no tokens on any rank

    const std::size_t es = dtype_size(c.x.dtype);
    const std::size_t row_bytes = static_cast<std::size_t>(c.x.cols) * es;
    const std::size_t half =
        overlap::ensure_parity_halves(world, st.buf, static_cast<std::size_t>(s.max_rows()) * row_bytes);

    GroupedGemmOptions gopts = c.opts.gemm;
    gopts.max_rows = static_cast<int>(s.max_rows());
    const int num_sms = gopts.num_sms > 0 && gopts.num_sms < dev.device_sms ? gopts.num_sms : dev.device_sms;
    MatrixView out = c.out;
    out.rows = s.max_rows();
    GroupedGemmProblem p{MatrixView{st.buf.p, c.x.dtype, s.max_rows(), c.x.cols},
                         c.w_up,
                         out,
                         s.num_experts,
                         c.routing.offsets,
                         s.num_groups(),
                         gopts};
    grouped_gemm_validate(p, dev.device);
    const GemmConfig cfg = grouped_gemm_config(p, dev.arch, num_sms);
    // Compiled before the counters advance (a JIT error leaves them as they were).
    jit::KernelSpec push_spec;
    push_spec.header = kTpHeader;
    push_spec.name = "loom::kernels::moe::moe_ag_push";
    const jit::Kernel& push = jit::get_kernel(push_spec);
    (void)jit::get_kernel(grouped_gemm_kernel_spec(cfg, c.x.dtype, c.out.dtype, p.b_kn(), gopts.activation,
                                                   "loom::kernels::moe::MoeAgHooks", kTpHeader));

    const uint64_t epoch = ++st.calls;
    char* const gather = static_cast<char*>(st.buf.p) + (epoch % 2) * half;
    const int blocks =
        ag_push_blocks(static_cast<int64_t>(c.x.rows) * s.topk * static_cast<int64_t>(row_bytes) * W, dev.device_sms);
    st.ticket_total += static_cast<uint64_t>(blocks);
    kernels::moe::MoeAgPushParams pp{};
    pp.x = c.x.data;
    pp.gather = gather;
    pp.offsets = c.routing.offsets;
    pp.counts = c.routing.counts;
    pp.dest_rows = c.routing.dest_rows;
    pp.sig = st.sig.p;
    pp.ticket = st.ticket;
    pp.ticket_target = st.ticket_total;
    pp.epoch = epoch;
    pp.row_words = static_cast<int64_t>(row_bytes / 16);
    pp.t_loc = static_cast<int32_t>(c.x.rows);
    pp.topk = s.topk;
    pp.num_groups = s.num_groups();
    pp.rows = static_cast<int32_t>(s.max_rows());
    jit::LaunchConfig lc;
    lc.grid = dim3(static_cast<unsigned>(blocks));
    lc.block = dim3(kernels::moe::kTpMoeThreads);
    lc.stream = c.stream;
    const Ctx ctx = world.ctx();
    push(lc, ctx, pp);

    kernels::moe::MoeAgHookArgs h{};
    h.arrived = st.sig.p->arrived;
    h.offsets = c.routing.offsets;
    h.counts = c.routing.counts;
    h.row_tokens = c.routing.row_tokens;
    h.epoch = epoch;
    h.timeout_ns = ctx.wait_timeout_ns;
    h.me = me;
    h.world = W;
    h.t_loc = static_cast<int32_t>(c.x.rows);
    h.rows = static_cast<int32_t>(s.max_rows());
    h.block_m = cfg.block_m;
    h.first_group = s.ranks == W ? me * s.num_experts : 0;  // source-major: own groups first
    p.a.data = gather;
    grouped_gemm_launch_hooked("loom::kernels::moe::MoeAgHooks", kTpHeader, p, cfg, num_sms, c.stream, h);
}

}  // namespace loom::moe
