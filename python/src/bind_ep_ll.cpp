// loom._C: expert-parallel dispatch / combine, low-latency mode (docs/moe.md, "Expert parallelism: low-latency
// mode"), on DLPack tensors. The receive layout is the caller's (python/loom/moe_ep_ll.py allocates it with torch);
// each binding checks what it converts (convert.hpp: ValueError naming the op and argument), releases the GIL and
// calls the C++ op on the given stream, whose own validation raises loom::Error.
#include <fmt/format.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "convert.hpp"
#include "loom/ops/moe_ep_ll.hpp"
#include "world_handle.hpp"

namespace loom::py {

namespace nb = nanobind;
using nb::arg;
using OptArray = std::optional<AnyArray>;

namespace {

// A receive-layout array of at least `bytes` bytes.
void* recv_part(const AnyArray& t, std::size_t bytes, std::optional<DType> want, const char* op, const char* arg) {
    const BufferView b = want ? as_buffer(t, op, arg, *want) : as_buffer(t, op, arg);
    if (b.bytes() < bytes)
        value_error(fmt::format("{}: {} must hold at least {} bytes (the receive layout of this shape); given {}", op,
                                arg, bytes, b.bytes()));
    return b.data;
}

struct Call {
    EpLowLatencyShape shape;
    EpLowLatencyRecv recv;
    EpLowLatencyOptions opts;
};

// The shape, the receive layout (x and scales only where `rx` is given: the dispatch) and the options.
Call call_of(const World& world, int max_tokens, int hidden, int topk, int num_experts, const AnyArray* rx,
             const OptArray& rs, const AnyArray& ri, const AnyArray& rc, bool fp8, bool return_without_waiting,
             const char* op) {
    Call c;
    c.shape = {max_tokens, hidden, topk, num_experts};
    c.opts.fp8 = fp8;
    c.opts.return_without_waiting = return_without_waiting;
    const int W = world.world_size();
    // Sizes only for a shape the op accepts; it names what is wrong with any other.
    const bool sized =
        max_tokens >= 1 && hidden >= 128 && hidden % 128 == 0 && topk >= 1 && num_experts >= 1 && num_experts % W == 0;
    if (!sized) {
        c.recv = {rx != nullptr ? as_buffer(*rx, op, "recv.x").data : nullptr,
                  rs ? static_cast<float*>(as_buffer(*rs, op, "recv.scales").data) : nullptr,
                  static_cast<int32_t*>(as_buffer(ri, op, "recv.src_info").data),
                  static_cast<int32_t*>(as_buffer(rc, op, "recv.counts").data)};
        return c;
    }
    if (rx != nullptr) {
        c.recv.x = recv_part(*rx, ep_ll_recv_x_bytes(c.shape, W, fp8), std::nullopt, op, "recv.x");
        if (fp8) {
            if (!rs) value_error(fmt::format("{}: recv.scales is required with fp8", op));
            c.recv.scales =
                static_cast<float*>(recv_part(*rs, ep_ll_recv_scales_bytes(c.shape, W), DType::F32, op, "recv.scales"));
        }
    }
    c.recv.src_info =
        static_cast<int32_t*>(recv_part(ri, ep_ll_recv_src_info_bytes(c.shape, W), DType::I32, op, "recv.src_info"));
    c.recv.counts =
        static_cast<int32_t*>(recv_part(rc, ep_ll_recv_counts_bytes(c.shape, W), DType::I32, op, "recv.counts"));
    return c;
}

}  // namespace

void bind_ep_ll(nb::module_& m) {
    m.def(
        "ep_ll_dispatch",
        [](WorldHandle& w, const AnyArray& x, const AnyArray& idx, int max_tokens, int hidden, int topk,
           int num_experts, const AnyArray& rx, const OptArray& rs, const AnyArray& ri, const AnyArray& rc,
           std::uintptr_t stream, bool fp8, bool return_without_waiting, bool recv_in_heap) {
            constexpr const char* op = "ep_ll_dispatch";
            const MatrixView vx = as_matrix(x, op, "x");
            const auto* pidx = static_cast<const int32_t*>(as_routing(idx, vx.rows, topk, DType::I32, op, "topk_idx"));
            Call c = call_of(w.world, max_tokens, hidden, topk, num_experts, &rx, rs, ri, rc, fp8,
                             return_without_waiting, op);
            c.opts.recv_in_heap = recv_in_heap;
            nb::gil_scoped_release unlocked;
            ep_ll_dispatch(w.world, vx, pidx, c.shape, c.recv, as_stream(stream), c.opts);
        },
        arg("world"), arg("x"), arg("topk_idx"), arg("max_tokens"), arg("hidden"), arg("topk"), arg("num_experts"),
        arg("recv_x"), arg("recv_scales").none(), arg("recv_src_info"), arg("recv_counts"), arg("stream"),
        arg("fp8") = true, arg("return_without_waiting") = false, arg("recv_in_heap") = false);
    m.def(
        "ep_ll_combine",
        [](WorldHandle& w, const AnyArray& expert_out, const AnyArray& idx, const AnyArray& weights, int max_tokens,
           int hidden, int topk, int num_experts, const AnyArray& ri, const AnyArray& rc, const AnyArray& y,
           std::uintptr_t stream, bool return_without_waiting) {
            constexpr const char* op = "ep_ll_combine";
            const MatrixView ve = as_matrix(expert_out, op, "expert_out"), vy = as_matrix(y, op, "out");
            const auto* pidx = static_cast<const int32_t*>(as_routing(idx, vy.rows, topk, DType::I32, op, "topk_idx"));
            const auto* pw =
                static_cast<const float*>(as_routing(weights, vy.rows, topk, DType::F32, op, "topk_weights"));
            const Call c = call_of(w.world, max_tokens, hidden, topk, num_experts, nullptr, std::nullopt, ri, rc, false,
                                   return_without_waiting, op);
            nb::gil_scoped_release unlocked;
            ep_ll_combine(w.world, ve, pidx, pw, c.shape, c.recv, vy, as_stream(stream), c.opts);
        },
        arg("world"), arg("expert_out"), arg("topk_idx"), arg("topk_weights"), arg("max_tokens"), arg("hidden"),
        arg("topk"), arg("num_experts"), arg("recv_src_info"), arg("recv_counts"), arg("out"), arg("stream"),
        arg("return_without_waiting") = false);
    m.def(
        "ep_ll_dispatch_wait",
        [](WorldHandle& w, std::uintptr_t stream) {
            nb::gil_scoped_release unlocked;
            ep_ll_dispatch_wait(w.world, as_stream(stream));
        },
        arg("world"), arg("stream"));
    m.def(
        "ep_ll_combine_wait",
        [](WorldHandle& w, std::uintptr_t stream) {
            nb::gil_scoped_release unlocked;
            ep_ll_combine_wait(w.world, as_stream(stream));
        },
        arg("world"), arg("stream"));
    m.def(
        "release_ep_ll_state",
        [](WorldHandle& w) {
            nb::gil_scoped_release unlocked;
            release_ep_ll_state(w.world);
        },
        arg("world"));
}

}  // namespace loom::py
