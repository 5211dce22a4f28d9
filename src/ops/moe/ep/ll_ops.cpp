// loom::ep_ll_dispatch / ep_ll_combine (+ their *_wait halves): validate, lay out the state's areas for the shape, and
// launch kernels/moe/ep_ll.cuh — both phases in one launch, or the send phase now and the receive phase at *_wait.
#include <string>

#include "loom/kernels/moe/ep_ll_params.hpp"
#include "loom/ops/moe_ep_ll.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/moe/ep/ll_state.hpp"
#include "runtime/call_agreement.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/remote_kernels.hpp"

namespace loom {

namespace kmoe = kernels::moe;

namespace {

using moe::ep_ll::LlState;

int64_t slots_of(const EpLowLatencyShape& s, int world_size) {
    return static_cast<int64_t>(s.num_experts / world_size) * world_size * s.max_tokens;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// What every rank must give alike (checking mode: detail::AgreedCall): the shape and the options the call reads (the
// dispatch's fp8 payload and receive placement; the combine reads neither).
detail::CallSignature ll_signature(const char* op, const EpLowLatencyShape& s, const EpLowLatencyOptions& o,
                                   bool dispatch) {
    detail::CallSignature sig(op);
    sig.add("shape.max_tokens", s.max_tokens).add("shape.hidden", s.hidden).add("shape.topk", s.topk);
    sig.add("shape.num_experts", s.num_experts);
    if (dispatch) {
        sig.add("options.fp8", static_cast<int>(o.fp8));
        sig.add("options.recv_in_heap", static_cast<int>(o.recv_in_heap));
    }
    sig.add("options.return_without_waiting", static_cast<int>(o.return_without_waiting));
    return sig;
}

// A bf16 [rows, H] matrix argument.
void check_rows(const char* op, const char* arg, const MatrixView& m, int64_t hidden) {
    LOOM_CHECK(m.dtype == DType::BF16, "{}: {}: expected bf16, given {}", op, arg, dtype_name(m.dtype));
    LOOM_CHECK(m.cols == hidden, "{}: {}: expected {} columns (shape.hidden), given {}", op, arg, hidden, m.cols);
    LOOM_CHECK(m.rows >= 0, "{}: {}: expected rows >= 0, given {}", op, arg, m.rows);
    LOOM_CHECK(m.stride() >= m.cols && m.stride() % 8 == 0,
               "{}: {}: expected a row stride >= cols and a multiple of 8 elements (16-byte rows), given {}", op, arg,
               m.stride());
    LOOM_CHECK(m.rows == 0 || (m.data != nullptr && aligned16(m.data)),
               "{}: {}: expected 16-byte aligned device memory, given {}", op, arg, m.data);
}

void check_recv(const char* op, const EpLowLatencyRecv& r, bool fp8, bool need_x) {
    if (need_x) {
        LOOM_CHECK(r.x != nullptr && aligned16(r.x), "{}: recv.x: expected 16-byte aligned device memory, given {}", op,
                   r.x);
        LOOM_CHECK(!fp8 || r.scales != nullptr, "{}: recv.scales: expected device memory (options.fp8), given null",
                   op);
    }
    LOOM_CHECK(r.src_info != nullptr, "{}: recv.src_info: expected device memory, given null", op);
    LOOM_CHECK(r.counts != nullptr, "{}: recv.counts: expected device memory, given null", op);
}

kmoe::EpLlParams base_params(const World& world, const EpLowLatencyShape& s, const EpLowLatencyRecv& r) {
    kmoe::EpLlParams p{};
    p.hidden = s.hidden;
    p.topk = s.topk;
    p.num_experts = s.num_experts;
    p.local_experts = s.num_experts / world.world_size();
    p.max_tokens = s.max_tokens;
    p.recv_x = r.x;
    p.recv_scales = r.scales;
    p.recv_src_info = r.src_info;
    p.recv_counts = r.counts;
    return p;
}

// detail::load_kernel: the first load of a kernel with remote peers meets every rank on the host.
void launch(World& world, const LlState& st, const jit::KernelSpec& spec, const kmoe::EpLlParams& p,
            cudaStream_t stream) {
    const jit::Kernel& k = detail::load_kernel(world, spec);
    const Ctx ctx = world.ctx();
    jit::LaunchConfig cfg;
    cfg.grid = dim3(static_cast<unsigned>(st.blocks));
    cfg.block = dim3(kmoe::kEpLlThreads);
    cfg.stream = stream;
    cfg.programmatic = true;  // the kernel waits for the previous one (griddep_wait) before touching memory
    k(cfg, ctx, p);
}

}  // namespace

std::size_t ep_ll_recv_x_bytes(const EpLowLatencyShape& s, int world_size, bool fp8) {
    return static_cast<std::size_t>(slots_of(s, world_size) * kmoe::ep_ll_payload_bytes(s.hidden, fp8));
}
std::size_t ep_ll_recv_scales_bytes(const EpLowLatencyShape& s, int world_size) {
    return static_cast<std::size_t>(slots_of(s, world_size) * (s.hidden / kmoe::kEpLlScaleBlock) * 4);
}
std::size_t ep_ll_recv_src_info_bytes(const EpLowLatencyShape& s, int world_size) {
    return static_cast<std::size_t>(slots_of(s, world_size) * 4);
}
std::size_t ep_ll_recv_counts_bytes(const EpLowLatencyShape& s, int world_size) {
    return static_cast<std::size_t>(s.num_experts / world_size * world_size * 4);
}

void ep_ll_dispatch(World& world, const MatrixView& x, const int32_t* topk_idx, const EpLowLatencyShape& shape,
                    const EpLowLatencyRecv& recv, cudaStream_t stream, const EpLowLatencyOptions& opts) {
    const char* op = "ep_ll_dispatch";
    const detail::NvtxRange nvtx("loom::ep_ll_dispatch T={} H={} k={} E={}", x.rows, shape.hidden, shape.topk,
                                 shape.num_experts);
    const int W = world.world_size();
    auto checks = [&] {
        moe::ep_ll::check_world(op, world);
        moe::ep_ll::check_shape(op, shape, W);
        check_rows(op, "x", x, shape.hidden);
        LOOM_CHECK(
            x.rows <= shape.max_tokens,
            "{}: x: expected at most shape.max_tokens = {} tokens (the receive capacity per source rank), given {}", op,
            shape.max_tokens, x.rows);
        LOOM_CHECK(x.rows == 0 || topk_idx != nullptr, "{}: topk_idx: expected device memory [{}, {}], given null", op,
                   x.rows, shape.topk);
        check_recv(op, recv, opts.fp8, true);
        if (opts.recv_in_heap) {
            LOOM_CHECK(world.num_nodes() == 1,
                       "{}: options.recv_in_heap: expected a World of one node, given {} nodes (peers on other nodes "
                       "receive through the op's buffers)",
                       op, world.num_nodes());
            const struct {
                const char* arg;
                const void* p;
                std::size_t bytes;
            } parts[] = {{"recv.x", recv.x, ep_ll_recv_x_bytes(shape, W, opts.fp8)},
                         {"recv.scales", opts.fp8 ? recv.scales : nullptr, ep_ll_recv_scales_bytes(shape, W)},
                         {"recv.src_info", recv.src_info, ep_ll_recv_src_info_bytes(shape, W)}};
            for (const auto& part : parts)
                LOOM_CHECK(part.p == nullptr || world.is_symmetric(part.p, part.bytes),
                           "{}: {}: options.recv_in_heap expects {} bytes in the World's symmetric heap, given {}", op,
                           part.arg, part.bytes, part.p);
        }
    };
    // Checking mode: the ranks' checks and calls agree before the send (each rank's T is its own).
    const detail::AgreedCall agreed(
        world, [&] { return ll_signature(op, shape, opts, true); }, checks);
    if (!agreed.checked()) checks();
    const bool captured = stream_ops::capturing(stream);
    LlState& st = moe::ep_ll::state(world, op, captured);
    LOOM_CHECK(!st.dispatch_pending,
               "{}: the previous dispatch was made with return_without_waiting and its receive is pending: call "
               "ep_ll_dispatch_wait first",
               op);
    const int64_t L = shape.num_experts / W, msg = kmoe::ep_ll_msg_bytes(shape.hidden, opts.fp8);
    // Several nodes: the staging of the messages to other nodes, [M][k] messages after the halves.
    const std::string layout = "M=" + std::to_string(shape.max_tokens) + " H=" + std::to_string(shape.hidden) +
                               " E=" + std::to_string(shape.num_experts) + (opts.fp8 ? " fp8" : " bf16") +
                               (st.remote ? " k=" + std::to_string(shape.topk) : "");
    moe::ep_ll::ensure_area(world, st.dispatch, layout, kmoe::ep_ll_dispatch_half_bytes(L, W, shape.max_tokens, msg),
                            st.remote ? kmoe::ep_ll_dispatch_staging_bytes(shape.max_tokens, shape.topk, msg) : 0, op,
                            captured);

    kmoe::EpLlParams p = base_params(world, shape, recv);
    p.tokens = static_cast<int32_t>(x.rows);
    p.topk_idx = topk_idx;
    p.x = x.data;
    p.x_ld = x.stride();
    p.area = st.dispatch.p;
    p.half_bytes = st.dispatch.half_bytes;
    p.epochs = st.dispatch_epochs;
    p.counters = st.counters;
    p.phases = opts.return_without_waiting ? kmoe::kEpLlSend : kmoe::kEpLlSend | kmoe::kEpLlRecv;
    p.direct = opts.recv_in_heap ? 1 : 0;
    launch(world, st, moe::ep_ll::dispatch_spec(opts.fp8, st.remote), p, stream);
    if (opts.return_without_waiting) {
        st.dispatch_pending = true;
        st.dispatch_fp8 = opts.fp8;
        st.pending_dispatch = p;
    }
}

void ep_ll_dispatch_wait(World& world, cudaStream_t stream) {
    LlState* st = world.find_state<LlState>();
    LOOM_CHECK(st != nullptr && st->dispatch_pending,
               "ep_ll_dispatch_wait: expected a pending dispatch made with return_without_waiting, found none");
    kmoe::EpLlParams p = st->pending_dispatch;
    p.phases = kmoe::kEpLlRecv;
    launch(world, *st, moe::ep_ll::dispatch_spec(st->dispatch_fp8, st->remote), p, stream);
    st->dispatch_pending = false;
}

void ep_ll_combine(World& world, const MatrixView& expert_out, const int32_t* topk_idx, const float* topk_weights,
                   const EpLowLatencyShape& shape, const EpLowLatencyRecv& recv, const MatrixView& y,
                   cudaStream_t stream, const EpLowLatencyOptions& opts) {
    const char* op = "ep_ll_combine";
    const detail::NvtxRange nvtx("loom::ep_ll_combine T={} H={} k={} E={}", y.rows, shape.hidden, shape.topk,
                                 shape.num_experts);
    const int W = world.world_size();
    auto checks = [&] {
        moe::ep_ll::check_world(op, world);
        moe::ep_ll::check_shape(op, shape, W);
        check_rows(op, "expert_out", expert_out, shape.hidden);
        LOOM_CHECK(expert_out.rows == slots_of(shape, W) && expert_out.stride() == shape.hidden,
                   "{}: expert_out: expected a dense [{}, {}] matrix (local experts x world x max_tokens rows), given "
                   "[{}, {}] with row stride {}",
                   op, slots_of(shape, W), shape.hidden, expert_out.rows, expert_out.cols, expert_out.stride());
        check_rows(op, "y", y, shape.hidden);
        LOOM_CHECK(y.rows <= shape.max_tokens, "{}: y: expected at most shape.max_tokens = {} tokens, given {}", op,
                   shape.max_tokens, y.rows);
        LOOM_CHECK(y.rows == 0 || (topk_idx != nullptr && topk_weights != nullptr),
                   "{}: topk_idx, topk_weights: expected device memory [{}, {}], given {} and {}", op, y.rows,
                   shape.topk, static_cast<const void*>(topk_idx), static_cast<const void*>(topk_weights));
        check_recv(op, recv, false, false);
    };
    const detail::AgreedCall agreed(
        world, [&] { return ll_signature(op, shape, opts, false); }, checks);
    if (!agreed.checked()) checks();
    const bool captured = stream_ops::capturing(stream);
    LlState& st = moe::ep_ll::state(world, op, captured);
    LOOM_CHECK(!st.dispatch_pending,
               "{}: the dispatch's receive is pending (return_without_waiting): call ep_ll_dispatch_wait first", op);
    LOOM_CHECK(!st.combine_pending,
               "{}: the previous combine was made with return_without_waiting and its receive is pending: call "
               "ep_ll_combine_wait first",
               op);
    const std::string layout = "M=" + std::to_string(shape.max_tokens) + " H=" + std::to_string(shape.hidden) +
                               " k=" + std::to_string(shape.topk) + " E=" + std::to_string(shape.num_experts);
    // Several nodes: a staging row per warp of the grid after the halves.
    moe::ep_ll::ensure_area(
        world, st.combine, layout,
        kmoe::ep_ll_combine_half_bytes(shape.max_tokens, shape.topk, shape.hidden, shape.num_experts, W),
        st.remote ? kmoe::ep_ll_combine_staging_bytes(st.blocks, shape.hidden) : 0, op, captured);

    kmoe::EpLlParams p = base_params(world, shape, recv);
    p.tokens = static_cast<int32_t>(y.rows);
    p.topk_idx = topk_idx;
    p.topk_weights = topk_weights;
    p.expert_out = expert_out.data;
    p.y = y.data;
    p.y_ld = y.stride();
    p.area = st.combine.p;
    p.half_bytes = st.combine.half_bytes;
    p.epochs = st.combine_epochs;
    p.arrivals = st.combine_arrivals;
    // Rows in this rank's symmetric heap are read by the token ranks this rank reaches (no copy through the combine
    // area); elsewhere they are pushed. Each rank decides for its own expert_out.
    p.pull =
        world.is_symmetric(expert_out.data, static_cast<std::size_t>(slots_of(shape, W) * shape.hidden * 2)) ? 1 : 0;
    p.phases = opts.return_without_waiting ? kmoe::kEpLlSend : kmoe::kEpLlSend | kmoe::kEpLlRecv;
    launch(world, st, moe::ep_ll::combine_spec(st.remote), p, stream);
    if (opts.return_without_waiting) {
        st.combine_pending = true;
        st.pending_combine = p;
    }
}

void ep_ll_combine_wait(World& world, cudaStream_t stream) {
    LlState* st = world.find_state<LlState>();
    LOOM_CHECK(st != nullptr && st->combine_pending,
               "ep_ll_combine_wait: expected a pending combine made with return_without_waiting, found none");
    kmoe::EpLlParams p = st->pending_combine;
    p.phases = kmoe::kEpLlRecv;
    launch(world, *st, moe::ep_ll::combine_spec(st->remote), p, stream);
    st->combine_pending = false;
}

void release_ep_ll_state(World& world) { world.release_states("moe/ep_ll/"); }

}  // namespace loom
