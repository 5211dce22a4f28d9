// loom._C: the ops on DLPack tensors. Each binding converts its tensors (convert.hpp: ValueError on a wrong device,
// dtype or layout), releases the GIL and calls the C++ op on the given stream; the op's own validation raises
// loom::Error (loom.Error in Python). Outputs are allocated by the Python layer.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>

#include <cstdint>
#include <optional>

#include "bindings.hpp"
#include "convert.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/moe.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "world_handle.hpp"

namespace loom::py {

namespace nb = nanobind;
using OptArray = std::optional<AnyArray>;
using nb::arg;

namespace {

CollOptions coll_options(CollAlgo algo, DataPath path, ReduceOp op, int num_sms) {
    CollOptions o;
    o.algo = algo;
    o.path = path;
    o.op = op;
    o.num_sms = num_sms;
    return o;
}

using CollFn = void (*)(World&, BufferView, BufferView, cudaStream_t, const CollOptions&);

template <CollFn fn>
void bind_collective(nb::module_& m, const char* name) {
    m.def(
        name,
        [name](WorldHandle& h, const AnyArray& in, const AnyArray& out, std::uintptr_t stream, CollAlgo algo,
               DataPath path, ReduceOp op, int num_sms) {
            const BufferView i = as_buffer(in, name, "input");
            const BufferView o = as_buffer(out, name, "out");
            const CollOptions opts = coll_options(algo, path, op, num_sms);
            nb::gil_scoped_release unlocked;
            fn(h.world, i, o, as_stream(stream), opts);
        },
        arg("world"), arg("input"), arg("out"), arg("stream"), arg("algo") = CollAlgo::Auto,
        arg("path") = DataPath::Auto, arg("op") = ReduceOp::Sum, arg("num_sms") = 0);
}

void bind_enums(nb::module_& m) {
    nb::enum_<CollAlgo>(m, "CollAlgo")
        .value("Auto", CollAlgo::Auto)
        .value("Push", CollAlgo::Push)
        .value("Pull", CollAlgo::Pull)
        .value("Ring", CollAlgo::Ring)
        .value("Scatter", CollAlgo::Scatter)
        .value("OneShot", CollAlgo::OneShot)
        .value("TwoShot", CollAlgo::TwoShot)
        .value("LL", CollAlgo::LL);
    nb::enum_<DataPath>(m, "DataPath")
        .value("Auto", DataPath::Auto)
        .value("LdSt", DataPath::LdSt)
        .value("Tma", DataPath::Tma)
        .value("CopyEngine", DataPath::CopyEngine);
    nb::enum_<ReduceOp>(m, "ReduceOp").value("Sum", ReduceOp::Sum).value("Max", ReduceOp::Max);
    nb::enum_<AgProducer>(m, "AgProducer")
        .value("Auto", AgProducer::Auto)
        .value("CopyEngine", AgProducer::CopyEngine)
        .value("Sm", AgProducer::Sm)
        .value("Direct", AgProducer::Direct)
        .value("Sequential", AgProducer::Sequential);
    nb::enum_<RsAlgo>(m, "RsAlgo")
        .value("Auto", RsAlgo::Auto)
        .value("FusedEpilogue", RsAlgo::FusedEpilogue)
        .value("ScatterReduce", RsAlgo::ScatterReduce)
        .value("Sequential", RsAlgo::Sequential)
        .value("FusedPull", RsAlgo::FusedPull);
    nb::enum_<RsTransport>(m, "RsTransport")
        .value("Auto", RsTransport::Auto)
        .value("Sm", RsTransport::Sm)
        .value("CopyEngine", RsTransport::CopyEngine);
    nb::enum_<ArAlgo>(m, "ArAlgo")
        .value("Auto", ArAlgo::Auto)
        .value("FusedEpilogue", ArAlgo::FusedEpilogue)
        .value("ReduceKernel", ArAlgo::ReduceKernel)
        .value("Sequential", ArAlgo::Sequential);
}

void bind_gemm(nb::module_& m) {
    m.def(
        "gemm",
        [](const AnyArray& a, const AnyArray& b, const AnyArray& c, std::uintptr_t stream, float alpha, float beta,
           const OptArray& bias, bool b_kn, const OptArray& scale_a, const OptArray& scale_b) {
            const MatrixView va = as_matrix(a, "gemm", "a"), vb = as_matrix(b, "gemm", "b"),
                             vc = as_matrix(c, "gemm", "out");
            GemmOptions o;
            o.alpha = alpha;
            o.beta = beta;
            if (bias) o.bias = as_buffer(*bias, "gemm", "bias");
            o.b_kn = b_kn;
            o.scale_a = as_scale(scale_a, "gemm", "scale_a");
            o.scale_b = as_scale(scale_b, "gemm", "scale_b");
            nb::gil_scoped_release unlocked;
            gemm(va, vb, vc, o, as_stream(stream));
        },
        arg("a"), arg("b"), arg("out"), arg("stream"), arg("alpha") = 1.f, arg("beta") = 0.f, arg("bias") = nb::none(),
        arg("b_kn") = false, arg("scale_a") = nb::none(), arg("scale_b") = nb::none());
}

void bind_moe(nb::module_& m) {
    m.def(
        "grouped_gemm",
        [](const AnyArray& a, const AnyArray& b, int num_experts, const AnyArray& c, const AnyArray& offsets,
           std::uintptr_t stream, bool b_kn, int activation, float alpha, const OptArray& scale_a,
           const OptArray& scale_b) {
            const MatrixView va = as_matrix(a, "grouped_gemm", "a"), vb = as_matrix(b, "grouped_gemm", "b"),
                             vc = as_matrix(c, "grouped_gemm", "out");
            const BufferView off = as_buffer(offsets, "grouped_gemm", "offsets", DType::I32);
            LOOM_CHECK(off.count >= 2, "grouped_gemm: expected offsets of num_groups + 1 >= 2 int32, given {}",
                       off.count);
            GroupedGemmOptions o;
            o.b_layout = b_kn ? BLayout::KN : BLayout::NK;
            o.activation = static_cast<MoeActivation>(activation);
            o.alpha = alpha;
            o.scale_a = as_scale(scale_a, "grouped_gemm", "scale_a");
            o.scale_b = scale_b
                            ? static_cast<const float*>(as_buffer(*scale_b, "grouped_gemm", "scale_b", DType::F32).data)
                            : nullptr;
            nb::gil_scoped_release unlocked;
            grouped_gemm(va, vb, num_experts, vc, static_cast<const int32_t*>(off.data),
                         static_cast<int>(off.count) - 1, as_stream(stream), o);
        },
        arg("a"), arg("b"), arg("num_experts"), arg("out"), arg("offsets"), arg("stream"), arg("b_kn") = false,
        arg("activation") = 0, arg("alpha") = 1.f, arg("scale_a") = nb::none(), arg("scale_b") = nb::none());
}

void bind_overlap(nb::module_& m) {
    m.def(
        "ag_gemm",
        [](WorldHandle& h, const AnyArray& a, const AnyArray& b, const AnyArray& c, std::uintptr_t stream,
           AgProducer producer, const OptArray& gathered, float alpha, const OptArray& scale_a, const OptArray& scale_b,
           int comm_sms, int num_sms) {
            const MatrixView va = as_matrix(a, "ag_gemm", "a"), vb = as_matrix(b, "ag_gemm", "b"),
                             vc = as_matrix(c, "ag_gemm", "out");
            AgGemmOptions o;
            o.producer = producer;
            if (gathered) o.gathered = as_matrix(*gathered, "ag_gemm", "gathered");
            o.alpha = alpha;
            o.scale_a = as_scale(scale_a, "ag_gemm", "scale_a");
            o.scale_b = as_scale(scale_b, "ag_gemm", "scale_b");
            o.comm_sms = comm_sms;
            o.num_sms = num_sms;
            nb::gil_scoped_release unlocked;
            ag_gemm(h.world, va, vb, vc, as_stream(stream), o);
        },
        arg("world"), arg("a"), arg("b"), arg("out"), arg("stream"), arg("producer") = AgProducer::Auto,
        arg("gathered") = nb::none(), arg("alpha") = 1.f, arg("scale_a") = nb::none(), arg("scale_b") = nb::none(),
        arg("comm_sms") = 0, arg("num_sms") = 0);
    m.def(
        "gemm_rs",
        [](WorldHandle& h, const AnyArray& a, const AnyArray& b, const AnyArray& c, std::uintptr_t stream, RsAlgo algo,
           RsTransport transport, float alpha, const OptArray& scale_a, const OptArray& scale_b, int comm_sms,
           int num_sms) {
            const MatrixView va = as_matrix(a, "gemm_rs", "a"), vb = as_matrix(b, "gemm_rs", "b"),
                             vc = as_matrix(c, "gemm_rs", "out");
            GemmRsOptions o;
            o.algo = algo;
            o.transport = transport;
            o.alpha = alpha;
            o.scale_a = as_scale(scale_a, "gemm_rs", "scale_a");
            o.scale_b = as_scale(scale_b, "gemm_rs", "scale_b");
            o.comm_sms = comm_sms;
            o.num_sms = num_sms;
            nb::gil_scoped_release unlocked;
            gemm_rs(h.world, va, vb, vc, as_stream(stream), o);
        },
        arg("world"), arg("a"), arg("b"), arg("out"), arg("stream"), arg("algo") = RsAlgo::Auto,
        arg("transport") = RsTransport::Auto, arg("alpha") = 1.f, arg("scale_a") = nb::none(),
        arg("scale_b") = nb::none(), arg("comm_sms") = 0, arg("num_sms") = 0);
    m.def(
        "gemm_ar",
        [](WorldHandle& h, const AnyArray& a, const AnyArray& b, const AnyArray& c, std::uintptr_t stream, ArAlgo algo,
           float alpha, const OptArray& scale_a, const OptArray& scale_b, int comm_sms, int num_sms) {
            const MatrixView va = as_matrix(a, "gemm_ar", "a"), vb = as_matrix(b, "gemm_ar", "b"),
                             vc = as_matrix(c, "gemm_ar", "out");
            GemmArOptions o;
            o.algo = algo;
            o.alpha = alpha;
            o.scale_a = as_scale(scale_a, "gemm_ar", "scale_a");
            o.scale_b = as_scale(scale_b, "gemm_ar", "scale_b");
            o.comm_sms = comm_sms;
            o.num_sms = num_sms;
            nb::gil_scoped_release unlocked;
            gemm_ar(h.world, va, vb, vc, as_stream(stream), o);
        },
        arg("world"), arg("a"), arg("b"), arg("out"), arg("stream"), arg("algo") = ArAlgo::Auto, arg("alpha") = 1.f,
        arg("scale_a") = nb::none(), arg("scale_b") = nb::none(), arg("comm_sms") = 0, arg("num_sms") = 0);
}

}  // namespace

void bind_ops(nb::module_& m) {
    bind_enums(m);
    bind_gemm(m);
    bind_moe(m);
    bind_collective<&all_gather>(m, "all_gather");
    bind_collective<&reduce_scatter>(m, "reduce_scatter");
    bind_collective<&all_reduce>(m, "all_reduce");
    bind_collective<&all_to_all>(m, "all_to_all");
    m.def(
        "all_to_all_v",
        [](WorldHandle& h, const AnyArray& in, const AnyArray& out, const AnyArray& send_counts,
           const OptArray& send_offsets, const OptArray& recv_counts, std::uintptr_t stream, CollAlgo algo,
           DataPath path, int num_sms) {
            const char* op = "all_to_all_v";
            const BufferView i = as_buffer(in, op, "input"), o = as_buffer(out, op, "out");
            const BufferView sc = as_buffer(send_counts, op, "send_counts", DType::I64);
            const auto* so =
                send_offsets
                    ? static_cast<const int64_t*>(as_buffer(*send_offsets, op, "send_offsets", DType::I64).data)
                    : nullptr;
            auto* rc = recv_counts ? static_cast<int64_t*>(as_buffer(*recv_counts, op, "recv_counts", DType::I64).data)
                                   : nullptr;
            const CollOptions opts = coll_options(algo, path, ReduceOp::Sum, num_sms);
            nb::gil_scoped_release unlocked;
            all_to_all_v(h.world, i, o, static_cast<const int64_t*>(sc.data), so, rc, as_stream(stream), opts);
        },
        arg("world"), arg("input"), arg("out"), arg("send_counts"), arg("send_offsets").none(),
        arg("recv_counts").none(), arg("stream"), arg("algo") = CollAlgo::Auto, arg("path") = DataPath::Auto,
        arg("num_sms") = 0);
    m.def(
        "barrier_on_stream",
        [](WorldHandle& h, std::uintptr_t stream) {
            nb::gil_scoped_release unlocked;
            barrier_on_stream(h.world, as_stream(stream));
        },
        arg("world"), arg("stream"));
    bind_overlap(m);
}

}  // namespace loom::py
