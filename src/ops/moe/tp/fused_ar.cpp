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
#include <algorithm>

#include "loom/jit/jit.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/kernels/moe/tp_moe_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"
#include "ops/moe/tp/tp_moe.hpp"
#include "ops/overlap/common/state.hpp"

namespace loom::moe {

namespace {

constexpr const char* kTpHeader = "loom/kernels/moe/tp_moe.cuh";

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
    const auto& dev = overlap::op_state<overlap::DeviceFacts>(world, op, c.captured);
    const MoeRoutingShape& s = c.routing.shape;
    const int W = world.world_size();
    const int64_t tokens = c.out.rows, H = c.out.cols;
    if (tokens == 0 || s.max_rows() == 0) return;  // no tokens (the same batch on every rank)

    const std::size_t es = dtype_size(c.out.dtype);
    const std::size_t half = overlap::ensure_parity_halves(
        world, st.buf, static_cast<std::size_t>(W) * static_cast<std::size_t>(tokens * H) * sizeof(float));
    void* const partial = overlap::ensure_local(st.partial, static_cast<std::size_t>(s.max_rows()) * H * es);

    GroupedGemmOptions gopts = c.opts.gemm;
    gopts.max_rows = static_cast<int>(s.max_rows());
    const int usable = gopts.num_sms > 0 && gopts.num_sms < dev.device_sms ? gopts.num_sms : dev.device_sms;
    const int blocks = rs_reduce_blocks(tokens, usable);
    const int gemm_sms = std::max(1, usable - blocks);
    MatrixView a = c.rows;
    a.rows = s.max_rows();
    GroupedGemmProblem p{a,
                         c.w_down,
                         MatrixView{partial, c.out.dtype, s.max_rows(), H},
                         s.num_experts,
                         c.routing.offsets,
                         s.num_groups(),
                         gopts};
    grouped_gemm_validate(p, dev.device);
    const GemmConfig cfg = grouped_gemm_config(p, dev.arch, gemm_sms);
    const int block_m = cfg.sm80 ? kernels::kSm80BlockM : cfg.block_m;
    const int block_n = cfg.sm80 ? kernels::kSm80BlockN : cfg.block_n;
    // Compiled before the counters advance (a JIT error leaves them as they were).
    jit::KernelSpec rspec;
    rspec.header = kTpHeader;
    rspec.name = "loom::kernels::moe::moe_ar_reduce_push";
    rspec.template_args = {dtype_cuda_name(c.out.dtype)};
    const jit::Kernel& reduce = jit::get_kernel(rspec);
    (void)jit::get_kernel(grouped_gemm_kernel_spec(cfg, c.rows.dtype, c.out.dtype, p.b_kn(), gopts.activation,
                                                   "loom::kernels::moe::MoeRsHooks", kTpHeader, p.block_scaled()));

    const uint64_t epoch = ++st.calls;
    st.ticket_total += static_cast<uint64_t>(blocks);
    kernels::moe::MoeArReduceParams rp{};
    rp.partial = partial;
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
    rp.block_m = block_m;
    rp.num_n = static_cast<int32_t>((H + block_n - 1) / block_n);

    kernels::moe::MoeRsHookArgs h{};
    h.done = st.counters;  // one source rank: group / E = 0 for every group
    h.num_experts = s.num_experts;
    h.first_group = 0;

    overlap::fork(st.side, c.stream);
    jit::LaunchConfig lc;
    lc.grid = dim3(static_cast<unsigned>(blocks));
    lc.block = dim3(kernels::moe::kTpMoeThreads);
    lc.stream = st.side.stream;
    reduce(lc, world.ctx(), rp);
    grouped_gemm_launch_hooked("loom::kernels::moe::MoeRsHooks", kTpHeader, p, cfg, gemm_sms, c.stream, h);
    overlap::join(st.side, c.stream);
}

}  // namespace loom::moe
