// CPU tests of kernels built with NVSHMEM (remote peers, NVSHMEM device calls) skip where that build cannot run: no
// NVSHMEM install found, or no nvcc.
#pragma once

#include <optional>
#include <string>

#include "jit/toolchain.hpp"
#include "loom/runtime/error.hpp"

namespace loom::test {

// Why the NVSHMEM device build cannot run here, or nothing.
inline std::optional<std::string> nvshmem_build_missing() {
    try {
        jit::detail::nvshmem_home();
    } catch (const Error& e) {
        return std::string(e.what());
    }
    if (jit::detail::toolchain().nvcc.empty()) return std::string("nvcc not found");
    return std::nullopt;
}

}  // namespace loom::test
