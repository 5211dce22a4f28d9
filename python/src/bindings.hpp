// The extension module loom._C: host code only (kernels are compiled at run time by Loom's JIT). Each bind_*
// adds one part; the Python package (python/loom) is the API users call.
#pragma once

#include <nanobind/nanobind.h>

namespace loom::py {

void bind_world(nanobind::module_& m);      // RankInfo parsing, World, symmetric allocations
void bind_ops(nanobind::module_& m);        // gemm, the collectives, the overlapped GEMMs
void bind_attention(nanobind::module_& m);  // decode, SP decode, Ulysses sequence parallelism
void bind_tp_moe(nanobind::module_& m);     // MoE routing utilities, ag_moe, moe_rs, moe_ar
void bind_ep_moe(nanobind::module_& m);     // ep_dispatch, ep_combine, ep_moe_experts (expert parallelism)
void bind_ep_ll(nanobind::module_& m);      // ep_ll_dispatch, ep_ll_combine (expert parallelism, low latency)
void bind_jit(nanobind::module_& m);        // compile and launch a user's kernel
void bind_bench(nanobind::module_& m);      // host time of an op call made from C++ (call-overhead measurement)

}  // namespace loom::py
