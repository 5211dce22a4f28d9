// loom_test_nvtx: opens Loom's NVTX ranges through runtime/nvtx_range.hpp (nested, and one with a name longer than
// the buffer). Run with NVTX_INJECTION64_PATH=<libloom_test_nvtx_tool.so>, the tool prints what it saw;
// tests/unit/test_nvtx.cpp checks the lines. Exit 0; 1 when Loom saw no tool.
#include <cstdint>
#include <cstdio>
#include <string>

#include "runtime/nvtx_range.hpp"

int main() {
    using loom::detail::NvtxRange;
    if (!loom::detail::nvtx_enabled()) {
        std::printf("no tool attached\n");
        return 1;
    }
    {
        const NvtxRange outer("loom::ag_gemm M={} N={} K={}", std::int64_t{8192}, std::int64_t{4096}, 8192);
        const NvtxRange inner("loom::gemm M={} N={} K={}", 8192, 4096, 4096);
    }
    const std::string long_name(400, 'x');
    { const NvtxRange r("loom::jit::compile {}", long_name); }
    return 0;
}
