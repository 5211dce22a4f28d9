// loom._C.cpp_call_us: the host time of one op call made from C++ (a loop of back-to-back calls on the same views,
// no Python in between), to set against the same call made from Python (bench/py_call_overhead.py).
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "bindings.hpp"
#include "convert.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "world_handle.hpp"

namespace loom::py {

namespace nb = nanobind;

void bind_bench(nb::module_& m) {
    m.def(
        "cpp_call_us",
        [](WorldHandle& h, const std::string& op, const AnyArray& a, const AnyArray& b, const AnyArray& c,
           std::uintptr_t stream, int iters) {
            // op: "all_reduce" (a -> c), "gemm" (a, b -> c), "gemm_ar" (a, b -> c). The caller synchronises around.
            std::function<void()> call;
            if (op == "all_reduce") {
                const BufferView in = as_buffer(a, "cpp_call_us", "a"), out = as_buffer(c, "cpp_call_us", "c");
                call = [&h, in, out, stream] { all_reduce(h.world, in, out, as_stream(stream)); };
            } else if (op == "gemm" || op == "gemm_ar") {
                const MatrixView va = as_matrix(a, "cpp_call_us", "a"), vb = as_matrix(b, "cpp_call_us", "b"),
                                 vc = as_matrix(c, "cpp_call_us", "c");
                if (op == "gemm")
                    call = [va, vb, vc, stream] { gemm(va, vb, vc, {}, as_stream(stream)); };
                else
                    call = [&h, va, vb, vc, stream] { gemm_ar(h.world, va, vb, vc, as_stream(stream)); };
            } else {
                LOOM_FAIL("cpp_call_us: expected op all_reduce, gemm or gemm_ar; given {}", op);
            }
            nb::gil_scoped_release unlocked;
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < iters; ++i) call();
            const std::chrono::duration<double, std::micro> dt = std::chrono::steady_clock::now() - t0;
            return dt.count() / iters;
        },
        nb::arg("world"), nb::arg("op"), nb::arg("a"), nb::arg("b"), nb::arg("c"), nb::arg("stream"), nb::arg("iters"));
}

}  // namespace loom::py
