// The registry of sample kernel instantiations: one or more entries per kernel template, so that CI compiles
// every kernel (tests/unit/test_jit_samples.cpp) and `loom-cache precompile` can warm a cache.
//
// To register a kernel: append to the table in kernel_samples.cpp. Every include/loom/kernels/*.cuh header
// needs at least one entry (the test fails otherwise). Mark entries that only compile for sm_90a (wgmma,
// TMA, setmaxnreg) with sm90_only.
#pragma once

#include <string>
#include <vector>

#include "loom/jit/jit.hpp"

namespace loom::jit {

struct KernelSample {
    std::string header;  // "loom/kernels/gemm/gemm.cuh"
    std::string name;    // qualified kernel template
    std::vector<std::string> template_args;
    bool sm90_only = false;
    std::vector<std::string> defines{};

    KernelSpec spec() const {
        KernelSpec s;
        s.header = header;
        s.name = name;
        s.template_args = template_args;
        s.defines = defines;
        return s;
    }
};

const std::vector<KernelSample>& kernel_samples();

// Loom headers that only compile for sm_90a when included alone (every other device header must compile
// alone for sm_80 and sm_90a).
const std::vector<std::string>& sm90_only_headers();

// The device headers that must compile alone: every embedded *.cuh plus the plain-data headers kernels use
// (config.hpp, tensor.hpp, kernels/*_params.hpp).
std::vector<std::string> standalone_headers();

}  // namespace loom::jit
