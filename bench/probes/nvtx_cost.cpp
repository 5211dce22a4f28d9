// Probe: what an op's NVTX range costs on the CPU (src/runtime/nvtx_range.hpp). Times, per call, a range with no
// tool attached (what every op call pays), formatting the range name into the stack buffer (what a call pays on top
// when a profiler is attached, besides the tool's own work), and std::string formatting for comparison. No GPU.
//   build/bench/probe-nvtx-cost          prints ns per call (median of 15 runs of 2^20 calls each)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/nvtx_range.hpp"

namespace {

// Keeps the compiler from dropping a result.
template <class T>
void keep(const T& v) {
    asm volatile("" : : "r,m"(v) : "memory");
}

template <class F>
double ns_per_call(F&& body) {
    constexpr int kCalls = 1 << 20;
    std::vector<double> runs;
    for (int r = 0; r < 15; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kCalls; ++i) body(static_cast<std::int64_t>(i));
        const auto t1 = std::chrono::steady_clock::now();
        runs.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kCalls);
    }
    std::sort(runs.begin(), runs.end());
    return runs[runs.size() / 2];
}

}  // namespace

int main() {
    using loom::detail::NvtxName;
    using loom::detail::NvtxRange;
    std::printf("NVTX tool attached: %s\n", loom::detail::nvtx_enabled() ? "yes" : "no");
    const double empty = ns_per_call([](std::int64_t i) { keep(i); });
    const double range = ns_per_call([](std::int64_t i) {
        const NvtxRange r("loom::ag_gemm M={} N={} K={}", i, std::int64_t{4096}, std::int64_t{8192});
        keep(i);
    });
    const double name = ns_per_call([](std::int64_t i) {
        const NvtxName n("loom::ag_gemm M={} N={} K={}", i, std::int64_t{4096}, std::int64_t{8192});
        keep(n.c_str()[0]);
    });
    const double string = ns_per_call([](std::int64_t i) {
        const std::string s = fmt::format("loom::ag_gemm M={} N={} K={}", i, std::int64_t{4096}, std::int64_t{8192});
        keep(s.data()[0]);
    });
    std::printf("%-52s %7.2f ns\n", "empty loop body", empty);
    std::printf("%-52s %7.2f ns\n", "NvtxRange (ctor + dtor)", range);
    std::printf("%-52s %7.2f ns\n", "NvtxName: the name into the stack buffer", name);
    std::printf("%-52s %7.2f ns\n", "fmt::format to std::string (for comparison)", string);
    return 0;
}
