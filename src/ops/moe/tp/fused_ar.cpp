// moe_ar's Fused algorithm (kernels/moe/tp_moe.cuh), one-shot. Per call e on every rank:
//   stream  fork ── grouped GEMM into the local partial [max_rows, H] with MoeRsHooks (E groups of one source rank:
//           done[0] += 1 per stored tile), on the SMs the reduce kernel leaves ── join
//   side    moe_ar_reduce_push (P blocks, waiting beside the GEMM): once every tile is stored, the top-k reduce of
//   every
//           token (fp32) into slot me of every rank's receive half e % 2, reduced[me] := e there; then out = the W
//           slots summed in rank order.
// Against Sequential (grouped_gemm -> moe_topk_reduce -> all_reduce): no reduced [T, H] round trip through memory and
// no launch gaps between the three steps (the reduce waits on the device while the GEMM runs); it pushes fp32, twice
// the bytes of a bf16 all_reduce.
// Reuse of half e % 2: a peer writes into it again in call e + 2, after its kernel of call e + 1 waited for this
// rank's push of call e + 1, which follows this rank's kernel of call e (the half's reader) on the side stream.
#include "loom/kernels/moe/tp_moe_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/tp/fused_down.hpp"
#include "ops/overlap/common/state.hpp"

namespace loom::moe {

namespace {

// Symmetric: MoeArSignals and buf, the receive buffer's two parity halves (fp32 [W][T][H]). Local: the partial product
// and the counters (done, expected [2], ticket), zeroed once.
struct FusedArState final : overlap::SignalState<kernels::moe::MoeArSignals> {
    static constexpr const char* kKey = "moe/tp/fused_ar";
    explicit FusedArState(World& world) : SignalState(world) {
        LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&counters), 4 * sizeof(uint64_t)));
        LOOM_CHECK_CUDA(cudaMemset(counters, 0, 4 * sizeof(uint64_t)));
    }
    ~FusedArState() override { cudaFree(counters); }
    overlap::SideStream side;
    overlap::LocalBuffer partial;
    uint64_t* counters = nullptr;
    uint64_t calls = 0;         // this algorithm's calls on the World: the epoch of the current call
    uint64_t ticket_total = 0;  // reduce blocks over all calls
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
        world, st.buf, static_cast<std::size_t>(W) * static_cast<std::size_t>(tokens * H) * sizeof(float));
    const FusedDown f = plan_fused_down(c, op, st.partial, tokens, "loom::kernels::moe::moe_ar_reduce_push");

    const uint64_t epoch = ++st.calls;
    st.ticket_total += static_cast<uint64_t>(f.blocks);
    kernels::moe::MoeArReduceParams rp{};
    rp.partial = f.partial;
    rp.out = c.out.data;
    rp.recv = reinterpret_cast<float*>(static_cast<char*>(st.buf.p) + (epoch % 2) * half);
    rp.offsets = c.routing.offsets;
    rp.dest_rows = c.routing.dest_rows;
    rp.weights = c.routing.weights;
    rp.done = st.counters;
    rp.expected = st.counters + 1;
    rp.ticket = st.counters + 3;
    rp.sig = st.sig.p;
    rp.ticket_target = st.ticket_total;
    rp.epoch = epoch;
    rp.h = H;
    rp.tokens = static_cast<int32_t>(tokens);
    rp.topk = s.topk;
    rp.num_experts = s.num_experts;
    rp.rows = static_cast<int32_t>(s.max_rows());
    rp.block_m = f.block_m;
    rp.num_n = f.num_n;

    kernels::moe::MoeRsHookArgs h{};
    h.done = st.counters;  // one source rank: group / E = 0 for every group
    h.num_experts = s.num_experts;
    h.first_group = 0;

    launch_fused_down(c, f, st.side, rp, h);
}

}  // namespace loom::moe
