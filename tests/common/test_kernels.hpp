// The JIT kernels of the test kernel headers, shared by the test binaries and the child helper (header-only: the
// helper links no GoogleTest).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "loom/jit/jit.hpp"

namespace loom::test {

// Kernel `name` of the test kernel header `header` (a path relative to the source tree), compiled on first use.
inline const jit::Kernel& test_kernel(const std::string& header, const std::string& name,
                                      std::vector<std::string> template_args = {}) {
    jit::KernelSpec spec;
    spec.header = std::string(LOOM_SOURCE_DIR) + "/" + header;
    spec.name = name;
    spec.template_args = std::move(template_args);
    return jit::get_kernel(spec);
}

// Kernel `name` of the language's multi-rank tests (tests/dist/kernels/lang_test.cuh).
inline const jit::Kernel& lang_kernel(const std::string& name, std::vector<std::string> template_args = {}) {
    return test_kernel("tests/dist/kernels/lang_test.cuh", name, std::move(template_args));
}

}  // namespace loom::test
