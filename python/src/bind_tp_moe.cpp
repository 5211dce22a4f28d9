// loom._C: the MoE routing utilities and the TP-MoE ops on DLPack tensors (docs/moe.md). A routing crosses over as
// its buffer (a uint8 CUDA tensor of moe_routing_bytes bytes, allocated by the Python layer) and its shape, a tuple
// (tokens, topk, num_experts, ranks, align); moe_routing_view carves the arrays from it again in every call. Each
// binding converts its tensors (convert.hpp: ValueError on a wrong device, dtype, layout or shape), releases the GIL
// and calls the C++ op on the given stream; the op's own validation raises loom::Error.
#include <fmt/format.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "bindings.hpp"
#include "convert.hpp"
#include "loom/ops/moe.hpp"
#include "world_handle.hpp"

namespace loom::py {

namespace nb = nanobind;
using nb::arg;
using OptArray = std::optional<AnyArray>;
using ShapeTuple = std::tuple<int, int, int, int, int>;  // tokens, topk, num_experts, ranks, align

namespace {

MoeRoutingShape routing_shape(const ShapeTuple& t) {
    MoeRoutingShape s;
    std::tie(s.tokens, s.topk, s.num_experts, s.ranks, s.align) = t;
    return s;
}

// The routing in `buffer` (uint8, contiguous, at least moe_routing_bytes(shape) bytes: moe_routing_view checks).
MoeRouting routing_of(const AnyArray& buffer, const ShapeTuple& shape, const char* op) {
    const BufferView b = as_buffer(buffer, op, "routing buffer", DType::U8);
    return moe_routing_view(routing_shape(shape), b.data, b.count);
}

// topk_idx int32 [rows, k] and topk_weights (None, or fp32 of the same shape), rows = the routing's tokens / `split`.
struct TopK {
    const int32_t* idx = nullptr;
    const float* weights = nullptr;
};

TopK topk_args(const AnyArray& idx, const OptArray& weights, const MoeRoutingShape& s, int split, const char* op) {
    const int64_t rows = s.tokens / split;
    TopK k;
    k.idx = static_cast<const int32_t*>(as_routing(idx, rows, s.topk, DType::I32, op, "topk_idx"));
    if (weights)
        k.weights = static_cast<const float*>(as_routing(*weights, rows, s.topk, DType::F32, op, "topk_weights"));
    return k;
}

TpMoeOptions tp_options(const char* op, TpMoeAlgo algo, bool b_kn, int activation, float alpha, const OptArray& scale_a,
                        const OptArray& scale_b) {
    TpMoeOptions o;
    o.algo = algo;
    o.gemm.b_layout = b_kn ? BLayout::KN : BLayout::NK;
    o.gemm.activation = static_cast<MoeActivation>(activation);
    o.gemm.alpha = alpha;
    o.gemm.scale_a = as_scale(scale_a, op, "scale_a");
    o.gemm.scale_b = scale_b ? static_cast<const float*>(as_buffer(*scale_b, op, "scale_b", DType::F32).data) : nullptr;
    return o;
}

void bind_routing(nb::module_& m) {
    m.def(
        "moe_routing_layout",
        [](const ShapeTuple& shape) {
            // moe_routing_view only carves pointers from the buffer: the arrays' byte offsets are those of a buffer
            // at a nominal 256-byte-aligned address.
            const MoeRoutingShape s = routing_shape(shape);
            const std::size_t bytes = moe_routing_bytes(s);
            char* base = reinterpret_cast<char*>(std::uintptr_t{256});
            const MoeRouting r = moe_routing_view(s, base, bytes);
            auto at = [&](const void* p) { return static_cast<int64_t>(static_cast<const char*>(p) - base); };
            nb::dict d;
            d["bytes"] = static_cast<int64_t>(bytes);
            d["offsets"] = at(r.offsets);
            d["counts"] = at(r.counts);
            d["dest_rows"] = at(r.dest_rows);
            d["row_tokens"] = at(r.row_tokens);
            d["weights"] = at(r.weights);
            d["max_rows"] = s.max_rows();
            return d;
        },
        arg("shape"), "bytes, max_rows and byte offsets of the arrays of a routing of shape (T, k, E, ranks, align)");
    m.def(
        "moe_route",
        [](const AnyArray& idx, const OptArray& weights, const AnyArray& buffer, const ShapeTuple& shape,
           std::uintptr_t stream) {
            const TopK k = topk_args(idx, weights, routing_shape(shape), 1, "moe_route");
            const MoeRouting r = routing_of(buffer, shape, "moe_route");
            nb::gil_scoped_release unlocked;
            moe_route(k.idx, k.weights, r, as_stream(stream));
        },
        arg("topk_idx"), arg("topk_weights").none(), arg("buffer"), arg("shape"), arg("stream"));
    m.def(
        "moe_permute",
        [](const AnyArray& x, const AnyArray& buffer, const ShapeTuple& shape, const AnyArray& rows,
           std::uintptr_t stream) {
            const MoeRouting r = routing_of(buffer, shape, "moe_permute");
            const MatrixView vx = as_matrix(x, "moe_permute", "x"), vr = as_matrix(rows, "moe_permute", "out");
            nb::gil_scoped_release unlocked;
            moe_permute(vx, r, vr, as_stream(stream));
        },
        arg("x"), arg("buffer"), arg("shape"), arg("out"), arg("stream"));
    m.def(
        "moe_topk_reduce",
        [](const AnyArray& rows, const AnyArray& buffer, const ShapeTuple& shape, const AnyArray& y,
           std::uintptr_t stream) {
            const MoeRouting r = routing_of(buffer, shape, "moe_topk_reduce");
            const MatrixView vr = as_matrix(rows, "moe_topk_reduce", "rows"),
                             vy = as_matrix(y, "moe_topk_reduce", "out");
            nb::gil_scoped_release unlocked;
            moe_topk_reduce(vr, r, vy, as_stream(stream));
        },
        arg("rows"), arg("buffer"), arg("shape"), arg("out"), arg("stream"));
}

using DownFn = void (*)(World&, const MatrixView&, const MatrixView&, const MoeRouting&, const MatrixView&,
                        cudaStream_t, const TpMoeOptions&);

template <DownFn fn>
void bind_down(nb::module_& m, const char* name) {
    m.def(
        name,
        [name](WorldHandle& h, const AnyArray& rows, const AnyArray& w_down, const AnyArray& buffer,
               const ShapeTuple& shape, const AnyArray& out, std::uintptr_t stream, TpMoeAlgo algo, bool b_kn,
               float alpha, const OptArray& scale_a, const OptArray& scale_b) {
            const MatrixView vr = as_matrix(rows, name, "rows"), vw = as_matrix(w_down, name, "w_down"),
                             vo = as_matrix(out, name, "out");
            const MoeRouting r = routing_of(buffer, shape, name);
            const TpMoeOptions o = tp_options(name, algo, b_kn, 0, alpha, scale_a, scale_b);
            nb::gil_scoped_release unlocked;
            fn(h.world, vr, vw, r, vo, as_stream(stream), o);
        },
        arg("world"), arg("rows"), arg("w_down"), arg("buffer"), arg("shape"), arg("out"), arg("stream"),
        arg("algo") = TpMoeAlgo::Auto, arg("b_kn") = false, arg("alpha") = 1.f, arg("scale_a") = nb::none(),
        arg("scale_b") = nb::none());
}

}  // namespace

void bind_tp_moe(nb::module_& m) {
    nb::enum_<TpMoeAlgo>(m, "TpMoeAlgo")
        .value("Auto", TpMoeAlgo::Auto)
        .value("Fused", TpMoeAlgo::Fused)
        .value("Sequential", TpMoeAlgo::Sequential);
    bind_routing(m);
    m.def(
        "ag_moe",
        [](WorldHandle& h, const AnyArray& x, const AnyArray& idx, const OptArray& weights, const AnyArray& w_up,
           const AnyArray& buffer, const ShapeTuple& shape, const AnyArray& out, std::uintptr_t stream, TpMoeAlgo algo,
           bool b_kn, int activation, float alpha, const OptArray& scale_a, const OptArray& scale_b) {
            constexpr const char* op = "ag_moe";
            const MatrixView vx = as_matrix(x, op, "x"), vw = as_matrix(w_up, op, "w_up"),
                             vo = as_matrix(out, op, "out");
            const MoeRoutingShape s = routing_shape(shape);
            const TopK k = topk_args(idx, weights, s, h.world.world_size(), op);  // this rank's T_loc = T / W rows
            const MoeRouting r = routing_of(buffer, shape, op);
            const TpMoeOptions o = tp_options(op, algo, b_kn, activation, alpha, scale_a, scale_b);
            nb::gil_scoped_release unlocked;
            ag_moe(h.world, vx, k.idx, k.weights, vw, r, vo, as_stream(stream), o);
        },
        arg("world"), arg("x"), arg("topk_idx"), arg("topk_weights").none(), arg("w_up"), arg("buffer"), arg("shape"),
        arg("out"), arg("stream"), arg("algo") = TpMoeAlgo::Auto, arg("b_kn") = false, arg("activation") = 0,
        arg("alpha") = 1.f, arg("scale_a") = nb::none(), arg("scale_b") = nb::none());
    bind_down<&moe_rs>(m, "moe_rs");
    bind_down<&moe_ar>(m, "moe_ar");
    m.def(
        "release_moe_state",
        [](WorldHandle& h) {
            nb::gil_scoped_release unlocked;
            release_moe_state(h.world);
        },
        arg("world"));
}

}  // namespace loom::py
