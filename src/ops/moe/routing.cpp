// The routing utilities' host side: shape checks, the routing buffer's layout, and the launches of
// kernels/moe/routing.cuh.
#include <algorithm>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/routing_params.hpp"
#include "loom/ops/moe.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/routing_internal.hpp"
#include "runtime/pointer_check.hpp"

namespace loom {

namespace kmoe = kernels::moe;

namespace moe {

void check_routing_shape(const char* op, const MoeRoutingShape& s) {
    LOOM_CHECK(s.tokens >= 0, "{}: routing tokens: expected >= 0, given {}", op, s.tokens);
    LOOM_CHECK(s.num_experts >= 1, "{}: num_experts: expected >= 1, given {}", op, s.num_experts);
    LOOM_CHECK(s.topk >= 1 && s.topk <= kMaxTopk, "{}: topk: expected 1..{}, given {}", op, kMaxTopk, s.topk);
    LOOM_CHECK(s.topk <= s.num_experts, "{}: topk: expected <= num_experts ({}), given {}", op, s.num_experts, s.topk);
    LOOM_CHECK(s.ranks >= 1, "{}: routing ranks: expected >= 1, given {}", op, s.ranks);
    LOOM_CHECK(s.tokens % s.ranks == 0, "{}: routing tokens: expected a multiple of ranks ({}), given {}", op, s.ranks,
               s.tokens);
    LOOM_CHECK(s.align >= 1 && s.align <= 4096, "{}: routing align: expected 1..4096, given {}", op, s.align);
    LOOM_CHECK(static_cast<int64_t>(s.ranks) * s.num_experts <= kmoe::kMaxGroups,
               "{}: groups (ranks x num_experts): expected <= {}, given {} x {}", op, kmoe::kMaxGroups, s.ranks,
               s.num_experts);
    LOOM_CHECK(s.max_rows() < (int64_t{1} << 31),
               "{}: routed rows (tokens x topk + padding): expected < 2^31, given {}", op, s.max_rows());
}

namespace {
void check_matrix(const char* op, const char* arg, const MatrixView& m) {
    LOOM_CHECK(m.rows >= 0 && m.cols >= 1, "{}: {}: expected rows >= 0 and cols >= 1, given [{}, {}]", op, arg, m.rows,
               m.cols);
    LOOM_CHECK(m.stride() >= m.cols, "{}: {}: expected ld >= cols ({}), given {}", op, arg, m.cols, m.ld);
    LOOM_CHECK(m.data != nullptr || m.rows == 0, "{}: {}: expected device memory, given null", op, arg);
}
}  // namespace

void check_permute(const char* op, const MatrixView& x, const MoeRouting& r, const MatrixView& rows) {
    check_matrix(op, "x", x);
    check_matrix(op, "rows", rows);
    LOOM_CHECK(x.rows == r.shape.tokens, "{}: x: expected {} rows (the routing's tokens), given {}", op, r.shape.tokens,
               x.rows);
    LOOM_CHECK(rows.dtype == x.dtype, "{}: rows: expected x's dtype {}, given {}", op, dtype_name(x.dtype),
               dtype_name(rows.dtype));
    LOOM_CHECK(rows.cols == x.cols, "{}: rows: expected x's {} columns, given {}", op, x.cols, rows.cols);
    LOOM_CHECK(rows.rows >= r.shape.max_rows(), "{}: rows: expected >= {} rows (the routing's max_rows), given {}", op,
               r.shape.max_rows(), rows.rows);
    detail::check_disjoint(op, "rows", rows, "x", x);  // every token's row is read for each of its k copies
}

void check_topk_reduce(const char* op, const MatrixView& rows, const MoeRouting& r, const MatrixView& y) {
    check_matrix(op, "rows", rows);
    check_matrix(op, "y", y);
    LOOM_CHECK(y.rows == r.shape.tokens, "{}: y: expected {} rows (the routing's tokens), given {}", op, r.shape.tokens,
               y.rows);
    LOOM_CHECK(rows.cols == y.cols, "{}: rows: expected y's {} columns, given {}", op, y.cols, rows.cols);
    LOOM_CHECK(rows.rows >= r.shape.entries(), "{}: rows: expected >= {} rows (tokens x topk), given {}", op,
               r.shape.entries(), rows.rows);
    detail::check_disjoint(op, "y", y, "rows", rows);  // a token's sum reads k rows from anywhere in rows
}

int route_chunks(const MoeRoutingShape& s) {
    return static_cast<int>(std::max<int64_t>(1, (s.entries() + kmoe::kRouteChunk - 1) / kmoe::kRouteChunk));
}

RoutingLayout routing_layout(const MoeRoutingShape& s) {
    auto up = [](std::size_t b) { return (b + 255) / 256 * 256; };
    const std::size_t G = static_cast<std::size_t>(s.num_groups());
    const std::size_t entries = static_cast<std::size_t>(s.entries());
    RoutingLayout l;
    std::size_t at = 0;
    l.offsets = at, at += up((G + 1) * 4);
    l.counts = at, at += up(G * 4);
    l.dest_rows = at, at += up(std::max<std::size_t>(entries, 1) * 4);
    l.row_tokens = at, at += up(std::max<std::size_t>(static_cast<std::size_t>(s.max_rows()), 1) * 4);
    l.weights = at, at += up(std::max<std::size_t>(entries, 1) * 4);
    l.workspace = at, at += up(static_cast<std::size_t>(route_chunks(s)) * G * 4);
    l.bytes = at;
    return l;
}

void check_routing(const char* op, const MoeRouting& r) {
    check_routing_shape(op, r.shape);
    LOOM_CHECK(r.offsets && r.counts && r.dest_rows && r.row_tokens && r.weights && r.workspace,
               "{}: routing: expected the arrays of moe_routing_view, given a routing with a null array", op);
}

}  // namespace moe

std::size_t moe_routing_bytes(const MoeRoutingShape& shape) {
    moe::check_routing_shape("moe_routing_bytes", shape);
    return moe::routing_layout(shape).bytes;
}

MoeRouting moe_routing_view(const MoeRoutingShape& shape, void* buffer, std::size_t bytes) {
    moe::check_routing_shape("moe_routing_view", shape);
    const moe::RoutingLayout l = moe::routing_layout(shape);
    LOOM_CHECK(buffer != nullptr, "moe_routing_view: buffer: expected device memory, given null");
    LOOM_CHECK(reinterpret_cast<std::uintptr_t>(buffer) % 256 == 0,
               "moe_routing_view: buffer: expected 256-byte alignment, given {}", buffer);
    LOOM_CHECK(bytes >= l.bytes, "moe_routing_view: bytes: expected >= {} (moe_routing_bytes), given {}", l.bytes,
               bytes);
    char* b = static_cast<char*>(buffer);
    MoeRouting r;
    r.shape = shape;
    r.offsets = reinterpret_cast<int32_t*>(b + l.offsets);
    r.counts = reinterpret_cast<int32_t*>(b + l.counts);
    r.dest_rows = reinterpret_cast<int32_t*>(b + l.dest_rows);
    r.row_tokens = reinterpret_cast<int32_t*>(b + l.row_tokens);
    r.weights = reinterpret_cast<float*>(b + l.weights);
    r.workspace = b + l.workspace;
    return r;
}

namespace {

const jit::Kernel& routing_kernel(const char* name, std::vector<std::string> args = {}) {
    jit::KernelSpec spec;
    spec.header = "loom/kernels/moe/routing.cuh";
    spec.name = name;
    spec.template_args = std::move(args);
    return jit::get_kernel(spec);
}

jit::LaunchConfig config(unsigned blocks, unsigned threads, std::size_t smem, cudaStream_t stream) {
    jit::LaunchConfig c;
    c.grid = dim3(blocks);
    c.block = dim3(threads);
    c.smem = smem;
    c.stream = stream;
    return c;
}

// The widest word (16, 4, 2 or 1 bytes) that divides the row bytes, both leading dimensions' bytes and both pointers.
int word_bytes(std::size_t row, std::size_t ld_a, std::size_t ld_b, const void* a, const void* b) {
    const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
    for (int w : {16, 4, 2}) {
        const std::size_t u = static_cast<std::size_t>(w);
        if (row % u == 0 && ld_a % u == 0 && ld_b % u == 0 && pa % u == 0 && pb % u == 0) return w;
    }
    return 1;
}
const char* word_type(int bytes) {
    switch (bytes) {
        case 16:
            return "uint4";
        case 4:
            return "unsigned int";
        case 2:
            return "unsigned short";
        default:
            return "unsigned char";
    }
}

const char* float_type(const char* op, const char* arg, DType t) {
    LOOM_CHECK(t == DType::F32 || t == DType::F16 || t == DType::BF16,
               "{}: {}: expected dtype f32, f16 or bf16, given {}", op, arg, dtype_name(t));
    return dtype_cuda_name(t);
}

}  // namespace

void moe_route(const int32_t* topk_idx, const float* topk_weights, const MoeRouting& routing, cudaStream_t stream) {
    moe::check_routing("moe_route", routing);
    const MoeRoutingShape& s = routing.shape;
    LOOM_CHECK(topk_idx != nullptr || s.entries() == 0,
               "moe_route: topk_idx: expected device int32 [{}, {}], given null", s.tokens, s.topk);
    kmoe::RouteParams p;
    p.topk_idx = topk_idx;
    p.weights_in = topk_weights;
    p.tokens = s.tokens;
    p.topk = s.topk;
    p.num_experts = s.num_experts;
    p.tokens_per_rank = std::max(1, s.tokens / s.ranks);
    p.num_groups = s.num_groups();
    p.align = s.align;
    p.chunks = moe::route_chunks(s);
    p.max_rows = s.max_rows();
    p.chunk_counts = static_cast<int32_t*>(routing.workspace);
    p.counts = routing.counts;
    p.offsets = routing.offsets;
    p.dest_rows = routing.dest_rows;
    p.row_tokens = routing.row_tokens;
    p.weights = routing.weights;
    const auto chunks = static_cast<unsigned>(p.chunks);
    const std::size_t hist_smem = static_cast<std::size_t>(p.num_groups) * 4;
    routing_kernel("loom::kernels::moe::moe_route_count")(config(chunks, kmoe::kRouteChunk, hist_smem, stream), p);
    routing_kernel("loom::kernels::moe::moe_route_scan")(config(1, kmoe::kScanThreads, 0, stream), p);
    routing_kernel("loom::kernels::moe::moe_route_scatter")(config(chunks, kmoe::kRouteChunk, 0, stream), p);
}

void moe_permute(const MatrixView& x, const MoeRouting& routing, const MatrixView& rows, cudaStream_t stream) {
    moe::check_routing("moe_permute", routing);
    moe::check_permute("moe_permute", x, routing, rows);
    const std::size_t es = static_cast<std::size_t>(dtype_size(x.dtype));
    const std::size_t row_bytes = static_cast<std::size_t>(x.cols) * es;
    const int w = word_bytes(row_bytes, static_cast<std::size_t>(x.stride()) * es,
                             static_cast<std::size_t>(rows.stride()) * es, x.data, rows.data);
    kmoe::PermuteParams p;
    p.x = x.data;
    p.rows = rows.data;
    p.x_ld_words = static_cast<int64_t>(static_cast<std::size_t>(x.stride()) * es / w);
    p.rows_ld_words = static_cast<int64_t>(static_cast<std::size_t>(rows.stride()) * es / w);
    p.words = static_cast<int64_t>(row_bytes / w);
    p.row_tokens = routing.row_tokens;
    p.offsets = routing.offsets;
    p.num_groups = routing.shape.num_groups();
    p.tokens = routing.shape.tokens;
    const int64_t warps = std::max<int64_t>(1, routing.shape.max_rows());
    const auto blocks = static_cast<unsigned>(std::min<int64_t>((warps + 7) / 8, 1024));
    routing_kernel("loom::kernels::moe::moe_permute", {word_type(w)})(config(blocks, 256, 0, stream), p);
}

void moe_topk_reduce(const MatrixView& rows, const MoeRouting& routing, const MatrixView& y, cudaStream_t stream) {
    moe::check_routing("moe_topk_reduce", routing);
    moe::check_topk_reduce("moe_topk_reduce", rows, routing, y);
    kmoe::TopkReduceParams p;
    p.rows = rows.data;
    p.y = y.data;
    p.rows_ld = rows.stride();
    p.y_ld = y.stride();
    p.cols = y.cols;
    p.dest_rows = routing.dest_rows;
    p.weights = routing.weights;
    p.tokens = routing.shape.tokens;
    p.topk = routing.shape.topk;
    p.rows_bound = rows.rows;
    if (p.tokens == 0) return;
    const auto blocks = static_cast<unsigned>(std::min(p.tokens, 4096));
    routing_kernel("loom::kernels::moe::moe_topk_reduce",
                   {float_type("moe_topk_reduce", "rows", rows.dtype), float_type("moe_topk_reduce", "y", y.dtype)})(
        config(blocks, 256, 0, stream), p);
}

}  // namespace loom
