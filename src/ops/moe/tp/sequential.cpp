// The TP-MoE ops' Sequential algorithm: Loom's collectives around the routing utilities and grouped_gemm, one after
// the other on the stream (no overlap). The baseline the fused algorithms are measured against.
//
//   ag_moe  all_gather x, topk_idx, topk_weights -> moe_route (the routing's groups: E or W x E) -> moe_permute ->
//           grouped_gemm
//   moe_rs  grouped_gemm -> moe_topk_reduce over all W x T_loc tokens -> reduce_scatter to the token owners
//   moe_ar  grouped_gemm -> moe_topk_reduce -> all_reduce
#include <algorithm>

#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/tp/tp_moe.hpp"

namespace loom::moe {

void* SymmetricBuffer::ensure(World& world, std::size_t need, const char* op, bool captured) {
    need = std::max<std::size_t>(need, 256);
    if (need <= bytes) return data;
    LOOM_CHECK(!captured,
               "{}: its buffers must grow to {} bytes, which cannot happen in a CUDA graph capture: make one call "
               "with the same shapes outside the capture first",
               op, need);
    release(world);
    data = world.alloc_bytes(need);
    bytes = need;
    return data;
}

void SymmetricBuffer::release(World& world) {
    if (data != nullptr) world.free(data);
    data = nullptr;
    bytes = 0;
}

namespace {

// The Sequential algorithm's buffers (shared by the three ops: a layer's calls run one after another on a stream).
struct SequentialState final : WorldState {
    static constexpr const char* kKey = "moe/tp/sequential";
    explicit SequentialState(World&) {}
    SymmetricBuffer x, idx, weights, rows, partial, reduced;
    void release(World& world) override {
        for (SymmetricBuffer* b : {&x, &idx, &weights, &rows, &partial, &reduced}) b->release(world);
    }
};

SequentialState& state(World& world, const char* op, bool captured) {
    if (SequentialState* s = world.find_state<SequentialState>()) return *s;
    LOOM_CHECK(!captured,
               "{}: its state is created on the first call, which cannot be captured in a CUDA graph: make one call "
               "outside the capture first",
               op);
    return world.state<SequentialState>();
}

std::size_t bytes_of(const MatrixView& m) {
    return static_cast<std::size_t>(m.rows) * static_cast<std::size_t>(m.cols) * dtype_size(m.dtype);
}

GroupedGemmOptions gemm_options(const TpMoeOptions& o, const MoeRouting& r) {
    GroupedGemmOptions g = o.gemm;
    g.max_rows = static_cast<int>(r.shape.max_rows());
    return g;
}

// grouped_gemm of `rows` with the stacked experts into c, over the routing's groups.
void grouped(const MatrixView& rows, const MatrixView& w, const MoeRouting& r, const MatrixView& c, cudaStream_t stream,
             const TpMoeOptions& o) {
    if (r.shape.max_rows() == 0) return;
    MatrixView a = rows, out = c;  // grouped_gemm takes A and C of the same rows: the layout's max_rows
    a.rows = out.rows = r.shape.max_rows();
    grouped_gemm(a, w, r.shape.num_experts, out, r.offsets, r.shape.num_groups(), stream, gemm_options(o, r));
}

}  // namespace

void ag_moe_sequential(const AgMoeCall& c) {
    World& world = *c.world;
    SequentialState& st = state(world, "ag_moe", c.captured);
    const MoeRoutingShape& s = c.routing.shape;
    const int W = world.world_size();
    const std::size_t x_bytes = bytes_of(c.x), ids = static_cast<std::size_t>(c.x.rows) * s.topk;
    void* xg = st.x.ensure(world, x_bytes * W, "ag_moe", c.captured);
    auto* idx = static_cast<int32_t*>(st.idx.ensure(world, ids * W * 4, "ag_moe", c.captured));
    float* weights = nullptr;
    if (c.topk_weights != nullptr)
        weights = static_cast<float*>(st.weights.ensure(world, ids * W * 4, "ag_moe", c.captured));
    const MatrixView rows{
        st.rows.ensure(world, static_cast<std::size_t>(s.max_rows()) * c.x.cols * dtype_size(c.x.dtype), "ag_moe",
                       c.captured),
        c.x.dtype, s.max_rows(), c.x.cols};
    if (ids > 0) {
        all_gather(world, BufferView{c.x.data, DType::U8, x_bytes}, BufferView{xg, DType::U8, x_bytes * W}, c.stream);
        all_gather(world, BufferView{const_cast<int32_t*>(c.topk_idx), DType::I32, ids},
                   BufferView{idx, DType::I32, ids * W}, c.stream);
        if (weights != nullptr)
            all_gather(world, BufferView{const_cast<float*>(c.topk_weights), DType::F32, ids},
                       BufferView{weights, DType::F32, ids * W}, c.stream);
    }
    moe_route(idx, weights, c.routing, c.stream);
    moe_permute(MatrixView{xg, c.x.dtype, s.tokens, c.x.cols}, c.routing, rows, c.stream);
    grouped(rows, c.w_up, c.routing, c.out, c.stream, c.opts);
}

namespace {

// grouped_gemm into the state's partial rows, then the weighted top-k reduce into the state's reduced [T, H].
MatrixView reduce_routed(const MoeDownCall& c, const char* op, SequentialState& st) {
    World& world = *c.world;
    const MoeRoutingShape& s = c.routing.shape;
    const int64_t H = c.out.cols;
    const std::size_t es = dtype_size(c.out.dtype);
    const MatrixView partial{st.partial.ensure(world, static_cast<std::size_t>(s.max_rows()) * H * es, op, c.captured),
                             c.out.dtype, s.max_rows(), H};
    const MatrixView reduced{st.reduced.ensure(world, static_cast<std::size_t>(s.tokens) * H * es, op, c.captured),
                             c.out.dtype, s.tokens, H};
    grouped(c.rows, c.w_down, c.routing, partial, c.stream, c.opts);
    moe_topk_reduce(partial, c.routing, reduced, c.stream);
    return reduced;
}

}  // namespace

void moe_rs_sequential(const MoeDownCall& c) {
    SequentialState& st = state(*c.world, "moe_rs", c.captured);
    const MatrixView reduced = reduce_routed(c, "moe_rs", st);
    const std::size_t n = static_cast<std::size_t>(c.out.rows * c.out.cols);
    if (n == 0) return;
    reduce_scatter(*c.world, BufferView{reduced.data, c.out.dtype, n * c.world->world_size()},
                   BufferView{c.out.data, c.out.dtype, n}, c.stream);
}

void moe_ar_sequential(const MoeDownCall& c) {
    SequentialState& st = state(*c.world, "moe_ar", c.captured);
    const MatrixView reduced = reduce_routed(c, "moe_ar", st);
    const std::size_t n = static_cast<std::size_t>(c.out.rows * c.out.cols);
    if (n == 0) return;
    all_reduce(*c.world, BufferView{reduced.data, c.out.dtype, n}, BufferView{c.out.data, c.out.dtype, n}, c.stream);
}

}  // namespace loom::moe
