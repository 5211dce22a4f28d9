// moe_rs's Fused algorithm (kernels/moe/tp_moe.cuh). Per call e on every rank:
//   stream  fork ── grouped GEMM into the local partial [max_rows, H] with MoeRsHooks (peers' groups first, own last;
//           done[source rank] += 1 per stored tile), on the SMs the side blocks leave ── moe_rs_reduce_send (full
//           grid) ── join ── stream wait for landed[e % 2] to count every rank ── moe_tp_sum_slots
//   side    moe_rs_reduce_send (a few blocks, sized by the work that becomes ready during the GEMM)
// Both reduce launches claim items from one counter: per source rank in the GEMM's order, chunks of its tokens (once
// its tiles are stored: the top-k reduce, rounded to out's type, into slot me of its receive half e % 2; the chunk that
// completes the rank adds 1 to landed[e % 2] there). The sum kernel adds this rank's tokens' W slots into out.
// An expert-major routing (ranks 1) runs no side blocks: they wait for a source rank's tiles, and its tiles mix the
// source ranks; the reduce after the GEMM reads any layout through dest_rows.
// Reuse of half e % 2: a peer q writes into this rank's half again in call e + 2, after its stream of call e + 1
// waited for this rank's sends of call e + 1, which follow this rank's sum kernel of call e (the half's reader) in
// stream order.
#include "loom/kernels/moe/tp_moe_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/tp/fused_down.hpp"
#include "ops/overlap/common/state.hpp"

namespace loom::moe {

namespace {

constexpr int kPeers = kMaxLocalPeers;
constexpr int kCounters = 4 * kPeers + 1;

// Symmetric: MoeDownSignals and buf, the receive buffer's two parity halves ([W][T_loc][H] of out's type). Local: the
// partial product, and the counters (done [kPeers], expected [2][kPeers], ticket [kPeers], work), zeroed once.
struct FusedRsState final : overlap::SignalState<kernels::moe::MoeDownSignals> {
    static constexpr const char* kKey = "moe/tp/fused_rs";
    explicit FusedRsState(World& world) : SignalState(world) {
        LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&counters), kCounters * sizeof(uint64_t)));
        LOOM_CHECK_CUDA(cudaMemset(counters, 0, kCounters * sizeof(uint64_t)));
    }
    ~FusedRsState() override { cudaFree(counters); }
    overlap::SideStream side;
    overlap::LocalBuffer partial;
    uint64_t* counters = nullptr;
    uint64_t calls = 0;         // this algorithm's calls on the World: the epoch of the current call
    uint64_t ticket_total = 0;  // chunks per source rank over all calls
    uint64_t work_total = 0;    // claims on the work counter over all calls
};

}  // namespace

void moe_rs_fused(const MoeDownCall& c) {
    World& world = *c.world;
    const char* op = "moe_rs";
    const MoeRoutingShape& s = c.routing.shape;
    const int W = world.world_size(), me = world.local_rank();
    const bool source_major = s.ranks == W;
    LOOM_CHECK(source_major || c.opts.comm_sms <= 0,
               "moe_rs: opts.comm_sms: reduce blocks beside the GEMM wait for a source rank's tiles, which need a "
               "routing of per-source-rank groups (ranks = the world size {}); this one has ranks = {}: expected "
               "comm_sms <= 0, given {}",
               W, s.ranks, c.opts.comm_sms);
    FusedRsState& st = overlap::op_state<FusedRsState>(world, op, c.captured);
    const int64_t t_loc = c.out.rows, H = c.out.cols;
    if (t_loc == 0 || s.max_rows() == 0) return;  // every rank has no tokens (T_loc is the same everywhere)

    const std::size_t half = overlap::ensure_parity_halves(
        world, st.buf, static_cast<std::size_t>(W) * static_cast<std::size_t>(t_loc * H) * dtype_size(c.out.dtype));
    const FusedDown f =
        plan_fused_down(c, op, st.partial, t_loc, W, "loom::kernels::moe::moe_rs_reduce_send", source_major);

    const uint64_t epoch = ++st.calls;
    st.ticket_total += static_cast<uint64_t>(f.chunks);
    uint64_t* const done = st.counters;
    kernels::moe::MoeRsReduceParams rp{};
    rp.partial = f.partial;
    rp.recv = static_cast<char*>(st.buf.p) + (epoch % 2) * half;
    rp.offsets = c.routing.offsets;
    rp.dest_rows = c.routing.dest_rows;
    rp.weights = c.routing.weights;
    rp.done = done;
    rp.expected = st.counters + kPeers;
    rp.ticket = st.counters + 3 * kPeers;
    rp.work = st.counters + 4 * kPeers;
    rp.sig = st.sig.p;
    rp.ticket_target = st.ticket_total;
    rp.work_base = st.work_total;
    rp.epoch = epoch;
    rp.row_words = f.row_words;
    rp.t_loc = static_cast<int32_t>(t_loc);
    rp.topk = s.topk;
    rp.num_experts = s.num_experts;
    rp.rows = static_cast<int32_t>(s.max_rows());
    rp.block_m = f.block_m;
    rp.num_n = f.num_n;
    rp.chunk = f.chunk;
    rp.chunks = static_cast<int32_t>(f.chunks);
    st.work_total += static_cast<uint64_t>(f.claims);
    rp.write_expected = f.side_blocks > 0 ? 1 : 0;
    rp.counted = f.hooked() ? 1 : 0;
    kernels::moe::MoeRsReduceParams tail = rp;
    tail.after_gemm = 1;
    tail.write_expected = 1 - rp.write_expected;

    kernels::moe::MoeRsHookArgs h{};
    h.done = done;
    h.num_experts = s.num_experts;
    h.first_group = W > 1 ? ((me + 1) % W) * s.num_experts : 0;

    launch_fused_down(op, c, f, &st.side, rp, tail, h, st.sig.p->landed, epoch, rp.recv);
}

}  // namespace loom::moe
