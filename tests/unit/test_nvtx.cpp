// NVTX ranges (src/runtime/nvtx_range.hpp): names formatted without allocation and truncated; no-ops without a
// tool; pushed and popped in Loom's domain when a tool is attached (loom_test_nvtx under a minimal tool,
// tests/helpers/nvtx_tool.cpp).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "runtime/nvtx_range.hpp"

namespace {

using loom::detail::NvtxName;
using loom::detail::NvtxRange;

TEST(Nvtx, NameIsFormatted) {
    EXPECT_STREQ(NvtxName("loom::ag_gemm M={} N={} K={}", 8192, int64_t{4096}, 8192u).c_str(),
                 "loom::ag_gemm M=8192 N=4096 K=8192");
    const std::string kernel = "loom::kernels::gemm";
    EXPECT_STREQ(NvtxName("loom::jit::compile {} sm_{}", kernel, 90).c_str(),
                 "loom::jit::compile loom::kernels::gemm sm_90");
    EXPECT_STREQ(NvtxName("loom::barrier_on_stream").c_str(), "loom::barrier_on_stream");
}

TEST(Nvtx, LongNameIsTruncated) {
    const std::string tail(1000, 'x');
    const std::string name = NvtxName("loom::jit::compile {}", tail).c_str();
    EXPECT_EQ(name.size(), NvtxName::kCapacity - 1);
    EXPECT_EQ(name, ("loom::jit::compile " + tail).substr(0, NvtxName::kCapacity - 1));
}

TEST(Nvtx, NoToolMeansNoRange) {
    if (std::getenv("NVTX_INJECTION64_PATH") != nullptr) GTEST_SKIP() << "an NVTX tool is attached to this process";
    EXPECT_FALSE(loom::detail::nvtx_enabled());
    for (int i = 0; i < 3; ++i) {
        const NvtxRange r("loom::all_reduce bytes={}", i);
    }
}

TEST(Nvtx, ToolSeesLoomsRanges) {
    std::error_code ec;
    const auto dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
    const auto program = dir / "loom_test_nvtx", tool = dir / "libloom_test_nvtx_tool.so";
    ASSERT_TRUE(std::filesystem::exists(program) && std::filesystem::exists(tool)) << program << ", " << tool;
    FILE* p = ::popen(
        ("NVTX_INJECTION64_PATH='" + tool.string() + "' timeout 60 '" + program.string() + "' 2>&1").c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[1024];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    const int status = ::pclose(p);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
    const std::string long_name = ("loom::jit::compile " + std::string(400, 'x')).substr(0, NvtxName::kCapacity - 1);
    EXPECT_EQ(out,
              "domain loom\n"
              "push loom::ag_gemm M=8192 N=4096 K=8192\n"
              "push loom::gemm M=8192 N=4096 K=4096\n"
              "pop\n"
              "pop\n"
              "push " +
                  long_name +
                  "\n"
                  "pop\n");
}

}  // namespace
