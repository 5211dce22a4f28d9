// loom._C: the attention ops on DLPack tensors (docs/attention.md). Each binding converts its tensors (convert.hpp:
// ValueError on a wrong device, dtype or layout), releases the GIL and calls the C++ op on the given stream.
#include <nanobind/ndarray.h>

#include <cstdint>

#include "bindings.hpp"
#include "convert.hpp"
#include "loom/ops/attention.hpp"
#include "world_handle.hpp"

namespace loom::py {

namespace nb = nanobind;
using nb::arg;

namespace {

UlyssesOptions ulysses_options(UlyssesAlgo algo, int comm_sms, int num_sms) {
    UlyssesOptions o;
    o.algo = algo;
    o.comm_sms = comm_sms;
    o.num_sms = num_sms;
    return o;
}

}  // namespace

void bind_attention(nb::module_& m) {
    nb::enum_<UlyssesAlgo>(m, "UlyssesAlgo")
        .value("Auto", UlyssesAlgo::Auto)
        .value("Fused", UlyssesAlgo::Fused)
        .value("Sequential", UlyssesAlgo::Sequential);
    m.def(
        "qkv_gemm_a2a",
        [](WorldHandle& h, const AnyArray& x, const AnyArray& w, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
           const AnyArray& q, const AnyArray& k, const AnyArray& v, std::uintptr_t stream, UlyssesAlgo algo,
           int comm_sms, int num_sms) {
            constexpr const char* op = "qkv_gemm_a2a";
            const MatrixView vx = as_matrix(x, op, "x"), vw = as_matrix(w, op, "w_qkv"), vq = as_matrix(q, op, "q"),
                             vk = as_matrix(k, op, "k"), vv = as_matrix(v, op, "v");
            const UlyssesOptions o = ulysses_options(algo, comm_sms, num_sms);
            nb::gil_scoped_release unlocked;
            qkv_gemm_a2a(h.world, vx, vw, UlyssesHeads{heads_q, heads_kv, head_dim}, vq, vk, vv, as_stream(stream), o);
        },
        arg("world"), arg("x"), arg("w_qkv"), arg("heads_q"), arg("heads_kv"), arg("head_dim"), arg("q"), arg("k"),
        arg("v"), arg("stream"), arg("algo") = UlyssesAlgo::Auto, arg("comm_sms") = 0, arg("num_sms") = 0);
    m.def(
        "a2a_o_gemm",
        [](WorldHandle& h, const AnyArray& o, const AnyArray& w, const AnyArray& out, std::uintptr_t stream,
           UlyssesAlgo algo, int comm_sms, int num_sms) {
            constexpr const char* op = "a2a_o_gemm";
            const MatrixView vo = as_matrix(o, op, "o"), vw = as_matrix(w, op, "w_o"), vout = as_matrix(out, op, "out");
            const UlyssesOptions opt = ulysses_options(algo, comm_sms, num_sms);
            nb::gil_scoped_release unlocked;
            a2a_o_gemm(h.world, vo, vw, vout, as_stream(stream), opt);
        },
        arg("world"), arg("o"), arg("w_o"), arg("out"), arg("stream"), arg("algo") = UlyssesAlgo::Auto,
        arg("comm_sms") = 0, arg("num_sms") = 0);
    m.def(
        "release_ulysses_state", [](WorldHandle& h) { release_ulysses_state(h.world); }, arg("world"));
}

}  // namespace loom::py
