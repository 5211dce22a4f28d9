// loom._C: expert-parallel dispatch / combine, throughput mode, and ep_moe_experts on DLPack tensors (docs/moe.md,
// "Expert parallelism: throughput mode"). The handle crosses over as loom._C.EpHandle (the C++ struct); its device
// arrays (recv_x, recv_offsets, recv_counts) are exported as DLPack views owned by the Python handle object, valid
// until the next dispatch on the World (the C++ handle's contract). Each binding converts its tensors (convert.hpp:
// ValueError on a wrong device, dtype, layout or shape), releases the GIL and calls the C++ op on the given stream;
// the op's own validation raises loom::Error.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "convert.hpp"
#include "loom/ops/moe_ep.hpp"
#include "world_handle.hpp"

namespace loom::py {

namespace nb = nanobind;
using nb::arg;
using OptArray = std::optional<AnyArray>;

namespace {

// topk_idx int32 [T, k] and topk_weights (None, or fp32 [T, k]), T = x's rows.
struct TopK {
    const int32_t* idx = nullptr;
    const float* weights = nullptr;
    int k = 0;
};

TopK topk_of(const AnyArray& idx, const OptArray& weights, int64_t tokens, const char* op) {
    TopK r;
    r.idx = static_cast<const int32_t*>(as_routing(idx, tokens, -1, DType::I32, op, "topk_idx"));
    r.k = static_cast<int>(idx.shape(1));
    if (weights)
        r.weights = static_cast<const float*>(as_routing(*weights, tokens, r.k, DType::F32, op, "topk_weights"));
    return r;
}

EpOptions ep_options(int64_t capacity, int num_blocks) {
    EpOptions o;
    o.capacity = capacity;
    o.num_blocks = num_blocks;
    return o;
}

// A CUDA DLPack view at `p` on `device`, kept alive by `owner` (the Python handle): [rows, cols] with row stride
// `stride` elements, or [rows] when cols is 0.
nb::ndarray<> view(nb::handle owner, const void* p, nb::dlpack::dtype type, std::size_t rows, std::size_t cols,
                   int64_t stride, int device) {
    const std::size_t shape[2] = {rows, cols};
    const int64_t strides[2] = {stride, 1};
    const bool matrix = cols > 0;
    return nb::ndarray<>(const_cast<void*>(p), matrix ? 2 : 1, shape, owner, matrix ? strides : nullptr, type,
                         nb::device::cuda::value, device);
}

constexpr nb::dlpack::dtype kBf16{static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};

}  // namespace

void bind_ep_moe(nb::module_& m) {
    nb::enum_<EpMoeAlgo>(m, "EpMoeAlgo")
        .value("Auto", EpMoeAlgo::Auto)
        .value("Sequential", EpMoeAlgo::Sequential)
        .value("Overlapped", EpMoeAlgo::Overlapped);
    nb::class_<EpHandle>(m, "EpHandle")
        .def_ro("tokens", &EpHandle::tokens)
        .def_ro("hidden", &EpHandle::hidden)
        .def_ro("topk", &EpHandle::topk)
        .def_ro("num_experts", &EpHandle::num_experts)
        .def_ro("local_experts", &EpHandle::local_experts)
        .def_ro("capacity", &EpHandle::capacity)
        .def_ro("call", &EpHandle::call)
        // recv_x [capacity, H] bf16, recv_offsets [L + 1] and recv_counts [L] int32; `device` the CUDA ordinal.
        .def(
            "recv_x",
            [](nb::handle self, int device) {
                const EpHandle& h = nb::cast<const EpHandle&>(self);
                return view(self, h.recv_x.data, kBf16, static_cast<std::size_t>(h.capacity),
                            static_cast<std::size_t>(h.hidden), h.recv_x.stride(), device);
            },
            arg("device"))
        .def(
            "recv_offsets",
            [](nb::handle self, int device) {
                const EpHandle& h = nb::cast<const EpHandle&>(self);
                return view(self, h.recv_offsets, nb::dtype<int32_t>(), static_cast<std::size_t>(h.local_experts) + 1,
                            0, 1, device);
            },
            arg("device"))
        .def(
            "recv_counts",
            [](nb::handle self, int device) {
                const EpHandle& h = nb::cast<const EpHandle&>(self);
                return view(self, h.recv_counts, nb::dtype<int32_t>(), static_cast<std::size_t>(h.local_experts), 0, 1,
                            device);
            },
            arg("device"));
    m.def(
        "ep_dispatch",
        [](WorldHandle& w, const AnyArray& x, const AnyArray& idx, const OptArray& weights, int num_experts,
           std::uintptr_t stream, int64_t capacity, int num_blocks) {
            constexpr const char* op = "ep_dispatch";
            const MatrixView vx = as_matrix(x, op, "x");
            const TopK k = topk_of(idx, weights, vx.rows, op);
            const EpOptions o = ep_options(capacity, num_blocks);
            nb::gil_scoped_release unlocked;
            return ep_dispatch(w.world, vx, k.idx, k.weights, k.k, num_experts, as_stream(stream), o);
        },
        arg("world"), arg("x"), arg("topk_idx"), arg("topk_weights").none(), arg("num_experts"), arg("stream"),
        arg("capacity") = 0, arg("num_blocks") = 0);
    m.def(
        "ep_combine",
        [](WorldHandle& w, const EpHandle& h, const AnyArray& expert_out, const AnyArray& y, std::uintptr_t stream,
           int num_blocks) {
            constexpr const char* op = "ep_combine";
            const MatrixView ve = as_matrix(expert_out, op, "expert_out"), vy = as_matrix(y, op, "out");
            const EpOptions o = ep_options(0, num_blocks);
            nb::gil_scoped_release unlocked;
            ep_combine(w.world, h, ve, vy, as_stream(stream), o);
        },
        arg("world"), arg("handle"), arg("expert_out"), arg("out"), arg("stream"), arg("num_blocks") = 0);
    m.def(
        "ep_check",
        [](WorldHandle& w, const EpHandle& h, std::uintptr_t stream) {
            nb::gil_scoped_release unlocked;
            ep_check(w.world, h, as_stream(stream));
        },
        arg("world"), arg("handle"), arg("stream"));
    m.def(
        "ep_dispatch_bytes",
        [](WorldHandle& w, const EpHandle& h, std::uintptr_t stream) {
            nb::gil_scoped_release unlocked;
            return ep_dispatch_bytes(w.world, h, as_stream(stream));
        },
        arg("world"), arg("handle"), arg("stream"));
    m.def(
        "ep_moe_experts",
        [](WorldHandle& w, const AnyArray& x, const AnyArray& idx, const OptArray& weights, int num_experts,
           const AnyArray& w_up, const OptArray& w_down, const AnyArray& y, std::uintptr_t stream, EpMoeAlgo algo,
           int activation, int64_t capacity, int num_blocks) {
            constexpr const char* op = "ep_moe_experts";
            const MatrixView vx = as_matrix(x, op, "x"), vu = as_matrix(w_up, op, "w_up"), vy = as_matrix(y, op, "out");
            const MatrixView vd = w_down ? as_matrix(*w_down, op, "w_down") : MatrixView{};
            const TopK k = topk_of(idx, weights, vx.rows, op);
            EpMoeOptions o;
            o.algo = algo;
            o.ep = ep_options(capacity, num_blocks);
            o.up.activation = static_cast<MoeActivation>(activation);
            nb::gil_scoped_release unlocked;
            return ep_moe_experts(w.world, vx, k.idx, k.weights, k.k, num_experts, vu, vd, vy, as_stream(stream), o);
        },
        arg("world"), arg("x"), arg("topk_idx"), arg("topk_weights").none(), arg("num_experts"), arg("w_up"),
        arg("w_down").none(), arg("out"), arg("stream"), arg("algo") = EpMoeAlgo::Auto, arg("activation") = 0,
        arg("capacity") = 0, arg("num_blocks") = 0);
    m.def(
        "release_moe_ep_state",
        [](WorldHandle& w) {
            nb::gil_scoped_release unlocked;
            release_moe_ep_state(w.world);
        },
        arg("world"));
}

}  // namespace loom::py
