// loom::ep_moe_experts: dispatch -> the local experts' grouped GEMMs -> combine. Sequential: the public ops one after
// the other. Overlapped (kernels/moe/ep_experts.cuh): the per-expert dispatch push, the first grouped GEMM with
// EpExpertHooks (each tile waits for its expert's rows), the second GEMM, the wait for the pair records, the combine.
// The first GEMM's problem and config are Sequential's (same operands, max_rows = capacity), so the bits agree.
#include <algorithm>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/ep_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/moe/ep/ep.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/pointer_check.hpp"

namespace loom {

namespace {

constexpr const char* kOp = "ep_moe_experts";
constexpr const char* kHeader = "loom/kernels/moe/ep_experts.cuh";

// Product width of a stacked weight of `experts` experts (NK: [E x N, K]; KN: [E x K, N]) and its output width.
int64_t out_width(const MatrixView& w, const GroupedGemmOptions& o, int experts) {
    const int64_t n = o.b_layout == BLayout::KN ? w.cols : w.rows / std::max(experts, 1);
    return o.activation == MoeActivation::SwiGLU ? n / 2 : n;
}

// Reduction width (K) of such a weight.
int64_t in_width(const MatrixView& w, const GroupedGemmOptions& o, int experts) {
    return o.b_layout == BLayout::KN ? w.rows / std::max(experts, 1) : w.cols;
}

// A weight matrix's layout as the grouped GEMM takes it (16-byte rows), checked before the dispatch communicates: a
// rank's misaligned weights raise there, not after its peers have started waiting for it. (Its memory: check_memory,
// after every layout check.)
void check_weights(const char* arg, const MatrixView& w) {
    LOOM_CHECK(w.rows > 0 && w.cols > 0 && w.stride() >= w.cols,
               "{}: {}: expected a non-empty matrix with ld >= cols, "
               "given [{}, {}] with ld {}",
               kOp, arg, w.rows, w.cols, w.stride());
    LOOM_CHECK(reinterpret_cast<std::uintptr_t>(w.data) % 16 == 0 && (w.stride() * dtype_size(w.dtype)) % 16 == 0,
               "{}: {}: expected 16-byte aligned rows (address and row stride), given address {} and ld {}", kOp, arg,
               w.data, w.stride());
}

void check_experts(World& world, const MatrixView& x, int num_experts, const MatrixView& w_up, const MatrixView& w_down,
                   const MatrixView& y, const EpMoeOptions& opts) {
    const int W = world.world_size();
    LOOM_CHECK(num_experts >= W && num_experts % W == 0,
               "{}: num_experts: expected a positive multiple of the world size {}, given {}", kOp, W, num_experts);
    const int L = num_experts / W;
    LOOM_CHECK(opts.algo == EpMoeAlgo::Auto || opts.algo == EpMoeAlgo::Sequential || opts.algo == EpMoeAlgo::Overlapped,
               "{}: opts.algo: expected Auto, Sequential or Overlapped, given {}", kOp, static_cast<int>(opts.algo));
    moe::ep::check_rows(kOp, "y", y);
    LOOM_CHECK(y.rows == x.rows && y.cols == x.cols, "{}: y: expected [{}, {}] (x's shape), given [{}, {}]", kOp,
               x.rows, x.cols, y.rows, y.cols);
    LOOM_CHECK(w_up.dtype == DType::BF16 && w_up.data != nullptr,
               "{}: w_up: expected bf16 device memory (the {} local experts stacked), given {} at {}", kOp, L,
               dtype_name(w_up.dtype), w_up.data);
    check_weights("w_up", w_up);
    const int64_t n1 = out_width(w_up, opts.up, L);
    LOOM_CHECK(in_width(w_up, opts.up, L) == x.cols,
               "{}: w_up: expected the {} local experts' weights over K = H = {} ({}), given [{}, {}]", kOp, L, x.cols,
               opts.up.b_layout == BLayout::KN ? "[L x H, N]" : "[L x N, H]", w_up.rows, w_up.cols);
    if (w_down.data == nullptr) {
        LOOM_CHECK(n1 == x.cols,
                   "{}: w_up: without w_down the experts' output width must be H = {}, given w_up [{}, {}] giving {}",
                   kOp, x.cols, w_up.rows, w_up.cols, n1);
        return;
    }
    LOOM_CHECK(w_down.dtype == DType::BF16, "{}: w_down: expected bf16, given {}", kOp, dtype_name(w_down.dtype));
    check_weights("w_down", w_down);
    LOOM_CHECK(n1 % 8 == 0, "{}: w_up: expected an output width (w_down's K) that is a multiple of 8, given {}", kOp,
               n1);
    LOOM_CHECK(in_width(w_down, opts.down, L) == n1,
               "{}: w_down: expected the {} local experts' weights over K = {} (w_up's output width), given [{}, {}]",
               kOp, L, n1, w_down.rows, w_down.cols);
    const int64_t n2 = out_width(w_down, opts.down, L);
    LOOM_CHECK(n2 == x.cols, "{}: w_down: expected an output width of H = {}, given w_down [{}, {}] giving {}", kOp,
               x.cols, w_down.rows, w_down.cols, n2);
}

// The weights' memory (this GPU's, or the World's heap, of the views' size), checked before the dispatch like their
// layout, and after every other check so that a view over a short buffer is named by its shape first.
void check_weights_memory(World& world, const MatrixView& w_up, const MatrixView& w_down) {
    auto check = [&](const char* arg, const MatrixView& w) {
        if (w.data != nullptr) detail::check_memory(&world, world.device(), kOp, arg, w);
    };
    check("w_up", w_up);
    check("w_down", w_down);
}

GroupedGemmOptions planned(const GroupedGemmOptions& o, int64_t capacity) {
    GroupedGemmOptions g = o;
    g.max_rows = static_cast<int>(capacity);
    return g;
}

}  // namespace

const char* to_string(EpMoeAlgo a) {
    switch (a) {
        case EpMoeAlgo::Auto:
            return "auto";
        case EpMoeAlgo::Sequential:
            return "sequential";
        case EpMoeAlgo::Overlapped:
            return "overlapped";
    }
    return "?";
}

EpHandle ep_moe_experts(World& world, const MatrixView& x, const int32_t* topk_idx, const float* topk_weights, int topk,
                        int num_experts, const MatrixView& w_up, const MatrixView& w_down, const MatrixView& y,
                        cudaStream_t stream, const EpMoeOptions& opts) {
    const detail::NvtxRange nvtx("loom::ep_moe_experts T={} H={} k={} E={}", x.rows, x.cols, topk, num_experts);
    // Checking mode: the ranks' checks (the dispatch's with them) and calls agree before the dispatch communicates.
    const detail::AgreedCall agreed(
        world,
        [&] {
            detail::CallSignature s = moe::ep::dispatch_signature(kOp, x, topk, num_experts, opts.ep);
            s.add("w_up.rows", w_up.rows).add("w_up.cols", w_up.cols);
            s.add("w_down.rows", w_down.rows).add("w_down.cols", w_down.cols);
            s.add("EpMoeOptions::algo", to_string(opts.algo));
            s.add("up.activation", static_cast<int>(opts.up.activation));
            s.add("up.b_layout", static_cast<int>(opts.up.b_layout));
            s.add("down.b_layout", static_cast<int>(opts.down.b_layout));
            return s;
        },
        [&] {
            check_experts(world, x, num_experts, w_up, w_down, y, opts);
            moe::ep::check_dispatch(world, x, topk_idx, topk, num_experts, opts.ep);
            check_weights_memory(world, w_up, w_down);
        });
    if (!agreed.checked()) {
        check_experts(world, x, num_experts, w_up, w_down, y, opts);
        check_weights_memory(world, w_up, w_down);
    }
    const bool captured = moe::ep::capturing(stream);
    const int W = world.world_size();
    const int L = num_experts / W;
    // Overlapped is not offered inside a CUDA graph capture: its replay is untested.
    LOOM_CHECK(!(captured && opts.algo == EpMoeAlgo::Overlapped),
               "{}: opts.algo: Overlapped is not supported inside a CUDA graph capture; use Sequential or Auto", kOp);
    LOOM_CHECK(!(moe::ep::multi_node(world) && opts.algo == EpMoeAlgo::Overlapped),
               "{}: opts.algo: Overlapped runs on one node (its per-expert push stores into the peers' memory), given "
               "a World of {} ranks over {} nodes; use Sequential or Auto",
               kOp, W, W / world.local_world_size());
    // Auto is Sequential: Overlapped measured no faster with ranks sharing a GPU (docs/moe.md).
    const bool overlapped = opts.algo == EpMoeAlgo::Overlapped;

    const EpHandle h =
        moe::ep::dispatch(world, x, topk_idx, topk_weights, topk, num_experts, stream, opts.ep, overlapped);
    moe::ep::State& st = *world.find_state<moe::ep::State>();
    const int64_t cap = h.capacity, H = x.cols;
    const bool two = w_down.data != nullptr;
    const int64_t n1 = out_width(w_up, opts.up, L);
    const std::size_t out_bytes = static_cast<std::size_t>(cap * H * 2);
    const std::size_t mid_bytes = two ? static_cast<std::size_t>(cap * n1 * 2) : 0;
    LOOM_CHECK(!captured || (out_bytes <= st.expert_out.bytes && mid_bytes <= st.expert_mid.bytes),
               "{}: a CUDA graph capture needs the experts' rows allocated: call once outside the capture with the "
               "same capacity first",
               kOp);
    const MatrixView out{overlap::ensure_local(st.expert_out, out_bytes), DType::BF16, cap, H, 0};
    const MatrixView mid =
        two ? MatrixView{overlap::ensure_local(st.expert_mid, mid_bytes), DType::BF16, cap, n1, 0} : out;

    const GroupedGemmOptions up = planned(opts.up, cap);
    if (overlapped) {
        const moe::GroupedGemmProblem p{h.recv_x, w_up, mid, L, h.recv_offsets, L, up};
        const detail::GemmDevice dev = detail::gemm_device();
        moe::grouped_gemm_validate(p, dev.device);
        // grouped_gemm's SM count and config: the same kernel but for the hooks.
        const int num_sms = up.num_sms > 0 && up.num_sms < dev.num_sms ? up.num_sms : dev.num_sms;
        const GemmConfig cfg = moe::grouped_gemm_config(p, dev.arch, num_sms);
        kernels::moe::EpExpertHookArgs a{};
        a.expert_ready = st.sig->expert_ready;
        a.target = static_cast<uint64_t>(W);  // every source's 1 for this call (the counters start at 0)
        a.timeout_ns = world.ctx().wait_timeout_ns;
        moe::grouped_gemm_launch_hooked("loom::kernels::moe::EpExpertHooks", kHeader, p, cfg, num_sms, stream, a);
    } else {
        grouped_gemm(h.recv_x, w_up, L, mid, h.recv_offsets, L, stream, up);
    }
    if (two) grouped_gemm(mid, w_down, L, out, h.recv_offsets, L, stream, planned(opts.down, cap));
    if (overlapped) moe::ep::launch_arrived_wait(world, stream);
    ep_combine(world, h, out, y, stream, opts.ep);
    return h;
}

}  // namespace loom
