#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/tensor.hpp"

namespace nb = nanobind;

NB_MODULE(_C, m) {
    m.doc() = "Loom's host library for Python (use the loom package, not this module)";
    // loom::Error -> loom.Error, a RuntimeError carrying Loom's message (API, detail, file:line).
    nb::exception<loom::Error>(m, "Error", PyExc_RuntimeError);

    nb::enum_<loom::DType>(m, "DType")
        .value("F32", loom::DType::F32)
        .value("F16", loom::DType::F16)
        .value("BF16", loom::DType::BF16)
        .value("F8E4M3", loom::DType::F8E4M3)
        .value("I32", loom::DType::I32)
        .value("I64", loom::DType::I64)
        .value("U8", loom::DType::U8);
    m.def("dtype_size", [](loom::DType t) { return loom::dtype_size(t); });
    m.def("dtype_name", [](loom::DType t) { return loom::dtype_name(t); });

    m.def("gpu_available", &loom::driver::available, "whether a CUDA driver and device are usable");
    m.def("gpu_unavailable_reason", &loom::driver::unavailable_reason);

    loom::py::bind_world(m);
    loom::py::bind_ops(m);
    loom::py::bind_attention(m);
    loom::py::bind_tp_moe(m);
    loom::py::bind_ep_moe(m);
    loom::py::bind_ep_ll(m);
    loom::py::bind_jit(m);
    loom::py::bind_bench(m);
}
