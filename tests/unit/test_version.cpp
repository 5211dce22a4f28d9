// Loom's version: the file VERSION, loom/version.hpp's macros, loom::version(), and every tool's --version agree.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "loom/version.hpp"

namespace {

std::string version_file() {
    std::ifstream f(LOOM_SOURCE_DIR "/VERSION");
    std::string line;
    std::getline(f, line);
    return line;
}

struct Output {
    int status = -1;  // exit code, or -1 when the program did not exit normally
    std::string text;
};

// Runs `program args` (stdout and stderr), bounded by coreutils' timeout.
Output run(const std::string& program, const std::string& args) {
    Output o;
    const std::string cmd = "timeout 60 '" + program + "' " + args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return o;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) o.text += buf;
    const int status = ::pclose(p);
    o.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return o;
}

TEST(Version, MatchesVersionFile) {
    const std::string v = version_file();
    ASSERT_FALSE(v.empty()) << "cannot read " << LOOM_SOURCE_DIR << "/VERSION";
    EXPECT_EQ(LOOM_VERSION_STRING, v);
    EXPECT_EQ(std::to_string(LOOM_VERSION_MAJOR) + "." + std::to_string(LOOM_VERSION_MINOR) + "." +
                  std::to_string(LOOM_VERSION_PATCH),
              v);
    EXPECT_STREQ(loom::version(), LOOM_VERSION_STRING);
}

TEST(Version, ToolsPrintIt) {
    const std::string v = version_file();
    for (const char* tool : {"loomrun", "loom-info", "loom-cache"}) {
        const Output o = run(std::string(LOOM_BINARY_DIR "/bin/") + tool, "--version");
        EXPECT_EQ(o.status, 0) << tool << ": " << o.text;
        EXPECT_EQ(o.text, std::string(tool) + " " + v + "\n") << tool;
    }
}

TEST(Version, BenchmarksPrintIt) {
    const std::string v = version_file();
    int found = 0;
    for (const char* bench : {"bench-attention", "bench-collectives", "bench-gemm", "bench-jit", "bench-lang",
                              "bench-overlap", "bench-runtime", "bench-ulysses"}) {
        const std::string path = std::string(LOOM_BINARY_DIR "/bench/") + bench;
        if (!std::filesystem::exists(path)) continue;
        ++found;
        const Output o = run(path, "--version");
        EXPECT_EQ(o.status, 0) << bench << ": " << o.text;
        EXPECT_EQ(o.text, std::string(bench) + " (Loom " + v + ")\n") << bench;
    }
    if (found == 0) GTEST_SKIP() << "no benchmark built (LOOM_BUILD_BENCH=OFF, or not built yet)";
}

}  // namespace
