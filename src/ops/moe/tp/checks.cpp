// The TP-MoE ops' argument checks.
#include "loom/runtime/error.hpp"
#include "ops/moe/routing_internal.hpp"
#include "ops/moe/tp/tp_moe.hpp"
#include "runtime/pointer_check.hpp"

namespace loom::moe {

namespace {

void check_view(const char* op, const char* arg, const MatrixView& m, bool dense = false) {
    LOOM_CHECK(m.rows >= 0 && m.cols >= 1, "{}: {}: expected rows >= 0 and cols >= 1, given [{}, {}]", op, arg, m.rows,
               m.cols);
    LOOM_CHECK(m.stride() >= m.cols, "{}: {}: expected ld >= cols ({}), given {}", op, arg, m.cols, m.ld);
    LOOM_CHECK(!dense || m.stride() == m.cols, "{}: {}: expected dense rows (ld == cols {}), given ld {}", op, arg,
               m.cols, m.ld);
    LOOM_CHECK(m.data != nullptr || m.rows == 0, "{}: {}: expected device memory, given null", op, arg);
}

void check_float(const char* op, const char* arg, DType t) {
    LOOM_CHECK(t == DType::BF16 || t == DType::F16 || t == DType::F32,
               "{}: {}: expected dtype bf16, f16 or f32, given {}", op, arg, dtype_name(t));
}

// An expert weight of E stacked experts: [E x n, k] (NK) or [E x k, n] (KN). Returns the per-expert (n, k).
struct ExpertDims {
    int64_t n = 0, k = 0;
};
ExpertDims expert_dims(const char* op, const char* arg, const MatrixView& w, int num_experts, BLayout layout) {
    check_view(op, arg, w);
    LOOM_CHECK(w.rows % num_experts == 0 && w.rows > 0,
               "{}: {}: expected rows a positive multiple of the routing's num_experts ({}), given {} rows", op, arg,
               num_experts, w.rows);
    const int64_t per = w.rows / num_experts;
    return layout == BLayout::NK ? ExpertDims{per, w.cols} : ExpertDims{w.cols, per};
}

// The memory of the call's buffers, here rather than in the collectives and GEMMs inside the op, which a rank given
// bad memory would reach alone (the checks here are agreed across ranks in checking mode).
void check_matrix_memory(World& world, const char* op, const char* arg, const MatrixView& m) {
    if (m.rows > 0) detail::check_memory(&world, world.device(), op, arg, m);
}
void check_ids_memory(World& world, const char* op, const char* arg, const void* p, int64_t entries) {
    if (p != nullptr && entries > 0)
        detail::check_memory(&world, world.device(), op, arg, p, static_cast<std::size_t>(entries) * 4);
}

// ag_moe's and moe_rs's routing: source-major (ranks = W, group r x E + e) or expert-major (ranks = 1, group e).
void check_layout_ranks(const char* op, const MoeRoutingShape& s, int W) {
    LOOM_CHECK(s.ranks == W || s.ranks == 1,
               "{}: routing ranks: expected the world size {} (source-major groups) or 1 (expert-major groups), "
               "given {}",
               op, W, s.ranks);
}

}  // namespace

void check_ag_moe(const AgMoeCall& c) {
    const char* op = "ag_moe";
    const int W = c.world->world_size();
    check_routing(op, c.routing);
    const MoeRoutingShape& s = c.routing.shape;
    check_view(op, "x", c.x, true);
    check_layout_ranks(op, s, W);
    LOOM_CHECK(s.tokens == W * c.x.rows, "{}: routing tokens: expected world size x x's rows = {} x {}, given {}", op,
               W, c.x.rows, s.tokens);
    LOOM_CHECK(c.topk_idx != nullptr || c.x.rows == 0, "{}: topk_idx: expected device int32 [{}, {}], given null", op,
               c.x.rows, s.topk);
    const ExpertDims d = expert_dims(op, "w_up", c.w_up, s.num_experts, c.opts.gemm.b_layout);
    LOOM_CHECK(d.k == c.x.cols, "{}: w_up: expected K = x's {} columns per expert, given {}", op, c.x.cols, d.k);
    LOOM_CHECK(c.w_up.dtype == c.x.dtype, "{}: w_up: expected x's dtype {}, given {}", op, dtype_name(c.x.dtype),
               dtype_name(c.w_up.dtype));
    const bool swiglu = c.opts.gemm.activation == MoeActivation::SwiGLU;
    LOOM_CHECK(!swiglu || d.n % 2 == 0, "{}: w_up: SwiGLU expects an even N per expert, given {}", op, d.n);
    const int64_t n_out = swiglu ? d.n / 2 : d.n;
    check_view(op, "out", c.out);
    LOOM_CHECK(c.out.cols == n_out, "{}: out: expected {} columns (N per expert{}), given {}", op, n_out,
               swiglu ? " / 2, SwiGLU" : "", c.out.cols);
    LOOM_CHECK(c.out.rows >= s.max_rows(), "{}: out: expected >= {} rows (the routing's max_rows), given {}", op,
               s.max_rows(), c.out.rows);
    LOOM_CHECK(c.opts.gemm.scale_a_blocks == nullptr && c.opts.gemm.scale_b_blocks == nullptr,
               "{}: opts.gemm: expected no per-128-block scales (the GEMM's A is the routed rows of the gathered x, "
               "which scales per x row do not follow), given {}",
               op, c.opts.gemm.scale_a_blocks != nullptr ? "scale_a_blocks" : "scale_b_blocks");
    LOOM_CHECK(c.opts.algo != TpMoeAlgo::Fused || x_in_words(c.x),
               "{}: x: the fused algorithm moves 16-byte words: expected rows of a multiple of 16 bytes from a 16-byte "
               "aligned address, given {} bytes per row at {} (TpMoeAlgo::Sequential takes any)",
               op, c.x.cols * dtype_size(c.x.dtype), c.x.data);
    World& world = *c.world;
    check_matrix_memory(world, op, "x", c.x);
    check_ids_memory(world, op, "topk_idx", c.topk_idx, c.x.rows * s.topk);
    check_ids_memory(world, op, "topk_weights", c.topk_weights, c.x.rows * s.topk);
    check_matrix_memory(world, op, "w_up", c.w_up);
    check_matrix_memory(world, op, "out", c.out);
}

namespace {
void check_down(const char* op, const MoeDownCall& c, int64_t out_rows) {
    check_routing(op, c.routing);
    const MoeRoutingShape& s = c.routing.shape;
    check_view(op, "rows", c.rows);
    check_float(op, "rows", c.rows.dtype);
    LOOM_CHECK(c.rows.rows >= s.max_rows(), "{}: rows: expected >= {} rows (the routing's max_rows), given {}", op,
               s.max_rows(), c.rows.rows);
    const ExpertDims d = expert_dims(op, "w_down", c.w_down, s.num_experts, c.opts.gemm.b_layout);
    LOOM_CHECK(d.k == c.rows.cols, "{}: w_down: expected K = rows' {} columns per expert, given {}", op, c.rows.cols,
               d.k);
    LOOM_CHECK(c.w_down.dtype == c.rows.dtype, "{}: w_down: expected rows' dtype {}, given {}", op,
               dtype_name(c.rows.dtype), dtype_name(c.w_down.dtype));
    LOOM_CHECK(c.opts.gemm.activation == MoeActivation::None, "{}: opts.gemm.activation: expected None, given another",
               op);
    check_view(op, "out", c.out, true);
    check_float(op, "out", c.out.dtype);
    LOOM_CHECK(c.out.rows == out_rows && c.out.cols == d.n, "{}: out: expected [{}, {}], given [{}, {}]", op, out_rows,
               d.n, c.out.rows, c.out.cols);
    check_matrix_memory(*c.world, op, "rows", c.rows);
    check_matrix_memory(*c.world, op, "w_down", c.w_down);
    check_matrix_memory(*c.world, op, "out", c.out);
}
}  // namespace

void check_moe_rs(const MoeDownCall& c) {
    const int W = c.world->world_size();
    check_layout_ranks("moe_rs", c.routing.shape, W);
    // Each rank gets tokens / W rows of the reduced sum: an expert-major routing (ranks 1) says nothing of W.
    LOOM_CHECK(c.routing.shape.tokens % W == 0,
               "moe_rs: routing tokens: expected a multiple of the world size {} (each rank gets tokens / {} rows), "
               "given {}",
               W, W, c.routing.shape.tokens);
    check_down("moe_rs", c, c.routing.shape.tokens / W);
}

void check_moe_ar(const MoeDownCall& c) {
    LOOM_CHECK(c.routing.shape.ranks == 1,
               "moe_ar: routing ranks: expected 1 (every rank routes the whole batch), given {}",
               c.routing.shape.ranks);
    check_down("moe_ar", c, c.routing.shape.tokens);
}

}  // namespace loom::moe
