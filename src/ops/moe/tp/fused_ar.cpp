// moe_ar's Fused algorithm (kernels/moe/tp_moe.cuh), one-shot. Per call e on every rank, on the stream:
//   grouped GEMM into the local partial [max_rows, H] on every usable SM ── moe_ar_reduce_push (full grid): blocks
//   claim items from a counter: chunks of the tokens (the top-k reduce, rounded to out's type, pushed into slot me of
//   every rank's receive half e % 2; the chunk that completes the call adds 1 to landed[e % 2] at every rank) ──
//   stream wait for landed[e % 2] to count every rank ── moe_tp_sum_slots: out = the W slots summed in rank order.
// Every token's sum needs the whole GEMM (its k rows lie in any groups), so nothing of the reduce can start beside it.
// Against Sequential (grouped_gemm -> moe_topk_reduce -> all_reduce): no reduced [T, H] round trip through memory, one
// pair of kernels for the reduce and the all_reduce; the same bytes as a one-shot all_reduce of out's type.
// Reuse of half e % 2: a peer writes into it again in call e + 2, after its stream of call e + 1 waited for this
// rank's push of call e + 1, which follows this rank's sum kernel of call e (the half's reader) on the stream.
#include "loom/kernels/moe/tp_moe_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/tp/fused_down.hpp"
#include "ops/overlap/common/state.hpp"

namespace loom::moe {

namespace {

// Symmetric: MoeDownSignals and buf, the receive buffer's two parity halves ([W][T][H] of out's type). Local: the
// partial product and the counters (ticket, work), zeroed once.
struct FusedArState final : overlap::SignalState<kernels::moe::MoeDownSignals> {
    static constexpr const char* kKey = "moe/tp/fused_ar";
    explicit FusedArState(World& world) : SignalState(world) {
        LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&counters), 2 * sizeof(uint64_t)));
        LOOM_CHECK_CUDA(cudaMemset(counters, 0, 2 * sizeof(uint64_t)));
    }
    ~FusedArState() override { cudaFree(counters); }
    overlap::LocalBuffer partial;
    uint64_t* counters = nullptr;
    uint64_t calls = 0;         // this algorithm's calls on the World: the epoch of the current call
    uint64_t ticket_total = 0;  // chunks over all calls
    uint64_t work_total = 0;    // claims on the work counter over all calls
};

}  // namespace

void moe_ar_fused(const MoeDownCall& c) {
    World& world = *c.world;
    const char* op = "moe_ar";
    FusedArState& st = overlap::op_state<FusedArState>(world, op, c.captured);
    const MoeRoutingShape& s = c.routing.shape;
    const int W = world.world_size();
    const int64_t tokens = c.out.rows, H = c.out.cols;
    if (tokens == 0 || s.max_rows() == 0) return;  // no tokens (the same batch on every rank)

    const std::size_t half = overlap::ensure_parity_halves(
        world, st.buf, static_cast<std::size_t>(W) * static_cast<std::size_t>(tokens * H) * dtype_size(c.out.dtype));
    const FusedDown f =
        plan_fused_down(c, op, st.partial, tokens, 1, "loom::kernels::moe::moe_ar_reduce_push", /*side=*/false);

    const uint64_t epoch = ++st.calls;
    st.ticket_total += static_cast<uint64_t>(f.chunks);
    kernels::moe::MoeArReduceParams rp{};
    rp.partial = f.partial;
    rp.recv = static_cast<char*>(st.buf.p) + (epoch % 2) * half;
    rp.dest_rows = c.routing.dest_rows;
    rp.weights = c.routing.weights;
    rp.ticket = st.counters;
    rp.work = st.counters + 1;
    rp.sig = st.sig.p;
    rp.ticket_target = st.ticket_total;
    rp.work_base = st.work_total;
    rp.epoch = epoch;
    rp.row_words = f.row_words;
    rp.tokens = static_cast<int32_t>(tokens);
    rp.topk = s.topk;
    rp.rows = static_cast<int32_t>(s.max_rows());
    rp.chunk = f.chunk;
    rp.chunks = static_cast<int32_t>(f.chunks);
    st.work_total += static_cast<uint64_t>(f.claims);

    launch_fused_down(op, c, f, nullptr, rp, rp, kernels::moe::MoeRsHookArgs{}, st.sig.p->landed, epoch, rp.recv);
}

}  // namespace loom::moe
